//! Memory given back to a colocated trainer over HTTP, against the real engine: SGLang's
//! `/release_memory_occupation` and `/resume_memory_occupation` with their tags, vLLM's `/sleep`,
//! `/wake_up` and `/is_sleeping`; a request sent meanwhile waits and then computes what it
//! computed before, a weight update waits for the weights, and a release is refused while a
//! request runs. Each test has its own server: a release stops every other test's requests.

mod common;

use common::{TestServer, prompt_ids, read_bytes_until, send_closing, test_config, wait_until};
use serde_json::{Value, json};

const MODEL: &str = "tiny_hybrid_default";

fn own_server() -> TestServer {
    TestServer::start(test_config(MODEL))
}

/// A greedy `/generate` with routing, for comparing two runs.
fn body() -> Value {
    json!({"input_ids": prompt_ids(40, 7), "return_logprob": true, "return_routed_experts": true,
           "sampling_params": {"max_new_tokens": 6, "temperature": 0, "ignore_eos": true}})
}

/// What a run computed (without its id and cache hits).
fn computed(out: &Value) -> Value {
    let meta = &out["meta_info"];
    json!([out["output_ids"], meta["output_token_logprobs"], meta["routed_experts"]])
}

fn is_sleeping(s: &TestServer) -> bool {
    let r = s.get("/is_sleeping");
    assert_eq!(r.status, 200);
    r.json()["is_sleeping"].as_bool().expect("a boolean")
}

#[test]
fn sglangs_release_and_resume_give_the_memory_back_and_take_it_again() {
    let s = own_server();
    assert!(!is_sleeping(&s));
    let before = s.ok("/generate", &body());

    let released = s.ok("/release_memory_occupation", &json!({}));
    assert_eq!(released["success"], true, "{released}");
    assert_eq!(released["released"], json!(["weights", "kv_cache"]), "{released}");
    assert!(released["num_bytes"].as_u64() > Some(0), "{released}");
    assert!(is_sleeping(&s));
    // The engine is well, only resting.
    assert_eq!(s.get("/health").status, 200);
    let r = s.get("/health_generate");
    assert_eq!((r.status, r.text().as_str()), (200, ""));
    // Updates wait for the weights, in SGLang's update shape.
    let dir = common::checkpoint(MODEL);
    let update = s.post("/update_weights_from_disk", &json!({"model_path": dir}));
    assert_eq!(update.status, 400);
    let update = update.json();
    assert_eq!(update["success"], false);
    assert!(update["message"].as_str().unwrap().contains("resume"), "{update}");

    // A request sent now waits for the memory.
    let waiting = std::thread::spawn({
        let s = s.clone();
        move || s.ok("/generate", &body())
    });
    wait_until("the request to be submitted", || s.registry.len() == 1);
    let weights = s.ok("/resume_memory_occupation", &json!({"tags": ["weights"]}));
    assert_eq!(weights["released"], json!(["kv_cache"]), "{weights}");
    std::thread::sleep(std::time::Duration::from_millis(100));
    assert!(!waiting.is_finished(), "still no KV cache");
    let all = s.ok("/resume_memory_occupation", &json!({"tags": null}));
    assert_eq!(all["released"], json!([]), "{all}");
    let after = waiting.join().unwrap();
    assert_eq!(computed(&after), computed(&before), "the same bits after the memory came back");
    assert_eq!(after["meta_info"]["cached_tokens"], 0, "the prefix cache went with the memory");
    assert!(!is_sleeping(&s));

    // GET works too (SGLang routes both); an unknown tag names the field.
    let r = s.get("/release_memory_occupation");
    assert_eq!(r.status, 200, "{}", r.text());
    s.ok("/resume_memory_occupation", &json!({}));
    let e = s.post("/release_memory_occupation", &json!({"tags": ["weights", "optimizer"]}));
    assert_eq!(e.error(400, "invalid_request_error")["param"], "tags");
    assert!(!is_sleeping(&s), "a refused release releases nothing");
}

#[test]
fn vllms_sleep_and_wake_up_drive_the_same_release() {
    let s = own_server();
    let before = s.ok("/generate", &body());
    let e = s.post("/sleep?level=3", &json!({}));
    assert_eq!(e.error(400, "invalid_request_error")["param"], "level");
    let r = s.post("/sleep?level=1", &json!({}));
    assert_eq!((r.status, r.text().as_str()), (200, ""));
    assert!(is_sleeping(&s));
    let r = s.post("/wake_up?tags=weights", &json!({}));
    assert_eq!((r.status, r.text().as_str()), (200, ""));
    assert!(is_sleeping(&s), "the KV cache is still away");
    let r = s.post("/wake_up", &json!({}));
    assert_eq!((r.status, r.text().as_str()), (200, ""));
    assert!(!is_sleeping(&s));
    assert_eq!(computed(&s.ok("/generate", &body())), computed(&before));
}

#[test]
fn a_release_is_refused_while_a_request_runs() {
    let s = own_server();
    let long = json!({"input_ids": prompt_ids(24, 5), "stream": true,
                      "sampling_params": {"max_new_tokens": 3000, "temperature": 0,
                                          "ignore_eos": true}});
    let mut stream = send_closing(s.addr, "/generate", &long);
    read_bytes_until(&mut stream, "data: ");
    let e = s.post("/release_memory_occupation", &json!({}));
    let error = e.error(400, "invalid_request_error");
    assert_eq!(error["code"], "conflict", "{error}");
    assert!(error["message"].as_str().unwrap().contains("running"), "{error}");
    assert!(!is_sleeping(&s));
    // A trainer aborts everything and releases at once: the release waits for the aborts of
    // the step in flight rather than counting those requests as running.
    assert_eq!(s.post("/abort_request", &json!({"abort_all": true})).status, 200);
    let r = s.post("/release_memory_occupation", &json!({"tags": ["kv_cache"]}));
    assert_eq!(r.status, 200, "{}", r.text());
    read_bytes_until(&mut stream, "\"abort\"");
    drop(stream);
    wait_until("the request to end", || s.registry.is_empty());
    assert!(is_sleeping(&s));
}
