#!/usr/bin/env python3
"""Reference logits of the golden checkpoints computed by transformers in bfloat16, for the
tolerance of routed's bf16 matmul precision (`tests/golden_bf16.rs`).

    python tests/golden/make_golden_bf16.py        # from the repository root; same venv as make_golden.py

For each family it loads `<arch>/model` with dtype=torch.bfloat16 (weights and every activation
in bf16, eager attention and experts, one CPU thread), runs one forward over the `main` and
`long` prompts of `golden.safetensors`, and writes their logits (as f32) to
`<arch>/golden_bf16.safetensors`, named `<case>.logits`, with `golden_bf16.json` beside it
(versions, and the sha256 of the checkpoint and prompts it read). It never touches the f32
goldens.
"""

import hashlib
import json
import os
import sys

import safetensors
import torch
import transformers
from safetensors.torch import load_file, save_file
from transformers import AutoModelForCausalLM

ROOT = os.path.dirname(os.path.abspath(__file__))
ARCHS = ["qwen3_moe", "mixtral", "nemotron_h", "granitemoehybrid"]
CASES = ["main", "long"]


def sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def main():
    torch.set_num_threads(1)
    torch.manual_seed(0)
    for arch in ARCHS:
        d = os.path.join(ROOT, arch)
        golden = load_file(os.path.join(d, "golden.safetensors"))
        model = AutoModelForCausalLM.from_pretrained(
            os.path.join(d, "model"), dtype=torch.bfloat16, attn_implementation="eager",
            experts_implementation="eager")
        model.eval()
        out = {}
        for case in CASES:
            ids = golden[f"{case}.prompt_ids"].to(torch.long).reshape(1, -1)
            with torch.no_grad():
                logits = model(input_ids=ids, use_cache=False).logits[0]
            out[f"{case}.logits"] = logits.to(torch.float32).contiguous()
            ref = golden[f"{case}.logits"]
            print(f"{arch}/{case}: max |bf16 - f32| = {(out[f'{case}.logits'] - ref).abs().max().item():.4g}")
        path = os.path.join(d, "golden_bf16.safetensors")
        save_file(out, path)
        meta = {
            "what": "logits of one forward over each case's prompt, transformers in bfloat16",
            "compute": "dtype=torch.bfloat16, attn_implementation=eager, experts_implementation=eager, 1 CPU thread",
            "cases": CASES,
            "versions": {"python": sys.version.split()[0], "torch": torch.__version__,
                         "transformers": transformers.__version__, "safetensors": safetensors.__version__},
            "inputs": {rel: sha256(os.path.join(d, rel))
                       for rel in ["golden.safetensors", "model/model.safetensors", "model/config.json"]},
            "sha256": sha256(path),
        }
        with open(os.path.join(d, "golden_bf16.json"), "w", encoding="utf-8") as f:
            json.dump(meta, f, indent=2)
            f.write("\n")


if __name__ == "__main__":
    main()
