#!/usr/bin/env python3
"""Build the golden fixtures that `routed`'s tests compare against.

For each model family it writes a tiny, randomly initialised Hugging Face checkpoint and the
numbers Hugging Face `transformers` computes from that checkpoint:

    tests/golden/<arch>/model/             the checkpoint (bf16 safetensors, configs, tokenizer)
    tests/golden/<arch>/golden.safetensors reference tensors (f32 / i64), named `<case>.<what>`
    tests/golden/<arch>/golden.json        ids, routing formula, self-checks, versions, sha256s

plus `tests/golden/tiny_hybrid_default/model/`, the small Nemotron-H style checkpoint that the
binary embeds as its default model (no reference numbers).

Everything runs offline on CPU in float32, single-threaded, with fixed seeds, so two runs give
byte-identical files. See README.md in this directory for the environment and the command.
"""

import argparse
import copy
import hashlib
import json
import os
import platform
import shutil
import sys
import tempfile

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"
os.environ["TOKENIZERS_PARALLELISM"] = "false"
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
os.environ["HF_HUB_DISABLE_PROGRESS_BARS"] = "1"

import safetensors  # noqa: E402
import tokenizers  # noqa: E402
import torch  # noqa: E402
import transformers  # noqa: E402
from safetensors.torch import load_file, save_file  # noqa: E402
from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers  # noqa: E402
from transformers import AutoModelForCausalLM, AutoTokenizer  # noqa: E402
from transformers.models.granitemoehybrid import modeling_granitemoehybrid  # noqa: E402
from transformers.models.nemotron_h import modeling_nemotron_h  # noqa: E402

transformers.utils.logging.disable_progress_bar()

HERE = os.path.dirname(os.path.abspath(__file__))
SEED = 20240611
NEW_TOKENS = 16
# A checkpoint is kept only if every routing decision and every greedy pick in its goldens is clear:
# near-ties would make an engine's f32 rounding flip an expert (which then changes every later
# number of that request) or a generated token. Seeds are tried in order until one qualifies.
MIN_SELECTION_MARGIN = 2e-4
MIN_STEP_LOGIT_GAP = 2e-3
MAX_SEED_TRIES = 64

# --------------------------------------------------------------------------------------------
# Tokenizer
# --------------------------------------------------------------------------------------------

VOCAB_SIZE = 512
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]  # ids 0, 1, 2
EOS_ID = 2  # <|im_end|> ends an assistant turn
PAD_ID = 0

# The pre-tokenizer split pattern of the Qwen2 / Qwen3 tokenizer.json files on the Hub.
SPLIT_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)

CHAT_TEMPLATE = (
    "{%- for message in messages -%}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' -}}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}"
    "{{- '<|im_start|>assistant\\n' -}}"
    "{%- endif -%}"
)

TRAINING_TEXT = """\
An inference engine reads a checkpoint, builds the layers, and then serves requests one batch at a time.
Every request brings its own prompt; the scheduler decides which tokens run in the next step.
In a mixture-of-experts block the router looks at the hidden state of a token and gives each expert a score.
Only the best experts run for that token, and their outputs are added with the router's weights.
When two scores are almost equal, a tiny rounding error can change which expert wins the race.
That is why the tests keep the margin between the last chosen expert and the first expert left out.
A trainer that wants to replay the routing needs the expert ids for the prompt and for every generated token.
The hybrid models mix three kinds of layers: state space layers, attention layers and expert layers.
A state space layer keeps a small recurrent state and a short convolution window instead of keys and values.
During the prompt it scans the sequence in chunks; during decoding it updates its state one token at a time.
Attention layers remember the keys and values of all earlier positions, so their cache grows with the text.
Prefix caching lets many requests share the blocks of a common prompt, which saves memory and time.
The quick brown fox jumps over the lazy dog, and five boxing wizards jump quickly at dawn.
Numbers and symbols matter too: 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 16, 64, 512, 2048, 3.5, -1, 1e-6, 100%.
fn route(scores: &[f32], k: usize) -> Vec<usize> { let mut ids: Vec<usize> = (0..scores.len()).collect(); ids }
def softmax(xs): m = max(xs); e = [math.exp(x - m) for x in xs]; return [v / sum(e) for v in e]
{"model": "tiny", "experts": 8, "top_k": 2, "hidden": 64, "layers": ["mamba", "attention", "moe"]}
Mots et lettres: déjà vu, Straße, naïve café, Ελληνικά, 日本語のテキスト, 中文字符, 한국어, emoji 🚀✨.
User: Which expert handled the last token? Assistant: Experts three and five, with weights near one half.
"""

# The token ids of every case come from these texts (no BOS is added).
MAIN_TEXT = "The router gives each token two experts, and the state space layer keeps a state."
LONG_MESSAGES = [
    {"role": "user", "content": "Which experts did the router choose for the last token of the prompt, and why?"},
]
SHORT_TEXTS = {"short1": "The", "short2": "The router", "short3": "The state layer"}


def train_tokenizer():
    tok = Tokenizer(models.BPE(unk_token=None, fuse_unk=False, byte_fallback=False))
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(SPLIT_PATTERN), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        min_frequency=2,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator((TRAINING_TEXT * 3).splitlines(keepends=True), trainer=trainer)
    assert tok.get_vocab_size() == VOCAB_SIZE, tok.get_vocab_size()
    for i, name in enumerate(SPECIAL_TOKENS):
        assert tok.token_to_id(name) == i, name
    return tok


def tokenizer_config():
    return {
        "add_bos_token": False,
        "add_prefix_space": False,
        "bos_token": None,
        "chat_template": CHAT_TEMPLATE,
        "clean_up_tokenization_spaces": False,
        "eos_token": SPECIAL_TOKENS[EOS_ID],
        "errors": "replace",
        "model_max_length": 4096,
        "pad_token": SPECIAL_TOKENS[PAD_ID],
        "split_special_tokens": False,
        "tokenizer_class": "PreTrainedTokenizerFast",
        "unk_token": None,
    }


