//! The calls RL trainers make on SGLang's server between rollout steps, made as they make them,
//! in Python with `requests` (`tests/sglang_control.py`), against a live server on the embedded
//! hybrid: slime's wait for a healthy server and its partial-rollout abort, then a weight sync
//! around a request in flight (pause, update from disk, continue).
//!
//! Uses `$ROUTED_PYTHON`, else `python3`. Without `requests` the test says so and skips, except
//! under `CI=true`, where it fails.

mod common;

use common::{TestServer, checkpoint, test_config};
use routed_test_support::{run_python, write_other_policy};

const MODEL: &str = "tiny_hybrid_default";

#[test]
fn rl_trainers_drive_the_server_between_rollout_steps() {
    // Its own server: the script pauses generation and swaps the weights.
    let s = TestServer::start(test_config(MODEL));
    let new = tempfile::tempdir().expect("a temporary directory");
    write_other_policy(&checkpoint(MODEL), new.path());
    let args = [format!("http://{}", s.addr), new.path().display().to_string()];
    if let Some(stdout) = run_python("sglang_control.py", &args) {
        assert!(stdout.contains("sglang controls: ok"), "{stdout}");
    }
}
