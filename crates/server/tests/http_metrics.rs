//! `/metrics` is true at every scrape: every gauge is there on a fresh server, the cache gauges
//! drop as soon as `/reset_prefix_cache` answers, `routed_routing_bytes_held` reads the routing
//! store, and `routed_memory_released` follows a release and a resume.
//!
//! The Prometheus recorder is global to the process, so this file runs one server and one test:
//! another engine in the same process would publish its own figures into the same gauges.

mod common;

use std::collections::BTreeMap;

use common::{prompt_ids, test_config, wait_until};
use serde_json::json;

const MODEL: &str = "tiny_hybrid_default";

/// The figures of one scrape, by name (unlabelled series only).
struct Scrape(String);

impl Scrape {
    /// Every series of `name` with its labels, in label order.
    fn series(&self, name: &str) -> Vec<(BTreeMap<String, String>, f64)> {
        let prefix = format!("{name}{{");
        let mut series: Vec<(BTreeMap<String, String>, f64)> = self
            .0
            .lines()
            .filter_map(|l| l.strip_prefix(&prefix))
            .map(|rest| {
                let (labels, value) = rest.split_once("} ").expect("labels, then the value");
                let labels = labels
                    .split(',')
                    .filter_map(|kv| kv.split_once('='))
                    .map(|(k, v)| (k.to_owned(), v.trim_matches('"').to_owned()))
                    .collect();
                (labels, value.trim().parse().expect("a number"))
            })
            .collect();
        series.sort_by(|a, b| a.0.cmp(&b.0));
        series
    }

    fn get(&self, name: &str) -> f64 {
        let line = self.0.lines().find(|l| l.split_whitespace().next() == Some(name));
        let value = line.and_then(|l| l.split_whitespace().nth(1)).and_then(|v| v.parse().ok());
        value.unwrap_or_else(|| panic!("{name} missing from /metrics:\n{}", self.0))
    }
}

fn scrape(s: &common::TestServer) -> Scrape {
    let r = s.get("/metrics");
    assert_eq!(r.status, 200, "{}", r.text());
    Scrape(r.text())
}

#[test]
fn every_gauge_is_true_at_every_scrape() {
    let config = test_config(MODEL);
    let s = common::TestServer::start(config);

    // A fresh server, before any engine step: every gauge of the contract at its fresh value.
    let fresh = scrape(&s);
    for (name, value) in [
        ("routed_kv_blocks_total", 256.0),
        ("routed_kv_blocks_cached", 0.0),
        ("routed_kv_blocks_evictable", 0.0),
        ("routed_mamba_snapshot_slots_total", 64.0),
        ("routed_mamba_snapshot_slots_used", 0.0),
        ("routed_routing_bytes_held", 0.0),
        ("routed_requests_running", 0.0),
        ("routed_requests_waiting", 0.0),
        ("routed_prefill_tokens_computed_total", 0.0),
        ("routed_prefill_tokens_skipped_total", 0.0),
        ("routed_prefix_cache_hits_total", 0.0),
        ("routed_preemptions_total", 0.0),
    ] {
        assert_eq!(fresh.get(name), value, "{name} on a fresh server");
    }

    // A finished request with routing leaves its full blocks cached, with their rows.
    s.ok("/v1/completions", &json!({"prompt": prompt_ids(40, 3), "max_tokens": 2}));
    wait_until("the request to be released", || scrape(&s).get("routed_requests_running") == 0.0);
    let used = scrape(&s);
    assert!(used.get("routed_kv_blocks_cached") >= 2.0, "{}", used.0);
    assert_eq!(used.get("routed_kv_blocks_evictable"), used.get("routed_kv_blocks_cached"));
    assert!(used.get("routed_routing_bytes_held") > 0.0, "{}", used.0);
    assert!(used.get("routed_mamba_snapshot_slots_used") > 0.0, "{}", used.0);
    assert_eq!(used.get("routed_prefill_tokens_computed_total"), 40.0);

    // The expert load since start: per MoE layer (labelled by decoder layer id), expert and
    // phase, 3 layers x 8 experts x 2 phases series; each layer's counts sum to top_k (2) per
    // token computed: 40 at prompt positions, 1 generated token fed back.
    let tokens = used.series("routed_expert_tokens_total");
    assert_eq!(tokens.len(), 3 * 8 * 2, "{}", used.0);
    for layer in ["1", "3", "5"] {
        for (phase, computed) in [("prefill", 40.0), ("decode", 1.0)] {
            let of = |l: &BTreeMap<String, String>| l["layer"] == layer && l["phase"] == phase;
            let sum: f64 = tokens.iter().filter(|(l, _)| of(l)).map(|(_, v)| v).sum();
            assert_eq!(sum, 2.0 * computed, "layer {layer} {phase}");
            let imbalance = used.series("routed_expert_load_imbalance");
            let value = imbalance.iter().find(|(l, _)| of(l)).map(|(_, v)| *v);
            assert!(value.is_some_and(|v| (1.0..=4.0).contains(&v)), "layer {layer} {phase}");
        }
    }
    // /v1/routing/stats/reset restarts the route's counts, not the Prometheus counters.
    assert_eq!(s.ok("/v1/routing/stats/reset", &json!({})), json!({"reset": true}));
    assert_eq!(scrape(&s).series("routed_expert_tokens_total"), tokens);

    // Right after the reset answers, with no engine step in between.
    assert_eq!(s.ok("/reset_prefix_cache", &json!({})), json!({"reset": true}));
    let reset = scrape(&s);
    for name in [
        "routed_kv_blocks_cached",
        "routed_kv_blocks_evictable",
        "routed_mamba_snapshot_slots_used",
        "routed_routing_bytes_held",
    ] {
        assert_eq!(reset.get(name), fresh.get(name), "{name} after /reset_prefix_cache");
    }
    assert_eq!(reset.get("routed_kv_blocks_total"), 256.0);

    // Memory given back, per tag, and taken again.
    let released = |scrape: &Scrape| {
        let series = scrape.series("routed_memory_released");
        series.into_iter().map(|(l, v)| (l["tag"].clone(), v)).collect::<Vec<_>>()
    };
    let none = vec![("kv_cache".to_owned(), 0.0), ("weights".to_owned(), 0.0)];
    assert_eq!(released(&fresh), none, "published from the start");
    s.ok("/release_memory_occupation", &json!({"tags": ["kv_cache"]}));
    let kv = vec![("kv_cache".to_owned(), 1.0), ("weights".to_owned(), 0.0)];
    assert_eq!(released(&scrape(&s)), kv);
    s.ok("/resume_memory_occupation", &json!({}));
    assert_eq!(released(&scrape(&s)), none);
}