def write_json(path, obj):
    with open(path, "w", encoding="utf-8") as f:
        json.dump(obj, f, indent=2, ensure_ascii=False)
        f.write("\n")


def write_tokenizer_files(model_dir, tok):
    tok.save(os.path.join(model_dir, "tokenizer.json"), pretty=True)
    write_json(os.path.join(model_dir, "tokenizer_config.json"), tokenizer_config())


# --------------------------------------------------------------------------------------------
# Model configurations
# --------------------------------------------------------------------------------------------

SHARED = dict(
    vocab_size=VOCAB_SIZE,
    hidden_size=64,
    max_position_embeddings=4096,
    initializer_range=0.1,
    bos_token_id=None,
    eos_token_id=EOS_ID,
    pad_token_id=PAD_ID,
)

ARCH_KWARGS = {
    "qwen3_moe": dict(
        SHARED,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        num_experts=8,
        num_experts_per_tok=2,
        moe_intermediate_size=16,
        intermediate_size=32,
        decoder_sparse_step=1,
        mlp_only_layers=[2],
        norm_topk_prob=True,
        rms_norm_eps=1e-6,
        tie_word_embeddings=False,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
    ),
    "mixtral": dict(
        SHARED,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        num_local_experts=8,
        num_experts_per_tok=2,
        intermediate_size=16,
        rms_norm_eps=1e-5,
        tie_word_embeddings=False,
        rope_parameters={"rope_type": "default", "rope_theta": 1000000.0},
    ),
    "nemotron_h": dict(
        SHARED,
        hybrid_override_pattern="ME*EM-E",
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        intermediate_size=32,
        mamba_num_heads=8,
        mamba_head_dim=16,
        n_groups=2,
        ssm_state_size=16,
        conv_kernel=4,
        chunk_size=8,
        n_routed_experts=8,
        num_experts_per_tok=2,
        moe_intermediate_size=16,
        n_shared_experts=1,
        moe_shared_expert_intermediate_size=32,
        n_group=2,
        topk_group=1,
        norm_topk_prob=True,
        routed_scaling_factor=2.5,
        mlp_hidden_act="relu2",
        layer_norm_epsilon=1e-5,
        tie_word_embeddings=False,
    ),
    "granitemoehybrid": dict(
        SHARED,
        num_hidden_layers=4,
        layer_types=["mamba", "attention", "mamba", "mamba"],
        num_attention_heads=4,
        num_key_value_heads=2,
        num_local_experts=8,
        num_experts_per_tok=2,
        intermediate_size=16,
        shared_intermediate_size=32,
        mamba_n_heads=8,
        mamba_d_head=16,
        mamba_n_groups=2,
        mamba_d_state=16,
        mamba_d_conv=4,
        mamba_expand=2,
        mamba_chunk_size=8,
        position_embedding_type="nope",
        embedding_multiplier=12.0,
        residual_multiplier=0.22,
        attention_multiplier=0.0625,
        logits_scaling=4.0,
        rms_norm_eps=1e-5,
        tie_word_embeddings=True,
    ),
}

# The default model of the binary: Nemotron-H style, grouped routing off as in the released models.
DEFAULT_MODEL_KWARGS = dict(ARCH_KWARGS["nemotron_h"], hybrid_override_pattern="ME*EME", n_group=1, topk_group=1)

ROUTING_FORMULA = {
    "qwen3_moe": (
        "logits = x W_gate^T; p = softmax(logits) in f32 over all experts; (w, ids) = topk(p, k), sorted "
        "descending; norm_topk_prob is true so w /= sum(w); out = sum_j w_j * SwiGLU_expert_ids[j](x). "
        "selection_scores = p."
    ),
    "mixtral": (
        "logits = x W_gate^T; p = softmax(logits) in f32 over all experts; (w, ids) = topk(p, k), sorted "
        "descending; w /= sum(w) always; out = sum_j w_j * SwiGLU_expert(x) with w1 = gate, w3 = up, w2 = down. "
        "selection_scores = p."
    ),
    "nemotron_h": (
        "logits = x W_gate^T in f32; s = sigmoid(logits); c = s + e_score_correction_bias (f32); "
        "group-limited choice: split c into n_group groups of E/n_group consecutive experts, group score = "
        "sum of the 2 largest c in the group (always 2, independent of k), keep the topk_group best groups, "
        "set c of the other groups to -inf; ids = topk(c, k, sorted=False) (order carries no meaning); "
        "w = s[ids] (no bias); w /= sum(w) + 1e-20 (norm_topk_prob); w *= routed_scaling_factor; "
        "out = sum_j w_j * down_j(relu(up_j(x))^2) + shared_experts(x) (experts are not gated). "
        "selection_scores = c before the group mask; selection_margin = min(k-th minus (k+1)-th of the "
        "masked c, topk_group-th minus (topk_group+1)-th group score)."
    ),
    "granitemoehybrid": (
        "logits = x W_router^T in f32; (l, ids) = topk(logits, k), sorted descending; w = softmax(l) over the "
        "k kept logits only; out = sum_j w_j * SwiGLU_expert(x) + shared_mlp(x); input_linear rows [0, I) are "
        "the gate (SiLU), rows [I, 2I) the up projection. selection_scores = logits."
    ),
}

LEGACY_LAYER_TYPE = {"linear_attention": "mamba", "full_attention": "attention"}
PATTERN_CHAR = {"linear_attention": "M", "moe": "E", "full_attention": "*", "mlp": "-"}


