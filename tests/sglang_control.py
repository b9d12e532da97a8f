"""Drives a running gateway the way RL trainers drive SGLang's server between rollout steps, with
`requests`, and checks what they read back.

Usage: sglang_control.py BASE_URL NEW_POLICY_DIR

The calls are the trainers': slime's wait for a healthy server (`/health_generate`, then
`/flush_cache` until it answers 200) and its partial-rollout abort (`/abort_request` with
`abort_all`, the aborted `/generate` answers keeping their tokens, logprobs and routing), then a
weight sync around requests in flight (`/pause_generation`, `/update_weights_from_disk`,
`/continue_generation`, `/get_weight_version`), then a colocated training step's memory calls as
slime makes them (`/flush_cache`, `/release_memory_occupation`, `/resume_memory_occupation` of
the weights, the update, then of the KV cache).

Run by crates/server/tests/http_sglang_control_python.rs, which starts the server. Exits 3 when a
package is missing (the Rust test then skips, unless CI=true).
"""

import sys
import threading
import time

try:
    import requests
except ImportError as err:  # pragma: no cover - depends on the environment
    print(f"missing python package: {err}")
    sys.exit(3)

PROMPT = [10 + (i * 37) % 300 for i in range(19)]


def metric(base, name):
    """A gauge from /metrics (the scrape reads the engine's figures first)."""
    for line in requests.get(f"{base}/metrics", timeout=30).text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    raise AssertionError(f"/metrics lacks {name}")


def wait_for(what, done, timeout=60.0):
    deadline = time.monotonic() + timeout
    while not done():
        assert time.monotonic() < deadline, f"still waiting for {what}"
        time.sleep(0.01)


def rollout_payload(max_new_tokens, seed):
    """A /generate body as slime's rollout posts it (sampled, logprobs and routing returned)."""
    return {
        "input_ids": PROMPT,
        "sampling_params": {
            "temperature": 1.0, "top_p": 1.0, "top_k": -1, "max_new_tokens": max_new_tokens,
            "ignore_eos": True, "skip_special_tokens": False, "no_stop_trim": True,
            "spaces_between_special_tokens": False, "sampling_seed": seed,
        },
        "return_logprob": True,
        "return_routed_experts": True,
    }


def in_background(base, payloads):
    """Posts each payload to /generate on its own thread; returns the threads and the answers."""
    answers = [None] * len(payloads)

    def post(i):
        answers[i] = requests.post(f"{base}/generate", json=payloads[i], timeout=120).json()

    threads = [threading.Thread(target=post, args=(i,)) for i in range(len(payloads))]
    for t in threads:
        t.start()
    return threads, answers


def check_sample(out, finishes, versions):
    """What slime keeps of a sample: tokens, their logprobs and routing rows, all consistent, and
    which of `versions` (in this order) sampled its tokens."""
    meta = out["meta_info"]
    assert meta["finish_reason"]["type"] in finishes, meta["finish_reason"]
    tokens = out["output_ids"]
    assert len(tokens) == meta["completion_tokens"] == len(meta["output_token_logprobs"]), meta
    assert [t[1] for t in meta["output_token_logprobs"]] == tokens
    rows = meta["routed_experts_shape"][0]
    assert rows == len(PROMPT) + len(tokens) - 1, (rows, len(tokens))
    spans = meta["weight_versions"]
    assert [s["start"] for s in spans] == [0] + [s["end"] for s in spans[:-1]], spans
    assert spans[-1]["end"] == len(tokens), (spans, len(tokens))
    names = [s["version"] for s in spans]
    assert names == [v for v in versions if v in names], (names, versions)
    assert meta["weight_version"] == names[-1], meta["weight_version"]


def main():
    base, new_policy = sys.argv[1:3]
    with requests.Session() as session:
        # slime's _wait_server_healthy.
        assert session.get(f"{base}/health_generate", timeout=30).status_code == 200
        assert session.get(f"{base}/flush_cache", timeout=30).status_code == 200
    version = requests.get(f"{base}/get_weight_version", timeout=30).json()["weight_version"]

    # Partial rollout: enough samples collected, the rest are aborted and kept as they are.
    threads, answers = in_background(base, [rollout_payload(4000, s) for s in range(3)])
    wait_for("3 requests running", lambda: metric(base, "routed_requests_running") == 3)
    r = requests.post(f"{base}/abort_request", json={"abort_all": True}, timeout=30)
    assert r.status_code == 200, r.text
    for t in threads:
        t.join()
    for out in answers:
        check_sample(out, ("abort",), (version,))
        assert 0 < out["meta_info"]["completion_tokens"] < 4000

    # Weight sync with a request in flight: pause, update from disk, continue.
    threads, answers = in_background(base, [rollout_payload(4000, 7)])
    wait_for("the request running", lambda: metric(base, "routed_requests_running") == 1)
    r = requests.post(f"{base}/pause_generation", json={"mode": "retract"}, timeout=60)
    assert r.status_code == 200 and r.json()["status"] == "ok", r.text
    r = requests.post(
        f"{base}/update_weights_from_disk",
        json={"model_path": new_policy, "weight_version": "step-1", "flush_cache": True},
        timeout=120,
    )
    assert r.status_code == 200 and r.json()["success"], r.text
    assert requests.post(f"{base}/continue_generation", json={}, timeout=30).status_code == 200
    wait_for("the request resumed", lambda: metric(base, "routed_requests_running") == 1)
    assert requests.post(f"{base}/abort_request", json={"abort_all": True}).status_code == 200
    threads[0].join()
    # Resumed on the new weights: aborted, or (had it raced the abort) finished; its tokens from
    # before the pause are the old weights', any after it the new ones'.
    check_sample(answers[0], ("abort", "length"), (version, "step-1"))
    after = requests.post(f"{base}/generate", json=rollout_payload(4, 1), timeout=60).json()
    check_sample(after, ("length",), ("step-1",))
    got = requests.get(f"{base}/get_weight_version", timeout=30).json()
    assert got == {"weight_version": "step-1"}, got

    # A colocated training step: the memory goes to the trainer and comes back, weights first.
    while requests.get(f"{base}/flush_cache", timeout=30).status_code != 200:
        time.sleep(0.05)
    r = requests.post(f"{base}/release_memory_occupation", json={}, timeout=60)
    assert r.status_code == 200 and r.json()["num_bytes"] > 0, r.text
    r = requests.post(f"{base}/resume_memory_occupation", json={"tags": ["weights"]}, timeout=120)
    assert r.status_code == 200 and r.json()["released"] == ["kv_cache"], r.text
    r = requests.post(
        f"{base}/update_weights_from_disk",
        json={"model_path": new_policy, "weight_version": "step-2"},
        timeout=120,
    )
    assert r.status_code == 200 and r.json()["success"], r.text
    r = requests.post(f"{base}/resume_memory_occupation", json={"tags": ["kv_cache"]}, timeout=60)
    assert r.status_code == 200 and r.json()["released"] == [], r.text
    again = requests.post(f"{base}/generate", json=rollout_payload(4, 1), timeout=60).json()
    check_sample(again, ("length",), ("step-2",))
    assert again["output_ids"] == after["output_ids"], "the same policy, the same tokens"
    print("sglang controls: ok")


if __name__ == "__main__":
    main()
