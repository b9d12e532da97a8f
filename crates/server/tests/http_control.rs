//! SGLang's controls between rollout steps over HTTP, against the real engine: `/abort_request` by
//! `rid` and for all, `/pause_generation` in its modes and `/continue_generation`, `/flush_cache`
//! only when nothing is open, `/health_generate`, `/update_weight_version`, `/generate`'s `rid`,
//! and vLLM's `/pause`, `/resume` and `/is_paused` over the same pause. Each test has its own server: a pause would stop every other test's requests.

mod common;

use std::net::TcpStream;

use common::{
    TestServer, prompt_ids, read_bytes_until, read_rest, send_closing, test_config, wait_until,
};
use serde_json::{Value, json};

const MODEL: &str = "tiny_hybrid_default";

/// A streamed greedy `/generate` long enough to be in flight for the whole test, read until
/// its first event.
fn start_streamed(s: &TestServer, rid: Option<&str>) -> (TcpStream, Vec<u8>) {
    start_streamed_for(s, rid, 3000)
}

/// [`start_streamed`] for `max_new_tokens` tokens.
fn start_streamed_for(s: &TestServer, rid: Option<&str>, tokens: u32) -> (TcpStream, Vec<u8>) {
    let mut body = json!({"input_ids": prompt_ids(24, 5), "stream": true,
                          "return_routed_experts": true,
                          "sampling_params": {"max_new_tokens": tokens, "temperature": 0,
                                              "ignore_eos": true}});
    if let Some(rid) = rid {
        body["rid"] = json!(rid);
    }
    let mut stream = send_closing(s.addr, "/generate", &body);
    let seen = read_bytes_until(&mut stream, "data: ");
    (stream, seen)
}

/// The last event of a streamed `/generate` before `[DONE]`.
fn last_event(stream: &mut TcpStream, seen: Vec<u8>) -> Value {
    let events = read_rest(stream, seen).sse_json();
    events.last().cloned().expect("an event")
}

fn own_server() -> TestServer {
    TestServer::start(test_config(MODEL))
}

#[test]
fn abort_request_ends_a_request_by_rid_or_all_of_them_with_what_they_computed() {
    let s = own_server();
    let (mut first, seen) = start_streamed(&s, Some("rollout-1"));
    // Paused in place so that it is still in flight however fast the engine runs.
    s.ok("/pause_generation", &json!({"mode": "in_place"}));
    // A second request may not take an id in flight.
    let dup = s
        .post("/generate", &json!({"rid": "rollout-1", "input_ids": [1, 2, 3]}))
        .error(400, "invalid_request_error");
    assert_eq!(dup["param"], "rid", "{dup}");
    let bad = s.post("/generate", &json!({"rid": ["a", "b"], "input_ids": [1]}));
    assert_eq!(bad.error(400, "invalid_request_error")["param"], "rid");

    // An unknown rid, or neither field, aborts nothing: 200 all the same.
    for body in [json!({"rid": "nobody"}), json!({})] {
        let r = s.post("/abort_request", &body);
        assert_eq!((r.status, r.text().as_str()), (200, ""), "{body}");
    }
    assert_eq!(s.registry.len(), 1);
    let r = s.post("/abort_request", &json!({"rid": "rollout-1"}));
    assert_eq!((r.status, r.text().as_str()), (200, ""));
    let last = last_event(&mut first, seen);
    let meta = &last["meta_info"];
    assert_eq!(meta["id"], "rollout-1", "{meta}");
    assert_eq!(meta["finish_reason"]["type"], "abort", "{meta}");
    let n = meta["completion_tokens"].as_u64().unwrap();
    assert!((1..3000).contains(&n), "{meta}");
    let rows = meta["routed_experts_shape"][0].as_u64().unwrap();
    assert_eq!(rows, 24 + n - 1, "the rows of every position it computed: {meta}");

    s.ok("/continue_generation", &json!({}));
    let mut streams: Vec<_> = (0..2).map(|_| start_streamed(&s, None)).collect();
    s.ok("/pause_generation", &json!({"mode": "in_place"}));
    let r = s.post("/abort_request", &json!({"abort_all": true}));
    assert_eq!(r.status, 200);
    for (stream, seen) in &mut streams {
        let last = last_event(stream, std::mem::take(seen));
        assert_eq!(last["meta_info"]["finish_reason"]["type"], "abort", "{last}");
        assert!(last["meta_info"]["id"].as_str().unwrap().starts_with("gen-"), "{last}");
    }
    wait_until("the registry empties", || s.registry.is_empty());
    s.ok("/continue_generation", &json!({}));
}

