//! The load and fault suite: `routed serve` on the embedded model under concurrent clients,
//! random disconnects, fuzzed bodies, a tight routing cap over a small KV pool, and SIGTERM.
//!
//! Every scenario holds the server to the same three promises: no 5xx for bad input, no answer
//! that differs from the same request run alone on a fresh server (temperature-0 and seeded
//! probes, text and routing rows bitwise), and, once the load is gone and the prefix cache is
//! reset, every idle gauge back at its fresh-server value (nothing leaked).
//!
//! CI runs a bounded form (a few hundred requests). `ROUTED_LOAD_SCALE=N` multiplies every
//! request count by N and prints each scenario's tally; docs/testing.md has the long-form command
//! and docs/reliability.md its figures.

mod common;

use common::http::{Response, Server, wait_until};
use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::io::Read;
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};

/// Gauges that must read as on a fresh server once requests are gone and the cache is reset.
const IDLE_GAUGES: [&str; 6] = [
    "routed_requests_running",
    "routed_requests_waiting",
    "routed_kv_blocks_cached",
    "routed_kv_blocks_evictable",
    "routed_mamba_snapshot_slots_used",
    "routed_routing_bytes_held",
];

/// Host bytes of one full block's routing rows on the embedded model: 16 rows x 3 MoE layers x
/// top-2, one byte per id (8 experts fit a byte).
const ROUTING_BYTES_PER_BLOCK: usize = 16 * 3 * 2;

/// How many times the bounded form's request counts to run (`ROUTED_LOAD_SCALE`, default 1).
fn scale() -> usize {
    std::env::var("ROUTED_LOAD_SCALE").ok().and_then(|s| s.parse().ok()).unwrap_or(1).max(1)
}

/// xorshift64*: which probe, which fault. Seeded per request, so a failure names a request that
/// can be replayed.
struct Rng(u64);