def hub_style(arch, v5):
    """Rewrite the config transformers 5 writes into the key style of the published checkpoints
    (written by transformers 4): torch_dtype, rope_theta/rope_scaling, num_experts (Qwen3-MoE),
    hybrid_override_pattern (Nemotron-H), mamba/attention layer_types (Granite-4.0-H)."""
    c = dict(v5)
    c["torch_dtype"] = c.pop("dtype")
    rope = c.pop("rope_parameters", None)
    if rope is not None:
        c["rope_theta"] = rope["rope_theta"]
        c["rope_scaling"] = None
        assert rope.get("rope_type", "default") == "default"
    if arch == "qwen3_moe":
        c["num_experts"] = c.pop("num_local_experts")
    if arch == "nemotron_h":
        blocks = c.pop("layers_block_type")
        c["hybrid_override_pattern"] = "".join(PATTERN_CHAR[b] for b in blocks)
        c["num_hidden_layers"] = len(blocks)
        c.pop("mtp_layers_block_type", None)
        c.pop("time_step_limit", None)  # unused by Nemotron-H (its mixer uses (time_step_min, inf))
    if arch == "granitemoehybrid":
        c["layer_types"] = [LEGACY_LAYER_TYPE[t] for t in c["layer_types"]]
        c.pop("time_step_limit", None)  # (0, inf) is the default
    return dict(sorted(c.items()))


# --------------------------------------------------------------------------------------------
# Checkpoint
# --------------------------------------------------------------------------------------------


def make_config(model_type, kwargs):
    return transformers.CONFIG_MAPPING[model_type](**kwargs)


def perturb_constant_tensors(model, seed):
    """Give every tensor that the initialiser leaves constant (norm weights, biases, D, the score
    correction bias, ...) and Mamba's deterministic A_log random values, so that an engine that
    ignores or mis-reads one of them fails the goldens."""
    gen = torch.Generator().manual_seed(seed)
    persistent = set(model.state_dict().keys())
    touched = []
    with torch.no_grad():
        named = list(model.named_parameters()) + list(model.named_buffers())
        for name, t in sorted(named, key=lambda kv: kv[0]):
            if name not in persistent or not t.is_floating_point():
                continue
            flat = t.detach().flatten().float()
            constant = t.numel() > 1 and bool((flat == flat[0]).all())
            if name.endswith("A_log"):
                t.add_((0.3 * torch.randn(t.shape, generator=gen)).to(t.dtype))
            elif constant and float(flat[0]) == 0.0:
                scale = 0.1 if name.endswith("e_score_correction_bias") else 0.05
                t.copy_((scale * torch.randn(t.shape, generator=gen)).to(t.dtype))
            elif constant:
                base = float(flat[0])
                t.copy_((base * (1.0 + 0.25 * torch.randn(t.shape, generator=gen))).to(t.dtype))
            else:
                continue
            touched.append(name)
    return touched


def save_checkpoint(model_type, kwargs, model_dir, tok, seed):
    config = make_config(model_type, kwargs)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, attn_implementation="eager", experts_implementation="eager")
    perturbed = perturb_constant_tensors(model, seed + 1)
    model = model.to(torch.bfloat16)
    for name, buf in model.named_buffers():
        if name.endswith("e_score_correction_bias"):
            buf.data = buf.data.float()  # the released checkpoints keep this one in f32
    os.makedirs(model_dir)
    model.save_pretrained(model_dir)
    write_tokenizer_files(model_dir, tok)
    cfg_path = os.path.join(model_dir, "config.json")
    with open(cfg_path, encoding="utf-8") as f:
        v5 = json.load(f)
    os.replace(cfg_path, os.path.join(model_dir, "config.v5.json"))
    write_json(cfg_path, hub_style(model_type, v5))
    # Rewrite the weights with a single metadata key: a map with several keys is written in hash
    # order, which would make the bytes differ between runs.
    st_path = os.path.join(model_dir, "model.safetensors")
    tensors = load_file(st_path)
    save_file({k: tensors[k] for k in sorted(tensors)}, st_path, metadata={"format": "pt"})
    return perturbed


def load_f32(model_dir):
    model = AutoModelForCausalLM.from_pretrained(
        model_dir, dtype=torch.float32, attn_implementation="eager", experts_implementation="eager"
    )
    model.eval()
    return model


# --------------------------------------------------------------------------------------------
# Probes
# --------------------------------------------------------------------------------------------


def layer_index(module_name):
    return int(module_name.split("layers.")[1].split(".")[0])


def topk_margin(scores, k):
    ordered = torch.sort(scores, dim=-1, descending=True).values
    return ordered[:, k - 1] - ordered[:, k]


