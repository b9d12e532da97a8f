#!/usr/bin/env python3
"""Hugging Face transformers on the benchmark checkpoints, on the CPU or a GPU (benches/README.md).

    python benches/hf_baseline.py [MODELS_DIR] [--models qwen3_moe nemotron_h] [--dtypes f32 bf16]
        [--runs 5] [--threads 2] [--device cpu|cuda] [--compile [--compile-mode MODE]
        [--compiled-only]] [--json FILE]

--device cuda runs on GPU 0 (every clock reading waits for the device first). --compile also
measures the model with a static KV cache and its forward through torch.compile (--compile-mode,
default "reduce-overhead": CUDA graphs on a GPU), recorded as engine "transformers+compile"
(another mode as "transformers+compile:MODE"); a model that does not compile is reported and
skipped. generate()'s own compilation of the decoding forward (automatic on a GPU with a static
cache) is turned off, so that MODE is the only compilation. A compiled model can also crash the
process (reduce-overhead did, on an H100 with PyTorch 2.11, in the CUDA-graph trees during
qwen3_moe's decode, while generate() still compiled the forward a second time around ours): run
one model per process to keep the others' figures.

For each model and dtype: load with from_pretrained (default attention and experts
implementations), one warm-up of each scenario, then RUNS measured runs; the figure is the median.

  pp512  greedy generate(max_new_tokens=1) on a 512-token prompt at batch 1; tokens/s =
         512 / wall time (one forward over the prompt plus choosing one token).
  tg_b1  greedy generate of 65 new tokens (EOS off: min_new_tokens = max_new_tokens) from a
  tg_b8  16-token prompt per sequence, at batch 1 / 8. A stopping criterion stamps the time as
         each token is appended; tokens/s = batch * 64 / (t[65] - t[1]): the prompt's forward is
         left out, generate()'s own per-step overhead is kept.
"""

import argparse
import os
import sys
import time

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"
os.environ["TOKENIZERS_PARALLELISM"] = "false"
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
os.environ["HF_HUB_DISABLE_PROGRESS_BARS"] = "1"

import torch  # noqa: E402
import transformers  # noqa: E402
from transformers import AutoModelForCausalLM, StoppingCriteria, StoppingCriteriaList  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from benchlib import add_scenario_args, host, measure, print_table, prompt_ids, record, write_records  # noqa: E402

transformers.utils.logging.disable_progress_bar()

DTYPES = {"f32": torch.float32, "bf16": torch.bfloat16}
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class StepClock(StoppingCriteria):
    """Never stops generation; notes the time each time a token has been appended."""

    def __init__(self):
        self.stamps = []

    def __call__(self, input_ids, scores, **kwargs):
        sync(input_ids.device)
        self.stamps.append(time.perf_counter())
        return torch.zeros(input_ids.shape[0], dtype=torch.bool, device=input_ids.device)


def generate(model, ids, new_tokens, clock=None):
    out = model.generate(
        input_ids=ids,
        attention_mask=torch.ones_like(ids),
        do_sample=False,
        max_new_tokens=new_tokens,
        min_new_tokens=new_tokens,
        pad_token_id=model.config.pad_token_id,
        stopping_criteria=StoppingCriteriaList([clock]) if clock else None,
    )
    assert out.shape == (ids.shape[0], ids.shape[1] + new_tokens), out.shape
    return out


