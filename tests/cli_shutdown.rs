//! `routed serve` drains on SIGTERM: new requests get 503 `shutting_down` from a listener that
//! keeps answering, in-flight requests that finish within `--shutdown-grace-s` complete, the ones
//! that cannot are ended with a 503 body or an error event and `[DONE]`, and the process exits 0.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

/// A watchdog on every wait: a hung server fails the test instead of hanging CI.
const WATCHDOG: Duration = Duration::from_secs(60);

/// Starts `routed serve` on a free port and returns it with its address. Its log is drained on a
/// thread (a full pipe would block it) and kept for failure messages.
fn serve(args: &[&str]) -> (Child, String, std::sync::mpsc::Receiver<String>) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_routed"))
        .args(["serve", "--port", "0", "--threads", "2", "--heartbeat-ms", "0"])
        .args(args)
        .env("RUST_LOG", "info")
        .env("NO_COLOR", "1")
        .stderr(Stdio::piped())
        .spawn()
        .expect("start routed serve");
    let mut lines = BufReader::new(child.stderr.take().expect("stderr")).lines();
    let addr = loop {
        let line = lines.next().expect("routed serve printed its address").expect("log line");
        if let Some(at) = line.find("serving on http://") {
            let rest = &line[at + "serving on http://".len()..];
            break rest.split_whitespace().next().expect("address").to_owned();
        }
    };
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in lines.map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    (child, addr, rx)
}

/// Sends one request (`Connection: close`); the answer is read later.
fn send(addr: &str, method: &str, path: &str, body: Option<&Value>) -> TcpStream {
    let mut stream = TcpStream::connect(addr).expect("the listener accepts");
    stream.set_read_timeout(Some(WATCHDOG)).expect("timeout");
    let body = body.map(Value::to_string).unwrap_or_default();
    let head = format!(
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    stream.write_all(head.as_bytes()).expect("write");
    stream.write_all(body.as_bytes()).expect("write");
    stream
}

/// Reads until what was read contains `needle`; returns it.
fn read_until(stream: &mut TcpStream, needle: &str) -> String {
    let mut seen = Vec::new();
    let mut buf = [0u8; 4096];
    while !String::from_utf8_lossy(&seen).contains(needle) {
        let n = stream.read(&mut buf).expect("read (watchdog)");
        assert!(n > 0, "closed before {needle:?}: {}", String::from_utf8_lossy(&seen));
        seen.extend_from_slice(&buf[..n]);
    }
    String::from_utf8_lossy(&seen).into_owned()
}

/// Reads the rest of the answer, up to the server's close.
fn read_rest(stream: &mut TcpStream, mut seen: String) -> String {
    let mut rest = String::new();
    stream.read_to_string(&mut rest).expect("read to the end (watchdog)");
    seen.push_str(&rest);
    seen
}

/// The status code and JSON body of a whole, non-streamed answer.
fn status_and_json(answer: &str) -> (u16, Value) {
    let status = answer.split(' ').nth(1).and_then(|s| s.parse().ok()).expect("status line");
    let body = answer.split_once("\r\n\r\n").expect("head end").1;
    (status, serde_json::from_str(body).unwrap_or_else(|e| panic!("{e}: {answer}")))
}

/// The figure `name` of a `/metrics` scrape.
fn metric(addr: &str, name: &str) -> f64 {
    let text = read_rest(&mut send(addr, "GET", "/metrics", None), String::new());
    let line = text.lines().find(|l| l.split_whitespace().next() == Some(name));
    line.and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
        .unwrap_or_else(|| panic!("{name} missing: {text}"))
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

fn wait_until(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + WATCHDOG;
    while !done() {
        assert!(Instant::now() < deadline, "watchdog: still waiting for {what}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn sigterm_drains_in_flight_requests_then_exits_zero() {
    // Room for requests that would run for minutes (100k tokens each), and a grace period that
    // the short ones (1000 tokens, about a second) fit in many times over.
    let (mut child, addr, log) =
        serve(&["--num-kv-blocks", "8192", "--max-model-len", "131072", "--shutdown-grace-s", "8"]);
    let mut long_stream = send(&addr, "POST", "/v1/completions", Some(&request(100_000, true)));
    let long_stream_seen = read_until(&mut long_stream, "data: ");
    let mut long_plain = send(&addr, "POST", "/v1/completions", Some(&request(100_000, false)));
    let mut short_stream = send(&addr, "POST", "/v1/completions", Some(&request(1000, true)));
    let short_stream_seen = read_until(&mut short_stream, "data: ");
    let mut short_plain = send(&addr, "POST", "/v1/completions", Some(&request(1000, false)));
    wait_until("four requests running", || metric(&addr, "routed_requests_running") == 4.0);

    // SAFETY: kill(2) on our own child's pid.
    assert_eq!(unsafe { libc::kill(child.id() as i32, libc::SIGTERM) }, 0);

    // The listener keeps answering, with 503s.
    wait_until("/health to say the server is shutting down", || {
        read_rest(&mut send(&addr, "GET", "/health", None), String::new())
            .starts_with("HTTP/1.1 503")
    });
    let refused = read_rest(
        &mut send(&addr, "POST", "/v1/completions", Some(&request(4, false))),
        String::new(),
    );
    let (status, body) = status_and_json(&refused);
    assert_eq!(status, 503, "{refused}");
    assert_eq!(body["error"]["type"], "overloaded_error", "{body}");
    assert_eq!(body["error"]["code"], "shutting_down", "{body}");

    // The short requests finish within the grace period, whole.
    let (status, body) = status_and_json(&read_rest(&mut short_plain, String::new()));
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["usage"]["completion_tokens"], 1000, "{body}");
    assert_eq!(body["choices"][0]["finish_reason"], "length", "{body}");
    let short = read_rest(&mut short_stream, short_stream_seen);
    assert!(
        short.contains(r#""finish_reason":"length""#) && !short.contains("\"error\""),
        "{short}"
    );
    assert!(short.contains("data: [DONE]"), "{short}");

    // The long ones are ended when the grace period is over: a 503 body, or an error event and
    // [DONE] on the stream that already sent tokens.
    let (status, body) = status_and_json(&read_rest(&mut long_plain, String::new()));
    assert_eq!(status, 503, "{body}");
    assert_eq!(body["error"]["code"], "shutting_down", "{body}");
    let long = read_rest(&mut long_stream, long_stream_seen);
    let error = long.find(r#"data: {"error""#).unwrap_or_else(|| panic!("no error event: {long}"));
    let done = long.rfind("data: [DONE]").unwrap_or_else(|| panic!("no [DONE]: {long}"));
    assert!(error < done && long[error..].contains("shutting_down"), "{long}");

    let deadline = Instant::now() + WATCHDOG;
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait") {
            break status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("routed serve did not exit: {:?}", log.try_iter().collect::<Vec<_>>());
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(status.success(), "exit status {status}: {:?}", log.try_iter().collect::<Vec<_>>());
}
