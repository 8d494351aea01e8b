#!/usr/bin/env python3
"""Golden outputs from Hugging Face transformers for every architecture duet loads.

Builds one tiny RANDOM model per architecture with transformers (5.x) and torch on CPU in
float32, saves it with save_pretrained(safe_serialization=True) under
tests/unit/model_hf/testdata/<name>/ (config.json, model.safetensors, generation_config.json) and
writes golden.json next to it:

  - prompts: token ids of lengths 1, 2, 17, 64 and 300 (numpy default_rng(1000 + length),
    uniform over the vocabulary);
  - first_logprobs: the log-softmax over the whole vocabulary at the last prompt position
    (float32 values, written as the shortest decimal that round-trips the float32);
  - greedy: 16 tokens from a manual greedy loop that runs the FULL forward (no KV cache) over
    prompt + generated tokens at every step and takes the argmax of the last position (ties go
    to the lowest id, as torch.argmax); greedy_logprobs: the chosen token's log-softmax value
    at each step; greedy_margins: top-1 minus top-2 logit at each step. The loop is checked
    against model.generate(do_sample=False) (which uses the KV cache and stops at eos): they
    must agree up to where generate stopped;
  - the transformers / torch versions, the init seed and the smallest greedy margin.

Random init gives near-uniform logits where greedy choices are ties, so the init is scaled up
(initializer_range 0.3), and norm weights and biases (zero / one at init) are perturbed so that
they matter. In gemma3 the embedding, the blocks' closing norms and the final norm are rescaled
as well (see GEMMA_* below). Every greedy step must have a top-1 minus top-2 margin > 1e-3;
otherwise the model is re-initialised with the next seed.

Not run by CI. To regenerate (a throwaway venv; the goldens were made with transformers
5.24.0, torch 2.15.0, safetensors 0.8.0, numpy 2.4.6):

  python3 -m venv /tmp/refvenv
  /tmp/refvenv/bin/pip install torch==2.15.0 transformers==5.24.0 safetensors numpy
  /tmp/refvenv/bin/python scripts/make_hf_reference.py            # all models
  /tmp/refvenv/bin/python scripts/make_hf_reference.py qwen3      # only some

then build and run the check:

  ninja -C build hf_reference_test && build/tests/unit/model_hf/hf_reference_test
"""

import json
import os
import shutil
import sys

import numpy as np
import torch
import transformers
from transformers import (Gemma3ForCausalLM, Gemma3TextConfig, LlamaConfig, LlamaForCausalLM,
                          MistralConfig, MistralForCausalLM, Qwen2Config, Qwen2ForCausalLM,
                          Qwen3Config, Qwen3ForCausalLM)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT_DIR = os.path.join(ROOT, "tests", "unit", "model_hf", "testdata")
PROMPT_LENGTHS = [1, 2, 17, 64, 300]
NUM_NEW_TOKENS = 16
MIN_MARGIN = 1e-3
INIT_STD = 0.3        # initializer_range: peaked distributions
NORM_NOISE_STD = 0.2  # added to every RMSNorm weight (1-centred, or 0-centred in Gemma)
BIAS_STD = 0.2        # q/k/v biases (zero at init)
# Gemma multiplies the (tied) embedding by sqrt(hidden_size): at random init the residual stream
# is then mostly the input token's embedding, and with the tied lm_head every token predicts
# itself again and again. So in gemma3 the embedding is scaled by 1 / sqrt(hidden_size), the
# sandwich norms that close each block by 1 + 2 (the blocks dominate the residual stream) and
# the final norm by 1 + 7 (peaked logits again).
GEMMA_POST_NORMS = ("post_attention_layernorm.weight", "post_feedforward_layernorm.weight")
GEMMA_POST_NORM_ADD = 2.0
GEMMA_FINAL_NORM_ADD = 7.0

COMMON = dict(
    vocab_size=256,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    max_position_embeddings=512,
    rms_norm_eps=1e-6,
    initializer_range=INIT_STD,
    bos_token_id=1,
    eos_token_id=2,
    pad_token_id=None,
)


def spec(**overrides):
    d = dict(COMMON)
    d.update(overrides)
    return d


