//! Hybrid (Mamba2 + attention + MoE) models: chunking, snapshots and dummy forwards leave the
//! math bitwise unchanged.

use routed::model::{LogitsWanted, Model, SeqInput};
use routed::types::{BlockGeneration, BlockId, BlockRef, SnapshotSlotId};
use routed_test_support::{Driver, Golden};

const HYBRIDS: [&str; 2] = ["nemotron_h", "granitemoehybrid"];

fn load(arch: &str) -> (Golden, Model) {
    let g = Golden::open(arch);
    let model = Model::load(&g.model_dir(), &mut |_, _| {}).unwrap();
    (g, model)
}

/// Prefill split into chunks of 1, 3, 5 and 8 tokens gives bitwise-identical logits, routing and
/// final recurrent state to the unchunked run.
#[test]
fn chunked_prefill_is_bitwise_identical_to_unchunked() {
    for arch in HYBRIDS {
        let (g, model) = load(arch);
        let prompt = g.prompt("long");
        let mut d = Driver::new(&model, 512);
        let cold = d.seq(prompt.len());
        let reference = d.prefill(&prompt, &cold, prompt.len());
        let cold_state = d.states.live_slot(cold.live).to_vec();
        for chunk in [1, 3, 5, 8] {
            let seq = d.seq(prompt.len());
            let got = d.prefill(&prompt, &seq, chunk);
            assert!(got.logits == reference.logits, "{arch}: logits differ with chunks of {chunk}");
            assert_eq!(
                got.routing, reference.routing,
                "{arch}: routing differs with chunks of {chunk}"
            );
            assert!(
                d.states.live_slot(seq.live) == cold_state.as_slice(),
                "{arch}: state differs with chunks of {chunk}"
            );
        }
    }
}

/// A snapshot taken at position 16 during one request, restored into a new request that reuses
/// the first 16 positions' KV blocks and continues from token 16, gives bitwise-identical logits
/// and routing for the remaining tokens to the cold run of the whole prompt.
#[test]
fn snapshot_restore_continues_bitwise_identically() {
    for arch in HYBRIDS {
        let (g, model) = load(arch);
        let prompt = g.prompt("long");
        let vocab = model.config().vocab_size;
        let l_k = model.routing_meta().unwrap().row_len();
        let mut d = Driver::new(&model, 512);
        let cold = d.seq(prompt.len());
        let reference = d.prefill(&prompt, &cold, prompt.len());

        // The writer takes snapshots at several positions inside its chunks.
        let writer = d.seq(prompt.len());
        let (slot, other_slot) = (SnapshotSlotId(3), SnapshotSlotId(4));
        d.prefill_from(&prompt, &writer, 0, None, 12, &[(16, slot), (24, other_slot)]);

        // The reader shares the writer's first four blocks (16 tokens of 4) and restores.
        let fresh = d.seq(prompt.len());
        let mut reader = fresh.clone();
        reader.table[..4].copy_from_slice(&writer.table[..4]);
        let got = d.prefill_from(&prompt, &reader, 16, Some(slot), 7, &[]);
        assert!(
            got.logits == reference.logits[16 * vocab..],
            "{arch}: logits after restore differ"
        );
        assert_eq!(
            got.routing,
            reference.routing[16 * l_k..],
            "{arch}: routing after restore differs"
        );
        assert!(
            d.states.live_slot(reader.live) == d.states.live_slot(cold.live),
            "{arch}: final state differs"
        );
    }
}

fn checksum(values: &[f32]) -> u64 {
    values.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, v| {
        (h ^ v.to_bits() as u64).wrapping_mul(0x100_0000_01b3)
    })
}

/// A dummy forward on the scratch state slot and a scratch block leaves every live state and
/// snapshot slot unchanged.
#[test]
fn dummy_forward_leaves_live_states_and_snapshots_unchanged() {
    for arch in HYBRIDS {
        let (g, model) = load(arch);
        let prompt = g.prompt("main");
        let mut d = Driver::new(&model, 64);
        let seq = d.seq(prompt.len());
        d.prefill_from(
            &prompt,
            &seq,
            0,
            None,
            prompt.len(),
            &[(8, SnapshotSlotId(0)), (16, SnapshotSlotId(1))],
        );
        let before: Vec<u64> = (0..16)
            .map(|i| checksum(d.states.live_slot(routed::model::LiveStateId(i))))
            .chain((0..16).map(|i| checksum(d.states.snapshot_slot(SnapshotSlotId(i)))))
            .collect();
        assert_ne!(before[0], before[1], "{arch}: the request's state should be non-zero");

        let scratch_block = [BlockRef::new(BlockId(63), BlockGeneration(0))];
        let dummy = SeqInput {
            token_ids: &[0],
            num_computed_tokens: 0,
            num_prompt_tokens: 1,
            block_table: &scratch_block,
            logits: LogitsWanted::None,
            state: Some(routed::model::StateIo {
                live: d.states.scratch(),
                restore_from: None,
                snapshots: &[],
            }),
        };
        for _ in 0..3 {
            d.step(&[dummy]);
        }
        let after: Vec<u64> = (0..16)
            .map(|i| checksum(d.states.live_slot(routed::model::LiveStateId(i))))
            .chain((0..16).map(|i| checksum(d.states.snapshot_slot(SnapshotSlotId(i)))))
            .collect();
        assert_eq!(before, after, "{arch}: a dummy forward changed a live state or snapshot slot");
    }
}

#[test]
fn invalid_state_bindings_are_errors() {
    let (g, model) = load("nemotron_h");
    let prompt = g.prompt("short3");
    let mut d = Driver::new(&model, 64);
    let seq = d.seq(prompt.len());
    let mut kv = model.new_kv_cache(8, 4);
    let mut states = model.new_state_cache(2, 2);
    let mut routing = model.new_routing_buffer(16);
    let mut input = SeqInput {
        token_ids: &prompt,
        num_computed_tokens: 0,
        num_prompt_tokens: prompt.len(),
        block_table: &seq.table,
        logits: LogitsWanted::Last,
        state: None,
    };
    let err = model.forward(&[input], &mut kv, &mut states, &mut routing).unwrap_err();
    assert!(err.to_string().contains("no state slot"), "{err}");
    let bad = [(2, SnapshotSlotId(9))];
    input.state = Some(routed::model::StateIo {
        live: routed::model::LiveStateId(0),
        restore_from: None,
        snapshots: &bad,
    });
    let err = model.forward(&[input], &mut kv, &mut states, &mut routing).unwrap_err();
    assert!(err.to_string().contains("snapshot"), "{err}");
}
