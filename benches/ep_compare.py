#!/usr/bin/env python3
"""routed with several expert-parallel sizes, interleaved in one run.

    python3 benches/ep_compare.py [--sizes 1 2] [--rounds 5] [--models qwen3_moe nemotron_h]

Each round runs `routed bench throughput` (decode at each batch size) and `routed bench
prefix-hit` (its cold prefill is pp512) once per size, rotating which size goes first, so that a
change in the machine's load falls on every size alike. It prints, per model and scenario, each
size's median tokens/s, the per-round ratios to the first size and their median, and the share of
step time the ranks spent waiting at barriers and exchanging expert outputs (summed over ranks).

Needs `cargo build --release` and the checkpoints of make_bench_models.py.
"""

import argparse
import json
import os
import statistics
import subprocess

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run_size(args, model, size, out):
    binary = os.path.join(REPO, "target", "release", "routed")
    common = ["--model", os.path.join(args.models_dir, model), "--num-kv-blocks", "8192",
              "--threads", str(args.threads), "--expert-parallel-size", str(size)]
    batches = ",".join(str(b) for b in args.batches)
    cmds = [
        [binary, "bench", "throughput", *common, "--batch-sizes", batches, "--prompt-len", "16",
         "--output-len", "65", "--repeats", "1", "--json", out + ".tg.json"],
        [binary, "bench", "prefix-hit", *common, "--prompt-len", "512", "--repeats", "1",
         "--json", out + ".pp.json"],
    ]
    records = []
    for cmd in cmds:
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
        with open(cmd[-1]) as f:
            records += json.load(f)
    return {r["scenario"]: r for r in records if r["scenario"].startswith(("tg_b", "pp"))}


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sizes", type=int, nargs="+", default=[1, 2])
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--models", nargs="+", default=["qwen3_moe", "nemotron_h"])
    p.add_argument("--models-dir", default=os.path.join(REPO, "target", "bench-models"))
    p.add_argument("--batches", type=int, nargs="+", default=[1, 8, 64])
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--out", default=os.path.join(REPO, "target", "bench", "ep"))
    args = p.parse_args()
    os.makedirs(args.out, exist_ok=True)
    # results[model][size] = list of {scenario: record}, one per round
    results = {m: {s: [] for s in args.sizes} for m in args.models}
    for rnd in range(args.rounds):
        order = args.sizes[rnd % len(args.sizes):] + args.sizes[:rnd % len(args.sizes)]
        for model in args.models:
            for size in order:
                out = os.path.join(args.out, f"r{rnd}-{model}-ep{size}")
                results[model][size].append(run_size(args, model, size, out))
                print(f"round {rnd + 1}/{args.rounds} {model} ep={size} done", flush=True)
    summary = []
    base = args.sizes[0]
    for model in args.models:
        for scenario in sorted(results[model][base][0]):
            row = {"model": model, "scenario": scenario}
            for size in args.sizes:
                rounds = results[model][size]
                rates = [r[scenario]["tokens_per_s"] for r in rounds]
                row[f"ep{size}_tokens_per_s"] = statistics.median(rates)
                for key in ("collective_wait_share", "collective_exchange_share"):
                    shares = [r[scenario].get(key) for r in rounds if r[scenario].get(key) is not None]
                    if shares:
                        row[f"ep{size}_{key}"] = statistics.median(shares)
                if size != base:
                    ratios = [a[scenario]["tokens_per_s"] / b[scenario]["tokens_per_s"]
                              for a, b in zip(rounds, results[model][base])]
                    row[f"ep{size}_over_ep{base}_rounds"] = ratios
                    row[f"ep{size}_over_ep{base}"] = statistics.median(ratios)
            summary.append(row)
    with open(os.path.join(args.out, "summary.json"), "w") as f:
        json.dump(summary, f, indent=2)
    print(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()