class RouterProbe:
    """Forward hooks on every router. In transformers 5 a router returns
    (router_logits, topk_weights, topk_ids); each call appends one record per MoE layer."""

    def __init__(self, arch, model):
        self.arch = arch
        self.config = model.config
        self.routers = []
        for name, mod in model.named_modules():
            if type(mod).__name__.lower().endswith("topkrouter"):
                self.routers.append((layer_index(name), mod))
        self.routers.sort(key=lambda x: x[0])
        self.moe_layers = [layer for layer, _ in self.routers]
        self.records = {layer: [] for layer in self.moe_layers}
        self.handles = [mod.register_forward_hook(self._hook(layer)) for layer, mod in self.routers]

    def _hook(self, layer):
        def hook(mod, args, out):
            logits, weights, ids = out
            scores, margin, chosen = self.selection(mod, logits.detach().float(), ids.shape[-1])
            self.records[layer].append(
                {
                    "ids": ids.detach().long().clone(),
                    "weights": weights.detach().float().clone(),
                    "scores": scores.clone(),
                    "margin": margin.clone(),
                    "chosen": chosen,
                }
            )

        return hook

    def selection(self, mod, logits, k):
        """The scores top-k is taken on, the margin, and the top-k set recomputed from them."""
        if self.arch in ("qwen3_moe", "mixtral"):
            scores = torch.softmax(logits, dim=-1)
            return scores, topk_margin(scores, k), torch.topk(scores, k, dim=-1).indices
        if self.arch == "granitemoehybrid":
            return logits, topk_margin(logits, k), torch.topk(logits, k, dim=-1).indices
        # nemotron_h
        n_group, topk_group = self.config.n_group, self.config.topk_group
        scores = logits.sigmoid() + mod.e_score_correction_bias.float()
        rows, n_experts = scores.shape
        group_scores = scores.view(rows, n_group, n_experts // n_group).topk(2, dim=-1).values.sum(-1)
        keep = torch.zeros_like(group_scores, dtype=torch.bool)
        keep.scatter_(1, torch.topk(group_scores, topk_group, dim=-1).indices, True)
        mask = keep.unsqueeze(-1).expand(rows, n_group, n_experts // n_group).reshape(rows, n_experts)
        masked = scores.masked_fill(~mask, float("-inf"))
        margin = topk_margin(masked, k)
        if topk_group < n_group:
            margin = torch.minimum(margin, topk_margin(group_scores, topk_group))
        return scores, margin, torch.topk(masked, k, dim=-1).indices

    def clear(self):
        for layer in self.records:
            self.records[layer] = []

    def remove(self):
        for h in self.handles:
            h.remove()


class LayerProbe:
    """Output of every decoder layer (the residual stream, before the final norm)."""

    def __init__(self, model):
        self.outputs = {}
        self.handles = [
            layer.register_forward_hook(self._hook(i)) for i, layer in enumerate(model.model.layers)
        ]

    def _hook(self, i):
        def hook(mod, args, out):
            o = out[0] if isinstance(out, tuple) else out
            self.outputs[i] = o.detach().float().clone()

        return hook

    def remove(self):
        for h in self.handles:
            h.remove()


class MambaProbe:
    """Wraps the PyTorch scan functions of the Mamba2 mixers to record which path each call takes
    (chunked scan, which clamps dt to dt_limit, or the single-step recurrent update, which does not)
    and how many dt = softplus(dt_raw + dt_bias) values fall under time_step_min."""

    PATCHED = [
        (modeling_nemotron_h, "mamba2_chunk_scan", "chunked"),
        (modeling_nemotron_h, "mamba2_selective_state_update", "recurrent"),
        (modeling_granitemoehybrid, "mamba2_chunk_scan", "chunked"),
        (modeling_granitemoehybrid, "mamba2_selective_state_update", "recurrent"),
    ]

    def __init__(self, model):
        self.threshold = float(getattr(model.config, "time_step_min", 0.0))
        self.calls = []
        self.current = None
        self.handles = []
        for name, mod in model.named_modules():
            if hasattr(mod, "dt_bias") and hasattr(mod, "in_proj"):
                self.handles.append(mod.register_forward_pre_hook(self._enter(layer_index(name), mod)))
        self.saved = []
        for module, fn_name, path in self.PATCHED:
            original = getattr(module, fn_name)
            self.saved.append((module, fn_name, original))
            setattr(module, fn_name, self._wrap(original, path))

    def _enter(self, layer, mixer):
        def pre_hook(mod, args, kwargs=None):
            self.current = (layer, mixer)

        return pre_hook

    def _wrap(self, original, path):
        def wrapped(*args, **kwargs):
            layer, mixer = self.current
            dt = args[2] if path == "recurrent" else args[1]
            if path == "recurrent":
                dt = dt[..., 0]  # [batch, heads, head_dim] expanded copies of one value per head
            dt = torch.nn.functional.softplus(dt.float() + mixer.dt_bias.float())
            limit = kwargs.get("dt_limit", (0.0, float("inf"))) if path == "chunked" else None
            self.calls.append(
                {
                    "layer": layer,
                    "path": path,
                    "tokens": int(dt.shape[1]) if path == "chunked" else 1,
                    "dt_lower_clamp": None if limit is None else float(limit[0]),
                    "n_dt": int(dt.numel()),
                    "n_dt_below_time_step_min": int((dt < self.threshold).sum()),
                }
            )
            return original(*args, **kwargs)

        return wrapped

    def clear(self):
        self.calls = []

    def remove(self):
        for h in self.handles:
            h.remove()
        for module, fn_name, original in self.saved:
            setattr(module, fn_name, original)


# --------------------------------------------------------------------------------------------
# Cases
# --------------------------------------------------------------------------------------------


def case_prompts(hf_tok):
    long_text = hf_tok.apply_chat_template(LONG_MESSAGES, tokenize=False, add_generation_prompt=True)
    texts = {"main": MAIN_TEXT, "long": long_text, **SHORT_TEXTS}
    prompts = {}
    for case, text in texts.items():
        ids = hf_tok(text, add_special_tokens=False)["input_ids"]
        prompts[case] = {"text": text, "ids": ids}
    for n in (1, 2, 3):
        assert len(prompts[f"short{n}"]["ids"]) == n, (n, prompts[f"short{n}"])
    return prompts


def greedy_config(model, use_cache):
    # generate() fills every None of the config it is given from model.generation_config, so EOS has
    # to be switched off there (in memory only; the saved generation_config.json keeps it).
    model.generation_config.eos_token_id = None
    cfg = copy.deepcopy(model.generation_config)
    cfg.pad_token_id = PAD_ID
    cfg.do_sample = False
    cfg.max_new_tokens = NEW_TOKENS
    cfg.min_new_tokens = None
    cfg.use_cache = use_cache
    cfg.output_logits = True
    cfg.return_dict_in_generate = True
    return cfg


def as_sets(ids):
    return torch.sort(ids, dim=-1).values


def summarise_dt(calls):
    """Per Mamba layer: the first call (the forward, or generate's prefill) and the later calls
    (generate's decode steps) with their scan path and dt counts."""
    per_layer = {}
    for c in calls:
        per_layer.setdefault(str(c["layer"]), []).append({k: v for k, v in c.items() if k != "layer"})
    out = {}
    for layer, seq in per_layer.items():
        out[layer] = {"first_call": seq[0]}
        if len(seq) > 1:
            rest = seq[1:]
            out[layer]["later_calls"] = {
                "calls": len(rest),
                "paths": sorted({c["path"] for c in rest}),
                "n_dt": sum(c["n_dt"] for c in rest),
                "n_dt_below_time_step_min": sum(c["n_dt_below_time_step_min"] for c in rest),
            }
    return out


def run_case(model, routers, layers, mamba, case, prompt, tensors, record_layers):
    ids = torch.tensor([prompt["ids"]], dtype=torch.long)
    T = ids.shape[1]
    k = model.config.num_experts_per_tok
    info = {"text": prompt["text"], "prompt_ids": prompt["ids"], "num_prompt_tokens": T}
    tensors[f"{case}.prompt_ids"] = ids[0].clone()

    # (a) one full forward over the prompt, no cache
    routers.clear()
    mamba.clear()
    layers.outputs = {}
    with torch.no_grad():
        out = model(ids, use_cache=False)
    logits = out.logits[0].float()
    tensors[f"{case}.logits"] = logits.contiguous()
    if record_layers:
        for i in range(len(model.model.layers)):
            tensors[f"{case}.layer{i}.output"] = layers.outputs[i][0].contiguous()
    forward_routing = {}
    consistent = True
    for layer in routers.moe_layers:
        (rec,) = routers.records[layer]
        tensors[f"{case}.layer{layer}.topk_ids"] = rec["ids"].contiguous()
        tensors[f"{case}.layer{layer}.topk_weights"] = rec["weights"].contiguous()
        tensors[f"{case}.layer{layer}.selection_scores"] = rec["scores"].contiguous()
        tensors[f"{case}.layer{layer}.selection_margin"] = rec["margin"].contiguous()
        consistent &= bool(torch.equal(as_sets(rec["ids"]), as_sets(rec["chosen"])))
        forward_routing[str(layer)] = {"min_selection_margin": float(rec["margin"].min())}
    info["forward"] = {"moe_layers": forward_routing}
    if mamba.calls:
        info["forward"]["mamba_dt"] = summarise_dt(mamba.calls)

    # (b) greedy generation with the KV / Mamba cache
    routers.clear()
    mamba.clear()
    with torch.no_grad():
        gen = model.generate(ids, generation_config=greedy_config(model, True))
    new_ids = gen.sequences[0, T:]
    assert new_ids.numel() == NEW_TOKENS, new_ids
    step_logits = torch.stack([x[0].float() for x in gen.logits])
    tensors[f"{case}.generate.ids"] = new_ids.clone()
    tensors[f"{case}.generate.step_logits"] = step_logits.contiguous()
    top2 = torch.topk(step_logits, 2, dim=-1).values
    gen_routing = {}
    for layer in routers.moe_layers:
        recs = routers.records[layer]
        assert len(recs) == NEW_TOKENS, (layer, len(recs))
        rows = torch.cat([r["ids"] for r in recs])
        assert rows.shape[0] == T + NEW_TOKENS - 1
        margin = torch.cat([r["margin"] for r in recs])
        tensors[f"{case}.generate.layer{layer}.topk_ids"] = rows.contiguous()
        tensors[f"{case}.generate.layer{layer}.topk_weights"] = torch.cat([r["weights"] for r in recs]).contiguous()
        tensors[f"{case}.generate.layer{layer}.selection_margin"] = margin.contiguous()
        consistent &= all(bool(torch.equal(as_sets(r["ids"]), as_sets(r["chosen"]))) for r in recs)
        gen_routing[str(layer)] = {"min_selection_margin": float(margin.min())}
    info["generate"] = {
        "ids": new_ids.tolist(),
        "text": None,
        "min_top1_minus_top2_step_logit": float((top2[:, 0] - top2[:, 1]).min()),
        "moe_layers": gen_routing,
    }
    if mamba.calls:
        info["generate"]["mamba_dt"] = summarise_dt(mamba.calls)

    # self-checks; the first two define what the goldens mean, so they must hold
    checks = {"selection_scores_reproduce_topk_ids_as_sets": consistent}
    checks["generated_ids_are_argmax_of_step_logits"] = bool(torch.equal(step_logits.argmax(-1), new_ids))
    assert all(checks.values()), (case, checks)
    checks["step0_logits_equal_forward_last_row_max_abs_diff"] = float((step_logits[0] - logits[-1]).abs().max())
    routers.clear()
    mamba.clear()
    with torch.no_grad():
        nocache = model.generate(ids, generation_config=greedy_config(model, False))
    checks["generate_cache_equals_no_cache"] = bool(torch.equal(nocache.sequences, gen.sequences))
    routers.clear()
    with torch.no_grad():
        full = model(gen.sequences[:, :-1], use_cache=False)
    checks["step_logits_vs_full_forward_max_abs_diff"] = float((full.logits[0, T - 1 :].float() - step_logits).abs().max())
    differing = 0
    for layer in routers.moe_layers:
        (rec,) = routers.records[layer]
        a = as_sets(rec["ids"])
        b = as_sets(tensors[f"{case}.generate.layer{layer}.topk_ids"])
        differing += int((a != b).any(-1).sum())
    checks["rows_where_cached_routing_differs_from_full_forward_routing"] = differing
    info["checks"] = checks
    routers.clear()
    mamba.clear()
    return info


# --------------------------------------------------------------------------------------------
# Driver
# --------------------------------------------------------------------------------------------


def sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def versions():
    return {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "safetensors": safetensors.__version__,
        "tokenizers": tokenizers.__version__,
    }


def config_equivalence(model_dir, ids, reference_logits):
    """Loading config.v5.json instead of the hub-style config.json must give the same logits."""
    with tempfile.TemporaryDirectory() as tmp:
        for name in os.listdir(model_dir):
            if name != "config.json":
                dst = "config.json" if name == "config.v5.json" else name
                shutil.copy(os.path.join(model_dir, name), os.path.join(tmp, dst))
        model = load_f32(tmp)
        with torch.no_grad():
            logits = model(ids, use_cache=False).logits[0].float()
    return bool(torch.equal(logits, reference_logits))


def build_arch(arch, out_root, tok, hf_tok, prompts, seed, seed_base):
    arch_dir = os.path.join(out_root, arch)
    if os.path.exists(arch_dir):
        shutil.rmtree(arch_dir)
    model_dir = os.path.join(arch_dir, "model")
    kwargs = dict(ARCH_KWARGS[arch])
    perturbed = save_checkpoint(arch, kwargs, model_dir, tok, seed)

    model = load_f32(model_dir)
    cfg = model.config
    routers = RouterProbe(arch, model)
    layers = LayerProbe(model)
    mamba = MambaProbe(model)
    tensors = {}
    cases = {}
    for case, prompt in prompts.items():
        cases[case] = run_case(model, routers, layers, mamba, case, prompt, tensors, case == "main")
        cases[case]["generate"]["text"] = hf_tok.decode(cases[case]["generate"]["ids"])
    routers.remove()
    layers.remove()
    mamba.remove()

    margins = [
        m["min_selection_margin"]
        for c in cases.values()
        for part in ("forward", "generate")
        for m in c[part]["moe_layers"].values()
    ]
    quality = {
        "min_selection_margin": min(margins),
        "min_top1_minus_top2_step_logit": min(c["generate"]["min_top1_minus_top2_step_logit"] for c in cases.values()),
    }
    if quality["min_selection_margin"] < MIN_SELECTION_MARGIN or quality["min_top1_minus_top2_step_logit"] < MIN_STEP_LOGIT_GAP:
        return None, quality

    main_ids = torch.tensor([prompts["main"]["ids"]], dtype=torch.long)
    checks = {
        "config_json_and_config_v5_json_give_identical_logits": config_equivalence(
            model_dir, main_ids, tensors["main.logits"]
        ),
        "generate_cache_equals_no_cache_all_cases": all(
            c["checks"]["generate_cache_equals_no_cache"] for c in cases.values()
        ),
        "rows_where_cached_routing_differs_from_full_forward_routing_all_cases": sum(
            c["checks"]["rows_where_cached_routing_differs_from_full_forward_routing"] for c in cases.values()
        ),
    }
    save_file(tensors, os.path.join(arch_dir, "golden.safetensors"), metadata={"format": "pt"})

    meta = {
        "architecture": cfg.architectures[0] if cfg.architectures else type(model).__name__,
        "model_type": cfg.model_type,
        "num_hidden_layers": len(model.model.layers),
        "layer_kinds": layer_kinds(arch, cfg),
        "moe_layers": routers.moe_layers,
        "num_experts": int(routers.routers[0][1].weight.shape[0]),
        "top_k": cfg.num_experts_per_tok,
        "vocab_size": cfg.vocab_size,
        "hidden_size": cfg.hidden_size,
        "new_tokens": NEW_TOKENS,
        "routing": ROUTING_FORMULA[arch],
        "position_encoding": position_encoding(arch, cfg),
        "storage_dtype": "bfloat16 (e_score_correction_bias float32)",
        "compute": "float32, attn_implementation=eager, experts_implementation=eager, 1 CPU thread",
        "seed": seed,
        "clear_margins": dict(
            quality,
            rule=f"seed = first of {seed_base} + {{0, 1, ...}} whose goldens have every selection_margin >= "
            f"{MIN_SELECTION_MARGIN} and every top1 - top2 step logit >= {MIN_STEP_LOGIT_GAP}",
        ),
        "perturbed_tensors": on_disk_names(model_dir, perturbed),
        "config_key_differences": config_key_differences(model_dir),
        "tensor_names": tensor_schema(routers.moe_layers, len(model.model.layers)),
        "cases": cases,
        "checks": checks,
        "notes": notes(arch),
        "versions": versions(),
    }
    if arch == "nemotron_h":
        meta["notes"].append(topk_order_note(tensors, routers.moe_layers, prompts))
        meta["dt_clamp"] = dt_clamp_facts(cfg, cases)
        meta["routing_ablation"] = nemotron_ablation(tensors, routers.moe_layers, model)
    meta["files"] = file_hashes(arch_dir)
    write_json(os.path.join(arch_dir, "golden.json"), meta)
    return meta, quality


def on_disk_names(model_dir, names):
    """transformers renames some prefixes in memory (Nemotron-H: backbone. -> model.); report the
    names as stored in model.safetensors."""
    from safetensors import safe_open

    with safe_open(os.path.join(model_dir, "model.safetensors"), "pt") as f:
        keys = set(f.keys())
    out = []
    for name in names:
        candidates = [name, "backbone." + name[len("model.") :] if name.startswith("model.") else name]
        found = [c for c in candidates if c in keys]
        assert found, name
        out.append(found[0])
    return out


def config_key_differences(model_dir):
    with open(os.path.join(model_dir, "config.json"), encoding="utf-8") as f:
        hub = json.load(f)
    with open(os.path.join(model_dir, "config.v5.json"), encoding="utf-8") as f:
        v5 = json.load(f)
    return {
        "only_in_config.json": sorted(set(hub) - set(v5)),
        "only_in_config.v5.json": sorted(set(v5) - set(hub)),
        "different_values": sorted(k for k in set(hub) & set(v5) if hub[k] != v5[k]),
    }


def layer_kinds(arch, cfg):
    if arch == "nemotron_h":
        names = {"linear_attention": "mamba2", "full_attention": "attention", "moe": "moe", "mlp": "mlp"}
        return [names[t] for t in cfg.layers_block_type]
    if arch == "granitemoehybrid":
        names = {"linear_attention": "mamba2+moe+shared_mlp", "full_attention": "attention+moe+shared_mlp"}
        return [names[t] for t in cfg.layer_types]
    if arch == "qwen3_moe":
        return ["attention+" + ("mlp" if i in cfg.mlp_only_layers else "moe") for i in range(cfg.num_hidden_layers)]
    return ["attention+moe"] * cfg.num_hidden_layers


def position_encoding(arch, cfg):
    if arch == "nemotron_h":
        return "none: Nemotron-H attention applies no positional encoding"
    if arch == "granitemoehybrid":
        return f"position_embedding_type={cfg.position_embedding_type!r}: no RoPE (only 'rope' enables it)"
    return f"rope, rope_theta={cfg.rope_parameters['rope_theta']}"


def tensor_schema(moe_layers, n_layers):
    return {
        "<case>.prompt_ids": "i64 [T]",
        "<case>.logits": "f32 [T, V], one forward over the prompt without cache",
        "main.layer{i}.output": f"f32 [T, H], output of decoder layer i (residual stream before the final norm), i in 0..{n_layers}",
        "<case>.layer{L}.topk_ids": "i64 [T, k], the model's order",
        "<case>.layer{L}.topk_weights": "f32 [T, k], same order as topk_ids",
        "<case>.layer{L}.selection_scores": "f32 [T, E], the scores top-k is taken on (see routing)",
        "<case>.layer{L}.selection_margin": "f32 [T], k-th minus (k+1)-th selection score (see routing)",
        "<case>.generate.ids": f"i64 [{NEW_TOKENS}], greedy, with cache, EOS disabled",
        "<case>.generate.step_logits": f"f32 [{NEW_TOKENS}, V], row j = logits token j was picked from "
        "(row 0 = last prompt position of the cached prefill call)",
        "<case>.generate.layer{L}.topk_ids": f"i64 [T+{NEW_TOKENS - 1}, k], prefill rows then one row per decode step",
        "<case>.generate.layer{L}.topk_weights": f"f32 [T+{NEW_TOKENS - 1}, k]",
        "<case>.generate.layer{L}.selection_margin": f"f32 [T+{NEW_TOKENS - 1}]",
        "L": f"decoder-layer index of an MoE layer, one of {moe_layers}",
    }


def dt_clamp_facts(cfg, cases):
    facts = {
        "time_step_min": cfg.time_step_min,
        "rule": (
            "transformers' Nemotron-H mixer uses time_step_limit = (time_step_min, inf), ignoring the config's "
            "time_step_limit; dt = softplus(dt_raw + dt_bias) is clamped to >= time_step_min only in the chunked "
            "scan (any multi-token call, any call without cache, and the first call of a cache, even with 1 token); "
            "the single-token recurrent update used for every decode step does not clamp."
        ),
        "per_case": {},
    }
    for case, info in cases.items():
        fwd = info["forward"]["mamba_dt"]
        gen = info["generate"]["mamba_dt"]
        facts["per_case"][case] = {
            "forward_n_dt": {layer: v["first_call"]["n_dt"] for layer, v in fwd.items()},
            "forward_below_min_clamped": {layer: v["first_call"]["n_dt_below_time_step_min"] for layer, v in fwd.items()},
            "generate_prefill_path": {layer: v["first_call"]["path"] for layer, v in gen.items()},
            "generate_prefill_below_min_clamped": {
                layer: v["first_call"]["n_dt_below_time_step_min"] for layer, v in gen.items()
            },
            "generate_decode_paths": sorted({p for v in gen.values() for p in v["later_calls"]["paths"]}),
            "generate_decode_n_dt": {layer: v["later_calls"]["n_dt"] for layer, v in gen.items()},
            "generate_decode_below_min_not_clamped": {
                layer: v["later_calls"]["n_dt_below_time_step_min"] for layer, v in gen.items()
            },
        }
    one = facts["per_case"]["short1"]
    facts["one_token_prompt"] = (
        f"generate() runs a 1-token prompt through the {sorted(set(one['generate_prefill_path'].values()))} path, "
        "so prompt positions are clamped whatever their number; decode steps take "
        f"{one['generate_decode_paths']} and are not clamped."
    )
    return facts


def topk_order_note(tensors, moe_layers, prompts):
    rows = descending = 0
    for case in prompts:
        for layer in moe_layers:
            ids = tensors[f"{case}.layer{layer}.topk_ids"]
            chosen = tensors[f"{case}.layer{layer}.selection_scores"].gather(1, ids)
            rows += ids.shape[0]
            descending += int((chosen[:, :-1] >= chosen[:, 1:]).all(-1).sum())
    return (
        f"With k=2 on CPU, {descending} of {rows} forward rows happen to list topk_ids in descending score "
        "order; nothing guarantees it (other k, other devices), so compare as sets."
    )


def tie_fact():
    ids = torch.topk(torch.tensor([1.0, 3.0, 2.0, 3.0, 0.0, 3.0]), 2).indices.tolist()
    first = int(torch.argmax(torch.tensor([1.0, 3.0, 2.0, 3.0, 0.0, 3.0])))
    return (
        f"Ties: in this torch, topk([1,3,2,3,0,3], 2) returns indices {ids} (not lowest index first) while "
        f"argmax returns {first} (the first maximum). Compare expert ids as sets and skip rows whose "
        "selection_margin is below the comparison's own error; greedy decoding uses argmax."
    )


def nemotron_ablation(tensors, moe_layers, model):
    """How many main-case rows would route differently without the correction bias or without the
    group limit: evidence that the goldens exercise both."""
    out = {}
    for layer in moe_layers:
        scores = tensors[f"main.layer{layer}.selection_scores"]
        ids = as_sets(tensors[f"main.layer{layer}.topk_ids"])
        router = dict(model.named_modules())[f"model.layers.{layer}.mixer.gate"]
        k = ids.shape[-1]
        no_group = as_sets(torch.topk(scores, k, dim=-1).indices)
        no_bias = scores - router.e_score_correction_bias.float()
        n_group = model.config.n_group
        rows, n_exp = scores.shape
        gs = no_bias.view(rows, n_group, n_exp // n_group).topk(2, -1).values.sum(-1)
        keep = torch.zeros_like(gs, dtype=torch.bool).scatter_(1, torch.topk(gs, model.config.topk_group, -1).indices, True)
        mask = keep.unsqueeze(-1).expand(rows, n_group, n_exp // n_group).reshape(rows, n_exp)
        no_bias_ids = as_sets(torch.topk(no_bias.masked_fill(~mask, float("-inf")), k, -1).indices)
        out[str(layer)] = {
            "rows": rows,
            "rows_changed_without_group_limit": int((no_group != ids).any(-1).sum()),
            "rows_changed_without_correction_bias": int((no_bias_ids != ids).any(-1).sum()),
        }
    return out


def notes(arch):
    n = [
        "All numbers come from the bf16 checkpoint in model/ loaded in float32, eager attention, eager experts.",
        "The eos token id (2, <|im_end|>) is disabled during generation, so every case produces exactly "
        f"{NEW_TOKENS} tokens; a generated 2 is just a token.",
        "generate.*.topk_ids has T + 15 rows: the router of the 16th generated token never runs.",
        tie_fact(),
        "selection_margin is in the units of selection_scores (probabilities, logits or sigmoid+bias).",
    ]
    if arch == "nemotron_h":
        n += [
            "Nemotron-H attention has no positional encoding (no RoPE); the config has no rope key at all.",
            "topk(sorted=False): the order of topk_ids carries no meaning; topk_weights follow that order.",
            "The experts are relu2 up/down MLPs without a gate; the MLP layer ('-') is relu2 too.",
            "Weights sum to routed_scaling_factor (2.5), not 1.",
            "dt is clamped to >= time_step_min only in the chunked scan: prompt positions are clamped "
            "(including a 1-token prompt), decode steps are not; see dt_clamp. For the same reason the full "
            "forward over prompt + generated tokens differs from the cached step logits by more than float noise "
            "(checks.step_logits_vs_full_forward_max_abs_diff).",
            "Group-limited routing is on (n_group=2, topk_group=1); group score = sum of the 2 best scores in the "
            "group. routing_ablation counts rows that the group limit and the correction bias change.",
            "On disk the weights use the 'backbone.' prefix (transformers renames it to 'model.' in memory); "
            "perturbed_tensors lists on-disk names.",
            "Two different keys: n_group/topk_group are the router's expert groups, n_groups is the Mamba2 B/C "
            "group count (heads are split evenly across n_groups).",
            "A_log is not constant at init (log(1..heads)) but is perturbed as well; dt_bias is random at init.",
            "config.json (hub style) leaves out time_step_limit; config.v5.json has [0.0, {\"__float__\": "
            "\"Infinity\"}]. Neither is used: the mixer's clamp is (time_step_min, inf).",
        ]
    if arch == "granitemoehybrid":
        n += [
            "position_embedding_type is 'nope' as in the released Granite-4.0-H models: attention has no RoPE. "
            "The v5 config still carries a default rope_parameters block, which the model ignores.",
            "tie_word_embeddings is true (lm_head.weight is not stored; logits use the embedding matrix) as in the "
            "released models.",
            "muP multipliers: embeddings *= embedding_multiplier; each residual branch *= residual_multiplier; "
            "attention scale = attention_multiplier (not 1/sqrt(head_dim)); logits /= logits_scaling.",
            "time_step_limit is (0, inf) so dt is never clamped.",
            "Top-k is taken on the raw logits, then softmax over the k kept logits.",
        ]
    if arch == "qwen3_moe":
        n += ["Layer 2 is dense (mlp_only_layers=[2]); q_norm/k_norm are applied per head before RoPE."]
    return n


def file_hashes(arch_dir):
    files = {}
    for root, _, names in os.walk(arch_dir):
        for name in sorted(names):
            path = os.path.join(root, name)
            rel = os.path.relpath(path, arch_dir)
            if rel == "golden.json":
                continue
            files[rel] = {"bytes": os.path.getsize(path), "sha256": sha256(path)}
    return dict(sorted(files.items()))


def build_default_model(out_root, tok, seed):
    target = os.path.join(out_root, "tiny_hybrid_default")
    if os.path.exists(target):
        shutil.rmtree(target)
    model_dir = os.path.join(target, "model")
    save_checkpoint("nemotron_h", dict(DEFAULT_MODEL_KWARGS), model_dir, tok, seed)
    os.remove(os.path.join(model_dir, "config.v5.json"))
    # smoke test: it loads from the hub-style config and generates
    model = load_f32(model_dir)
    hf_tok = AutoTokenizer.from_pretrained(model_dir)
    ids = torch.tensor([hf_tok(MAIN_TEXT, add_special_tokens=False)["input_ids"]])
    with torch.no_grad():
        gen = model.generate(ids, generation_config=greedy_config(model, True))
    return {"generated": gen.sequences[0, ids.shape[1] :].tolist(), "files": file_hashes(target)}


ARCHS = ["qwen3_moe", "mixtral", "nemotron_h", "granitemoehybrid"]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=HERE, help="output directory (default: the directory of this script)")
    ap.add_argument("--arch", nargs="*", default=ARCHS, choices=ARCHS)
    ap.add_argument("--no-default-model", action="store_true", help="skip tiny_hybrid_default")
    args = ap.parse_args()

    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)

    tok = train_tokenizer()
    with tempfile.TemporaryDirectory() as tmp:
        write_tokenizer_files(tmp, tok)
        hf_tok = AutoTokenizer.from_pretrained(tmp)
    chat = hf_tok.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True)
    assert chat == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n", repr(chat)
    prompts = case_prompts(hf_tok)
    for case, p in prompts.items():
        assert hf_tok.decode(p["ids"]) == p["text"], case
        assert tok.encode(p["text"], add_special_tokens=False).ids == p["ids"], case

    summary = {}
    for arch in args.arch:
        base = SEED + 100 * ARCHS.index(arch)
        for attempt in range(MAX_SEED_TRIES):
            meta, quality = build_arch(arch, args.out, tok, hf_tok, prompts, base + attempt, base)
            if meta is not None:
                break
            print(json.dumps({arch: {"rejected_seed": base + attempt, **quality}}), flush=True)
        else:
            raise SystemExit(f"{arch}: no seed with clear margins in {MAX_SEED_TRIES} tries")
        summary[arch] = {
            "seed": meta["seed"],
            "T": {c: v["num_prompt_tokens"] for c, v in meta["cases"].items()},
            "checks": meta["checks"],
            "bytes": sum(f["bytes"] for f in meta["files"].values()),
        }
        print(json.dumps({arch: summary[arch]}), flush=True)
    if not args.no_default_model:
        print(json.dumps({"tiny_hybrid_default": build_default_model(args.out, tok, SEED + 1000)}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
