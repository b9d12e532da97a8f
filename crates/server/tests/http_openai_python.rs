//! The official `openai` Python client against the gateway: completions, chat, streaming and
//! routing requested through `extra_body`, decoded with numpy (`tests/openai_client.py`).
//!
//! Uses `$ROUTED_PYTHON`, else `python3`. Without `openai` or `numpy` the test says so and
//! skips, except under `CI=true`, where it fails.

mod common;

use std::path::PathBuf;
use std::process::Command;

use common::server;

#[test]
fn the_openai_python_client_reads_completions_chat_streams_and_routing() {
    let in_ci = std::env::var("CI").is_ok_and(|v| v == "true");
    let python = std::env::var("ROUTED_PYTHON").unwrap_or_else(|_| "python3".to_owned());
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/openai_client.py");
    let s = server("tiny_hybrid_default");
    let output = Command::new(&python)
        .arg(&script)
        .arg(format!("http://{}", s.addr))
        .arg("tiny_hybrid_default")
        .output();
    let output = match output {
        Ok(output) => output,
        Err(err) if !in_ci => {
            eprintln!("SKIP openai client test: cannot run {python}: {err}");
            return;
        }
        Err(err) => panic!("CI=true but {python} cannot run: {err}"),
    };
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    if output.status.code() == Some(3) {
        assert!(!in_ci, "CI=true but {python} lacks a package: {stdout}");
        eprintln!("SKIP openai client test: {python}: {}", stdout.trim());
        return;
    }
    assert!(output.status.success(), "openai client failed:\n{stdout}\n{stderr}");
    assert!(stdout.contains("openai client agrees"), "{stdout}");
}
