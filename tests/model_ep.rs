//! Expert parallelism at the model level: each rank reads only its slice of the experts from the
//! checkpoint, and ranks running side by side produce every logit and every routing row bitwise
//! as one rank holding every expert does.

use routed::backend::collective::{Collective, InProcessGroup};
use routed::model::Model;
use routed_test_support::{Driver, Golden};
use safetensors::SafeTensors;
use std::{ops::Range, sync::Arc};

const FAMILIES: [&str; 4] = ["qwen3_moe", "mixtral", "nemotron_h", "granitemoehybrid"];

/// What one rank computed: chunked prefill logits and routing, then greedy decode.
#[derive(Debug, PartialEq)]
struct Trace {
    prefill_logits: Vec<f32>,
    prefill_routing: Vec<i16>,
    tokens: Vec<u32>,
    decode_logits: Vec<f32>,
    decode_routing: Vec<i16>,
}

fn trace(model: &Model, g: &Golden) -> Trace {
    let mut driver = Driver::new(model, 64);
    let long = g.prompt("long");
    let seq = driver.seq(long.len());
    let pre = driver.prefill(&long, &seq, 7);
    let (tokens, decode_logits, decode_routing) = driver.generate_greedy(&g.prompt("main"), 5);
    Trace {
        prefill_logits: pre.logits,
        prefill_routing: pre.routing,
        tokens,
        decode_logits,
        decode_routing,
    }
}

/// Loads every rank of a group of `n` and runs the trace on each, one thread per rank.
fn traces(g: &Golden, n: usize) -> Vec<Trace> {
    let ranks = InProcessGroup::ranks(n);
    let dir = g.model_dir();
    std::thread::scope(|s| {
        let handles: Vec<_> = ranks
            .iter()
            .map(|c| {
                let (c, dir) = (c.clone(), &dir);
                s.spawn(move || {
                    let model = Model::load_rank(dir, c, &mut |_, _| {}).expect("rank loads");
                    trace(&model, g)
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().expect("rank thread")).collect()
    })
}

#[test]
fn ranks_compute_bitwise_what_one_rank_computes() {
    for arch in FAMILIES {
        let g = Golden::open(arch);
        let whole = Model::load(&g.model_dir(), &mut |_, _| {}).expect("loads");
        let want = trace(&whole, &g);
        for n in [2, 4] {
            for (rank, got) in traces(&g, n).into_iter().enumerate() {
                assert!(got == want, "{arch}: rank {rank} of {n} differs from one rank");
            }
        }
    }
}

/// Bytes of the checkpoint's expert tensors that rank `rank` of `n` must not read: per-expert
/// tensors (`...experts.{e}...`) of other ranks' experts, and other ranks' share of fused
/// `[experts, ...]` tensors.
fn other_ranks_expert_bytes(g: &Golden, rank: usize, n: usize) -> usize {
    let bytes = std::fs::read(g.model_dir().join("model.safetensors")).unwrap();
    let st = SafeTensors::deserialize(&bytes).unwrap();
    let num_experts = 8;
    let mine: Range<usize> = rank * num_experts / n..(rank + 1) * num_experts / n;
    let mut total = 0;
    for (name, view) in st.tensors() {
        let len = view.data().len();
        let per_expert = name
            .split('.')
            .skip_while(|p| *p != "experts")
            .nth(1)
            .and_then(|e| e.parse::<usize>().ok());
        if let Some(e) = per_expert.filter(|_| !name.contains("shared")) {
            if !mine.contains(&e) {
                total += len;
            }
        } else if name.contains("block_sparse_moe.input_linear")
            || name.contains("block_sparse_moe.output_linear")
        {
            total += len / num_experts * (num_experts - mine.len());
        }
    }
    total
}

#[test]
fn each_rank_reads_its_experts_and_never_another_ranks() {
    for arch in FAMILIES {
        let g = Golden::open(arch);
        let whole = Model::load(&g.model_dir(), &mut |_, _| {}).expect("loads").load_stats();
        for n in [2, 4] {
            let ranks = InProcessGroup::ranks(n);
            for (rank, c) in ranks.into_iter().enumerate() {
                let c: Arc<dyn Collective> = c;
                let stats =
                    Model::load_rank(&g.model_dir(), c, &mut |_, _| {}).unwrap().load_stats();
                let skipped = other_ranks_expert_bytes(&g, rank, n);
                assert!(skipped > 0, "{arch}: the checkpoint has experts to skip");
                assert_eq!(
                    stats.num_bytes,
                    whole.num_bytes - skipped,
                    "{arch}: rank {rank} of {n} read exactly the replicated parts and its experts"
                );
            }
        }
    }
}
