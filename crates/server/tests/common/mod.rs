//! Helpers shared by the HTTP end-to-end tests: a real engine behind the gateway on
//! `127.0.0.1:0`, a tiny blocking HTTP/1.1 client, and a `.npy` reader.
#![allow(dead_code)]

use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::PathBuf;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use routed_runtime::{Engine, EngineConfig, EngineHandle, ModelSource};
use routed_server::Registry;
use serde_json::Value;

/// A watchdog on every socket read: a hung server fails the test instead of hanging CI.
pub const WATCHDOG: Duration = Duration::from_secs(60);

/// The directory of a golden checkpoint (`nemotron_h`, `qwen3_moe`, `tiny_hybrid_default`).
pub fn checkpoint(arch: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/golden").join(arch).join("model")
}

/// A running gateway in front of a real engine.
#[derive(Clone)]
pub struct TestServer {
    /// Where it listens.
    pub addr: SocketAddr,
    /// The gateway's in-flight registry.
    pub registry: Arc<Registry>,
    /// The engine.
    pub handle: EngineHandle,
}

/// Small, test-friendly engine settings.
pub fn test_config(arch: &str) -> EngineConfig {
    let mut config = EngineConfig::new(ModelSource::Dir(checkpoint(arch)));
    config.served_model_name = arch.to_owned();
    config.block_size = 16;
    config.num_kv_blocks = Some(256);
    config.mamba_snapshot_slots = 64;
    config.max_num_batched_tokens = 512;
    config.max_num_seqs = 32;
    config.heartbeat_ms = 0;
    config.threads = Some(2);
    config
}

impl TestServer {
    /// Starts an engine with `config` and the gateway in front of it, on its own actix system
    /// thread. The server lives until the test process exits.
    pub fn start(config: EngineConfig) -> Self {
        Self::start_with(config, routed_server::ServerConfig::default())
    }

    /// [`TestServer::start`] with the gateway's own settings (workers, timeouts).
    pub fn start_with(config: EngineConfig, server: routed_server::ServerConfig) -> Self {
        routed_server::install_metrics_recorder().expect("metrics recorder");
        let handle = Engine::start(config).expect("engine starts");
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let (tx, rx) = std::sync::mpsc::channel();
        let engine = handle.clone();
        std::thread::spawn(move || {
            actix_rt::System::new().block_on(async move {
                let bound = routed_server::bind_server_with(engine, listener, &server)
                    .expect("server builds");
                tx.send((bound.addr, Arc::clone(bound.state.registry()))).expect("send addr");
                bound.server.await.expect("server runs");
            });
        });
        let (addr, registry) = rx.recv_timeout(WATCHDOG).expect("server starts");
        Self { addr, registry, handle }
    }

    /// One shared server per name, started on first use with `make()`'s config.
    pub fn shared(name: &str, make: impl FnOnce() -> EngineConfig) -> Self {
        static SERVERS: OnceLock<Mutex<HashMap<String, TestServer>>> = OnceLock::new();
        let servers = SERVERS.get_or_init(Default::default);
        let mut servers = servers.lock().unwrap_or_else(|e| e.into_inner());
        servers.entry(name.to_owned()).or_insert_with(|| Self::start(make())).clone()
    }

    /// `POST path` with a JSON body.
    pub fn post(&self, path: &str, body: &Value) -> Response {
        request(self.addr, "POST", path, Some(body.to_string().as_bytes()))
    }

    /// `GET path`.
    pub fn get(&self, path: &str) -> Response {
        request(self.addr, "GET", path, None)
    }

    /// `POST path` that must answer 200 with JSON.
    pub fn ok(&self, path: &str, body: &Value) -> Value {
        let r = self.post(path, body);
        assert_eq!(r.status, 200, "POST {path} {body} -> {}", r.text());
        r.json()
    }
}

/// The server of `arch` with default test settings (capture on, prefix caching on).
pub fn server(arch: &str) -> TestServer {
    TestServer::shared(arch, || test_config(arch))
}

/// An HTTP response.
#[derive(Debug)]
pub struct Response {
    /// Status code.
    pub status: u16,
    /// Headers, names lower-cased.
    pub headers: Vec<(String, String)>,
    /// The (de-chunked) body.
    pub body: Vec<u8>,
}

