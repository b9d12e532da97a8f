#!/usr/bin/env python3
"""llama.cpp (through llama-cpp-python's C bindings) on the benchmark GGUFs (see benches/README.md).

Run with the venv that `LLAMACPP_BINDINGS=1 benches/setup_llamacpp.sh` builds:

    target/bench/llamacpp-venv/bin/python benches/llamacpp_baseline.py [GGUF_DIR]
        [--models qwen3_moe nemotron_h] [--dtypes bf16] [--runs 5] [--threads 2] [--json FILE]

GGUF_DIR (default target/bench/gguf) holds <model>-<dtype>.gguf. The scenarios are those of
hf_baseline.py, on the same prompt ids, driven with llama_decode directly (no sampler chain,
no Python-side token bookkeeping beyond a numpy argmax):

  pp512  one llama_decode of a 512-token batch (logits for the last token only) into an empty
         context, at batch 1; tokens/s = 512 / wall time, argmax of that one row included.
  tg_b1  a 16-token prompt per sequence, decoded in one batch; then 64 greedy steps, each one
  tg_b8  llama_decode of a batch holding one token per sequence (1 or 8 sequences, each with its
         own sequence id and KV / recurrent state) and an argmax per sequence; tokens/s =
         batch * 64 / time of those 64 steps.

Context defaults follow llama-bench's: f16 KV cache, flash attention auto, n_ubatch 512, mmap.
One warm-up of each scenario, then RUNS measured runs; the figure is the median.
"""

import argparse
import ctypes
import os
import sys
import time

import numpy as np

import llama_cpp as L

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from benchlib import add_scenario_args, host, measure, print_table, prompt_ids, record, write_records  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


LOG_WARN, LOG_ERROR = 3, 4  # enum ggml_log_level in ggml.h


@L.llama_log_callback
def _quiet(level, text, user_data):
    """llama.cpp's errors go to stderr; its warnings too with BENCH_LLAMA_LOG=1; the rest nowhere."""
    if level == LOG_ERROR or (level == LOG_WARN and os.environ.get("BENCH_LLAMA_LOG")):
        sys.stderr.write(text.decode(errors="replace"))


class Context:
    """A llama_context for `n_seq` sequences of up to `n_ctx_seq` positions each."""

    def __init__(self, model, n_seq, n_ctx_seq, threads, n_batch):
        p = L.llama_context_default_params()
        p.n_ctx = n_seq * n_ctx_seq
        p.n_batch = n_batch
        p.n_ubatch = min(512, n_batch)
        p.n_seq_max = n_seq
        p.n_threads = threads
        p.n_threads_batch = threads
        p.no_perf = True
        self.ctx = L.llama_init_from_model(model, p)
        if not self.ctx:
            raise RuntimeError("llama_init_from_model failed")
        self.n_vocab = L.llama_vocab_n_tokens(L.llama_model_get_vocab(model))
        self.batch = L.llama_batch_init(n_batch, 0, 1)

    def close(self):
        L.llama_batch_free(self.batch)
        L.llama_free(self.ctx)

    def clear(self):
        L.llama_memory_clear(L.llama_get_memory(self.ctx), True)

    def decode(self, entries):
        """entries: (token, position, sequence, want_logits) tuples. Returns the argmax of each
        row that asked for logits, in batch order."""
        b = self.batch
        n_out = 0
        for i, (tok, pos, seq, want) in enumerate(entries):
            b.token[i] = tok
            b.pos[i] = pos
            b.n_seq_id[i] = 1
            b.seq_id[i][0] = seq
            b.logits[i] = 1 if want else 0
            n_out += bool(want)
        b.n_tokens = len(entries)
        rc = L.llama_decode(self.ctx, b)
        if rc != 0:
            raise RuntimeError(f"llama_decode returned {rc}")
        ptr = L.llama_get_logits(self.ctx)
        logits = np.ctypeslib.as_array(ctypes.cast(ptr, ctypes.POINTER(ctypes.c_float)),
                                       shape=(n_out, self.n_vocab))
        return logits.argmax(axis=1).tolist()


def prefill_rate(ctx, ids):
    ctx.clear()
    t0 = time.perf_counter()
    ctx.decode([(t, i, 0, i == len(ids) - 1) for i, t in enumerate(ids)])
    return len(ids) / (time.perf_counter() - t0)


def decode_rate(ctx, prompts, steps):
    ctx.clear()
    entries = [(t, i, s, i == len(p) - 1) for s, p in enumerate(prompts) for i, t in enumerate(p)]
    nxt = ctx.decode(entries)
    pos = len(prompts[0])
    t0 = time.perf_counter()
    for _ in range(steps):
        nxt = ctx.decode([(t, pos, s, True) for s, t in enumerate(nxt)])
        pos += 1
    return len(prompts) * steps / (time.perf_counter() - t0)


def bench(path, name, dtype, args):
    mp = L.llama_model_default_params()
    t0 = time.perf_counter()
    model = L.llama_model_load_from_file(path.encode(), mp)
    if not model:
        raise RuntimeError(f"cannot load {path}")
    load_s = time.perf_counter() - t0
    extra = dict(threads=args.threads, llama_cpp_python=L.__version__, gguf=os.path.basename(path),
                 load_s=round(load_s, 2), **host())
    print(f"# {name} {dtype}: {os.path.basename(path)} loaded in {load_s:.1f} s", flush=True)
    records = []
    if args.prefill:
        ctx = Context(model, 1, args.prefill + 64, args.threads, args.prefill)
        ids = prompt_ids(0, args.prefill)
        runs, others, dropped = measure(lambda: prefill_rate(ctx, ids), args.runs, args.max_others,
                                        args.retries, args.quiet_wait)
        ctx.close()
        records.append(record("llama.cpp", dtype, name, f"pp{args.prefill}", runs, batch=1,
                              others_cpu=others, dropped_runs=dropped,
                              prompt_tokens=args.prefill, **extra))
        print_table(records[-1:])
    for b in args.batches:
        prompts = [prompt_ids(1 + i, args.decode_prompt) for i in range(b)]
        n_ctx_seq = -(-(args.decode_prompt + args.decode + 1) // 256) * 256
        ctx = Context(model, b, n_ctx_seq, args.threads, max(512, b * args.decode_prompt))
        runs, others, dropped = measure(lambda: decode_rate(ctx, prompts, args.decode), args.runs, args.max_others,
                                       args.retries, args.quiet_wait)
        ctx.close()
        records.append(record("llama.cpp", dtype, name, f"tg_b{b}", runs, batch=b,
                              others_cpu=others, dropped_runs=dropped,
                              prompt_tokens=args.decode_prompt, new_tokens=args.decode, **extra))
        print_table(records[-1:])
    L.llama_model_free(model)
    return records


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("gguf_dir", nargs="?", default=os.path.join(REPO, "target", "bench", "gguf"))
    ap.add_argument("--models", nargs="+", default=["qwen3_moe", "nemotron_h"])
    ap.add_argument("--dtypes", nargs="+", default=["bf16"], help="GGUF types, as in <model>-<dtype>.gguf")
    add_scenario_args(ap)
    args = ap.parse_args()

    L.llama_log_set(_quiet, ctypes.c_void_p())
    L.llama_backend_init()
    print("# " + L.llama_print_system_info().decode().strip(), flush=True)
    records = []
    for name in args.models:
        for dtype in args.dtypes:
            records += bench(os.path.join(args.gguf_dir, f"{name}-{dtype}.gguf"), name, dtype, args)
            if args.json:
                write_records(args.json, records)
    L.llama_backend_free()
    print()
    print_table(records)


if __name__ == "__main__":
    main()
