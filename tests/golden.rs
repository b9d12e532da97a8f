//! Golden parity of every family against Hugging Face transformers, and the deterministic-mode
//! guarantee (batching and chunking change nothing, bit for bit).

use routed::model::{LogitsWanted, MatmulPrecision, Model, SeqInput};
use routed_test_support::{Driver, Golden, max_abs_diff};

const TOL: f32 = 1e-4;
/// Tokens whose router margin is below this are too close to call in f32 and are not compared.
const MARGIN: f32 = 1e-4;

fn load(g: &Golden) -> Model {
    Model::load(&g.model_dir(), &mut |_, _| {}).expect("golden checkpoint loads")
}

/// Compares our `[rows, L, K]` routing against the reference's per-layer top-k ids as sets,
/// wherever the reference's selection margin is clear. Returns the number of rows compared.
fn check_routing(g: &Golden, ours: &[i16], prefix: &str, rows: usize, what: &str) -> usize {
    let layers = g.moe_layers();
    let k = g.meta["top_k"].as_u64().unwrap() as usize;
    let mut compared = 0;
    for (li, layer) in layers.iter().enumerate() {
        let (ids, shape) = g.i64(&format!("{prefix}.layer{layer}.topk_ids"));
        let (margin, _) = g.f32(&format!("{prefix}.layer{layer}.selection_margin"));
        assert_eq!(shape, [rows, k], "{what}: reference shape");
        for t in 0..rows {
            if margin[t] <= MARGIN {
                continue;
            }
            let at = (t * layers.len() + li) * k;
            let mut a: Vec<i64> = ours[at..at + k].iter().map(|&x| x as i64).collect();
            let mut b = ids[t * k..(t + 1) * k].to_vec();
            a.sort();
            b.sort();
            assert_eq!(a, b, "{what}: experts of token {t} at layer {layer}");
            compared += 1;
        }
    }
    compared
}

fn check_family(arch: &str) {
    let g = Golden::open(arch);
    let model = load(&g);
    let vocab = model.config().vocab_size;
    let cases: Vec<String> = g.meta["cases"].as_object().unwrap().keys().cloned().collect();
    assert!(cases.len() >= 4, "{arch}: expected several cases, got {cases:?}");
    for case in &cases {
        let prompt = g.prompt(case);
        let mut d = Driver::new(&model, 256);
        let seq = d.seq(prompt.len());
        let pre = d.prefill(&prompt, &seq, prompt.len());
        let (want, shape) = g.f32(&format!("{case}.logits"));
        assert_eq!(shape, [prompt.len(), vocab]);
        let diff = max_abs_diff(&pre.logits, &want);
        assert!(diff < TOL, "{arch}/{case}: prompt logits differ by {diff}");
        let n =
            check_routing(&g, &pre.routing, case, prompt.len(), &format!("{arch}/{case} prefill"));
        assert!(n > 0, "{arch}/{case}: no routing row had a clear margin");

        let (want_ids, _) = g.i64(&format!("{case}.generate.ids"));
        let (tokens, step_logits, routing) = d.generate_greedy(&prompt, want_ids.len());
        let got: Vec<i64> = tokens.iter().map(|&t| t as i64).collect();
        assert_eq!(got, want_ids, "{arch}/{case}: greedy tokens");
        let (want_steps, _) = g.f32(&format!("{case}.generate.step_logits"));
        let diff = max_abs_diff(&step_logits, &want_steps);
        assert!(diff < TOL, "{arch}/{case}: decode-step logits differ by {diff}");
        let rows = prompt.len() + want_ids.len() - 1;
        check_routing(
            &g,
            &routing,
            &format!("{case}.generate"),
            rows,
            &format!("{arch}/{case} generate"),
        );
    }
}

#[test]
fn qwen3_moe_matches_transformers() {
    check_family("qwen3_moe");
}

#[test]
fn mixtral_matches_transformers() {
    check_family("mixtral");
}

#[test]
fn nemotron_h_matches_transformers() {
    check_family("nemotron_h");
}

#[test]
fn granite_moe_hybrid_matches_transformers() {
    check_family("granitemoehybrid");
}

#[test]
fn qwen3_moe_has_a_dense_layer() {
    let model = load(&Golden::open("qwen3_moe"));
    let moe = model.config().moe_layer_ids();
    assert!(
        moe.len() < model.config().layers.len(),
        "the golden Qwen3-MoE must include a dense layer"
    );
}

#[test]
fn both_config_key_styles_give_identical_logits() {
    for arch in ["qwen3_moe", "mixtral", "nemotron_h", "granitemoehybrid"] {
        let g = Golden::open(arch);
        let hub = load(&g);
        let v5 =
            Model::load_with_config(&g.model_dir(), &g.model_dir().join("config.v5.json")).unwrap();
        assert_eq!(hub.config(), v5.config(), "{arch}: normalised configs differ");
        let prompt = g.prompt("main");
        let (mut a, mut b) = (Driver::new(&hub, 64), Driver::new(&v5, 64));
        let (sa, sb) = (a.seq(prompt.len()), b.seq(prompt.len()));
        assert_eq!(
            a.prefill(&prompt, &sa, 24).logits,
            b.prefill(&prompt, &sb, 24).logits,
            "{arch}"
        );
    }
}

