//! `/metrics` is true at every scrape: every gauge is there on a fresh server, the cache gauges
//! drop as soon as `/reset_prefix_cache` answers, and `routed_routing_bytes_held` reads the
//! routing store.
//!
//! The Prometheus recorder is global to the process, so this file runs one server and one test:
//! another engine in the same process would publish its own figures into the same gauges.

mod common;

use common::{prompt_ids, test_config, wait_until};
use serde_json::json;

const MODEL: &str = "tiny_hybrid_default";

/// The figures of one scrape, by name (unlabelled series only).
struct Scrape(String);

impl Scrape {
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
}
