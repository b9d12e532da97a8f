//! The sampling and scoring features RL and evaluation clients use (penalties, `min_p`, logit
//! bias, bad words, prompt logprobs, constrained outputs), aborted requests' routing, and the
//! expert-load counts, through the engine: each feature does what it says, deterministically under its seed, and a request's
//! results are bitwise the same alone as batched with others in chunked steps.

mod common;

use common::{Outcome, collect, engine, greedy, request, run, test_device};
use futures_util::{StreamExt, future::join_all};
use routed::runtime::{FinalOutput, TokenEvent};
use routed::types::{
    FinishReason, Grammar, JsonSchema, Regex, ResponseFormat, SamplingParams, SchemaNode,
    SchemaNodeId, StructuralTag, TagStructure, TokenId,
};
use routed::{EngineHandle, GenerateRequest, RequestEvent};
use routed_test_support::{Golden, json_object_prefix};
use std::sync::Arc;

/// Each feature on its own, sampled (temperature 1) so its effect on the draw shows.
fn features() -> Vec<(&'static str, SamplingParams)> {
    let sampled = SamplingParams { temperature: 1.0, seed: 11, logprobs: Some(2), ..greedy(10) };
    vec![
        ("presence_penalty", SamplingParams { presence_penalty: 1.5, ..sampled.clone() }),
        ("frequency_penalty", SamplingParams { frequency_penalty: 0.7, ..sampled.clone() }),
        ("repetition_penalty", SamplingParams { repetition_penalty: 1.8, ..sampled.clone() }),
        ("min_p", SamplingParams { min_p: 0.3, ..sampled.clone() }),
        (
            "logit_bias",
            SamplingParams { logit_bias: vec![(3, 4.0), (40, -50.0)], ..sampled.clone() },
        ),
        ("prompt_logprobs", SamplingParams { prompt_logprobs: Some(3), ..sampled.clone() }),
        ("bad_words", SamplingParams { bad_words: vec![vec![3], vec![7, 40]], ..sampled.clone() }),
        (
            "json_object",
            SamplingParams { response_format: ResponseFormat::JsonObject, ..sampled.clone() },
        ),
        ("json_schema", SamplingParams { response_format: list_of_flags(), ..sampled.clone() }),
        ("regex", SamplingParams { response_format: counted_words(), ..sampled.clone() }),
        ("grammar", SamplingParams { response_format: nested_sums(), ..sampled.clone() }),
        (
            "structural_tag",
            SamplingParams {
                response_format: flags_in_text(),
                // The trigger's token (`<` in both vocabularies) pushed, so structures open.
                logit_bias: vec![(30, 6.0)],
                ..sampled.clone()
            },
        ),
        (
            "allowed_token_ids",
            SamplingParams {
                response_format: ResponseFormat::Tokens(vec![3, 7, 40, 41].into()),
                ..sampled.clone()
            },
        ),
        (
            "logprob_token_ids",
            SamplingParams {
                logprob_token_ids: vec![3, 40, 7, 3].into(),
                prompt_logprobs: Some(1),
                ..sampled
            },
        ),
    ]
}

/// `[bool, ...]` of one to three items, compact: a schema's output.
fn list_of_flags() -> ResponseFormat {
    let nodes = vec![
        SchemaNode::Array {
            prefix_items: vec![],
            items: SchemaNodeId(1),
            min_items: 1,
            max_items: Some(3),
        },
        SchemaNode::Literals(vec!["true".into(), "false".into()]),
    ];
    ResponseFormat::JsonSchema { schema: Arc::new(JsonSchema { nodes }), compact: true }
}

/// Words and a count, as a regex says: a text's output.
fn counted_words() -> ResponseFormat {
    ResponseFormat::Regex(Arc::new(Regex::new("(the|a) [a-z]+ [0-9]{1,2}").unwrap()))
}

/// Free text with a flag list wherever it writes `<`: `<list>` `[true, ...]` `</list>`.
fn flags_in_text() -> ResponseFormat {
    let ResponseFormat::JsonSchema { schema, .. } = list_of_flags() else { unreachable!() };
    let structure = TagStructure { begin: "<list>".into(), schema, end: "</list>".into() };
    let tag = StructuralTag::new(vec![structure], vec!["<".into()]);
    ResponseFormat::StructuralTag(Arc::new(tag))
}

