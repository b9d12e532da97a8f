#!/usr/bin/env python3
"""routed, llama.cpp and (optionally) transformers on the same checkpoints, interleaved in one run.

    python3 benches/side_by_side.py [--rounds 5] [--hf-python $BENCH_PYTHON] [--out DIR]
        [--routed-variant bf16="--matmul-precision bf16"]

Each round runs every engine once over every model and scenario (one measured run each, after
each tool's own warm-up), rotating which engine goes first, so that a change in the machine's
load during the run falls on all engines alike. The table gives each engine's median over the
rounds and routed's ratio to each baseline per round (routed's run of round r over the
baseline's run of round r), then the median of those ratios.

Scenarios (those of benches/benchlib.py): pp512 (a 512-token prompt at batch 1) and tg_bB (decode
of 64 steps after a 16-token prompt per sequence, B sequences, the decode steps timed).

- routed: `routed bench throughput` (its tg_bB records time the decode steps) and `routed bench
  prefix-hit` (its pp512 record is the cold prefill, through the whole engine); each
  --routed-variant NAME=FLAGS adds one more routed engine, run with those flags, named
  `routed NAME` in the table (ratios are given for every routed engine).
- llama.cpp: its own programs, through benches/llamacpp_tools.py: `llama-bench -p 512 -n 64`
  (pp512, and tg64 as tg_b1) and `llama-batched-bench -npp 16 -ntg 64 -npl B` (tg_bB, B > 1).
- llama.cpp-py (with --llama-python): the same library through its Python bindings driven by
  benches/llamacpp_baseline.py, the figures earlier versions of docs/performance.md quoted.
- transformers (with --hf-python): benches/hf_baseline.py.

Needs: `cargo build --release`, the checkpoints (make_bench_models.py), the GGUFs and llama.cpp's
programs (setup_llamacpp.sh), and the Pythons of the optional baselines.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def routed_cmds(args, model, out, extra):
    binary = os.path.join(REPO, "target", "release", "routed")
    model_dir = os.path.join(args.models_dir, model)
    common = ["--model", model_dir, "--num-kv-blocks", "8192", "--threads", str(args.threads), *extra]
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


def tools_cmd(args, out):
    return [sys.executable, os.path.join(REPO, "benches", "llamacpp_tools.py"), "--models", *args.models,
            "--threads", str(args.threads), "--prefill", str(args.prefill), "--decode", str(args.decode),
            "--decode-prompt", str(args.decode_prompt), "--batches", *map(str, args.batches), "--json", out]


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
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--prefill", type=int, default=512)
    ap.add_argument("--decode", type=int, default=64)
    ap.add_argument("--decode-prompt", type=int, default=16)
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 8, 64])
    ap.add_argument("--routed-variant", action="append", default=[], metavar="NAME=FLAGS",
                    help="one more routed engine, run with FLAGS (repeatable)")
    ap.add_argument("--hf-python", help="Python with torch + transformers (no transformers runs without it)")
    ap.add_argument("--hf-dtypes", nargs="+", default=["bf16"], choices=["bf16", "f32"])
    ap.add_argument("--llama-python", help="the llama-cpp-python venv's Python (no binding runs without it)")
    ap.add_argument("--out", default=os.path.join(REPO, "target", "bench", "side_by_side"))
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)

    variants = {"routed": []}
    for v in args.routed_variant:
        name, _, flags = v.partition("=")
        variants[f"routed {name}"] = flags.split()
    engines = [*variants, "llama.cpp"] + (["llama.cpp-py"] if args.llama_python else []) + \
        (["transformers"] if args.hf_python else [])
    # (engine, dtype, model, scenario) -> {round: tokens/s}
    runs = {}
    for r in range(args.rounds):
        order = engines[r % len(engines):] + engines[:r % len(engines)]
        for engine in order:
            out = os.path.join(args.out, f"round{r}_{engine.replace(' ', '_')}")
            if engine in variants:
                files = []
                for model in args.models:
                    for cmd in routed_cmds(args, model, f"{out}_{model}", variants[engine]):
                        run(cmd)
                    files += [f"{out}_{model}.tg.json", f"{out}_{model}.pp.json"]
            elif engine == "llama.cpp":
                run(tools_cmd(args, out + ".json"))
                files = [out + ".json"]
            elif engine == "llama.cpp-py":
                run(baseline_cmd(args.llama_python, "llamacpp_baseline.py", args, args.models, out + ".json"))
                files = [out + ".json"]
            else:
                run(baseline_cmd(args.hf_python, "hf_baseline.py", args, args.models, out + ".json",
                                 ["--dtypes", *args.hf_dtypes]))
                files = [out + ".json"]
            for path in files:
                for rec in load(path):
                    name = engine if engine in variants or engine == "llama.cpp-py" else rec["engine"]
                    key = (name, rec["dtype"], rec["model"], rec["scenario"])
                    runs.setdefault(key, {})[r] = rec["tokens_per_s"]

    medians = {k: statistics.median(v.values()) for k, v in runs.items()}
    summary = [{"engine": e, "dtype": d, "model": m, "scenario": s, "tokens_per_s": round(medians[e, d, m, s], 2),
                "runs": [round(v, 2) for _, v in sorted(runs[e, d, m, s].items())]} for (e, d, m, s) in runs]
    with open(os.path.join(args.out, "summary.json"), "w", encoding="utf-8") as f:
        json.dump(summary, f, indent=2)
        f.write("\n")

    ours = sorted({(e, d) for (e, d, _, _) in runs if e in variants}, key=lambda k: list(variants).index(k[0]))
    baselines = sorted({(e, d) for (e, d, _, _) in runs if e not in variants})
    print()
    print(f"{args.rounds} interleaved rounds; tokens/s are medians; a ratio is routed / baseline per round, "
          "then the median of the rounds' ratios")
    cols = [f"{e} {d}" for e, d in ours + baselines]
    pairs = [(o, b) for o in ours for b in baselines]
    print("| model | scenario | " + " | ".join(cols) + " | " +
          " | ".join(f"{o[0]} / {b[0]}: median (per round)" for o, b in pairs) + " |")
    print("|" + " --- |" * (2 + len(cols) + len(pairs)))
    for model in args.models:
        scenarios = sorted({s for (e, _, m, s) in runs if m == model},
                           key=lambda s: (not s.startswith("pp"), int(s.split("_b")[-1]) if "_b" in s else 0))
        for s in scenarios:
            cells = [f"{medians[e, d, model, s]:,.1f}" if (e, d, model, s) in medians else ""
                     for e, d in ours + baselines]
            ratios = []
            for o, b in pairs:
                mine, theirs = runs.get((*o, model, s), {}), runs.get((*b, model, s), {})
                per_round = [mine[r] / theirs[r] for r in sorted(mine) if r in theirs]
                ratios.append(f"{statistics.median(per_round):.2f} ({', '.join(f'{x:.2f}' for x in per_round)})"
                              if per_round else "")
            print(f"| {model} | {s} | " + " | ".join(cells + ratios) + " |")

if __name__ == "__main__":
    main()
