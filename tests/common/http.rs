//! `routed serve` as a child process, and the small HTTP/1.1 client the command-line tests drive
//! it with. Every request closes its connection, so an answer is everything read up to the close;
//! every read has a watchdog, so a hung server fails a test instead of hanging CI.

use serde_json::Value;
use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::WATCHDOG;

/// The `routed` binary cargo built, or `$ROUTED_BIN` (test executables run on another machine,
/// with the binary beside them).
pub fn routed_bin() -> std::ffi::OsString {
    std::env::var_os("ROUTED_BIN").unwrap_or_else(|| env!("CARGO_BIN_EXE_routed").into())
}

/// A `routed serve` child process on a free port, killed when dropped.
pub struct Server {
    child: Child,
    /// `host:port` it listens on.
    pub addr: String,
    log: Arc<Mutex<Vec<String>>>,
}

impl Server {
    /// Starts `routed serve --port 0 --threads 2 <args>` and waits for its address. Its log is
    /// drained on a thread (a full pipe would block the server) and kept for failure messages.
    /// The binary is [`routed_bin`].
    pub fn start(args: &[&str]) -> Self {
        let mut child = Command::new(routed_bin())
            .args(["serve", "--port", "0", "--threads", "2"])
            .args(args)
            .env("RUST_LOG", "info")
            .env("NO_COLOR", "1")
            .stderr(Stdio::piped())
            .spawn()
            .expect("start routed serve");
        let mut lines = BufReader::new(child.stderr.take().expect("stderr")).lines();
        let mut seen = Vec::new();
        let addr = loop {
            let Some(Ok(line)) = lines.next() else {
                panic!("routed serve exited before serving: {seen:#?}");
            };
            if let Some(at) = line.find("serving on http://") {
                let rest = &line[at + "serving on http://".len()..];
                break rest.split_whitespace().next().expect("address").to_owned();
            }
            seen.push(line);
        };
        let log = Arc::new(Mutex::new(seen));
        let sink = Arc::clone(&log);
        std::thread::spawn(move || {
            for line in lines.map_while(Result::ok) {
                sink.lock().unwrap().push(line);
            }
        });
        Self { child, addr, log }
    }

    /// Sends a request and reads the whole answer.
    pub fn request(&self, method: &str, path: &str, body: Option<&Value>) -> Response {
        read_response(&mut self.send(method, path, body))
    }

    /// Like [`Server::request`], but a refused connection, a read error or an answer cut before
    /// its head is an `Err` saying which, not a panic: for tests where the server may be going away.
    pub fn try_request(&self, method: &str, path: &str, body: &Value) -> Result<Response, String> {
        let mut stream = TcpStream::connect(&self.addr).map_err(|e| format!("connect: {e}"))?;
        stream.set_read_timeout(Some(WATCHDOG)).expect("read timeout");
        let body = body.to_string();
        write_request(&mut stream, &self.addr, method, path, "application/json", body.as_bytes())
            .map_err(|e| format!("write: {e}"))?;
        let mut raw = Vec::new();
        stream.read_to_end(&mut raw).map_err(|e| format!("read: {e}"))?;
        if !raw.windows(4).any(|w| w == b"\r\n\r\n") {
            return Err(format!("closed before a head: {:?}", String::from_utf8_lossy(&raw)));
        }
        Ok(parse_response(&raw))
    }

    /// `POST path` with a JSON body; the whole answer.
    pub fn post(&self, path: &str, body: &Value) -> Response {
        self.request("POST", path, Some(body))
    }

    /// `GET path`; the whole answer.
    pub fn get(&self, path: &str) -> Response {
        self.request("GET", path, None)
    }

    /// Sends a request (`Connection: close`) and returns the connection, for tests that read
    /// part of an answer or drop it unread.
    pub fn send(&self, method: &str, path: &str, body: Option<&Value>) -> TcpStream {
        let body = body.map(Value::to_string).unwrap_or_default();
        self.send_raw(method, path, "application/json", body.as_bytes())
    }

    /// Sends `body` as it is, whatever it holds.
    pub fn send_raw(&self, method: &str, path: &str, content_type: &str, body: &[u8]) -> TcpStream {
        let mut stream = TcpStream::connect(&self.addr).expect("the listener accepts");
        stream.set_read_timeout(Some(WATCHDOG)).expect("read timeout");
        // A server that already answered (a 413, say) may close before the whole body is sent.
        let _ = write_request(&mut stream, &self.addr, method, path, content_type, body);
        stream
    }