impl Response {
    /// The body as text.
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    /// The body as JSON.
    pub fn json(&self) -> Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {}", self.text()))
    }

    /// A header's value.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(k, _)| k == name).map(|(_, v)| v.as_str())
    }

    /// The `data:` payloads of an SSE body, in order.
    pub fn sse(&self) -> Vec<String> {
        self.text()
            .split("\n\n")
            .filter_map(|event| event.strip_prefix("data: "))
            .map(str::to_owned)
            .collect()
    }

    /// The SSE payloads before `[DONE]` as JSON; asserts the stream ends with `[DONE]`.
    pub fn sse_json(&self) -> Vec<Value> {
        let events = self.sse();
        assert_eq!(events.last().map(String::as_str), Some("[DONE]"), "{}", self.text());
        events[..events.len() - 1]
            .iter()
            .map(|e| serde_json::from_str(e).unwrap_or_else(|err| panic!("{err}: {e}")))
            .collect()
    }

    /// Asserts an OpenAI error of `status` and `kind` and returns its `error` object.
    pub fn error(&self, status: u16, kind: &str) -> Value {
        assert_eq!(self.status, status, "{}", self.text());
        let body = self.json();
        let error = body["error"].clone();
        assert_eq!(error["type"], kind, "{body}");
        assert!(error["message"].as_str().is_some_and(|m| !m.is_empty()), "{body}");
        assert!(error.get("param").is_some() && error.get("code").is_some(), "{body}");
        error
    }
}

/// Sends one request (`Connection: close`) and reads the whole response.
pub fn request(addr: SocketAddr, method: &str, path: &str, body: Option<&[u8]>) -> Response {
    let mut stream = TcpStream::connect(addr).expect("connect");
    stream.set_read_timeout(Some(WATCHDOG)).expect("timeout");
    let body = body.unwrap_or_default();
    let head = format!(
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    stream.write_all(head.as_bytes()).expect("write head");
    stream.write_all(body).expect("write body");
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw).expect("read response (watchdog)");
    parse_response(&raw)
}

/// Sends a request without reading the answer; dropping the stream disconnects.
pub fn send_only(addr: SocketAddr, path: &str, body: &Value) -> TcpStream {
    let mut stream = TcpStream::connect(addr).expect("connect");
    let body = body.to_string();
    let head = format!(
        "POST {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\n\r\n{body}",
        body.len()
    );
    stream.write_all(head.as_bytes()).expect("write");
    stream
}

/// Sends a request that closes its connection when answered, without reading the answer: read
/// part of it with [`read_until`] and the rest with [`read_rest`].
pub fn send_closing(addr: SocketAddr, path: &str, body: &Value) -> TcpStream {
    let mut stream = TcpStream::connect(addr).expect("connect");
    let body = body.to_string();
    let head = format!(
        "POST {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    stream.write_all(head.as_bytes()).expect("write");
    stream
}

/// Reads the rest of a response whose beginning [`read_bytes_until`] returned, to the end.
pub fn read_rest(stream: &mut TcpStream, mut raw: Vec<u8>) -> Response {
    stream.read_to_end(&mut raw).expect("read response (watchdog)");
    parse_response(&raw)
}

/// Polls `done` until it holds; panics, naming `what`, when the watchdog runs out first.
pub fn wait_until(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = std::time::Instant::now() + WATCHDOG;
    while !done() {
        assert!(std::time::Instant::now() < deadline, "watchdog: still waiting for {what}");
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Reads from `stream` until what was read contains `needle`, and returns it.
pub fn read_until(stream: &mut TcpStream, needle: &str) -> String {
    String::from_utf8_lossy(&read_bytes_until(stream, needle)).into_owned()
}

/// Reads from `stream` until what was read contains `needle`, and returns the bytes.
pub fn read_bytes_until(stream: &mut TcpStream, needle: &str) -> Vec<u8> {
    stream.set_read_timeout(Some(WATCHDOG)).expect("timeout");
    let mut seen = Vec::new();
    let mut buf = [0u8; 4096];
    while !seen.windows(needle.len()).any(|w| w == needle.as_bytes()) {
        let n = stream.read(&mut buf).expect("read (watchdog)");
        assert!(n > 0, "closed before {needle:?}: {}", String::from_utf8_lossy(&seen));
        seen.extend_from_slice(&buf[..n]);
    }
    seen
}

fn parse_response(raw: &[u8]) -> Response {
    let split = raw.windows(4).position(|w| w == b"\r\n\r\n").expect("header end");
    let head = String::from_utf8_lossy(&raw[..split]);
    let mut lines = head.split("\r\n");
    let status = lines.next().and_then(|l| l.split(' ').nth(1)).and_then(|s| s.parse().ok());
    let headers: Vec<(String, String)> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_owned()))
        .collect();
    let mut body = raw[split + 4..].to_vec();
    if headers.iter().any(|(k, v)| k == "transfer-encoding" && v.contains("chunked")) {
        body = dechunk(&body);
    }
    Response { status: status.expect("status line"), headers, body }
}

fn dechunk(mut data: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    while let Some(eol) = data.windows(2).position(|w| w == b"\r\n") {
        let size_text = String::from_utf8_lossy(&data[..eol]);
        let size = usize::from_str_radix(size_text.split(';').next().unwrap_or("").trim(), 16)
            .expect("chunk size");
        if size == 0 {
            break;
        }
        out.extend_from_slice(&data[eol + 2..eol + 2 + size]);
        data = &data[eol + 2 + size + 2..];
    }
    out
}

/// A decoded routing array: shape `[rows, L, K]` and the ids, row-major.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Rows {
    /// `[rows, L, K]`.
    pub shape: [usize; 3],
    /// The ids.
    pub ids: Vec<u32>,
    /// The `.npy` dtype (`|u1`, `<u2`) or `int32`.
    pub dtype: String,
}

