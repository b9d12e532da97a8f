#!/usr/bin/env python3
"""PyTorch's matrix product and decode attention at a model's shapes, beside `routed bench kernels`.

    python3 benches/torch_kernels.py --model DIR [--batch-sizes 1 8 64 256] [--repeats 10]
                                     [--device cuda] [--json FILE]

The same cases under the same scenario names as `routed bench kernels` (see benches/README.md):
`gemm_<proj>_m<M>` is F.linear of bf16 activations [M, k] by the bf16 weight [n, k] (the
projections: qkv_proj, q_proj, kv_proj, o_proj, expert_up, shared_up, lm_head, as the model's
config has them), `add_rms_norm_m<M>` is an in-place add of f32 rows [M, hidden] then F.rms_norm,
and `attn_decode_b<B>_ctx<L>` is scaled_dot_product_attention of one bf16 query per
sequence over L contiguous bf16 keys and values (grouped heads as the config says), and `argmax_b<B>`,
`log_softmax_b<B>`, `greedy_b<B>` (both), `sample_b<B>`, `sample_top_p_b<B>` and `top_logprobs_b<B>` choose tokens from B rows of f32 logits
as vLLM's sampler does (softmax and multinomial; top-k, sort and cumulative sum for top-p). Each
case is captured as a CUDA graph of 20 launches and timed per replay with CUDA events, as routed
times its kernels, so neither side pays its host's launch cost. A `hbm_copy` record gives the
device's copy bandwidth (a 1 GiB device-to-device copy, bytes read plus written): the roofline the
others are read against. Records: engine "torch", dtype "bf16", `us` (median per launch),
`gb_per_s` (the bytes the case must move, over `us`), `tflops`, `runs_us`.
"""

import argparse
import json
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from benchlib import write_records  # noqa: E402

LAUNCHES = 20
CONTEXTS = (512, 2048)


