#!/usr/bin/env python3
"""Makes the reference data of the real-model tests (run once; the outputs are committed):

  python3 -m venv /tmp/refvenv
  /tmp/refvenv/bin/pip install tokenizers==0.23.3 gguf==0.19.0 numpy
  /tmp/refvenv/bin/python tests/unit/model_real/make_reference.py \
      models/smollm2-135m-instruct-q4_1.gguf tests/unit/model_real/testdata

Writes
- smollm2_token_ids.json: ids of fixed strings from the HF `tokenizers` library, with a BPE model
  built from the GGUF's tokenizer.ggml.tokens/merges, the pre-tokenizer SmolLM2's tokenizer.json
  uses (Sequence[Digits(individual_digits=True), ByteLevel(add_prefix_space=False)]) and the
  control tokens (token_type 3) as special added tokens.
- pretokenizer_splits.json: the words `tokenizers` pre-tokenizers give for gpt2 (ByteLevel),
  smollm (Digits + ByteLevel), llama3 and qwen2 (Split(regex) + ByteLevel(use_regex=False)).
- smollm2_dequant.json: for a few tensors, the first 16 values and the float64 sum of all
  values after `gguf.quants.dequantize` (the reference dequantiser of the gguf package), in the
  GGUF's own row order (before any un-permutation).
"""
import json
import sys

import numpy as np
from gguf import GGUFReader
from gguf.quants import dequantize
from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers

STRINGS = [
    "The capital of France is",
    "Hello world",
    "Hello, world! How's it going? I'm fine, they'll see; we've done it, I'd say.",
    "  leading spaces and trailing spaces   ",
    "tabs\tand\nnewlines\n\n\nand\r\nwindows line ends",
    "Numbers: 1234567890, 3.14159, -42, 1e10, 2024-11-29",
    "Unicode: café naïve résumé Ærøskøbing",
    "Chinese: 你好，世界！ Japanese: こんにちは Korean: 안녕하세요",
    "Emoji: 😀🎉👍🏽 and ❤️ and 🇫🇷",
    "Math: ∑ x² ≤ ∞, α+β=γ",
    "def fib(n):\n    return n if n < 2 else fib(n-1) + fib(n-2)\n",
    "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n",
    "text<|endoftext|>more text<|im_end|>",
    "don't DON'T You're THEY'LL",
    "   ",
    "a",
    "",
    "\u00a0non-breaking\u2003em space\u3000ideographic",
    "URL: https://huggingface.co/HuggingFaceTB/SmolLM2-135M-Instruct?x=1&y=2#frag",
    "!!!???...,,,;;;",
    "Ωmega ﬁ ligature ½ ⅔ Ⅻ ٣٤٥",
]

LLAMA3_RE = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|"
             r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN2_RE = LLAMA3_RE.replace(r"\p{N}{1,3}", r"\p{N}")


def words(pre, text):
    return [text[a:b] for _, (a, b) in pre.pre_tokenize_str(text)]


def hf_pre_tokenizers():
    """HF `tokenizers` pre-tokenizers of the four kinds duet implements, by duet's name."""
    return {
        "gpt2": pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
        "smollm": pre_tokenizers.Sequence([
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)]),
        "llama3": pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(LLAMA3_RE), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)]),
        "qwen2": pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(QWEN2_RE), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)]),
    }


def smollm2_bpe(gguf_path):
    """HF `tokenizers` BPE from the GGUF's vocabulary and merges, with SmolLM2's pre-tokenizer
    and its control tokens (token_type 3) as special tokens."""
    r = GGUFReader(gguf_path)
    toks = r.fields["tokenizer.ggml.tokens"].contents()
    types = r.fields["tokenizer.ggml.token_type"].contents()
    merges = r.fields["tokenizer.ggml.merges"].contents()
    tk = Tokenizer(models.BPE({t: i for i, t in enumerate(toks)},
                              [tuple(m.split(" ", 1)) for m in merges]))
    tk.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)])
    tk.decoder = decoders.ByteLevel()
    tk.add_special_tokens([AddedToken(toks[i], special=True)
                           for i in range(len(toks)) if types[i] == 3])
    return tk


def main():
    gguf_path, out_dir = sys.argv[1], sys.argv[2]
    r = GGUFReader(gguf_path)
    tk = smollm2_bpe(gguf_path)
    cases = [{"text": s, "ids": tk.encode(s).ids} for s in STRINGS]
    with open(f"{out_dir}/smollm2_token_ids.json", "w", encoding="utf-8") as f:
        json.dump({"made_by": "tests/unit/model_real/make_reference.py (HF tokenizers)",
                   "cases": cases}, f, ensure_ascii=False, indent=1)

    pres = hf_pre_tokenizers()
    extra = ["x  \n\n  y", "a\n b", "1234567 89", "I'M HERE 'S", " \t\tfoo", "foo  ", "'abc"]
    splits = {name: [{"text": s, "words": words(p, s)} for s in STRINGS + extra]
              for name, p in pres.items()}
    with open(f"{out_dir}/pretokenizer_splits.json", "w", encoding="utf-8") as f:
        json.dump(splits, f, ensure_ascii=False, indent=1)

    deq = []
    for t in r.tensors:
        if t.name in ("token_embd.weight", "blk.0.attn_q.weight", "blk.0.attn_k.weight",
                      "blk.0.ffn_down.weight", "blk.29.attn_norm.weight", "output_norm.weight"):
            v = dequantize(t.data, t.tensor_type).astype(np.float32).reshape(-1)
            deq.append({"name": t.name, "type": t.tensor_type.name, "count": int(v.size),
                        "first": [float(x) for x in v[:16]],
                        "sum": float(v.astype(np.float64).sum()),
                        "abs_sum": float(np.abs(v.astype(np.float64)).sum())})
    with open(f"{out_dir}/smollm2_dequant.json", "w") as f:
        json.dump(deq, f, indent=1)


if __name__ == "__main__":
    main()