/// Sums of digits and bracketed sums, as a grammar says: an output that nests.
fn nested_sums() -> ResponseFormat {
    let grammar = "root ::= term (\"+\" term)*\nterm ::= [0-9] | \"(\" root \")\"";
    ResponseFormat::Grammar(Arc::new(Grammar::new(grammar).unwrap()))
}

/// Per continuation: its token events (token, logprob, top alternatives).
fn streams(o: &Outcome) -> Vec<Vec<TokenEvent>> {
    (0..o.finals.len())
        .map(|i| o.tokens.iter().filter(|t| t.index == i).cloned().collect())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_feature_is_batch_invariant_and_deterministic() {
    for arch in ["qwen3_moe", "nemotron_h"] {
        let g = Golden::open(arch);
        let prompt = g.prompt("main");
        let solo = engine(arch, |c| c.enable_prefix_caching = false);
        let busy = engine(arch, |c| c.max_num_batched_tokens = 9);
        for (name, params) in features() {
            let req = GenerateRequest::new(prompt.clone(), params.clone());
            let alone = run(&solo, req.clone()).await;
            let again = run(&solo, req.clone()).await;
            assert!(alone.error.is_none(), "{arch} {name}: {:?}", alone.error);
            assert_eq!(streams(&alone), streams(&again), "{arch} {name}: same seed, same bits");
            // Batched with others, in 9-token steps.
            let others = (0..3).map(|i| request(&g.prompt("long")[i..], 6 + i as u32));
            let mut batch: Vec<_> = others.collect();
            batch.insert(1, req);
            let outs = join_all(batch.into_iter().map(|r| run(&busy, r))).await;
            let batched = &outs[1];
            assert_eq!(streams(batched), streams(&alone), "{arch} {name}: batched = alone");
            // The busy engine keeps its prefix cache, so later features hit it: everything but the
            // hit count must match.
            let uncached = |o: &Outcome| -> Vec<_> {
                o.finals.iter().map(|f| FinalOutput { num_cached_tokens: 0, ..f.clone() }).collect()
            };
            assert_eq!(uncached(batched), uncached(&alone), "{arch} {name}: outputs, routing");
        }
        solo.shutdown().await;
        busy.shutdown().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn json_object_outputs_are_json_objects_or_their_prefixes() {
    // Greedy and seeded continuations of every family's prompts, sampled with and without the
    // constraint: the tiny checkpoints write no JSON of their own, so every constrained answer
    // being a JSON object's prefix, and every one ended by EOS a whole object, is the mask's work.
    let (mut num_whole, mut num_free_json) = (0, 0);
    for arch in ["qwen3_moe", "nemotron_h"] {
        let g = Golden::open(arch);
        let handle = engine(arch, |c| c.max_num_batched_tokens = 16);
        let json = ResponseFormat::JsonObject;
        for (i, name) in ["main", "short3", "long"].into_iter().enumerate() {
            for seed in 0..4 {
                let temperature = if seed == 0 { 0.0 } else { 1.0 };
                let free = SamplingParams { temperature, seed, ..greedy(40 + 10 * i as u32) };
                let constrained = SamplingParams { response_format: json.clone(), ..free.clone() };
                let prompt = g.prompt(name);
                let out = run(&handle, GenerateRequest::new(prompt.clone(), constrained)).await;
                let f = &out.finals[0];
                let whole = json_object_prefix(&f.text)
                    .unwrap_or_else(|| panic!("{arch} {name} {seed}: {:?}", f.text));
                // An object may also close on the last token the length allows.
                let stopped = matches!(f.finish_reason, FinishReason::Stop { .. });
                assert!(whole || !stopped, "{arch} {name} {seed}: stopped in {:?}", f.text);
                num_whole += usize::from(whole);
                let rows = f.routing.as_ref().expect("routing").num_rows;
                assert_eq!(rows, prompt.len() + f.token_ids.len() - 1, "every row kept");
                let out = run(&handle, GenerateRequest::new(prompt, free)).await;
                num_free_json += usize::from(json_object_prefix(&out.finals[0].text).is_some());
            }
        }
        handle.shutdown().await;
    }
    assert!(num_whole > 0, "some answer closed its object");
    assert_eq!(num_free_json, 0, "unconstrained, the checkpoints write no JSON");
}

/// How often `token` appears in a greedy continuation of `prompt` under `params`.
async fn count_of(
    handle: &EngineHandle,
    prompt: &[TokenId],
    params: SamplingParams,
    token: u32,
) -> usize {
    let out = run(handle, GenerateRequest::new(prompt.to_vec(), params)).await;
    out.finals[0].token_ids.iter().filter(|&&t| t == token).count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bias_forces_a_token_and_penalties_see_the_history() {
    let g = Golden::open("qwen3_moe");
    let handle = engine("qwen3_moe", |_| {});
    let prompt = g.prompt("short3");
    let favoured = 77;
    // A strong bias makes a greedy continuation repeat one token...
    let biased = SamplingParams { logit_bias: vec![(favoured, 30.0)], ..greedy(12) };
    assert_eq!(count_of(&handle, &prompt, biased.clone(), favoured).await, 12);
    // ...until each repetition costs more than the bias: the penalties read the tokens generated
    // in earlier steps.
    let frequency = SamplingParams {
        frequency_penalty: 2.0,
        logit_bias: vec![(favoured, 5.0)],
        ..biased.clone()
    };
    let with_frequency = count_of(&handle, &prompt, frequency, favoured).await;
    assert!((1..12).contains(&with_frequency), "frequency penalty: {with_frequency} of 12");
    let repetition =
        SamplingParams { repetition_penalty: 100.0, logit_bias: vec![(favoured, 2.0)], ..biased };
    let with_repetition = count_of(&handle, &prompt, repetition, favoured).await;
    assert!(with_repetition < 12, "repetition penalty: {with_repetition} of 12");
    handle.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_words_never_appear_in_the_output() {
    let g = Golden::open("qwen3_moe");
    let handle = engine("qwen3_moe", |c| c.max_num_batched_tokens = 16);
    let prompt = g.prompt("main");
    let plain = run(&handle, GenerateRequest::new(prompt.clone(), greedy(16))).await;
    let free = plain.finals[0].token_ids.clone();
    // A token the greedy answer writes first at `i`, and a later pair of its tokens without it
    // that the answer does not write before `i`.
    let i = (1..free.len()).find(|&i| !free[..i].contains(&free[i])).expect("a new token");
    let one = free[i];
    let before = |pair: &[u32]| free[..=i].windows(2).any(|w| w == pair);
    let j = (i + 1..free.len() - 1)
        .find(|&j| !free[j..j + 2].contains(&one) && !before(&free[j..j + 2]))
        .unwrap_or_else(|| panic!("a pair after {i} in {free:?}"));
    let pair = [free[j], free[j + 1]];
    for seed in 0..3 {
        let temperature = if seed == 0 { 0.0 } else { 1.0 };
        let params = SamplingParams {
            temperature,
            seed,
            bad_words: vec![vec![one], pair.to_vec()],
            ..greedy(16)
        };
        let out = run(&handle, GenerateRequest::new(prompt.clone(), params)).await;
        let tokens = &out.finals[0].token_ids;
        assert_eq!(tokens.len(), 16, "{seed}: {tokens:?}");
        assert!(!tokens.contains(&one), "{seed}: {tokens:?}");
        assert!(!tokens.windows(2).any(|w| w == pair), "{seed}: {tokens:?}");
        if seed == 0 {
            // Greedy: the same answer up to the first banned token, then another.
            assert_eq!(tokens[..i], free[..i]);
            assert_ne!(tokens[i], one);
        }
    }
    handle.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prompt_and_named_token_logprobs_match_transformers_and_skip_the_prefix_cache() {
    // The CPU keeps f32 everywhere; the CUDA worker keeps K and V in bf16 (each rounded by up to
    // 2^-9 of itself), which moves these logprobs by up to 3e-3 (measured on the CUDA simulator).
    let tol = match test_device() {
        routed_backend::DeviceSpec::Cpu => 2e-4,
        _ => 1e-2,
    };
    for arch in ["qwen3_moe", "granitemoehybrid"] {
        let g = Golden::open(arch);
        let prompt = g.prompt("main");
        let (logits, shape) = g.f32("main.logits");
        let vocab = shape[1];
        let handle = engine(arch, |c| c.max_num_batched_tokens = 7);
        // Warm the prefix cache with the same prompt: the scoring request must not use it.
        run(&handle, request(&prompt, 2)).await;
        // Named tokens too: two of the prompt's and one it may not hold.
        let named: Vec<TokenId> = vec![prompt[1], 5, prompt[3]];
        let params = SamplingParams {
            prompt_logprobs: Some(2),
            logprobs: Some(0),
            logprob_token_ids: named.clone().into(),
            ..greedy(2)
        };
        let out = run(&handle, GenerateRequest::new(prompt.clone(), params)).await;
        let f = &out.finals[0];
        // transformers' logprob of token `t` at row `i`.
        let raw = |i: usize, t: TokenId| {
            let row = &logits[i * vocab..(i + 1) * vocab];
            let max = row.iter().copied().fold(f32::MIN, f32::max);
            row[t as usize] - (max + row.iter().map(|x| (x - max).exp()).sum::<f32>().ln())
        };
        let near = |got: &[f32], i: usize, what: &str| {
            assert_eq!(got.len(), named.len(), "{arch} {what}");
            for (&lp, &t) in got.iter().zip(&named) {
                assert!((lp - raw(i, t)).abs() < tol, "{arch} {what} token {t}: {lp}");
            }
        };
        // The last prompt row is the first generated token's distribution.
        near(&out.tokens[0].token_id_logprobs, prompt.len() - 1, "the first output token");
        assert_eq!(f.num_cached_tokens, 0, "{arch}: prompt logprobs compute the whole prompt");
        let got = f.prompt_logprobs.as_ref().expect("asked for");
        assert_eq!(got.len(), prompt.len() - 1, "{arch}: one per prompt token but the first");
        for (i, entry) in got.iter().enumerate() {
            let want = raw(i, prompt[i + 1]);
            near(&entry.token_id_logprobs, i, &format!("position {}", i + 1));
            assert_eq!(entry.token, prompt[i + 1]);
            assert!(
                (entry.logprob - want).abs() < tol,
                "{arch} position {}: {} vs {want}",
                i + 1,
                entry.logprob
            );
            assert_eq!(entry.top_logprobs.len(), 2);
            // The rank agrees with the alternatives' order where the token is one of them.
            let rank = entry.rank.expect("prompt logprobs carry the rank");
            match entry.top_logprobs.iter().position(|&(t, _)| t == entry.token) {
                Some(j) => assert_eq!(rank as usize, j + 1, "{arch} position {}", i + 1),
                None => assert!(rank > 2, "{arch} position {}: rank {rank}", i + 1),
            }
        }
        handle.shutdown().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_aborted_request_returns_the_routing_of_what_it_computed() {
    for arch in ["nemotron_h", "mixtral"] {
        let g = Golden::open(arch);
        let prompt = g.prompt("long");
        let handle = engine(arch, |_| {});
        let full = run(&handle, request(&prompt, 40)).await;
        let full_rows = full.finals[0].routing.clone().expect("routing");
        let mut stream = handle.submit(request(&prompt, 40)).await.unwrap();
        let mut seen = 0;
        while seen < 5 {
            if let Some(RequestEvent::Token(_)) = stream.next().await {
                seen += 1;
            }
        }
        handle.abort(stream.id());
        let out = collect(stream).await;
        let f = &out.finals[0];
        assert_eq!(f.finish_reason, routed::types::FinishReason::Abort, "{arch}");
        // The stream carried every token the final output lists, the one sampled by the step in
        // flight when the abort arrived included.
        assert_eq!(seen + out.tokens.len(), f.token_ids.len(), "{arch}");
        let rows = f.routing.as_ref().expect("an aborted request keeps its routing");
        // One row per token fed to the model: the prompt and every generated token but the last.
        assert_eq!(rows.num_rows, prompt.len() + f.token_ids.len() - 1, "{arch}");
        assert!(f.token_ids.len() >= 5 && f.token_ids.len() < 40, "{arch}");
        let n = rows.ids.len();
        assert_eq!(rows.ids[..], full_rows.ids[..n], "{arch}: the same rows as the full run");
        // Aborted before any forward: no routing.
        let big = engine(arch, |c| c.max_num_seqs = 1);
        let blocker = big.submit(request(&prompt, 30)).await.unwrap();
        let waiting = big.submit(request(&prompt, 4)).await.unwrap();
        big.abort(waiting.id());
        let out = collect(waiting).await;
        assert_eq!(out.finals[0].routing, None, "{arch}: aborted while waiting");
        drop(blocker);
        big.shutdown().await;
        handle.shutdown().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn expert_load_counts_every_routed_token_by_phase() {
    let g = Golden::open("qwen3_moe");
    let handle = engine("qwen3_moe", |c| c.enable_prefix_caching = false);
    let prompt = g.prompt("main");
    run(&handle, request(&prompt, 5)).await;
    let load = handle.expert_load().await.unwrap().expect("an MoE model");
    let (prefill, decode) = (routed::routing::Phase::Prefill, routed::routing::Phase::Decode);
    for l in 0..load.since_start.num_layers() {
        let sum = |phase| load.since_start.counts(l, phase).iter().sum::<u64>();
        // top-2: every prompt token and every fed-back generated token picks two experts.
        assert_eq!(sum(prefill), 2 * prompt.len() as u64, "layer {l}");
        assert_eq!(sum(decode), 2 * 4, "layer {l}");
        assert!(load.since_start.imbalance(l, prefill).unwrap() >= 1.0);
    }
    assert_eq!(load.since_reset, load.since_start);
    handle.reset_expert_load();
    let after = handle.expert_load().await.unwrap().unwrap();
    assert_eq!(after.since_reset.imbalance(0, prefill), None, "reset");
    assert_eq!(after.since_start, load.since_start, "the since-start counts keep going");
    handle.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn json_schema_outputs_are_values_of_the_schema() {
    // The tiny checkpoints write no such list of their own: each answer ended by EOS being one
    // (and every answer a prefix of one) is the constraint's work, on every family.
    for arch in ["qwen3_moe", "mixtral", "nemotron_h", "granitemoehybrid"] {
        let g = Golden::open(arch);
        let handle = engine(arch, |_| {});
        let mut num_whole = 0;
        for seed in 0..6 {
            let params = SamplingParams {
                temperature: 1.0,
                seed,
                response_format: list_of_flags(),
                ignore_eos: false,
                ..greedy(12)
            };
            let out = run(&handle, GenerateRequest::new(g.prompt("main"), params)).await;
            let f = &out.finals[0];
            let text = f.text.as_str();
            assert!(text.starts_with('['), "{arch} {seed}: {text:?}");
            let words = ["true", "false"];
            let items: Vec<&str> = text[1..].trim_end_matches(']').split(',').collect();
            assert!(items.len() <= 3, "{arch} {seed}: {text:?}");
            for item in &items[..items.len() - 1] {
                assert!(words.contains(item), "{arch} {seed}: {text:?}");
            }
            let last = items[items.len() - 1];
            assert!(words.iter().any(|w| w.starts_with(last)), "{arch} {seed}: {text:?}");
            if f.finish_reason == (FinishReason::Stop { matched: None }) {
                let value: Vec<bool> = serde_json::from_str(text)
                    .unwrap_or_else(|e| panic!("{arch} {seed}: {e}: {text:?}"));
                assert!((1..=3).contains(&value.len()), "{arch} {seed}: {text:?}");
                num_whole += 1;
            }
        }
        assert!(num_whole > 0, "{arch}: no answer closed its list");
        handle.shutdown().await;
    }
}
