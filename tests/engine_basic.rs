//! The actor engine end to end on the golden models: routing rows are complete and correct.

mod common;

use common::{engine, request, run};
use routed::runtime::MissingDevice;
use routed_test_support::Golden;

/// Rows = prompt + generated - 1, ids in range and distinct per row, equal to the transformers
/// reference where its margin is clear; tokens equal transformers' greedy tokens.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn routing_rows_are_complete_and_match_transformers() {
    for arch in ["qwen3_moe", "nemotron_h"] {
        let g = Golden::open(arch);
        let handle = engine(arch, |_| {});
        let prompt = g.prompt("main");
        let out = run(&handle, request(&prompt, 16)).await;
        assert!(out.error.is_none(), "{arch}: {:?}", out.error);
        let f = &out.finals[0];
        let want: Vec<u32> = g.i64("main.generate.ids").0.iter().map(|&x| x as u32).collect();
        assert_eq!(f.token_ids, want, "{arch}: tokens");
        assert_eq!(out.tokens.len(), 16);
        let rows = f.routing.as_ref().expect("routing returned");
        let layers = g.moe_layers();
        assert_eq!(rows.shape(), [prompt.len() + 16 - 1, layers.len(), 2], "{arch}");
        for r in 0..rows.num_rows {
            for (li, layer) in layers.iter().enumerate() {
                let ids = &rows.row(r)[li * 2..li * 2 + 2];
                assert!(
                    ids.iter().all(|&e| e < 8) && ids[0] != ids[1],
                    "{arch}: row {r} layer {layer}: {ids:?}"
                );
                let (want, _) = g.i64(&format!("main.generate.layer{layer}.topk_ids"));
                let (margin, _) = g.f32(&format!("main.generate.layer{layer}.selection_margin"));
                if margin[r] > 1e-4 {
                    let mut a = [ids[0] as i64, ids[1] as i64];
                    let mut b = [want[r * 2], want[r * 2 + 1]];
                    a.sort();
                    b.sort();
                    assert_eq!(a, b, "{arch}: row {r} layer {layer}");
                }
            }
        }
        handle.shutdown().await;
    }
}

/// An engine asked for a CUDA device that cannot be opened (no `cuda` feature in this build, or
/// no driver or GPU on this machine) fails to start with the device error, saying why and naming
/// CUDA; nothing panics and no actor is left running.
#[test]
fn a_cuda_device_that_cannot_open_is_a_device_error() {
    let dir = routed_test_support::golden_root().join("qwen3_moe").join("model");
    let mut config = routed::EngineConfig::new(routed::ModelSource::Dir(dir));
    config.device = "cuda:0".parse().expect("a device spec");
    match routed::Engine::start(config) {
        Err(routed::runtime::EngineError::DeviceUnavailable { kind, message }) => {
            assert!(message.contains("CUDA"), "{message}");
            // This build without the feature, or a machine without a driver or a GPU.
            let expected = match cfg!(feature = "cuda") {
                false => vec![MissingDevice::NotCompiled],
                true => vec![MissingDevice::NoDriver, MissingDevice::TooFewDevices],
            };
            assert!(expected.contains(&kind), "{kind:?}: {message}");
        }
        Err(other) => panic!("expected a device error, got {other}"),
        // Only on a machine with a GPU and a build with the feature.
        Ok(handle) => assert!(handle.model_info().device.starts_with("cuda:0")),
    }
}