def sync(device):
    """Waits for the device's queued work, so that a host clock reading covers it."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def prefill_rate(model, ids):
    sync(ids.device)
    t0 = time.perf_counter()
    generate(model, ids, 1)
    sync(ids.device)
    return ids.shape[1] / (time.perf_counter() - t0)


def decode_rate(model, ids, steps):
    clock = StepClock()
    generate(model, ids, steps + 1, clock)
    assert len(clock.stamps) == steps + 1, len(clock.stamps)
    return ids.shape[0] * steps / (clock.stamps[-1] - clock.stamps[0])


def compiled(model, mode):
    """The model with a static KV cache and its forward compiled in `mode`."""
    model.generation_config.cache_implementation = "static"
    # On a GPU with a static cache, generate() compiles the forward itself for decoding (in
    # reduce-overhead mode unless told otherwise) around the one compiled here: two compilations
    # nested, CUDA graphs in the outer one whatever `mode` says. Ours is the only one.
    model.generation_config.disable_compile = True
    # Every batch size and cache length is a recompilation; past torch's default limit of 8 the
    # forward would silently run uncompiled, and the figures with it.
    torch._dynamo.config.recompile_limit = 256
    model.forward = torch.compile(model.forward, mode=mode)
    return model


def bench(model_dir, name, dtype, args, compile_=False):
    device = torch.device(args.device)
    t0 = time.perf_counter()
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=DTYPES[dtype]).to(device)
    model.eval()
    if compile_:
        model = compiled(model, args.compile_mode)
    load_s = time.perf_counter() - t0
    cfg = model.config
    engine = "transformers"
    if compile_:  # reduce-overhead keeps the plain name the earlier records have
        engine += "+compile" + ("" if args.compile_mode == "reduce-overhead" else f":{args.compile_mode}")
    extra = dict(compile_mode=args.compile_mode if compile_ else None, threads=args.threads, torch=torch.__version__, transformers=transformers.__version__,
                 attn_implementation=cfg._attn_implementation,
                 experts_implementation=getattr(cfg, "_experts_implementation", None),
                 device=torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
                 cpu_capability=torch.backends.cpu.get_cpu_capability(), load_s=round(load_s, 2), **host())
    print(f"# {name} {dtype} {engine} on {extra['device']}: loaded in {load_s:.1f} s "
          f"(attention {extra['attn_implementation']}, experts {extra['experts_implementation']})", flush=True)
    records = []
    with torch.inference_mode():
        if args.prefill:
            ids = torch.tensor([prompt_ids(0, args.prefill)], device=device)
            runs, others, dropped = measure(lambda: prefill_rate(model, ids), args.runs, args.max_others,
                                           args.retries, args.quiet_wait)
            records.append(record(engine, dtype, name, f"pp{args.prefill}", runs, batch=1,
                                  others_cpu=others, dropped_runs=dropped,
                                  prompt_tokens=args.prefill, **extra))
            print_table(records[-1:])
        for b in args.batches:
            ids = torch.tensor([prompt_ids(1 + i, args.decode_prompt) for i in range(b)], device=device)
            runs, others, dropped = measure(lambda: decode_rate(model, ids, args.decode), args.runs, args.max_others,
                                           args.retries, args.quiet_wait)
            records.append(record(engine, dtype, name, f"tg_b{b}", runs, batch=b,
                                  others_cpu=others, dropped_runs=dropped,
                                  prompt_tokens=args.decode_prompt, new_tokens=args.decode, **extra))
            print_table(records[-1:])
    return records


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("models_dir", nargs="?", default=os.path.join(REPO, "target", "bench-models"))
    ap.add_argument("--models", nargs="+", default=["qwen3_moe", "nemotron_h"])
    ap.add_argument("--dtypes", nargs="+", choices=list(DTYPES), default=list(DTYPES))
    ap.add_argument("--device", default="cpu", help="cpu, or cuda (GPU 0)")
    ap.add_argument("--compile", action="store_true",
                    help="also measure with a static cache and torch.compile (engine transformers+compile)")
    ap.add_argument("--compile-mode", default="reduce-overhead",
                    help="torch.compile's mode: reduce-overhead (CUDA graphs), default, max-autotune...")
    ap.add_argument("--compiled-only", action="store_true",
                    help="with --compile, measure the compiled model alone (the eager one measured apart)")
    add_scenario_args(ap)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)

    records = []
    for name in args.models:
        for dtype in args.dtypes:
            model_dir = os.path.join(args.models_dir, name)
            if not (args.compile and args.compiled_only):
                records += bench(model_dir, name, dtype, args)
            if args.compile:
                try:
                    records += bench(model_dir, name, dtype, args, compile_=True)
                except Exception as err:  # noqa: BLE001 - a model that does not compile is a result
                    print(f"# {name} {dtype}: torch.compile failed: {type(err).__name__}: {err}"[:2000],
                          flush=True)
            if args.json:  # keep what is done if a later model fails
                write_records(args.json, records)
    print()
    print_table(records)


if __name__ == "__main__":
    main()