impl Rows {
    /// Row `i` (all layers).
    pub fn row(&self, i: usize) -> &[u32] {
        let n = self.shape[1] * self.shape[2];
        &self.ids[i * n..(i + 1) * n]
    }

    /// Rows `[from, to)`.
    pub fn rows(&self, from: usize, to: usize) -> &[u32] {
        let n = self.shape[1] * self.shape[2];
        &self.ids[from * n..to * n]
    }
}

/// Decodes base64 `.npy` (`|u1` or `<u2`, C order, 3 dims).
pub fn decode_npy_b64(b64: &str) -> Rows {
    let bytes = STANDARD.decode(b64).expect("base64");
    assert_eq!(&bytes[..8], b"\x93NUMPY\x01\x00", "npy magic");
    let header_len = u16::from_le_bytes([bytes[8], bytes[9]]) as usize;
    let header = std::str::from_utf8(&bytes[10..10 + header_len]).expect("header text");
    assert!(header.contains("'fortran_order': False"), "{header}");
    let descr =
        header.split("'descr': '").nth(1).and_then(|s| s.split('\'').next()).expect("descr");
    let shape_text =
        header.split("'shape': (").nth(1).and_then(|s| s.split(')').next()).expect("shape");
    let dims: Vec<usize> = shape_text
        .split(',')
        .filter(|s| !s.trim().is_empty())
        .map(|s| s.trim().parse().expect("dim"))
        .collect();
    assert_eq!(dims.len(), 3, "{header}");
    let data = &bytes[10 + header_len..];
    let ids: Vec<u32> = match descr {
        "|u1" => data.iter().map(|&b| u32::from(b)).collect(),
        "<u2" => data.chunks(2).map(|c| u32::from(u16::from_le_bytes([c[0], c[1]]))).collect(),
        other => panic!("unexpected dtype {other}"),
    };
    assert_eq!(ids.len(), dims.iter().product::<usize>(), "npy data length");
    Rows { shape: [dims[0], dims[1], dims[2]], ids, dtype: descr.to_owned() }
}

/// Decodes base64 flat little-endian int32 with `L` layers and `K` experts per row.
pub fn decode_raw_b64(b64: &str, layers: usize, top_k: usize) -> Rows {
    let bytes = STANDARD.decode(b64).expect("base64");
    assert_eq!(bytes.len() % (4 * layers * top_k), 0, "raw length");
    let ids: Vec<u32> = bytes
        .chunks(4)
        .map(|c| u32::try_from(i32::from_le_bytes([c[0], c[1], c[2], c[3]])).expect("id >= 0"))
        .collect();
    Rows { shape: [ids.len() / (layers * top_k), layers, top_k], ids, dtype: "int32".into() }
}

/// Decodes the `list` format.
pub fn decode_list(value: &Value) -> Rows {
    let rows = value.as_array().expect("rows");
    let mut ids = Vec::new();
    let (mut layers, mut top_k) = (0, 0);
    for row in rows {
        let row = row.as_array().expect("row");
        layers = row.len();
        for layer in row {
            let layer = layer.as_array().expect("layer");
            top_k = layer.len();
            ids.extend(layer.iter().map(|v| v.as_u64().expect("id") as u32));
        }
    }
    Rows { shape: [rows.len(), layers, top_k], ids, dtype: "list".into() }
}