#[test]
fn a_pause_holds_new_requests_until_continue_and_a_flush_waits_for_quiet() {
    let s = own_server();
    let r = s.get("/health_generate");
    assert_eq!((r.status, r.text().as_str()), (200, ""), "an idle engine generates");
    let e =
        s.post("/pause_generation", &json!({"mode": "later"})).error(400, "invalid_request_error");
    assert_eq!(e["param"], "mode", "{e}");

    // In place: the request in flight stops where it is and resumes on continue.
    let (mut kept, kept_seen) = start_streamed_for(&s, Some("kept"), 1000);
    let paused = s.ok("/pause_generation", &json!({"mode": "in_place"}));
    assert_eq!(paused["status"], "ok", "{paused}");
    assert_eq!((&paused["mode"], &paused["num_paused_requests"]), (&json!("in_place"), &json!(1)));
    let ids = prompt_ids(40, 9);
    let held_body = json!({"input_ids": ids,
                           "sampling_params": {"max_new_tokens": 4, "temperature": 0}});
    let held = std::thread::spawn({
        let s = s.clone();
        let body = held_body.clone();
        move || s.ok("/generate", &body)
    });
    wait_until("the held request is registered", || s.registry.len() == 2);
    let r = s.get("/flush_cache");
    assert_eq!(r.status, 400, "requests are open: {}", r.text());
    assert_eq!(s.get("/health_generate").status, 200, "paused on purpose is healthy");
    let version = s.ok("/update_weight_version", &json!({"new_version": "step-3"}));
    assert_eq!(
        version,
        json!({"success": true, "message": "Weight version updated to step-3",
               "new_version": "step-3"})
    );
    assert_eq!(s.get("/get_weight_version").json(), json!({"weight_version": "step-3"}));

    let resumed = s.ok("/continue_generation", &json!({}));
    assert_eq!((&resumed["status"], &resumed["num_admitted_requests"]), (&json!("ok"), &json!(1)));
    let held = held.join().unwrap();
    assert_eq!(held["meta_info"]["weight_version"], "step-3", "{held}");
    assert_eq!(held["meta_info"]["finish_reason"]["type"], "length");
    let events = read_rest(&mut kept, kept_seen).sse_json();
    let (first, last) = (&events[0]["meta_info"], &events[events.len() - 1]["meta_info"]);
    assert_eq!(last["finish_reason"]["type"], "length", "resumed to its end");
    // Renamed while open: its tokens after the rename say so, those before keep the old name.
    assert_eq!(last["weight_version"], "step-3", "{last}");
    let spans = last["weight_versions"].as_array().unwrap();
    assert_eq!(spans.len(), 2, "{last}");
    let before = spans[0]["end"].as_u64().unwrap();
    assert!(before >= 1, "the first event came before the pause: {last}");
    assert_eq!(
        (&spans[0], &spans[1]),
        (
            &json!({"version": "default", "start": 0, "end": before}),
            &json!({"version": "step-3", "start": before, "end": 1000})
        )
    );
    assert_eq!(
        (&first["weight_version"], &first["weight_versions"][0]["version"]),
        (&json!("default"), &json!("default")),
        "every streamed event names its versions so far: {first}"
    );
    assert_eq!(
        held["meta_info"]["weight_versions"],
        json!([{"version": "step-3", "start": 0, "end": 4}])
    );

    // Abort mode (the default, what slime sends): the request in flight ends at once. (Paused in
    // place first, so that it is still in flight however fast the engine runs.)
    let (mut cut, cut_seen) = start_streamed(&s, None);
    s.ok("/pause_generation", &json!({"mode": "in_place"}));
    let r = s.post("/pause_generation", &json!({}));
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["num_paused_requests"], 1);
    let last = last_event(&mut cut, cut_seen);
    assert_eq!(last["meta_info"]["finish_reason"]["type"], "abort", "{last}");
    assert_eq!(s.ok("/continue_generation", &json!({}))["num_admitted_requests"], 0);

    // Quiet now: the flush drops the cache, so the prompt computes again.
    wait_until("the registry empties", || s.registry.is_empty());
    let warm = s.ok("/generate", &held_body);
    assert!(warm["meta_info"]["cached_tokens"].as_u64().unwrap() > 0, "{warm}");
    let r = s.post("/flush_cache", &json!({}));
    assert_eq!((r.status, r.text().as_str()), (200, "Cache flushed.\n"));
    assert_eq!(s.get("/flush_cache").status, 200, "GET works too");
    let cold = s.ok("/generate", &held_body);
    assert_eq!(cold["meta_info"]["cached_tokens"], 0, "{cold}");
    assert_eq!(cold["output_ids"], warm["output_ids"]);

    let e = s.post("/update_weight_version", &json!({})).error(400, "invalid_request_error");
    assert_eq!(e["param"], "new_version", "{e}");
    assert_eq!(s.get("/abort_request").status, 405);
}