def model_shapes(cfg):
    """(products, attention) of a Hugging Face config, as routed's kernels scenario reads them."""
    h = cfg["hidden_size"]
    heads = cfg.get("num_attention_heads")
    head_dim = cfg.get("head_dim") or (h // heads if heads else None)
    products = []
    attention = None
    if heads and cfg.get("num_key_value_heads") is not None:
        kv = cfg["num_key_value_heads"] * head_dim
        products += [("qkv_proj", heads * head_dim + 2 * kv, h), ("q_proj", heads * head_dim, h),
                     ("kv_proj", kv, h), ("o_proj", h, heads * head_dim)]
        attention = (heads, cfg["num_key_value_heads"], head_dim)
    # Mixtral names its experts' width intermediate_size.
    inter = cfg.get("moe_intermediate_size") or (cfg.get("num_local_experts") and cfg["intermediate_size"])
    if inter:
        products.append(("expert_up", inter, h))
        shared = (cfg.get("shared_intermediate_size") or cfg.get("shared_expert_intermediate_size")
                  or cfg.get("moe_shared_expert_intermediate_size"))
        if shared:
            products.append(("shared_up", shared, h))
    products.append(("lm_head", cfg["vocab_size"], h))
    return products, attention


def time_graph(torch, fn, repeats):
    """Microseconds per launch of LAUNCHES calls of `fn` captured into a CUDA graph, per replay."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(LAUNCHES):
            fn()
    graph.replay()
    torch.cuda.synchronize()
    runs = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        runs.append(start.elapsed_time(end) * 1e3 / LAUNCHES)
    return runs


def copy_bandwidth(torch, dev, repeats):
    """(bytes moved, us per copy) of a 1 GiB device-to-device copy: read plus written."""
    src = torch.empty(1 << 29, dtype=torch.bfloat16, device=dev)
    dst = torch.empty_like(src)
    return 2 * src.numel() * src.element_size(), time_graph(torch, lambda: dst.copy_(src), repeats)


def sampling(torch, F, model, m, vocab, dev, repeats, name):
    """Token selection from m rows of f32 logits, as vLLM's sampler does it: argmax, log-softmax,
    both (a greedy row's token and logprob), a temperature-1 draw (softmax, multinomial), a draw after top-k 50 and top-p 0.9 (sort,
    cumulative sum, mask), and the chosen token's rank with 20 alternatives (log-softmax, topk)."""
    gen = torch.Generator(device=dev).manual_seed(1)
    logits = torch.rand(m, vocab, generator=gen, device=dev).sub_(0.5).mul_(16.0)

    def top_p():
        x = logits / 0.7
        kth = torch.topk(x, 50, dim=-1).values[:, -1:]
        x = x.masked_fill(x < kth, float("-inf"))
        probs, idx = torch.sort(torch.softmax(x, -1), dim=-1, descending=True)
        drop = probs.cumsum(-1) - probs > 0.9
        probs = probs.masked_fill(drop, 0.0)
        return idx.gather(-1, torch.multinomial(probs, 1))

    chosen = torch.argmax(logits, -1, keepdim=True)

    def top_logprobs():
        lp = torch.log_softmax(logits, -1)
        rank = (lp > lp.gather(-1, chosen)).sum(-1) + 1
        return torch.topk(lp, min(20, vocab), dim=-1), rank

    cases = [
        ("argmax", "argmax", lambda: torch.argmax(logits, -1)),
        ("log_softmax", "log_softmax", lambda: torch.log_softmax(logits, -1)),
        # A greedy row's token and logprob.
        ("greedy", "argmax+log_softmax",
         lambda: (torch.argmax(logits, -1), torch.log_softmax(logits, -1))),
        ("sample", "softmax+multinomial", lambda: torch.multinomial(torch.softmax(logits, -1), 1)),
        ("sample_top_p", "topk+sort+cumsum+multinomial", top_p),
        ("top_logprobs", "log_softmax+topk+rank", top_logprobs),
    ]
    nbytes = 4 * m * vocab
    return [record(model, f"{case}_b{m}", kernel, nbytes, 0, time_graph(torch, fn, repeats), name)
            for case, kernel, fn in cases]


def record(model, scenario, kernel, nbytes, flops, runs, device):
    us = statistics.median(runs)
    return {
        "engine": "torch", "dtype": "bf16", "model": model, "device": device, "scenario": scenario,
        "kernel": kernel, "us": us, "gb_per_s": nbytes / us / 1e3, "tflops": flops / us / 1e6,
        "bytes": nbytes, "flops": flops, "runs_us": [round(r, 3) for r in runs],
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", required=True, help="a checkpoint directory (its config.json)")
    ap.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 8, 32, 64])
    ap.add_argument("--repeats", type=int, default=10)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--json")
    args = ap.parse_args()
    import torch
    import torch.nn.functional as F

    with open(os.path.join(args.model, "config.json"), encoding="utf-8") as f:
        cfg = json.load(f)
    model = os.path.basename(os.path.normpath(args.model))
    dev = torch.device(args.device)
    if dev.type == "cuda" and dev.index is None:  # set_device wants an ordinal
        dev = torch.device("cuda", 0)
    name = torch.cuda.get_device_name(dev)
    torch.cuda.set_device(dev)
    products, attention = model_shapes(cfg)
    records = []

    nbytes, copy = copy_bandwidth(torch, dev, max(3, args.repeats // 2))
    records.append(record(None, "hbm_copy", "copy_", nbytes, 0, copy, name))

    gen = torch.Generator(device=dev).manual_seed(0)

    def rand(*shape):
        return torch.rand(*shape, generator=gen, device=dev, dtype=torch.float32).sub_(0.5).to(torch.bfloat16)

    for m in args.batch_sizes:
        for what, n, k in products:
            x, w = rand(m, k), rand(n, k)
            runs = time_graph(torch, lambda: F.linear(x, w), args.repeats)
            nbytes = 2 * (n * k + m * k + m * n)
            records.append(record(model, f"gemm_{what}_m{m}", "F.linear", nbytes, 2 * m * n * k, runs, name))
        # The residual add and the norm: in f32, as routed keeps the residual stream.
        h = cfg["hidden_size"]
        x = torch.rand(m, h, generator=gen, device=dev).sub_(0.5)
        branch = torch.rand(m, h, generator=gen, device=dev).sub_(0.5)
        nw = torch.ones(h, device=dev)
        fn = lambda: F.rms_norm(x.add_(branch), (h,), nw, 1e-6)  # noqa: E731
        runs = time_graph(torch, fn, args.repeats)
        records.append(record(model, f"add_rms_norm_m{m}", "add_ + F.rms_norm", 16 * m * h + 4 * h, 0, runs, name))
        if attention:
            heads, kv_heads, d = attention
            for ctx in (c for c in CONTEXTS if c <= cfg.get("max_position_embeddings", c)):
                q, kk, vv = rand(m, heads, 1, d), rand(m, kv_heads, ctx, d), rand(m, kv_heads, ctx, d)
                fn = lambda: F.scaled_dot_product_attention(q, kk, vv, enable_gqa=True)  # noqa: E731
                runs = time_graph(torch, fn, args.repeats)
                nbytes = m * ctx * kv_heads * d * 2 * 2 + m * heads * d * 2 * 2
                flops = 4 * m * ctx * heads * d
                records.append(record(model, f"attn_decode_b{m}_ctx{ctx}", "sdpa", nbytes, flops, runs, name))
        records += sampling(torch, F, model, m, cfg["vocab_size"], dev, args.repeats, name)
    print("| case | kernel | us | GB/s | TFLOP/s |")
    print("|---|---|---:|---:|---:|")
    for r in records:
        print(f"| {r['scenario']} | {r['kernel']} | {r['us']:.2f} | {r['gb_per_s']:.1f} | {r['tflops']:.3f} |")
    if args.json:
        write_records(args.json, records)


if __name__ == "__main__":
    main()
