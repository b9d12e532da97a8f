//! Request validation, in one place: the engine checks every [`GenerateRequest`] against the
//! served model before admitting it, and the HTTP gateway runs the same check to answer a batch
//! with a 400 before submitting any of it. The sampling parameters' ranges are
//! [`SamplingParams::check`](routed_types::SamplingParams::check)'s, run from here.

use crate::{EngineError, GenerateRequest, ModelInfo};
use routed_types::SeqId;

/// The largest `n` (continuations per request).
pub const MAX_N: usize = 128;

const _: () = assert!(MAX_N <= SeqId::MAX_PER_REQUEST);

/// Checks `request` against the served model; the error names the offending field.
pub fn validate(request: &GenerateRequest, info: &ModelInfo) -> Result<(), EngineError> {
    let bad =
        |param: &'static str, message: String| Err(EngineError::InvalidRequest { param, message });
    let p = request.prompt_token_ids.len();
    let max_tokens = request.sampling.max_tokens as usize;
    let limit = info.max_model_len;
    let capacity = info.num_kv_blocks * info.block_size;
    // When the routing cap sized the pool, a limit it set says so.
    let why = |bound: usize| match info.kv_pool_sized_by_routing_cap && bound >= capacity {
        true => " (the KV pool holds what --routing-cache-max-bytes holds routing rows for)",
        false => "",
    };
    if p == 0 {
        return bad("prompt", "the prompt must have at least one token".into());
    }
    if let Some(t) = request.prompt_token_ids.iter().find(|&&t| t as usize >= info.vocab_size) {
        let message = format!("token ids must be in [0, {}), got {t}", info.vocab_size);
        return bad("prompt", message);
    }
    if p >= limit {
        let message = format!(
            "this model's maximum context length is {limit} tokens{}, and the prompt has {p}",
            why(limit)
        );
        return bad("prompt", message);
    }
    if max_tokens == 0 {
        return bad("max_tokens", "max_tokens must be at least 1".into());
    }
    if p + max_tokens > limit {
        let message = format!(
            "this model's maximum context length is {limit} tokens{}; the prompt ({p}) plus \
             max_tokens ({max_tokens}) exceeds it",
            why(limit)
        );
        return bad("max_tokens", message);
    }
    if p + max_tokens > capacity {
        // Such a request could never hold all its blocks at once: it would be preempted forever.
        let message = format!(
            "the prompt ({p}) plus max_tokens ({max_tokens}) needs more than the KV cache's \
             {capacity} token slots{}",
            why(capacity)
        );
        return bad("max_tokens", message);
    }
    if let Err(e) = request.sampling.check(info.vocab_size) {
        return bad(e.param, e.message);
    }
    if request.n == 0 || request.n > MAX_N {
        return bad("n", format!("n must be between 1 and {MAX_N}, got {}", request.n));
    }
    if request.n > info.max_waiting_requests {
        // Every sequence of a request enters the waiting queue at once: it could never be admitted.
        let message = format!(
            "n ({}) is more than the server's waiting queue holds (--max-waiting-requests {})",
            request.n, info.max_waiting_requests
        );
        return bad("n", message);
    }
    if request.return_routing && !info.routing_capture {
        let message = "routing capture is off (start the server with \
                       --enable-return-routed-experts)";
        return bad("return_routed_experts", message.into());
    }
    if request.return_routing && request.routing_start > p {
        let message = format!(
            "routed_experts_start_len ({}) must be between 0 and the prompt's {p} tokens",
            request.routing_start
        );
        return bad("routed_experts_start_len", message);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use routed_types::SamplingParams;

    fn info() -> ModelInfo {
        ModelInfo {
            checkpoint_dir: std::path::PathBuf::new(),
            served_model_name: "m".into(),
            max_model_len: 64,
            vocab_size: 100,
            routing: None,
            routing_capture: true,
            num_kv_blocks: 8,
            kv_pool_sized_by_routing_cap: false,
            block_size: 4,
            num_snapshot_slots: 0,
            max_waiting_requests: 16,
            max_num_seqs: 8,
            max_num_batched_tokens: 64,
            prefix_caching: true,
            device: "cpu".into(),
            expert_parallel_size: 1,
            default_seed: 0,
            weight_bytes_per_token: 0,
        }
    }

    fn param(r: GenerateRequest) -> Option<&'static str> {
        match validate(&r, &info()) {
            Ok(()) => None,
            Err(EngineError::InvalidRequest { param, .. }) => Some(param),
            Err(e) => panic!("unexpected {e}"),
        }
    }

    fn req(prompt: usize, max_tokens: u32) -> GenerateRequest {
        GenerateRequest::new(vec![1; prompt], SamplingParams::greedy(max_tokens))
    }

    #[test]
    fn each_bad_field_is_named() {
        assert_eq!(param(req(3, 4)), None);
        assert_eq!(param(req(0, 4)), Some("prompt"));
        assert_eq!(
            param(GenerateRequest { prompt_token_ids: vec![100], ..req(1, 4) }),
            Some("prompt")
        );
        assert_eq!(param(req(64, 1)), Some("prompt"));
        assert_eq!(param(req(3, 0)), Some("max_tokens"));
        assert_eq!(param(req(30, 30)), Some("max_tokens")); // past the 32 KV slots
        assert_eq!(param(req(60, 10)), Some("max_tokens")); // past max_model_len
        assert_eq!(param(GenerateRequest { n: 0, ..req(3, 4) }), Some("n"));
        assert_eq!(param(GenerateRequest { n: MAX_N + 1, ..req(3, 4) }), Some("n"));
        assert_eq!(param(GenerateRequest { n: 16, ..req(3, 4) }), None);
        assert_eq!(param(GenerateRequest { n: 17, ..req(3, 4) }), Some("n")); // past the queue
        let start = GenerateRequest { routing_start: 4, ..req(3, 4) };
        assert_eq!(param(start), Some("routed_experts_start_len"));
    }

    #[test]
    fn bad_sampling_parameters_are_named_as_the_engine_names_them() {
        let sampled = |sampling: SamplingParams| GenerateRequest::new(vec![1; 3], sampling);
        let greedy = SamplingParams::greedy(4);
        let nan = SamplingParams { temperature: f32::NAN, ..greedy.clone() };
        assert_eq!(param(sampled(nan)), Some("temperature"));
        let top_p = SamplingParams { top_p: 0.0, ..greedy.clone() };
        assert_eq!(param(sampled(top_p)), Some("top_p"));
        // The model's vocabulary bounds the bias's ids: 100 tokens here.
        let bias = SamplingParams { logit_bias: vec![(99, 1.0)], ..greedy.clone() };
        assert_eq!(param(sampled(bias)), None);
        let bias = SamplingParams { logit_bias: vec![(100, 1.0)], ..greedy.clone() };
        assert_eq!(param(sampled(bias)), Some("logit_bias"));
        let logprobs = SamplingParams { logprobs: Some(21), ..greedy.clone() };
        assert_eq!(param(sampled(logprobs)), Some("logprobs"));
        let min = SamplingParams { min_tokens: 5, ..greedy };
        assert_eq!(param(sampled(min)), Some("min_tokens"));
        match validate(&sampled(SamplingParams { top_k: Some(0), ..Default::default() }), &info()) {
            Err(EngineError::InvalidRequest { param: "top_k", message }) => {
                assert!(message.starts_with("top_k must be at least 1"), "{message}")
            }
            other => panic!("expected top_k to be refused, got {other:?}"),
        }
    }
}