impl Rng {
    fn new(seed: u64) -> Self {
        Self(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }

    fn below(&mut self, n: usize) -> usize {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        (self.0.wrapping_mul(0x2545_F491_4F6C_DD1D) >> 33) as usize % n
    }
}

/// One request of the workload.
#[derive(Clone, Debug)]
struct Probe {
    path: &'static str,
    body: Value,
}

impl Probe {
    fn streamed(&self) -> bool {
        self.body["stream"] == true
    }
}

/// Requests over three shared prefixes (prefix-cache hits under load), on every generating
/// route, streamed and not, n > 1 with a seed, token and text prompts.
fn probes() -> Vec<Probe> {
    let prefixes = [
        "The router gives each token two experts, and the state space layer keeps a state ",
        "Routing replay records which experts were picked for every token of every request, ",
        "A block of sixteen tokens is cached with its routing rows and its Mamba snapshot. ",
    ];
    let tails = ["so", "and then", "while the cache", "because"];
    let mut probes = Vec::new();
    for (i, prefix) in prefixes.iter().enumerate() {
        for (j, tail) in tails.iter().enumerate() {
            let prompt = format!("{prefix}{tail}");
            let max_tokens = 8 + 8 * ((i + j) % 4);
            let completion = json!({
                "prompt": prompt, "max_tokens": max_tokens, "temperature": 0,
                "ignore_eos": true, "routed_experts_format": "list",
            });
            let mut streamed = completion.clone();
            streamed["stream"] = json!(true);
            let mut sampled = completion.clone();
            sampled.as_object_mut().unwrap().extend([
                ("n".into(), json!(2)),
                ("temperature".into(), json!(0.8)),
                ("seed".into(), json!(11 + j)),
            ]);
            probes.push(Probe { path: "/v1/completions", body: completion });
            probes.push(Probe { path: "/v1/completions", body: streamed });
            probes.push(Probe { path: "/v1/completions", body: sampled });
            probes.push(Probe {
                path: "/v1/chat/completions",
                body: json!({
                    "messages": [{"role": "user", "content": prompt}],
                    "max_tokens": max_tokens, "temperature": 0, "routed_experts_format": "list",
                }),
            });
            probes.push(Probe {
                path: "/generate",
                body: json!({
                    "text": prompt, "return_routed_experts": true,
                    "sampling_params": {"max_new_tokens": max_tokens, "temperature": 0},
                }),
            });
        }
    }
    probes.push(Probe {
        path: "/v1/completions",
        body: json!({"prompt": (1..40).collect::<Vec<u32>>(), "max_tokens": 12,
                     "temperature": 0, "routed_experts_format": "list"}),
    });
    probes
}

/// What must be identical between a solo run and a run under load: per choice, the text, the
/// finish reason and the routing rows. `Err` says why the answer is not a whole success.
fn fingerprint(probe: &Probe, r: &Response) -> Result<Value, String> {
    if r.status != 200 {
        return Err(format!("status {}: {}", r.status, r.body));
    }
    if probe.path == "/generate" {
        let v: Value = serde_json::from_str(&r.body).map_err(|e| format!("{e}: {}", r.body))?;
        let meta = &v["meta_info"];
        return Ok(json!([
            v["text"],
            v["output_ids"],
            meta["finish_reason"],
            meta["routed_experts"]
        ]));
    }
    let chunks: Vec<Value> = if probe.streamed() {
        let events = r.events();
        if events.last() != Some(&"[DONE]") {
            return Err(format!("stream without [DONE]: {}", r.body));
        }
        let parse = |e: &&str| serde_json::from_str(e).map_err(|err| format!("{err}: {e}"));
        events[..events.len() - 1].iter().map(parse).collect::<Result<_, _>>()?
    } else {
        vec![serde_json::from_str(&r.body).map_err(|e| format!("{e}: {}", r.body))?]
    };
    let mut choices: BTreeMap<u64, (String, Value, Value)> = BTreeMap::new();
    for chunk in &chunks {
        if chunk.get("error").is_some() {
            return Err(format!("error event: {chunk}"));
        }
        for c in chunk["choices"].as_array().into_iter().flatten() {
            let entry = choices.entry(c["index"].as_u64().unwrap_or(0)).or_default();
            let text = c["text"].as_str().or(c["message"]["content"].as_str());
            entry.0.push_str(text.or(c["delta"]["content"].as_str()).unwrap_or(""));
            if !c["finish_reason"].is_null() {
                entry.1 = c["finish_reason"].clone();
            }
            if !c["routed_experts"].is_null() {
                entry.2 = c["routed_experts"].clone();
            }
        }
    }
    if choices.values().any(|(_, _, rows)| !rows.is_array()) {
        return Err(format!("a choice without routing rows: {}", r.body));
    }
    Ok(json!(choices.into_values().map(|(t, f, rows)| json!([t, f, rows])).collect::<Vec<_>>()))
}

/// Every probe run alone, one after another, on `server`.
fn solo(server: &Server, probes: &[Probe]) -> Vec<Value> {
    let run = |p: &Probe| fingerprint(p, &server.post(p.path, &p.body));
    probes.iter().map(|p| run(p).unwrap_or_else(|e| panic!("solo {p:?}: {e}"))).collect()
}

/// What a scenario saw.
#[derive(Debug, Default)]
struct Tally {
    requests: usize,
    disconnects: usize,
    /// Answers that were not whole successes, with why.
    failures: Vec<String>,
    /// Answers that differ from the solo run, with the request.
    wrong: Vec<String>,
}

/// `num_requests` requests from `num_clients` concurrent clients, each a random probe compared
/// with its solo run; with `disconnect_one_in`, that share of requests instead opens a long
/// stream and hangs up after its first bytes (or before any).
fn hammer(
    server: &Server,
    probes: &[Probe],
    solo: &[Value],
    num_requests: usize,
    num_clients: usize,
    disconnect_one_in: Option<usize>,
) -> Tally {
    let next = AtomicUsize::new(0);
    let tally = Mutex::new(Tally::default());
    std::thread::scope(|s| {
        for _ in 0..num_clients {
            s.spawn(|| {
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    if i >= num_requests {
                        break;
                    }
                    let mut rng = Rng::new(i as u64 + 1);
                    if disconnect_one_in.is_some_and(|k| rng.below(k) == 0) {
                        hang_up(server, rng.below(2) == 0);
                        tally.lock().unwrap().disconnects += 1;
                        continue;
                    }
                    let k = rng.below(probes.len());
                    let outcome =
                        fingerprint(&probes[k], &server.post(probes[k].path, &probes[k].body));
                    let mut t = tally.lock().unwrap();
                    t.requests += 1;
                    match outcome {
                        Err(e) => t.failures.push(format!("request {i} ({:?}): {e}", probes[k])),
                        Ok(f) if f != solo[k] => {
                            t.wrong.push(format!("request {i}: {:?}", probes[k]))
                        }
                        Ok(_) => {}
                    }
                }
            });
        }
    });
    tally.into_inner().unwrap()
}

