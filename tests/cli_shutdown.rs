//! `routed serve` drains on SIGTERM: new requests get 503 `shutting_down` from a listener that
//! keeps answering, in-flight requests that finish within `--shutdown-grace-s` complete (paused
//! ones resume), the ones that cannot are ended with a 503 body or an error event and `[DONE]`
//! (at once when they wait for memory given back to a trainer), and the process exits 0.

mod common;

use common::http::{Response, Server, parse_response, wait_until};
use serde_json::{Value, json};
use std::io::Read;
use std::net::TcpStream;

/// Reads until what was read contains `needle`; returns the bytes read so far.
fn read_until(stream: &mut TcpStream, needle: &str) -> Vec<u8> {
    let mut seen = Vec::new();
    let mut buf = [0u8; 4096];
    while !String::from_utf8_lossy(&seen).contains(needle) {
        let n = stream.read(&mut buf).expect("read (watchdog)");
        assert!(n > 0, "closed before {needle:?}: {}", String::from_utf8_lossy(&seen));
        seen.extend_from_slice(&buf[..n]);
    }
    seen
}

/// Reads the rest of an answer whose start was `seen`, up to the server's close.
fn read_rest(stream: &mut TcpStream, mut seen: Vec<u8>) -> Response {
    stream.read_to_end(&mut seen).expect("read to the end (watchdog)");
    parse_response(&seen)
}

/// A completion of `tokens` tokens that no EOS ends early.
fn request(tokens: u32, stream: bool) -> Value {
    json!({
        "prompt": "x",
        "max_tokens": tokens,
        "ignore_eos": true,
        "stream": stream,
    })
}

#[test]
fn sigterm_drains_in_flight_requests_then_exits_zero() {
    // Room for requests that would run for minutes (100k tokens each), and a grace period that
    // the short ones (1000 tokens, about a second) fit in many times over.
    let mut serve = Server::start(&[
        "--heartbeat-ms",
        "0",
        "--num-kv-blocks",
        "8192",
        "--max-model-len",
        "131072",
        "--shutdown-grace-s",
        "8",
    ]);
    let completion =
        |tokens, stream| serve.send("POST", "/v1/completions", Some(&request(tokens, stream)));
    let mut long_stream = completion(100_000, true);
    let long_stream_seen = read_until(&mut long_stream, "data: ");
    let mut long_plain = completion(100_000, false);
    let mut short_stream = completion(1000, true);
    let short_stream_seen = read_until(&mut short_stream, "data: ");
    let mut short_plain = completion(1000, false);
    wait_until("four requests running", || serve.metric("routed_requests_running") == 4.0);
    // Paused, as a trainer leaves it between rollout steps: the drain resumes what is in flight.
    let paused = serve.post("/pause_generation", &json!({"mode": "in_place"}));
    assert_eq!(paused.status, 200, "{paused:?}");

    serve.sigterm();

    // The listener keeps answering, with 503s.
    wait_until("/health to say the server is shutting down", || serve.get("/health").status == 503);
    let refused = serve.post("/v1/completions", &request(4, false));
    let body = refused.json();
    assert_eq!(refused.status, 503, "{refused:?}");
    assert_eq!(body["error"]["type"], "overloaded_error", "{body}");
    assert_eq!(body["error"]["code"], "shutting_down", "{body}");

    // The short requests finish within the grace period, whole.
    let short = read_rest(&mut short_plain, Vec::new());
    let body = short.json();
    assert_eq!(short.status, 200, "{body}");
    assert_eq!(body["usage"]["completion_tokens"], 1000, "{body}");
    assert_eq!(body["choices"][0]["finish_reason"], "length", "{body}");
    let short = read_rest(&mut short_stream, short_stream_seen).body;
    assert!(
        short.contains(r#""finish_reason":"length""#) && !short.contains("\"error\""),
        "{short}"
    );
    assert!(short.contains("data: [DONE]"), "{short}");

    // The long ones are ended when the grace period is over: a 503 body, or an error event and
    // [DONE] on the stream that already sent tokens.
    let long = read_rest(&mut long_plain, Vec::new());
    let body = long.json();
    assert_eq!(long.status, 503, "{body}");
    assert_eq!(body["error"]["code"], "shutting_down", "{body}");
    let long = read_rest(&mut long_stream, long_stream_seen).body;
    let error = long.find(r#"data: {"error""#).unwrap_or_else(|| panic!("no error event: {long}"));
    let done = long.rfind("data: [DONE]").unwrap_or_else(|| panic!("no [DONE]: {long}"));
    assert!(error < done && long[error..].contains("shutting_down"), "{long}");

    let status = serve.wait_exit();
    assert!(status.success(), "exit status {status}: {:#?}", serve.log());
}

#[test]
fn sigterm_with_memory_released_ends_what_waits_for_it_at_once() {
    // A grace period far longer than the test may take: only the release can cut it short.
    let mut serve = Server::start(&["--heartbeat-ms", "0", "--shutdown-grace-s", "600"]);
    let released = serve.post("/release_memory_occupation", &json!({}));
    assert_eq!(released.status, 200, "{released:?}");
    let mut waiting = serve.send("POST", "/v1/completions", Some(&request(8, false)));
    wait_until("the request to wait for the memory", || {
        serve.metric("routed_requests_waiting") == 1.0
    });

    serve.sigterm();

    let answer = read_rest(&mut waiting, Vec::new());
    let body = answer.json();
    assert_eq!(answer.status, 503, "{body}");
    assert_eq!(body["error"]["code"], "shutting_down", "{body}");
    let status = serve.wait_exit();
    assert!(status.success(), "exit status {status}: {:#?}", serve.log());
}
