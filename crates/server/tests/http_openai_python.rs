//! The official `openai` Python client against the gateway: completions, chat, streaming and
//! routing requested through `extra_body`, decoded with numpy (`tests/openai_client.py`).
//!
//! Uses `$ROUTED_PYTHON`, else `python3`. Without `openai` or `numpy` the test says so and
//! skips, except under `CI=true`, where it fails.

mod common;

use common::server;
use routed_test_support::run_python;

#[test]
fn the_openai_python_client_reads_completions_chat_streams_and_routing() {
    let s = server("tiny_hybrid_default");
    let args = [format!("http://{}", s.addr), "tiny_hybrid_default".to_owned()];
    if let Some(stdout) = run_python("openai_client.py", &args) {
        assert!(stdout.contains("openai client agrees"), "{stdout}");
    }
}