/// A client that goes away: a long stream dropped after its first bytes, or right after sending.
fn hang_up(server: &Server, after_first_bytes: bool) {
    let body = json!({"prompt": "A client that goes away", "max_tokens": 200, "ignore_eos": true,
                      "stream": true, "temperature": 0});
    let mut stream = server.send("POST", "/v1/completions", Some(&body));
    if after_first_bytes {
        let mut buf = [0u8; 64];
        let _ = stream.read(&mut buf);
    }
}

/// Waits for the engine to go idle, checks no block is held, resets the prefix cache, and
/// compares every idle gauge with `fresh`.
fn assert_back_to_idle(server: &Server, fresh: &BTreeMap<String, f64>) {
    wait_until("no request running or waiting", || {
        let m = server.metrics();
        m["routed_requests_running"] == 0.0 && m["routed_requests_waiting"] == 0.0
    });
    let m = server.metrics();
    assert_eq!(
        m["routed_kv_blocks_cached"], m["routed_kv_blocks_evictable"],
        "idle, yet some cached block is still held"
    );
    assert_eq!(server.post("/reset_prefix_cache", &json!({})).status, 200);
    let now = server.metrics();
    for gauge in IDLE_GAUGES {
        assert_eq!(now.get(gauge), fresh.get(gauge), "{gauge} after the load");
    }
}

fn report(scenario: &str, tally: &Tally) {
    println!(
        "{scenario}: {} requests, {} disconnects, {} failures, {} wrong",
        tally.requests,
        tally.disconnects,
        tally.failures.len(),
        tally.wrong.len()
    );
    assert!(tally.failures.is_empty(), "{scenario}: {:#?}", tally.failures);
    assert!(
        tally.wrong.is_empty(),
        "{scenario}: answers differ from solo runs: {:#?}",
        tally.wrong
    );
}

#[test]
fn concurrent_clients_and_disconnects_match_solo_runs() {
    let probes = probes();
    let server = Server::start(&["--num-kv-blocks", "256"]);
    let fresh = server.metrics();
    let solo = solo(&server, &probes);
    assert_back_to_idle(&server, &fresh);
    let tally = hammer(&server, &probes, &solo, 400 * scale(), 16, Some(6));
    report("concurrency and disconnects", &tally);
    assert!(tally.disconnects > 0 && tally.requests > 0);
    let hits = server.metric("routed_prefix_cache_hits_total");
    println!("  prefix-cache hits: {hits}");
    assert!(hits > 0.0, "the load hit the cache");
    assert_back_to_idle(&server, &fresh);
}

#[test]
fn a_tight_routing_cap_over_a_small_pool_preempts_and_stays_exact() {
    let probes = probes();
    let solo = solo(&Server::start(&["--num-kv-blocks", "256"]), &probes);
    // The cap holds 20 blocks' rows, so the pool gets 20 blocks: 8 sequences of up to 5 blocks
    // each must preempt.
    let cap = (20 * ROUTING_BYTES_PER_BLOCK).to_string();
    let server = Server::start(&[
        "--routing-cache-max-bytes",
        &cap,
        "--max-num-seqs",
        "8",
        "--heartbeat-ms",
        "0",
    ]);
    let fresh = server.metrics();
    assert_eq!(fresh["routed_kv_blocks_total"], 20.0, "the pool is sized by the cap");
    let tally = hammer(&server, &probes, &solo, 200 * scale(), 8, None);
    report("tight routing cap, small pool", &tally);
    let preemptions = server.metric("routed_preemptions_total");
    println!("  preemptions: {preemptions}");
    assert!(preemptions > 0.0, "the small pool preempted");
    assert_back_to_idle(&server, &fresh);
}

/// Values a fuzzed field may get: wrong types, out-of-range numbers, overflow, empty and
/// oversized strings, control characters.
fn odd_value(rng: &mut Rng) -> Value {
    let long = "x".repeat(20_000);
    let values = [
        json!(null),
        json!(true),
        json!(-1),
        json!(0),
        json!(-0.5),
        json!(1e300),
        json!(2_147_483_648u64),
        json!(u64::MAX),
        json!(""),
        json!("\u{0}\u{7f}"),
        json!(long),
        json!([]),
        json!({}),
        json!([1, "a", null]),
        json!({"role": "user"}),
        json!([[1, 2], [3]]),
        json!(["a", "b"]),
        json!(1_000_000),
    ];
    values[rng.below(values.len())].clone()
}

