#!/usr/bin/env python3
"""Writes the fuzzers' seed corpora (committed): python3 fuzz/make_seeds.py fuzz/corpus
A tiny llama GGUF (metadata, byte-level tokenizer, F32/F16/Q8_0/Q4_0/Q4_1 tensors) and a tiny
SentencePiece-tokenizer GGUF written by hand with struct (no packages), a tiny safetensors file,
and a few tokenizer strings."""
import json
import os
import struct
import sys


def gguf_str(s):
    b = s.encode()
    return struct.pack("<Q", len(b)) + b


def byte_tokens():
    printable = lambda x: 33 <= x <= 126 or 161 <= x <= 172 or x >= 174
    out, n = [], 0
    for b in range(256):
        if printable(b):
            out.append(chr(b))
        else:
            out.append(chr(256 + n))
            n += 1
    return out


def gguf():
    kv = []
    def add(key, typ, payload):
        kv.append(gguf_str(key) + struct.pack("<I", typ) + payload)
    add("general.architecture", 8, gguf_str("llama"))
    for k, v in [("block_count", 1), ("context_length", 64), ("embedding_length", 32),
                 ("feed_forward_length", 32), ("attention.head_count", 2),
                 ("attention.head_count_kv", 1), ("rope.dimension_count", 16),
                 ("vocab_size", 258)]:
        add("llama." + k, 4, struct.pack("<I", v))
    add("llama.attention.layer_norm_rms_epsilon", 6, struct.pack("<f", 1e-5))
    add("tokenizer.ggml.model", 8, gguf_str("gpt2"))
    add("tokenizer.ggml.pre", 8, gguf_str("smollm"))
    toks = byte_tokens() + ["<|im_start|>", "<|im_end|>"]
    add("tokenizer.ggml.tokens", 9,
        struct.pack("<IQ", 8, len(toks)) + b"".join(gguf_str(t) for t in toks))
    add("tokenizer.ggml.token_type", 9,
        struct.pack("<IQ", 5, len(toks)) + struct.pack(f"<{len(toks)}i", *([1] * 256 + [3, 3])))
    add("tokenizer.ggml.merges", 9, struct.pack("<IQ", 8, 1) + gguf_str("Ġ t"))
    add("tokenizer.ggml.eos_token_id", 4, struct.pack("<I", 257))
    tensors, data = [], b""
    def tensor(name, dims, typ, payload):
        nonlocal data
        off = len(data)
        tensors.append(gguf_str(name) + struct.pack("<I", len(dims)) +
                       struct.pack(f"<{len(dims)}Q", *dims) + struct.pack("<IQ", typ, off))
        data += payload + b"\0" * ((-len(payload)) % 32)
    tensor("token_embd.weight", [32, 2], 8, (struct.pack("<e", 0.5) + bytes(range(32))) * 2)
    tensor("output_norm.weight", [32], 0, struct.pack("<32f", *([1.0] * 32)))
    tensor("blk.0.attn_q.weight", [32], 2, struct.pack("<e", 1.0) + bytes(range(16)))
    tensor("blk.0.attn_k.weight", [32], 3, struct.pack("<ee", 1.0, -1.0) + bytes(range(16)))
    tensor("blk.0.attn_v.weight", [4, 2], 1, struct.pack("<8e", *range(8)))
    head = b"GGUF" + struct.pack("<IQQ", 3, len(tensors), len(kv)) + b"".join(kv) + b"".join(tensors)
    head += b"\0" * ((-len(head)) % 32)
    return head + data


def spm_gguf():
    kv = []
    def add(key, typ, payload):
        kv.append(gguf_str(key) + struct.pack("<I", typ) + payload)
    add("general.architecture", 8, gguf_str("gemma3"))
    add("tokenizer.ggml.model", 8, gguf_str("llama"))
    add("tokenizer.ggml.pre", 8, gguf_str("default"))
    sp = "\u2581"
    toks = (["<pad>", "<eos>", "<bos>", "<unk>", "<start_of_turn>", "\n", "  "] +
            [f"<0x{b:02X}>" for b in range(256)] +
            ["H", "e", "l", "o", sp, sp + "H", "He", "ll", "llo", "Hello", sp + "w"])
    types = [3, 3, 3, 2, 3, 4, 4] + [6] * 256 + [1] * 11
    scores = [-1000.0] * 7 + [0.0] * 256 + [-float(i) for i in range(11)]
    add("tokenizer.ggml.tokens", 9,
        struct.pack("<IQ", 8, len(toks)) + b"".join(gguf_str(t) for t in toks))
    add("tokenizer.ggml.scores", 9,
        struct.pack("<IQ", 6, len(toks)) + struct.pack(f"<{len(toks)}f", *scores))
    add("tokenizer.ggml.token_type", 9,
        struct.pack("<IQ", 5, len(toks)) + struct.pack(f"<{len(toks)}i", *types))
    for key, v in [("bos_token_id", 2), ("eos_token_id", 1), ("unknown_token_id", 3)]:
        add("tokenizer.ggml." + key, 4, struct.pack("<I", v))
    add("tokenizer.ggml.add_bos_token", 7, b"\x01")
    add("tokenizer.ggml.add_space_prefix", 7, b"\x00")
    head = b"GGUF" + struct.pack("<IQQ", 3, 0, len(kv)) + b"".join(kv)
    return head + b"\0" * ((-len(head)) % 32)


def safetensors():
    header = {"a": {"dtype": "F32", "shape": [2, 2], "data_offsets": [0, 16]},
              "b": {"dtype": "BF16", "shape": [3], "data_offsets": [16, 22]},
              "__metadata__": {"format": "pt"}}
    h = json.dumps(header).encode()
    return struct.pack("<Q", len(h)) + h + struct.pack("<4f", 1, 2, 3, 4) + b"\x80\x3f" * 3


def main():
    out = sys.argv[1]
    for sub in ("gguf", "safetensors", "tokenizer"):
        os.makedirs(os.path.join(out, sub), exist_ok=True)
    with open(os.path.join(out, "gguf", "tiny_llama.gguf"), "wb") as f:
        f.write(gguf())
    with open(os.path.join(out, "gguf", "tiny_spm.gguf"), "wb") as f:
        f.write(spm_gguf())
    with open(os.path.join(out, "safetensors", "tiny.safetensors"), "wb") as f:
        f.write(safetensors())
    texts = ["\x00Hello world, it's 2024!", "\x01<|im_start|>user\nhi<|im_end|>\n",
             "\x02  spaces\t\ttabs\r\n\nDON'T 12345", "\x03café 你好 😀 ١٢٣"]
    for i, t in enumerate(texts):
        with open(os.path.join(out, "tokenizer", f"seed{i}"), "wb") as f:
            f.write(t.encode())


if __name__ == "__main__":
    main()
