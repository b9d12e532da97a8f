//! The Python scripts of `tests/` (the official `openai` client, the RL frameworks' routing
//! readers), run from Rust tests.

use std::path::PathBuf;

/// The repository root.
pub fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// Runs the Python script `tests/<script>` with `args` under `$ROUTED_PYTHON` (else `python3`)
/// and returns its stdout once it succeeded. Returns `None`, saying why, when the interpreter or
/// a package (exit code 3) is missing: the caller skips, except under `CI=true`, where that fails.
pub fn run_python(script: &str, args: &[String]) -> Option<String> {
    let in_ci = std::env::var("CI").is_ok_and(|v| v == "true");
    let python = std::env::var("ROUTED_PYTHON").unwrap_or_else(|_| "python3".to_owned());
    let path = repo_root().join("tests").join(script);
    let output = match std::process::Command::new(&python).arg(&path).args(args).output() {
        Ok(output) => output,
        Err(err) if !in_ci => {
            eprintln!("SKIP {script}: cannot run {python}: {err}");
            return None;
        }
        Err(err) => panic!("CI=true but {python} cannot run: {err}"),
    };
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&output.stderr);
    if output.status.code() == Some(3) {
        assert!(!in_ci, "CI=true but {python} lacks a package: {stdout}");
        eprintln!("SKIP {script}: {python}: {}", stdout.trim());
        return None;
    }
    assert!(output.status.success(), "{script} failed:\n{stdout}\n{stderr}");
    Some(stdout)
}