    /// Every unlabelled figure of a `/metrics` scrape, by name.
    pub fn metrics(&self) -> BTreeMap<String, f64> {
        let text = self.get("/metrics").body;
        text.lines()
            .filter(|l| !l.starts_with('#') && !l.contains('{'))
            .filter_map(|l| {
                let (name, value) = l.split_once(' ')?;
                Some((name.to_owned(), value.trim().parse().ok()?))
            })
            .collect()
    }

    /// One unlabelled figure of a `/metrics` scrape.
    pub fn metric(&self, name: &str) -> f64 {
        *self.metrics().get(name).unwrap_or_else(|| panic!("{name} missing from /metrics"))
    }

    /// Sends SIGTERM to the server.
    pub fn sigterm(&self) {
        // SAFETY: kill(2) on our own child's pid.
        assert_eq!(unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) }, 0);
    }

    /// Waits for the server to exit, killing it (and failing) after the watchdog.
    pub fn wait_exit(&mut self) -> ExitStatus {
        let deadline = Instant::now() + WATCHDOG;
        loop {
            if let Some(status) = self.child.try_wait().expect("wait") {
                return status;
            }
            if Instant::now() > deadline {
                let _ = self.child.kill();
                panic!("routed serve did not exit: {:#?}", self.log());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// What the server logged so far.
    pub fn log(&self) -> Vec<String> {
        self.log.lock().unwrap().clone()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Writes a `Connection: close` request.
fn write_request(
    stream: &mut TcpStream,
    addr: &str,
    method: &str,
    path: &str,
    content_type: &str,
    body: &[u8],
) -> std::io::Result<()> {
    let head = format!(
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Type: {content_type}\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    stream.write_all(head.as_bytes())?;
    stream.write_all(body)
}

/// A whole HTTP answer, its body de-chunked.
#[derive(Debug, Clone)]
pub struct Response {
    /// Status code.
    pub status: u16,
    /// The head, status line included.
    pub head: String,
    /// The body as text.
    pub body: String,
}

impl Response {
    /// The body as JSON; panics with the answer when it is not.
    pub fn json(&self) -> Value {
        serde_json::from_str(&self.body).unwrap_or_else(|e| panic!("{e}: {self:?}"))
    }

    /// The payloads of a server-sent-event stream's `data:` lines, in order.
    pub fn events(&self) -> Vec<&str> {
        self.body.lines().filter_map(|l| l.strip_prefix("data: ")).collect()
    }
}

/// Reads an answer up to the server's close and splits it.
pub fn read_response(stream: &mut TcpStream) -> Response {
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw).expect("read the answer (watchdog)");
    parse_response(&raw)
}

/// Splits a raw answer into status, head and body, undoing chunked transfer encoding.
pub fn parse_response(raw: &[u8]) -> Response {
    let end = raw.windows(4).position(|w| w == b"\r\n\r\n");
    let end = end.unwrap_or_else(|| panic!("no head: {:?}", String::from_utf8_lossy(raw)));
    let head = String::from_utf8_lossy(&raw[..end]).into_owned();
    let body = &raw[end + 4..];
    let status = head.split(' ').nth(1).and_then(|s| s.parse().ok()).expect("status line");
    let chunked = head.lines().any(|l| {
        let l = l.to_ascii_lowercase();
        l.starts_with("transfer-encoding:") && l.contains("chunked")
    });
    // Chunks may split a character: join the bytes first, then decode.
    let body = if chunked { dechunk(body) } else { body.to_vec() };
    Response { status, head, body: String::from_utf8_lossy(&body).into_owned() }
}

/// The payload of a chunked body; a body cut short keeps what arrived.
fn dechunk(mut body: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    while let Some(eol) = body.windows(2).position(|w| w == b"\r\n") {
        let size = std::str::from_utf8(&body[..eol]).ok();
        let Some(size) = size.and_then(|s| usize::from_str_radix(s.trim(), 16).ok()) else {
            break;
        };
        let rest = &body[eol + 2..];
        out.extend_from_slice(&rest[..size.min(rest.len())]);
        if size == 0 || rest.len() < size + 2 {
            break;
        }
        body = &rest[size + 2..];
    }
    out
}

/// Polls `done` every 10 ms until it holds; fails after the watchdog.
pub fn wait_until(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + WATCHDOG;
    while !done() {
        assert!(Instant::now() < deadline, "watchdog: still waiting for {what}");
        std::thread::sleep(Duration::from_millis(10));
    }
}
