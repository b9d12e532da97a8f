//! Metric names (stable: they are part of the HTTP contract) and the helpers that publish the
//! engine's figures through the `metrics` facade. Whoever embeds the engine installs a recorder
//! (the server renders Prometheus text); without one these calls cost next to nothing.

use crate::{EngineStats, MemoryTags};
use routed_routing::{ExpertLoad, Phase};

/// Prompt tokens run through the model.
pub const PREFILL_TOKENS_COMPUTED: &str = "routed_prefill_tokens_computed_total";
/// Prompt tokens skipped thanks to the prefix cache.
pub const PREFILL_TOKENS_SKIPPED: &str = "routed_prefill_tokens_skipped_total";
/// Requests that skipped at least one token.
pub const PREFIX_CACHE_HITS: &str = "routed_prefix_cache_hits_total";
/// Usable KV blocks.
pub const KV_BLOCKS_TOTAL: &str = "routed_kv_blocks_total";
/// Blocks carrying a hash.
pub const KV_BLOCKS_CACHED: &str = "routed_kv_blocks_cached";
/// Cached blocks no request holds.
pub const KV_BLOCKS_EVICTABLE: &str = "routed_kv_blocks_evictable";
/// Snapshot pool capacity.
pub const SNAPSHOT_SLOTS_TOTAL: &str = "routed_mamba_snapshot_slots_total";
/// Snapshot pool occupancy.
pub const SNAPSHOT_SLOTS_USED: &str = "routed_mamba_snapshot_slots_used";
/// Heartbeat dummy forwards executed.
pub const DUMMY_FORWARDS: &str = "routed_dummy_forwards_total";
/// Admissions deferred by the budget recheck or a same-step sibling.
pub const DEFERRALS: &str = "routed_scheduler_deferrals_total";
/// Requests preempted.
pub const PREEMPTIONS: &str = "routed_preemptions_total";
/// Host bytes of stored routing rows.
pub const ROUTING_BYTES_HELD: &str = "routed_routing_bytes_held";
/// Engine step wall time.
pub const STEP_DURATION: &str = "routed_step_duration_seconds";
/// Weight updates applied.
pub const WEIGHT_UPDATES: &str = "routed_weight_updates_total";
/// Requests running.
pub const REQUESTS_RUNNING: &str = "routed_requests_running";
/// Requests waiting.
pub const REQUESTS_WAITING: &str = "routed_requests_waiting";
/// Tokens each expert received, labelled `layer` (decoder layer id), `expert` and `phase`
/// (`prefill` / `decode`).
pub const EXPERT_TOKENS: &str = "routed_expert_tokens_total";
/// Busiest expert's tokens over the mean, per `layer` and `phase` (1 is even).
pub const EXPERT_LOAD_IMBALANCE: &str = "routed_expert_load_imbalance";

/// Memory given back to a colocated trainer, labelled `tag` (`weights`, `kv_cache`): 1 while
/// released.
pub const MEMORY_RELEASED: &str = "routed_memory_released";

/// Most `routed_expert_tokens_total` series published: a model with more MoE layers x experts x
/// 2 phases publishes only the per-layer imbalance (the full counts stay in
/// `GET /v1/routing/stats`), so a large model cannot flood a Prometheus server.
pub const MAX_EXPERT_SERIES: usize = 4096;

/// Publishes a stats snapshot: counters as absolute values, gauges as they are.
pub fn publish(stats: &EngineStats) {
    publish_step(stats);
    metrics::gauge!(ROUTING_BYTES_HELD).set(stats.routing_bytes_held as f64);
}

/// Publishes every figure but `routed_routing_bytes_held`: the scheduler's own copy of the stats
/// after a step does not know it (the routing host-cache owns it and reports it when stats are
/// read), and publishing that copy would reset the gauge to a stale value after every step.
pub(crate) fn publish_step(stats: &EngineStats) {
    metrics::counter!(PREFILL_TOKENS_COMPUTED).absolute(stats.num_prefill_tokens_computed);
    metrics::counter!(PREFILL_TOKENS_SKIPPED).absolute(stats.num_prefill_tokens_skipped);
    metrics::counter!(PREFIX_CACHE_HITS).absolute(stats.num_prefix_cache_hits);
    metrics::counter!(DEFERRALS).absolute(stats.num_deferrals);
    metrics::counter!(PREEMPTIONS).absolute(stats.num_preemptions);
    metrics::counter!(DUMMY_FORWARDS).absolute(stats.num_dummy_forwards);
    metrics::counter!(WEIGHT_UPDATES).absolute(stats.num_weight_updates);
    metrics::gauge!(KV_BLOCKS_TOTAL).set(stats.num_kv_blocks_total as f64);
    metrics::gauge!(KV_BLOCKS_CACHED).set(stats.num_kv_blocks_cached as f64);
    metrics::gauge!(KV_BLOCKS_EVICTABLE).set(stats.num_kv_blocks_evictable as f64);
    metrics::gauge!(SNAPSHOT_SLOTS_TOTAL).set(stats.num_snapshot_slots_total as f64);
    metrics::gauge!(SNAPSHOT_SLOTS_USED).set(stats.num_snapshot_slots_used as f64);
    metrics::gauge!(REQUESTS_RUNNING).set(stats.num_running as f64);
    metrics::gauge!(REQUESTS_WAITING).set(stats.num_waiting as f64);
}

/// Publishes what memory is released.
pub(crate) fn publish_memory(released: MemoryTags) {
    for (tag, on) in [("weights", released.weights), ("kv_cache", released.kv_cache)] {
        metrics::gauge!(MEMORY_RELEASED, "tag" => tag).set(f64::from(u8::from(on)));
    }
}

/// Publishes the expert load since start: per-layer imbalance always, per-expert counts while
/// they stay within [`MAX_EXPERT_SERIES`]. `layer_ids[l]` is MoE layer `l`'s decoder layer id.
pub fn publish_expert_load(load: &ExpertLoad, layer_ids: &[u32]) {
    let per_expert = load.num_layers() * load.num_experts() * 2 <= MAX_EXPERT_SERIES;
    for (l, &layer) in layer_ids.iter().enumerate().take(load.num_layers()) {
        for phase in Phase::ALL {
            let imbalance = load.imbalance(l, phase).unwrap_or(0.0);
            let labels = [("layer", layer.to_string()), ("phase", phase.name().to_owned())];
            metrics::gauge!(EXPERT_LOAD_IMBALANCE, &labels).set(imbalance);
            if !per_expert {
                continue;
            }
            for (e, &count) in load.counts(l, phase).iter().enumerate() {
                let labels = [
                    ("layer", layer.to_string()),
                    ("expert", e.to_string()),
                    ("phase", phase.name().to_owned()),
                ];
                metrics::counter!(EXPERT_TOKENS, &labels).absolute(count);
            }
        }
    }
}