/// A body derived from `base`: a field replaced by an odd value, removed or added, or the
/// serialised bytes cut, corrupted or made invalid UTF-8.
fn fuzz_body(base: &Value, rng: &mut Rng) -> Vec<u8> {
    let mut v = base.clone();
    let obj = v.as_object_mut().unwrap();
    let keys: Vec<String> = obj.keys().cloned().collect();
    match rng.below(7) {
        0 => {
            let key = &keys[rng.below(keys.len())];
            obj.insert(key.clone(), odd_value(rng));
        }
        1 => {
            obj.remove(&keys[rng.below(keys.len())]);
        }
        2 => {
            let extra = [
                "n",
                "logprobs",
                "top_logprobs",
                "stop",
                "seed",
                "stream_options",
                "routed_experts_format",
                "routed_experts_start_len",
                "best_of",
                "max_completion_tokens",
                "echo",
                "sampling_params",
                "input_ids",
            ];
            obj.insert(extra[rng.below(extra.len())].into(), odd_value(rng));
        }
        3 if obj.contains_key("sampling_params") => {
            let sp = ["max_new_tokens", "temperature", "top_p", "top_k", "stop", "min_new_tokens"];
            obj["sampling_params"][sp[rng.below(sp.len())]] = odd_value(rng);
        }
        4 => {
            let bytes = v.to_string().into_bytes();
            return bytes[..rng.below(bytes.len())].to_vec();
        }
        5 => {
            let mut bytes = v.to_string().into_bytes();
            let at = rng.below(bytes.len());
            bytes[at] = [0xff, b'{', b'"', b']', 0x00, 0xc3][rng.below(6)];
            return bytes;
        }
        _ => {
            let key = &keys[rng.below(keys.len())];
            obj.insert(key.clone(), json!([odd_value(rng), odd_value(rng)]));
        }
    }
    v.to_string().into_bytes()
}

#[test]
fn fuzzed_bodies_get_a_4xx_and_never_a_5xx() {
    let bases = [
        ("/v1/completions", json!({"prompt": "The experts", "max_tokens": 4, "temperature": 0})),
        (
            "/v1/chat/completions",
            json!({"messages": [{"role": "user", "content": "Hi"}],
                                        "max_tokens": 4, "stream": true}),
        ),
        (
            "/generate",
            json!({"input_ids": [1, 2, 3],
                            "sampling_params": {"max_new_tokens": 4, "temperature": 0}}),
        ),
        ("/tokenize", json!({"prompt": "The experts"})),
        ("/detokenize", json!({"tokens": [1, 2, 3]})),
    ];
    let server = Server::start(&["--num-kv-blocks", "256", "--max-model-len", "4096"]);
    let fresh = server.metrics();
    let num_bodies = 500 * scale();
    let next = AtomicUsize::new(0);
    let bad = Mutex::new(Vec::new());
    std::thread::scope(|s| {
        for _ in 0..8 {
            s.spawn(|| {
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    if i >= num_bodies {
                        break;
                    }
                    let mut rng = Rng::new(i as u64 + 7);
                    let (path, base) = &bases[rng.below(bases.len())];
                    let body = fuzz_body(base, &mut rng);
                    let kind = ["application/json", "text/plain"][usize::from(rng.below(10) == 0)];
                    let mut stream = server.send_raw("POST", path, kind, &body);
                    let mut raw = Vec::new();
                    let _ = stream.read_to_end(&mut raw);
                    let answer = String::from_utf8_lossy(&raw);
                    let status = answer.split(' ').nth(1).and_then(|s| s.parse::<u16>().ok());
                    if status.is_none_or(|s| s >= 500) {
                        let sent = String::from_utf8_lossy(&body);
                        let sent: String = sent.chars().take(300).collect();
                        bad.lock().unwrap().push(format!("{path} {sent}\n  -> {answer:.300}"));
                    }
                }
            });
        }
    });
    let bad = bad.into_inner().unwrap();
    println!("fuzzed bodies: {num_bodies} sent, {} answered 5xx or not at all", bad.len());
    assert!(bad.is_empty(), "{} bodies got a 5xx or no answer: {bad:#?}", bad.len());
    assert_eq!(server.get("/health").status, 200);
    assert_back_to_idle(&server, &fresh);
}

