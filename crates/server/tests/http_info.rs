//! The introspection routes against the real engine: SGLang's `/server_info` (and
//! `/get_server_info`) report the settings the server runs with under SGLang's names, `/get_load`
//! the requests and KV tokens in use, idle and with a request holding blocks, and vLLM's
//! `/version` the version.

mod common;

use common::{TestServer, prompt_ids, read_bytes_until, read_rest, send_closing, test_config};
use serde_json::{Value, json};

const MODEL: &str = "qwen3_moe";

#[test]
fn server_info_and_load_report_settings_and_what_is_in_use() {
    let mut config = test_config(MODEL);
    config.max_waiting_requests = 100;
    let s = TestServer::start(config);

    let info = s.get("/server_info").json();
    let expected = json!({
        "served_model_name": MODEL, "weight_version": "default", "device": "cpu",
        "page_size": 16, "max_running_requests": 32, "max_queued_requests": 100,
        "chunked_prefill_size": 512, "disable_radix_cache": false,
        "enable_return_routed_experts": true, "tp_size": 1, "dp_size": 1, "pp_size": 1,
        "ep_size": 1, "max_total_num_tokens": 256 * 16, "version": env!("CARGO_PKG_VERSION"),
    });
    for (key, want) in expected.as_object().unwrap() {
        assert_eq!(&info[key], want, "{key}: {info}");
    }
    let models = s.get("/v1/models").json();
    let model = &models["data"][0];
    assert_eq!(info["context_length"], model["max_model_len"], "{info}");
    assert_eq!(info["num_experts_per_tok"], model["routing"]["top_k"], "{info}");
    assert_eq!(info["model_path"], info["tokenizer_path"], "no update yet: {info}");
    let idle = &info["internal_states"][0];
    assert_eq!((&idle["num_running_reqs"], &idle["num_used_tokens"]), (&json!(0), &json!(0)));
    assert_eq!(s.get("/get_server_info").json(), info, "the older name answers the same");
    // vLLM's version route: the same version, alone.
    assert_eq!(s.get("/version").json(), json!({"version": env!("CARGO_PKG_VERSION")}));

    let load = s.get("/get_load").json();
    let idle = &load.as_array().expect("one entry per rank")[0];
    assert_eq!(
        (&idle["dp_rank"], &idle["num_reqs"], &idle["num_waiting_reqs"]),
        (&json!(0), &json!(0), &json!(0))
    );
    assert_eq!((&idle["num_tokens"], &idle["num_pending_tokens"]), (&json!(4096), &json!(4096)));

    // A request paused in place holds its blocks: in flight, and its tokens are in use.
    let body = json!({"input_ids": prompt_ids(40, 7), "stream": true,
                      "sampling_params": {"max_new_tokens": 2000, "ignore_eos": true}});
    let mut stream = send_closing(s.addr, "/generate", &body);
    let seen = read_bytes_until(&mut stream, "data: ");
    s.ok("/pause_generation", &json!({"mode": "in_place"}));
    let busy = &s.get("/get_load").json()[0];
    assert_eq!(busy["num_reqs"], 1, "{busy}");
    let pending = busy["num_pending_tokens"].as_u64().unwrap();
    assert!(pending <= 4096 - 48, "at least three blocks held: {busy}");
    let state = &s.get("/server_info").json()["internal_states"][0];
    assert_eq!((&state["num_running_reqs"], &state["is_paused"]), (&json!(1), &json!(true)));
    assert_eq!(state["num_used_tokens"], 4096 - pending, "{state}");
    assert_eq!(s.post("/abort_request", &json!({"abort_all": true})).status, 200);
    s.ok("/continue_generation", &json!({}));
    let events = read_rest(&mut stream, seen).sse_json();
    let last: &Value = events.last().expect("an event");
    assert_eq!(last["meta_info"]["finish_reason"]["type"], "abort", "{last}");
}
