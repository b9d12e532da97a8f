//! `GET /v1/routing/stats` counts exactly the routing the responses carry: per MoE layer, the
//! tokens each expert received at prompt (prefill) and generated (decode) positions equal the
//! histogram of the returned rows, every layer's counts sum to `top_k` times the tokens computed,
//! a prefix-cache hit is not counted twice, and `POST /v1/routing/stats/reset` starts them from
//! zero. One server of its own, so no other test's tokens are counted.

mod common;

use common::{Rows, TestServer, prompt_ids, routing_of, test_config};
use serde_json::{Value, json};

const MODEL: &str = "tiny_hybrid_default";
const MOE_LAYERS: [usize; 3] = [1, 3, 5];
const NUM_EXPERTS: usize = 8;
const TOP_K: u64 = 2;

/// Per MoE layer, tokens per expert over rows `[from, to)`.
fn histogram(rows: &Rows, from: usize, to: usize) -> Vec<Vec<u64>> {
    MOE_LAYERS
        .iter()
        .map(|&layer| {
            let mut counts = vec![0u64; NUM_EXPERTS];
            for r in from..to {
                for &e in &rows.row(r)[layer * 2..layer * 2 + 2] {
                    counts[e as usize] += 1;
                }
            }
            counts
        })
        .collect()
}

fn stats(s: &TestServer) -> Value {
    let r = s.get("/v1/routing/stats");
    assert_eq!(r.status, 200, "{}", r.text());
    r.json()
}

/// The stats' per-layer counts of `phase`.
fn counts(stats: &Value, phase: &str) -> Vec<Vec<u64>> {
    stats["layers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| l[phase]["expert_tokens"].as_array().unwrap().iter().map(|c| c.as_u64().unwrap()))
        .map(Iterator::collect)
        .collect()
}

/// Checks every layer of `phase` against `want` (per layer, per expert): counts, tokens and
/// imbalance.
fn assert_phase(stats: &Value, phase: &str, want: &[Vec<u64>], tokens: u64) {
    assert_eq!(counts(stats, phase), want, "{phase}: {stats}");
    for (l, layer) in stats["layers"].as_array().unwrap().iter().enumerate() {
        let p = &layer[phase];
        assert_eq!(p["tokens"], tokens, "{phase} layer {l}");
        assert_eq!(want[l].iter().sum::<u64>(), TOP_K * tokens, "{phase} layer {l}: top_k each");
        let max = *want[l].iter().max().unwrap() as f64;
        let imbalance = (tokens > 0).then(|| max * NUM_EXPERTS as f64 / (TOP_K * tokens) as f64);
        assert_eq!(p["imbalance"].as_f64(), imbalance, "{phase} layer {l}");
    }
    assert_eq!(stats["totals"][phase]["tokens"], tokens, "{phase}");
}

#[test]
fn routing_stats_count_the_returned_rows_and_reset() {
    let s = TestServer::start(test_config(MODEL));
    let fresh = stats(&s);
    assert_eq!(fresh["object"], "routing_stats");
    assert_eq!(fresh["routing_capture"], true);
    assert_eq!(fresh["moe_layer_ids"], json!(MOE_LAYERS));
    assert_eq!((fresh["num_experts"].as_u64(), fresh["top_k"].as_u64()), (Some(8), Some(TOP_K)));
    let layer_ids: Vec<&Value> =
        fresh["layers"].as_array().unwrap().iter().map(|l| &l["layer"]).collect();
    assert_eq!(layer_ids, [&json!(1), &json!(3), &json!(5)]);
    let zeros = vec![vec![0; NUM_EXPERTS]; 3];
    assert_phase(&fresh, "prefill", &zeros, 0);
    assert_phase(&fresh, "decode", &zeros, 0);
    assert_eq!(fresh["totals"]["prefill"]["max_imbalance"], Value::Null);

    // 40 prompt tokens and 6 generated: rows 0..40 were computed at prompt positions, 40..45 at
    // generated ones (the last token is never fed back).
    let request = json!({"prompt": prompt_ids(40, 61), "max_tokens": 6, "temperature": 0,
                         "ignore_eos": true});
    let first = s.ok("/v1/completions", &request);
    let rows = routing_of(&first["choices"][0]);
    assert_eq!(rows.shape, [45, 6, 2]);
    let after = stats(&s);
    assert_phase(&after, "prefill", &histogram(&rows, 0, 40), 40);
    assert_phase(&after, "decode", &histogram(&rows, 40, 45), 5);
    assert_eq!(after["totals"]["tokens"], 45);
    let worst = after["layers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| l["prefill"]["imbalance"].as_f64().unwrap());
    assert_eq!(after["totals"]["prefill"]["max_imbalance"].as_f64(), worst.reduce(f64::max));

    // Reset: zeros again, and the next request counts alone. It hits the prefix cache, and the
    // tokens it skipped were not computed, so they are not counted.
    assert_eq!(s.ok("/v1/routing/stats/reset", &json!({})), json!({"reset": true}));
    let reset = stats(&s);
    assert_phase(&reset, "prefill", &zeros, 0);
    assert_phase(&reset, "decode", &zeros, 0);
    let second = s.ok("/v1/completions", &request);
    let cached =
        second["usage"]["prompt_tokens_details"]["cached_tokens"].as_u64().unwrap() as usize;
    assert!(cached > 0, "the second request should hit the prefix cache");
    let rows = routing_of(&second["choices"][0]);
    let again = stats(&s);
    assert_phase(&again, "prefill", &histogram(&rows, cached, 40), 40 - cached as u64);
    assert_phase(&again, "decode", &histogram(&rows, 40, 45), 5);

    // The methods are fixed.
    assert_eq!(s.post("/v1/routing/stats", &json!({})).status, 405);
    assert_eq!(s.get("/v1/routing/stats/reset").status, 405);
}