/// Decodes `choice["routed_experts"]` in the default format.
pub fn routing_of(choice: &Value) -> Rows {
    decode_npy_b64(choice["routed_experts"].as_str().expect("routed_experts is a string"))
}

/// Token ids `0..len` shifted into the ordinary vocabulary, as a JSON prompt.
pub fn prompt_ids(len: usize, salt: u32) -> Vec<u32> {
    (0..len as u32).map(|i| 10 + (i * 37 + salt * 101) % 400).collect()
}

/// Each choice's text (or chat message content) and finish reason, of an OpenAI answer.
pub fn answers(out: &Value) -> Vec<(String, String)> {
    let choices = out["choices"].as_array().expect("choices");
    let text =
        |c: &Value| c["text"].as_str().or(c["message"]["content"].as_str()).map(str::to_owned);
    choices
        .iter()
        .map(|c| (text(c).unwrap_or_default(), c["finish_reason"].as_str().unwrap().to_owned()))
        .collect()
}

/// `sampling` on both OpenAI routes: completing `prompt`, and a chat whose one user turn says
/// `message`.
pub fn on_both_routes(sampling: &Value, prompt: &str, message: &str) -> [(&'static str, Value); 2] {
    let mut completion = sampling.clone();
    completion["prompt"] = serde_json::json!(prompt);
    let mut chat = sampling.clone();
    chat["messages"] = serde_json::json!([{"role": "user", "content": message}]);
    [("/v1/completions", completion), ("/v1/chat/completions", chat)]
}

/// A chat's first choice streamed: its content deltas joined.
pub fn streamed_content(s: &TestServer, body: &Value) -> String {
    let mut stream = body.clone();
    stream["stream"] = serde_json::json!(true);
    let chunks = s.post("/v1/chat/completions", &stream).sse_json();
    chunks.iter().filter_map(|c| c["choices"][0]["delta"]["content"].as_str()).collect()
}

/// One output constraint asked for every way the clients ask for it, for seeds 0 to 3: each
/// of `openai`'s fields (a name and its value) on both OpenAI routes with two choices, and
/// SGLang's `sampling_params` key `sglang` set to `value` on `/generate`; up to 24 tokens at
/// temperature 1. `check` sees each answer's text, its finish reason and what asked for it, and
/// says whether EOS ended it whole; the number that did.
pub fn count_whole_answers(
    s: &TestServer,
    openai: &[(&str, Value)],
    (sglang, value): (&str, Value),
    (prompt, message): (&str, &str),
    check: impl Fn(&str, &str, &str) -> bool,
) -> usize {
    let mut num_whole = 0;
    for seed in 0..4 {
        for (field, constraint) in openai {
            let mut sampling =
                serde_json::json!({"max_tokens": 24, "temperature": 1.0, "seed": seed, "n": 2});
            sampling[*field] = constraint.clone();
            for (route, body) in on_both_routes(&sampling, prompt, message) {
                for (text, finish) in answers(&s.ok(route, &body)) {
                    num_whole +=
                        usize::from(check(&text, &finish, &format!("{route} {field} {seed}")));
                }
            }
        }
        let mut generate = serde_json::json!({"text": prompt, "sampling_params": {
            "max_new_tokens": 24, "temperature": 1.0, "sampling_seed": seed}});
        generate["sampling_params"][sglang] = value.clone();
        let out = s.ok("/generate", &generate);
        let finish = out["meta_info"]["finish_reason"]["type"].as_str().unwrap();
        num_whole +=
            usize::from(check(out["text"].as_str().unwrap(), finish, &format!("/generate {seed}")));
    }
    num_whole
}

/// Each body (a completion's `field` set to a value) is a 400 naming `param` with `code`, its
/// message saying `says`.
pub fn assert_completions_refused(s: &TestServer, cases: &[(&str, Value, &str, &str, &str)]) {
    for (field, value, param, code, says) in cases {
        let mut body = serde_json::json!({"prompt": "hi", "max_tokens": 2});
        body[*field] = value.clone();
        let error = s.post("/v1/completions", &body).error(400, "invalid_request_error");
        assert_eq!(
            (error["param"].as_str(), error["code"].as_str()),
            (Some(*param), Some(*code)),
            "{field}: {error}"
        );
        assert!(error["message"].as_str().unwrap().contains(says), "{error}");
    }
}
