//! Weight updates over HTTP in SGLang's shapes (`/update_weights_from_disk`,
//! `/get_weight_version`, `/get_model_info`), against the real engine: refusals keep the old
//! weights, an accepted update serves the new ones with the prefix cache dropped, and `/generate`
//! and every route reports the version that computed each output.

mod common;

use common::{checkpoint, prompt_ids, server};
use serde_json::{Value, json};

const MODEL: &str = "tiny_hybrid_default";

fn generate(s: &common::TestServer, ids: &[u32]) -> Value {
    s.ok(
        "/generate",
        &json!({"input_ids": ids, "return_routed_experts": true,
                "sampling_params": {"max_new_tokens": 4, "temperature": 0, "ignore_eos": true}}),
    )
}

#[test]
fn an_update_from_disk_serves_the_new_weights_under_their_version() {
    let s = server(MODEL);
    assert_eq!(s.get("/get_weight_version").json(), json!({"weight_version": "default"}));
    let ids = prompt_ids(40, 3);
    let before = generate(&s, &ids);
    assert_eq!(before["meta_info"]["weight_version"], "default");

    // A body that is no update: the gateway's 400 naming the field.
    let e = s
        .post("/update_weights_from_disk", &json!({"load_format": "auto"}))
        .error(400, "invalid_request_error");
    assert_eq!(e["param"], "model_path", "{e}");
    let e = s
        .post("/update_weights_from_disk", &json!({"model_path": "x", "flush_cache": false}))
        .error(400, "invalid_request_error");
    assert_eq!(e["param"], "flush_cache", "{e}");
    // Another model's checkpoint: SGLang's refusal, and the old weights keep serving.
    let other = checkpoint("qwen3_moe");
    let refused = s.post("/update_weights_from_disk", &json!({"model_path": other}));
    assert_eq!(refused.status, 400);
    let refused = refused.json();
    assert_eq!(refused["success"], false, "{refused}");
    assert!(refused["message"].as_str().unwrap().contains("differs"), "{refused}");
    let kept = generate(&s, &ids);
    assert!(kept["meta_info"]["cached_tokens"].as_u64().unwrap() > 0, "{kept}");
    assert_eq!(kept["output_ids"], before["output_ids"]);

    let new = tempfile::tempdir().unwrap();
    routed_test_support::write_other_policy(&checkpoint(MODEL), new.path());
    let done = s.post(
        "/update_weights_from_disk",
        &json!({"model_path": new.path(), "load_format": null, "weight_version": "step-7",
                "abort_all_requests": false, "flush_cache": true}),
    );
    assert_eq!(done.status, 200, "{}", done.text());
    assert_eq!(
        done.json(),
        json!({"success": true, "num_paused_requests": 0,
               "message": "Succeeded to update model weights. Weight version updated to step-7."})
    );
    let after = generate(&s, &ids);
    let meta = &after["meta_info"];
    assert_eq!(meta["weight_version"], "step-7");
    assert_eq!(meta["cached_tokens"], 0, "the old weights' cache is gone: {meta}");
    assert_ne!(meta["routed_experts"], before["meta_info"]["routed_experts"], "new weights route");
    assert_eq!(s.get("/get_weight_version").json(), json!({"weight_version": "step-7"}));
    // The OpenAI routes carry the version in SGLang's response-level `metadata`.
    for (route, body) in [
        ("/v1/completions", json!({"prompt": ids, "max_tokens": 3})),
        (
            "/v1/chat/completions",
            json!({"messages": [{"role": "user", "content": "hi"}],
                                         "max_tokens": 3, "ignore_eos": true}),
        ),
    ] {
        let r = s.ok(route, &body);
        let spans = json!([{"version": "step-7", "start": 0, "end": 3}]);
        assert_eq!(r["metadata"], json!({"weight_version": "step-7", "weight_versions": spans}));
    }
    let info = s.get("/get_model_info").json();
    assert_eq!(info["model_path"], json!(new.path()), "{info}");
    assert_eq!(info["tokenizer_path"], json!(checkpoint(MODEL)), "{info}");
    assert_eq!((&info["weight_version"], &info["is_generation"]), (&json!("step-7"), &json!(true)));
    let metrics = s.get("/metrics").text();
    assert!(metrics.lines().any(|l| l == "routed_weight_updates_total 1"), "{metrics}");
}
