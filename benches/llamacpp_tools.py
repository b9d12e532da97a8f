#!/usr/bin/env python3
"""llama.cpp measured with its own benchmark programs, `llama-bench` and `llama-batched-bench`,
built from the same llama-cpp-python source tree by benches/setup_llamacpp.sh (see
benches/README.md).

    python3 benches/llamacpp_tools.py [--models qwen3_moe nemotron_h] [--threads 2]
        [--batches 1 8 64] [--repetitions 1] [--json FILE]

Records (the format of benches/benchlib.py, engine "llama.cpp", dtype "bf16"):

  pp512  llama-bench's pp512 test (`-p 512 -n 64`): a 512-token batch into an empty context.
  tg_b1  llama-bench's tg64 test of the same run: 64 single-token decodes.
  tg_bB  (B > 1) llama-batched-bench `-npp 16 -ntg 64 -npl B`: B sequences of 16 prompt tokens
         each, then 64 decode steps of one token per sequence; S_TG = B * 64 / their time.

Both programs warm up before measuring (llama-bench one run of each test, llama-batched-bench a
16-token batch) and use llama.cpp's defaults otherwise (f16 KV cache, flash attention auto,
n_ubatch 512, mmap). The standard output of every run is kept next to the JSON file.
"""

import argparse
import json
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from benchlib import host, print_table, record, write_records  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BIN = os.path.join(REPO, "target", "bench", "llamacpp-build", "bin")


def run(cmd, log):
    """Runs `cmd`, appending its output to `log`; returns its standard output."""
    done = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if log:
        with open(log, "a", encoding="utf-8") as f:
            f.write("+ " + " ".join(cmd) + "\n" + done.stdout + done.stderr + "\n")
    if done.returncode != 0:
        sys.exit(f"failed ({done.returncode}): {' '.join(cmd)}\n{done.stderr[-4000:]}")
    return done.stdout


def llama_bench(args, gguf, log):
    """pp512 and tg64 from one llama-bench run: {scenario: tokens/s} (the mean of its
    repetitions, as llama-bench reports it)."""
    cmd = [os.path.join(args.bin, "llama-bench"), "-m", gguf, "-p", str(args.prefill), "-n", str(args.decode),
           "-t", str(args.threads), "-r", str(args.repetitions), "-o", "json"]
    tests = json.loads(run(cmd, log))
    out = {}
    for t in tests:
        if t["n_prompt"] and not t["n_gen"]:
            out[f"pp{t['n_prompt']}"] = t["avg_ts"]
        elif t["n_gen"] and not t["n_prompt"]:
            out["tg_b1"] = t["avg_ts"]
    return out


def batched_bench(args, gguf, batches, log):
    """{tg_bB: S_TG} from one llama-batched-bench run over `batches`."""
    ctx = max(batches) * (args.decode_prompt + args.decode)
    cmd = [os.path.join(args.bin, "llama-batched-bench"), "-m", gguf, "-npp", str(args.decode_prompt),
           "-ntg", str(args.decode), "-npl", ",".join(map(str, batches)), "-t", str(args.threads),
           "-c", str(ctx), "--output-format", "jsonl"]
    out = {}
    for line in run(cmd, log).splitlines():
        line = line.strip()
        if line.startswith("{"):
            rec = json.loads(line)
            out[f"tg_b{rec['pl']}"] = rec["speed_tg"]
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gguf-dir", default=os.path.join(REPO, "target", "bench", "gguf"))
    ap.add_argument("--bin", default=BIN, help="where llama-bench and llama-batched-bench are")
    ap.add_argument("--models", nargs="+", default=["qwen3_moe", "nemotron_h"])
    ap.add_argument("--dtype", default="bf16", help="the GGUF's type: <model>-<dtype>.gguf")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--prefill", type=int, default=512)
    ap.add_argument("--decode", type=int, default=64)
    ap.add_argument("--decode-prompt", type=int, default=16)
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 8, 64])
    ap.add_argument("--repetitions", type=int, default=1, help="llama-bench -r")
    ap.add_argument("--json", help="write the records to this file (a JSON list)")
    args = ap.parse_args()

    log = os.path.splitext(args.json)[0] + ".log" if args.json else None
    records = []
    for model in args.models:
        gguf = os.path.join(args.gguf_dir, f"{model}-{args.dtype}.gguf")
        rates = llama_bench(args, gguf, log)
        batched = [b for b in args.batches if b > 1]
        if batched:
            rates.update(batched_bench(args, gguf, batched, log))
        for scenario, rate in rates.items():
            if scenario == "tg_b1" and 1 not in args.batches:
                continue
            records.append(record("llama.cpp", args.dtype, model, scenario, [rate], threads=args.threads,
                                  tool="llama-bench" if scenario in ("tg_b1", f"pp{args.prefill}")
                                  else "llama-batched-bench", **host()))
    print_table(records)
    if args.json:
        write_records(args.json, records)


if __name__ == "__main__":
    main()