# name -> (model class, config class, config kwargs)
MODELS = {
    "llama_gqa": (LlamaForCausalLM, LlamaConfig, spec(
        num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=False,
        rope_parameters={"rope_type": "default", "rope_theta": 500000.0})),
    # head_dim 32, theta 5e5, original context 64: wavelengths 2*pi*theta^(2i/32) are
    # 6.3, 14.3 (< 64/4: unchanged), 32.5 (smoothed), 74 and up (> 64: divided by 8).
    "llama3_scaled": (LlamaForCausalLM, LlamaConfig, spec(
        num_attention_heads=2, num_key_value_heads=1, head_dim=32, tie_word_embeddings=True,
        rope_parameters={"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0,
                         "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                         "original_max_position_embeddings": 64})),
    "qwen2": (Qwen2ForCausalLM, Qwen2Config, spec(
        vocab_size=300, num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True,
        rope_parameters={"rope_type": "default", "rope_theta": 1000000.0})),
    "qwen3": (Qwen3ForCausalLM, Qwen3Config, spec(
        num_attention_heads=4, num_key_value_heads=2, head_dim=32, tie_word_embeddings=True,
        attention_bias=False,
        rope_parameters={"rope_type": "default", "rope_theta": 1000000.0})),
    "mistral_sw": (MistralForCausalLM, MistralConfig, spec(
        num_attention_heads=4, num_key_value_heads=1, head_dim=16, tie_word_embeddings=False,
        sliding_window=24,
        rope_parameters={"rope_type": "default", "rope_theta": 100000.0})),
    # Local layers 0, 1, 3 (window 16, theta 2e4) and a global layer 2 (theta 5e5); head_dim 24
    # (not hidden / heads), query_pre_attn_scalar 32 (not head_dim). Softcapping: the
    # Gemma3TextConfig defaults (recorded in golden.json).
    "gemma3": (Gemma3ForCausalLM, Gemma3TextConfig, spec(
        num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2, head_dim=24,
        query_pre_attn_scalar=32, sliding_window=16, tie_word_embeddings=True,
        bos_token_id=2, eos_token_id=1, pad_token_id=0,
        layer_types=["sliding_attention", "sliding_attention", "full_attention",
                     "sliding_attention"],
        rope_parameters={
            "sliding_attention": {"rope_type": "default", "rope_theta": 20000.0},
            "full_attention": {"rope_type": "default", "rope_theta": 500000.0},
        })),
}


def f32(x):
    """The shortest decimal string that round-trips float32 x, as a Python float."""
    return float(np.format_float_positional(np.float32(x), unique=True, trim="-"))


def prompts(vocab):
    return {n: np.random.default_rng(1000 + n).integers(0, vocab, size=n).tolist()
            for n in PROMPT_LENGTHS}


def build(model_cls, config_cls, kwargs, seed):
    torch.manual_seed(seed)
    config = config_cls(**kwargs)
    config._attn_implementation = "eager"
    model = model_cls(config).to(torch.float32).eval()
    g = torch.Generator().manual_seed(seed + 1)
    gemma = config.model_type == "gemma3_text"
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.add_(torch.randn(p.shape, generator=g) * NORM_NOISE_STD)
                if gemma and name.endswith(GEMMA_POST_NORMS):
                    p.add_(GEMMA_POST_NORM_ADD)
                if gemma and name == "model.norm.weight":
                    p.add_(GEMMA_FINAL_NORM_ADD)
            elif name.endswith(".bias"):
                p.copy_(torch.randn(p.shape, generator=g) * BIAS_STD)
            elif gemma and name == "model.embed_tokens.weight":
                p.mul_(config.hidden_size ** -0.5)
    return model


@torch.no_grad()
def last_logits(model, ids):
    out = model(input_ids=torch.tensor([ids]), use_cache=False)
    return out.logits[0, -1].to(torch.float32)


@torch.no_grad()
def run_prompt(model, ids):
    logits = last_logits(model, ids)
    first = torch.log_softmax(logits.double(), -1).float()
    seq, greedy, lps, margins = list(ids), [], [], []
    for step in range(NUM_NEW_TOKENS):
        if step > 0:
            logits = last_logits(model, seq)
        top = torch.topk(logits, 2)
        tok = int(torch.argmax(logits))
        assert tok == int(top.indices[0])
        margins.append(float(top.values[0] - top.values[1]))
        lps.append(float(torch.log_softmax(logits.double(), -1)[tok]))
        greedy.append(tok)
        seq.append(tok)
    # generate() stops at eos_token_id (the loop does not): compare up to where it stopped.
    gen = model.generate(torch.tensor([ids]), do_sample=False, max_new_tokens=NUM_NEW_TOKENS,
                         attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                         pad_token_id=model.config.pad_token_id or 0)
    gen_ids = gen[0, len(ids):].tolist()
    stopped = len(gen_ids) < NUM_NEW_TOKENS and gen_ids[-1] == model.config.eos_token_id
    if gen_ids != greedy[:len(gen_ids)] or not (len(gen_ids) == NUM_NEW_TOKENS or stopped):
        raise RuntimeError(f"generate() gave {gen_ids}, the full-forward loop {greedy}")
    return first, greedy, lps, margins


def make(name, seed0=1):
    model_cls, config_cls, kwargs = MODELS[name]
    ps = prompts(kwargs["vocab_size"])
    for seed in range(seed0, seed0 + 20):
        model = build(model_cls, config_cls, kwargs, seed)
        results = {n: run_prompt(model, ids) for n, ids in ps.items()}
        smallest = min(min(r[3]) for r in results.values())
        if smallest > MIN_MARGIN:
            break
        print(f"{name}: seed {seed} has a greedy margin {smallest:.3g}; re-seeding")
    else:
        raise RuntimeError(f"{name}: no seed gives greedy margins > {MIN_MARGIN}")

    out = os.path.join(OUT_DIR, name)
    if os.path.exists(out):
        shutil.rmtree(out)
    model.save_pretrained(out, safe_serialization=True)
    with open(os.path.join(out, "config.json")) as f:
        written = json.load(f)
    print(f"== {name}: config.json as written")
    print(json.dumps(written, indent=2))
    assert "rope_parameters" in written, "expected transformers 5 to write rope_parameters"
    assert "rope_theta" not in written and "rope_scaling" not in written

    # The goldens come from the model as reloaded from what was written. It agrees with the
    # in-memory one to float32 rounding (torch picks kernels by memory layout: a few 1e-6).
    reloaded = model_cls.from_pretrained(out, dtype=torch.float32,
                                         attn_implementation="eager").eval()
    assert reloaded.config._attn_implementation == "eager"
    for n, ids in ps.items():
        again = run_prompt(reloaded, ids)
        err = float((again[0] - results[n][0]).abs().max())
        assert err < 1e-5 and again[1] == results[n][1], (
            f"{name}: the reloaded model differs at prompt length {n}: {err}")
        results[n] = again
    smallest = min(min(r[3]) for r in results.values())
    assert smallest > MIN_MARGIN
    model = reloaded

    cfg = model.config
    golden = {
        "model": name,
        "architecture": written["architectures"][0],
        "transformers_version": transformers.__version__,
        "torch_version": torch.__version__,
        "dtype": "float32",
        "attn_implementation": "eager",
        "greedy_method": "manual greedy loop over the full forward (no KV cache), argmax of the "
                         "last position; equal to generate(do_sample=False) up to its eos stop",
        "seed": seed,
        "init": {"initializer_range": INIT_STD, "norm_noise_std": NORM_NOISE_STD,
                 "bias_std": BIAS_STD},
        "min_greedy_margin": smallest,
        "cases": [],
    }
    if name == "gemma3":
        golden["final_logit_softcapping"] = cfg.final_logit_softcapping
        golden["attn_logit_softcapping"] = cfg.attn_logit_softcapping
        golden["layer_types"] = list(cfg.layer_types)
    for n, ids in ps.items():
        first, greedy, lps, margins = results[n]
        golden["cases"].append({
            "prompt_len": n,
            "prompt": ids,
            "first_logprobs": [f32(x) for x in first.tolist()],
            "first_logsumexp": f32(torch.logsumexp(last_logits(model, ids).double(), -1)),
            "greedy": greedy,
            "greedy_logprobs": [f32(x) for x in lps],
            "greedy_margins": [f32(x) for x in margins],
        })
    with open(os.path.join(out, "golden.json"), "w") as f:
        json.dump(golden, f, separators=(",", ":"))
        f.write("\n")
    # The legacy config read by transformers describes the same model.
    legacy_dir = write_legacy_config(name, written)
    legacy_cfg = config_cls.from_pretrained(legacy_dir)
    assert legacy_cfg.rope_parameters == model.config.rope_parameters, legacy_cfg.rope_parameters
    assert getattr(legacy_cfg, "layer_types", None) == getattr(model.config, "layer_types", None)
    legacy_model = model_cls.from_pretrained(out, config=legacy_cfg, dtype=torch.float32,
                                             attn_implementation="eager").eval()
    for n, ids in ps.items():
        lp = torch.log_softmax(last_logits(legacy_model, ids).double(), -1).float()
        assert float((lp - results[n][0]).abs().max()) < 1e-6, f"{name}_legacy_config, {n}"
    print(f"== {name}: seed {seed}, smallest greedy margin {smallest:.4g}")
    return smallest


def write_legacy_config(name, config):
    """<name>_legacy_config/config.json: the same model with RoPE in the places transformers 4.x
    used (top-level rope_theta, rope_scaling; Gemma 3: rope_theta for the global layers and
    rope_local_base_freq for the local ones) and torch_dtype for dtype. The weights and goldens
    are <name>'s."""
    legacy = {k: v for k, v in config.items() if k != "rope_parameters"}
    rope = config["rope_parameters"]
    if "full_attention" in rope:  # Gemma 3: one entry per layer type
        assert rope["full_attention"]["rope_type"] == "default", rope
        assert rope["sliding_attention"]["rope_type"] == "default", rope
        legacy["rope_theta"] = rope["full_attention"]["rope_theta"]
        legacy["rope_local_base_freq"] = rope["sliding_attention"]["rope_theta"]
        legacy["rope_scaling"] = None
    else:
        legacy["rope_theta"] = rope["rope_theta"]
        scaling = {k: v for k, v in rope.items() if k != "rope_theta"}
        legacy["rope_scaling"] = None if scaling["rope_type"] == "default" else scaling
    legacy["torch_dtype"] = legacy.pop("dtype")
    out = os.path.join(OUT_DIR, name + "_legacy_config")
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(dict(sorted(legacy.items())), f, indent=2)
        f.write("\n")
    return out


def main():
    torch.set_num_threads(1)
    names = sys.argv[1:] or list(MODELS)
    summary = {n: make(n) for n in names}
    for n, m in summary.items():
        print(f"{n:14s} smallest greedy margin {m:.4g}")


if __name__ == "__main__":
    main()