/// How one request fared while the server shut down.
enum Ending {
    /// A whole success, equal (or not) to its solo run.
    Whole(bool),
    /// Refused or ended by the shutdown, as the drain promises: a 503 `shutting_down`, or an
    /// error event and `[DONE]` on a stream.
    Drained,
    /// The listener is gone.
    Refused,
    /// Anything else: cut silently, a 5xx other than the drain's, a malformed answer.
    Broken(String),
}

fn ending(probe: &Probe, solo: &Value, answer: Result<Response, String>) -> Ending {
    let r = match answer {
        Err(e) if e.starts_with("connect") => return Ending::Refused,
        Err(e) => return Ending::Broken(e),
        Ok(r) => r,
    };
    let drained = r.body.contains("shutting_down");
    match fingerprint(probe, &r) {
        Ok(f) => Ending::Whole(&f == solo),
        Err(_) if r.status == 503 && drained => Ending::Drained,
        Err(_) if r.status == 200 && drained && r.events().last() == Some(&"[DONE]") => {
            Ending::Drained
        }
        Err(e) => Ending::Broken(e),
    }
}

#[test]
fn sigterm_under_load_ends_every_request_cleanly_and_exits_zero() {
    let mut probes = probes();
    // Streams that outlive the grace period, so the drain also has requests to cut.
    probes.push(Probe {
        path: "/v1/completions",
        body: json!({"prompt": "A long rollout", "max_tokens": 6000, "ignore_eos": true,
                     "stream": true, "temperature": 0, "routed_experts_format": "list"}),
    });
    let args = ["--num-kv-blocks", "2048", "--max-model-len", "8192", "--heartbeat-ms", "0"];
    // The long stream has no solo run to compare with (Null): it is never meant to end whole.
    let mut solo = solo(&Server::start(&args), &probes[..probes.len() - 1]);
    solo.push(Value::Null);
    let mut server = Server::start(&[&args[..], &["--shutdown-grace-s", "1"]].concat());
    let done = AtomicUsize::new(0);
    let endings = Mutex::new(Vec::new());
    std::thread::scope(|s| {
        for client in 0..12 {
            let (probes, solo, done, endings, server) = (&probes, &solo, &done, &endings, &server);
            s.spawn(move || {
                let mut rng = Rng::new(1000 + client);
                loop {
                    let k = rng.below(probes.len());
                    let p = &probes[k];
                    let e = ending(p, &solo[k], server.try_request("POST", p.path, &p.body));
                    done.fetch_add(1, Ordering::Relaxed);
                    let stop = matches!(e, Ending::Drained | Ending::Refused | Ending::Broken(_));
                    endings.lock().unwrap().push((k, e));
                    if stop {
                        break;
                    }
                }
            });
        }
        wait_until("some requests under load", || done.load(Ordering::Relaxed) >= 24 * scale());
        server.sigterm();
    });
    let status = server.wait_exit();
    assert!(status.success(), "exit status {status}: {:#?}", server.log());
    let endings = endings.into_inner().unwrap();
    let count = |f: fn(&Ending) -> bool| endings.iter().filter(|(_, e)| f(e)).count();
    let broken: Vec<_> = endings
        .iter()
        .filter_map(|(k, e)| match e {
            Ending::Broken(why) => Some(format!("{:?}: {why}", probes[*k])),
            _ => None,
        })
        .collect();
    let wrong: Vec<_> = endings
        .iter()
        .filter(|(k, e)| matches!(e, Ending::Whole(false)) && solo[*k] != Value::Null)
        .map(|(k, _)| &probes[*k])
        .collect();
    println!(
        "sigterm under load: {} whole, {} drained, {} refused, {} broken",
        count(|e| matches!(e, Ending::Whole(_))),
        count(|e| matches!(e, Ending::Drained)),
        count(|e| matches!(e, Ending::Refused)),
        broken.len()
    );
    assert!(broken.is_empty(), "{broken:#?}");
    assert!(wrong.is_empty(), "whole answers that differ from solo runs: {wrong:#?}");
    assert!(count(|e| matches!(e, Ending::Drained)) > 0, "the drain ended some requests");
}
