"""Runs the routing-reading lines docs/api.md shows for RL trainers against a running gateway.

Usage: rl_clients.py BASE_URL MODEL CHECKPOINT_DIR API_MD

Each snippet in API_MD that follows an `<!-- rl-client: NAME -->` marker is executed as written,
with `client` (an `openai.OpenAI`), `base_url`, `model`, `prompt_ids` and `hf_config` (the
checkpoint's config.json, where trainers read `num_hidden_layers` and `num_experts_per_tok`) in
scope, and must leave the decoded routing in `routed`. The arrays must have the decoder-layer
shape, agree with each other, hold distinct valid ids in the MoE layers and zeros elsewhere, and
agree with the compact `routed_experts_layers: "moe"` layout.

Run by crates/server/tests/http_rl_clients_python.rs, which starts the server. Exits 3 when a
package is missing (the Rust test then skips, unless CI=true).
"""

import base64
import importlib
import io
import json
import os
import re
import sys

try:
    import numpy as np
    import openai

    importlib.import_module("requests")  # the clients' snippets import it
except ImportError as err:  # pragma: no cover - depends on the environment
    print(f"missing python package: {err}")
    sys.exit(3)

CLIENTS = ("vllm", "verl", "slime", "sglang-openai")


def snippets(api_md):
    """The python block after each `<!-- rl-client: NAME -->` marker, by name."""
    text = open(api_md, encoding="utf-8").read()
    found = dict(re.findall(r"<!-- rl-client: ([\w-]+) -->\s*```python\n(.*?)```", text, re.S))
    missing = [name for name in CLIENTS if name not in found]
    assert not missing, f"{api_md} lacks the snippets {missing}"
    return found


def check_layout(routed, rows, hf_config, routing, name):
    """The decoder-layer layout: MoE layers hold distinct ids below num_experts, others 0."""
    layers, top_k = hf_config["num_hidden_layers"], hf_config["num_experts_per_tok"]
    assert routed.shape == (rows, layers, top_k), (name, routed.shape, rows, layers, top_k)
    moe = routing["moe_layer_ids"]
    dense = [i for i in range(layers) if i not in moe]
    assert (routed[:, dense] == 0).all(), (name, "non-MoE layers must hold vLLM's zeros")
    assert ((routed[:, moe] >= 0) & (routed[:, moe] < routing["num_experts"])).all(), name
    for ids in routed[:, moe].reshape(-1, top_k):
        assert len(set(ids.tolist())) == top_k, (name, ids)


def main():
    base_url, model, checkpoint, api_md = sys.argv[1:5]
    client = openai.OpenAI(base_url=base_url + "/v1", api_key="unused", max_retries=0, timeout=60)
    with open(os.path.join(checkpoint, "config.json"), encoding="utf-8") as f:
        hf_config = json.load(f)
    routing = client.models.list().data[0].model_dump()["routing"]
    assert routing["num_layers"] == hf_config["num_hidden_layers"], (routing, hf_config)
    assert routing["top_k"] == hf_config["num_experts_per_tok"], routing
    prompt_ids = [10 + (i * 53) % 400 for i in range(21)]

    # The reference: token ids and the compact layout, from the same greedy request.
    reference = client.completions.create(
        model=model, prompt=prompt_ids, max_tokens=8, temperature=0,
        extra_body={"return_token_ids": True, "routed_experts_layers": "moe"},
    ).model_dump()
    choice = reference["choices"][0]
    rows = len(prompt_ids) + len(choice["token_ids"]) - 1
    compact = np.load(io.BytesIO(base64.b64decode(choice["routed_experts"])))
    assert reference["routed_experts_meta"]["layers"] == "moe"

    arrays = {}
    for name, code in snippets(api_md).items():
        scope = {"client": client, "base_url": base_url, "model": model,
                 "prompt_ids": list(prompt_ids), "hf_config": hf_config}
        exec(compile(code, f"{api_md}:{name}", "exec"), scope)
        routed = np.asarray(scope["routed"]).astype(np.int64)
        check_layout(routed, rows, hf_config, routing, name)
        assert (routed[:, routing["moe_layer_ids"]] == compact).all(), (name, "vs moe layout")
        if name == "slime":
            for layer_id, replayed in scope["replay"].items():
                assert (np.asarray(replayed) == routed[:, layer_id]).all(), layer_id
            assert sorted(scope["replay"]) == routing["moe_layer_ids"]
        if name == "verl":
            assert scope["response_ids"] == choice["token_ids"], scope["response_ids"]
        arrays[name] = routed
    first = arrays[CLIENTS[0]]
    for name, routed in arrays.items():
        assert (routed == first).all(), f"{name} reads other rows than {CLIENTS[0]}"
    print(f"rl clients agree: {', '.join(arrays)} on {model} {first.shape}")


if __name__ == "__main__":
    main()