/// The golden prompt run together with other requests, with its prefill split into chunks of 5,
/// gives bitwise-identical logits and routing to its solo unchunked run.
#[test]
fn deterministic_mode_batching_and_chunking_are_bitwise_invisible() {
    batching_and_chunking_are_bitwise_invisible(MatmulPrecision::F32);
}

/// The same in bf16 matmul precision: rounding the inputs of the products is per element, so a
/// row's bits still never depend on the batch or the chunking.
#[test]
fn bf16_precision_batching_and_chunking_are_bitwise_invisible() {
    batching_and_chunking_are_bitwise_invisible(MatmulPrecision::Bf16);
}

fn batching_and_chunking_are_bitwise_invisible(precision: MatmulPrecision) {
    for arch in ["qwen3_moe", "mixtral", "nemotron_h", "granitemoehybrid"] {
        let g = Golden::open(arch);
        let mut model = load(&g);
        model.set_matmul_precision(precision);
        let prompt = g.prompt("main");
        let others = [g.prompt("long"), g.prompt("short3"), g.prompt("short1")];
        let mut solo = Driver::new(&model, 256);
        let seq = solo.seq(prompt.len());
        let reference = solo.prefill(&prompt, &seq, prompt.len());

        let mut d = Driver::new(&model, 256);
        let seq = d.seq(prompt.len());
        let other_seqs: Vec<_> = others.iter().map(|o| d.seq(o.len())).collect();
        let vocab = model.config().vocab_size;
        let (mut logits, mut routing) = (Vec::new(), Vec::new());
        for (i, chunk) in prompt.chunks(5).enumerate() {
            // Each step batches the golden chunk with a different mix of other work.
            let mut seqs = vec![SeqInput {
                token_ids: chunk,
                num_computed_tokens: i * 5,
                num_prompt_tokens: prompt.len(),
                block_table: &seq.table,
                logits: LogitsWanted::All,
                state: d.state(&seq, None, &[]),
            }];
            let o = i % others.len();
            if i < others.len() {
                seqs.insert(
                    o % 2,
                    SeqInput {
                        token_ids: &others[o],
                        num_computed_tokens: 0,
                        num_prompt_tokens: others[o].len(),
                        block_table: &other_seqs[o].table,
                        logits: LogitsWanted::Last,
                        state: d.state(&other_seqs[o], None, &[]),
                    },
                );
            }
            let at = seqs.iter().position(|s| s.block_table == seq.table.as_slice()).unwrap();
            let (l, r) = d.step(&seqs).swap_remove(at);
            assert_eq!(l.len(), chunk.len() * vocab);
            logits.extend(l);
            routing.extend(r);
        }
        assert!(logits == reference.logits, "{arch}: logits are not bitwise identical");
        assert_eq!(routing, reference.routing, "{arch}: routing differs");
    }
}

/// Mixtral with a sliding window of 20 (the golden checkpoint, config edited): the first 20
/// positions see exactly what full attention sees, later ones differ, and chunking the prompt
/// (blocks of queries whose windows start at different keys, more keys than kernel lanes)
/// changes no bit.
#[test]
fn sliding_window_attention_is_windowed_and_chunk_invariant() {
    let g = Golden::open("mixtral");
    let dir = tempfile::tempdir().unwrap();
    for entry in std::fs::read_dir(g.model_dir()).unwrap() {
        let path = entry.unwrap().path();
        std::fs::copy(&path, dir.path().join(path.file_name().unwrap())).unwrap();
    }
    let config_path = dir.path().join("config.json");
    let mut config: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&config_path).unwrap()).unwrap();
    const WINDOW: usize = 20;
    config["sliding_window"] = WINDOW.into();
    std::fs::write(&config_path, config.to_string()).unwrap();
    let windowed = Model::load(dir.path(), &mut |_, _| {}).expect("edited checkpoint loads");
    let full = load(&g);
    let prompt: Vec<u32> = g.prompt("long").into_iter().cycle().take(3 * WINDOW + 7).collect();
    let vocab = full.config().vocab_size;

    let mut d = Driver::new(&full, 256);
    let seq = d.seq(prompt.len());
    let reference = d.prefill(&prompt, &seq, prompt.len()).logits;
    let mut d = Driver::new(&windowed, 256);
    let seq = d.seq(prompt.len());
    let whole = d.prefill(&prompt, &seq, prompt.len()).logits;
    let inside = WINDOW * vocab;
    assert!(whole[..inside] == reference[..inside], "positions inside the window");
    assert!(max_abs_diff(&whole[inside..], &reference[inside..]) > 1e-3, "window ignored");
    for chunk in [1, 5, 7, 23] {
        let mut d = Driver::new(&windowed, 256);
        let seq = d.seq(prompt.len());
        let chunked = d.prefill(&prompt, &seq, chunk).logits;
        assert!(chunked == whole, "chunks of {chunk} change the windowed logits");
    }
}