#[test]
fn vllms_pause_routes_share_the_engines_pause() {
    let s = own_server();
    let is_paused = |s: &TestServer| s.get("/is_paused").json()["is_paused"].as_bool().unwrap();
    assert!(!is_paused(&s));
    let (mut kept, seen) = start_streamed_for(&s, None, 200);
    assert_eq!(s.ok("/pause?mode=keep", &json!({})), json!({"status": "paused"}));
    assert!(is_paused(&s));
    let e = s.post("/pause?mode=in_place", &json!({})).error(400, "invalid_request_error");
    assert_eq!(e["param"], "mode", "{e}");
    // `wait` lets the frozen request finish, then (clear_cache defaults to true) drops the cache.
    assert_eq!(s.ok("/pause?mode=wait", &json!({})), json!({"status": "paused"}));
    let last = last_event(&mut kept, seen);
    assert_eq!(last["meta_info"]["finish_reason"]["type"], "length", "{last}");
    assert_eq!(s.ok("/resume", &json!({})), json!({"status": "resumed"}));
    assert!(!is_paused(&s));
    let body = json!({"input_ids": prompt_ids(24, 5),
                      "sampling_params": {"max_new_tokens": 2, "temperature": 0}});
    let cold = s.ok("/generate", &body);
    assert_eq!(cold["meta_info"]["cached_tokens"], 0, "the wait pause cleared the cache: {cold}");

    // Without clear_cache the cache stays; SGLang's continue ends vLLM's pause too.
    s.ok("/pause?mode=abort&clear_cache=false", &json!({}));
    assert!(s.get("/is_paused").json()["is_paused"].as_bool().unwrap());
    s.ok("/continue_generation", &json!({}));
    let warm = s.ok("/generate", &body);
    assert!(warm["meta_info"]["cached_tokens"].as_u64().unwrap() > 0, "{warm}");
    let e = s.post("/pause?clear_cache=maybe", &json!({})).error(400, "invalid_request_error");
    assert_eq!(e["param"], "clear_cache", "{e}");
}

#[test]
fn abort_request_by_rid_ends_one_prompt_of_a_batch() {
    let s = own_server();
    // Held by the pause until continue, so both are in flight when the abort comes.
    s.ok("/pause_generation", &json!({"mode": "in_place"}));
    let body = json!({"input_ids": [prompt_ids(12, 41), prompt_ids(9, 42)], "rid": ["keep", "drop"],
                      "return_routed_experts": true,
                      "sampling_params": {"max_new_tokens": 8, "temperature": 0,
                                          "ignore_eos": true}});
    let batch = std::thread::spawn({
        let s = s.clone();
        move || s.ok("/generate", &body)
    });
    wait_until("both prompts to be submitted", || s.registry.len() == 2);
    let r = s.post("/abort_request", &json!({"rid": "drop"}));
    assert_eq!(r.status, 200);
    wait_until("the aborted prompt to leave", || s.registry.len() == 1);
    s.ok("/continue_generation", &json!({}));
    let answer = batch.join().unwrap();
    let [keep, drop] = answer.as_array().expect("a list").as_slice() else { panic!("{answer}") };
    assert_eq!(keep["meta_info"]["id"], "keep");
    assert_eq!(keep["meta_info"]["finish_reason"]["type"], "length", "{keep}");
    assert_eq!(keep["meta_info"]["routed_experts_shape"][0], 12 + 8 - 1, "{keep}");
    assert_eq!(drop["meta_info"]["id"], "drop");
    assert_eq!(drop["meta_info"]["finish_reason"]["type"], "abort", "{drop}");
    assert_eq!(drop["meta_info"]["completion_tokens"], 0, "aborted before it ran: {drop}");
}

#[test]
fn abort_request_by_a_continuations_id_ends_it_alone() {
    let s = own_server();
    // Held by the pause until continue, so the pair is in flight when the aborts come.
    s.ok("/pause_generation", &json!({"mode": "in_place"}));
    let body = json!({"input_ids": prompt_ids(12, 43), "rid": "pair", "return_routed_experts": true,
                      "sampling_params": {"n": 2, "max_new_tokens": 8, "temperature": 0,
                                          "ignore_eos": true}});
    let pair = std::thread::spawn({
        let s = s.clone();
        move || s.ok("/generate", &body)
    });
    wait_until("the pair to be submitted", || s.registry.len() == 1);
    // Ids `/generate` never gives this pair abort nothing.
    for rid in ["pair-2", "pair-01", "pair-+1", "pai-1"] {
        assert_eq!(s.post("/abort_request", &json!({"rid": rid})).status, 200, "{rid}");
    }
    assert_eq!(s.post("/abort_request", &json!({"rid": "pair-1"})).status, 200);
    s.ok("/continue_generation", &json!({}));
    let answer = pair.join().unwrap();
    let [kept, aborted] = answer.as_array().expect("a list").as_slice() else { panic!("{answer}") };
    assert_eq!(kept["meta_info"]["id"], "pair-0");
    assert_eq!(kept["meta_info"]["finish_reason"]["type"], "length", "{kept}");
    assert_eq!(kept["meta_info"]["routed_experts_shape"][0], 12 + 8 - 1, "{kept}");
    assert_eq!(aborted["meta_info"]["id"], "pair-1");
    assert_eq!(aborted["meta_info"]["finish_reason"]["type"], "abort", "{aborted}");
    assert_eq!(aborted["meta_info"]["completion_tokens"], 0, "aborted before it ran: {aborted}");
}
