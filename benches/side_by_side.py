#!/usr/bin/env python3
"""routed, llama.cpp and transformers on the same checkpoints, interleaved in one run.

    python3 benches/side_by_side.py --hf-python $BENCH_PYTHON [--rounds 3] [--out DIR]

Each round runs every engine once over every model and scenario (one measured run each, after
the scripts' own warm-up), rotating which engine goes first, so that a change in the machine's
load during the run falls on all engines alike. The figure per engine and scenario is the median
over the rounds; the table puts routed's figure over each baseline's, from the same run.

Scenarios (those of benches/benchlib.py): pp512 (a 512-token prompt at batch 1) and tg_bB (greedy
decode of 64 steps after a 16-token prompt per sequence, B sequences, the decode steps timed).
routed runs `routed bench throughput` (its tg_bB records time the same steps) and
`routed bench prefix-hit` (its pp512 record is the cold prefill).

Needs: `cargo build --release`, the checkpoints (make_bench_models.py), the GGUFs and the
llama.cpp venv (setup_llamacpp.sh), and a Python with torch and transformers for the
transformers runs.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def routed_cmds(args, model, out):
    binary = os.path.join(REPO, "target", "release", "routed")
    model_dir = os.path.join(args.models_dir, model)
    common = ["--model", model_dir, "--num-kv-blocks", "8192", "--threads", str(args.threads)]
    batches = ",".join(str(b) for b in args.batches)
    return [
        [binary, "bench", "throughput", *common, "--batch-sizes", batches, "--prompt-len",
         str(args.decode_prompt), "--output-len", str(args.decode + 1), "--repeats", "1",
         "--json", out + ".tg.json"],
        [binary, "bench", "prefix-hit", *common, "--prompt-len", str(args.prefill), "--repeats", "1",
         "--json", out + ".pp.json"],
    ]


def baseline_cmd(python, script, args, models, out, extra=()):
    return [python, os.path.join(REPO, "benches", script), "--models", *models, "--runs", "1",
            "--threads", str(args.threads), "--prefill", str(args.prefill), "--decode", str(args.decode),
            "--decode-prompt", str(args.decode_prompt), "--batches", *map(str, args.batches),
            "--json", out, *extra]


def run(cmd):
    print("+", " ".join(cmd), flush=True)
    done = subprocess.run(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if done.returncode != 0:
        sys.exit(f"failed ({done.returncode}):\n{done.stdout[-4000:]}")


def load(path):
    if not os.path.exists(path):
        return []
    with open(path, encoding="utf-8") as f:
        return [r for r in json.load(f) if "tokens_per_s" in r and r["scenario"].startswith(("pp", "tg_"))]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models-dir", default=os.path.join(REPO, "target", "bench-models"))
    ap.add_argument("--models", nargs="+", default=["qwen3_moe", "nemotron_h"])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--prefill", type=int, default=512)
    ap.add_argument("--decode", type=int, default=64)
    ap.add_argument("--decode-prompt", type=int, default=16)
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 8, 32, 64])
    ap.add_argument("--hf-python", help="Python with torch + transformers (no transformers runs without it)")
    ap.add_argument("--hf-dtypes", nargs="+", default=["bf16"], choices=["bf16", "f32"])
    ap.add_argument("--llama-python", default=os.path.join(REPO, "target", "bench", "llamacpp-venv", "bin", "python"))
    ap.add_argument("--out", default=os.path.join(REPO, "target", "bench", "side_by_side"))
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)

    engines = ["routed", "llama.cpp"] + (["transformers"] if args.hf_python else [])
    files = []
    for r in range(args.rounds):
        order = engines[r % len(engines):] + engines[:r % len(engines)]
        for engine in order:
            out = os.path.join(args.out, f"round{r}_{engine}")
            if engine == "routed":
                for model in args.models:
                    for cmd in routed_cmds(args, model, f"{out}_{model}"):
                        run(cmd)
                    files += [f"{out}_{model}.tg.json", f"{out}_{model}.pp.json"]
            elif engine == "llama.cpp":
                run(baseline_cmd(args.llama_python, "llamacpp_baseline.py", args, args.models, out + ".json"))
                files.append(out + ".json")
            else:
                run(baseline_cmd(args.hf_python, "hf_baseline.py", args, args.models, out + ".json",
                                 ["--dtypes", *args.hf_dtypes]))
                files.append(out + ".json")

    runs = {}
    for path in files:
        for rec in load(path):
            key = (rec["engine"], rec["dtype"], rec["model"], rec["scenario"])
            runs.setdefault(key, []).append(rec["tokens_per_s"])
    medians = {k: statistics.median(v) for k, v in runs.items()}
    summary = [{"engine": e, "dtype": d, "model": m, "scenario": s, "tokens_per_s": round(medians[e, d, m, s], 2),
                "runs": [round(x, 2) for x in runs[e, d, m, s]]} for (e, d, m, s) in runs]
    with open(os.path.join(args.out, "summary.json"), "w", encoding="utf-8") as f:
        json.dump(summary, f, indent=2)
        f.write("\n")

    baselines = sorted({(e, d) for (e, d, _, _) in runs if e != "routed"})
    header = "| model | scenario | routed | " + " | ".join(f"{e} {d}" for e, d in baselines)
    header += " | " + " | ".join(f"routed / {e} {d}" for e, d in baselines) + " |"
    print()
    print(f"medians of {args.rounds} interleaved rounds, tokens/s")
    print(header)
    print("|" + " --- |" * (2 + 2 * len(baselines) + 1))
    for model in args.models:
        scenarios = sorted({s for (e, _, m, s) in runs if m == model},
                           key=lambda s: (not s.startswith("pp"), int(s.split("_b")[-1]) if "_b" in s else 0))
        for s in scenarios:
            ours = medians.get(("routed", "f32", model, s))
            cells = [f"{medians[e, d, model, s]:,.1f}" if (e, d, model, s) in medians else "" for e, d in baselines]
            ratios = [f"{ours / medians[e, d, model, s]:.2f}" if ours and (e, d, model, s) in medians else ""
                      for e, d in baselines]
            print(f"| {model} | {s} | {ours:,.1f} | " + " | ".join(cells + ratios) + " |" if ours else
                  f"| {model} | {s} | | " + " | ".join(cells + ratios) + " |")


if __name__ == "__main__":
    main()
