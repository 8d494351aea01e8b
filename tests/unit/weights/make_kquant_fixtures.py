"""Writes testdata/kquant_fixtures.json: a few random K-quant blocks of each type (Q2_K, Q3_K,
Q4_K, Q5_K, Q6_K, Q8_K) and their float32 values as dequantised by the Python `gguf` package
(`gguf.quants.dequantize`), the reference that gguf_kquant_test.cc compares against bit for bit.
The test reads only the committed JSON; rerun this script only to change the fixtures:

  python3 -m venv /tmp/kqvenv && /tmp/kqvenv/bin/pip install gguf numpy
  /tmp/kqvenv/bin/python tests/unit/weights/make_kquant_fixtures.py

The package dequantises but does not quantise K-quants, so each block is random bytes whose
scales (d, dmin: IEEE halves) are then overwritten with finite values: block 0 has subnormal
halves, block 1 large ones, the others random magnitudes of either sign. The package has no
Q8_K (ggml's format for quantised activations, rarely found in model files); its reference is
d * q computed here in float32, as the format defines it, and the JSON says so ("oracle").

Output: {"generator": ..., "types": [{"name", "type", "block_bytes", "oracle", "blocks": hex of
all blocks back to back, "expected": hex of the little-endian float32 values}, ...]}.
"""

import json
import os
from importlib.metadata import version

import gguf
import numpy as np
from gguf.quants import dequantize

SEED = 20240521
BLOCKS = 4
QK_K = 256

# name -> (byte offsets of the half-precision scales in a block, or "f32" for Q8_K's float d)
SCALES = {
    "Q2_K": [80, 82],   # scales[16], qs[64], d, dmin
    "Q3_K": [108],      # hmask[32], qs[64], scales[12], d
    "Q4_K": [0, 2],     # d, dmin, scales[12], qs[128]
    "Q5_K": [0, 2],     # d, dmin, scales[12], qh[32], qs[128]
    "Q6_K": [208],      # ql[128], qh[64], scales[16], d
    "Q8_K": "f32",      # float d, qs[256], bsums[16]
}


def random_half(rng, block):
    if block == 0:
        return np.uint16(rng.integers(1, 0x400)) | np.uint16(rng.integers(0, 2) << 15)  # subnormal
    if block == 1:
        value = rng.uniform(1.0, 8.0)
    else:
        value = 2.0 ** rng.uniform(-14, -2) * rng.choice([-1.0, 1.0])
    return np.float16(value).view(np.uint16)


def make_blocks(rng, qtype, name):
    _, type_size = gguf.GGML_QUANT_SIZES[qtype]
    blocks = rng.integers(0, 256, size=(BLOCKS, type_size), dtype=np.uint8)
    for b in range(BLOCKS):
        if SCALES[name] == "f32":
            d = np.float32(rng.uniform(1e-4, 1.0) * rng.choice([-1.0, 1.0]))
            blocks[b, 0:4] = np.frombuffer(d.tobytes(), dtype=np.uint8)
            qs = blocks[b, 4:4 + QK_K].view(np.int8).astype(np.int16)
            blocks[b, 4 + QK_K:] = np.frombuffer(
                qs.reshape(16, 16).sum(axis=1).astype("<i2").tobytes(), dtype=np.uint8)
        else:
            for off in SCALES[name]:
                h = random_half(rng, b)
                blocks[b, off:off + 2] = np.frombuffer(np.uint16(h).astype("<u2").tobytes(),
                                                       dtype=np.uint8)
    return blocks.reshape(-1)


def reference(data, qtype, name):
    try:
        return dequantize(data, qtype).astype(np.float32), "gguf.quants.dequantize"
    except NotImplementedError:
        if name != "Q8_K":
            raise
    blocks = data.reshape(BLOCKS, -1)
    d = blocks[:, 0:4].copy().view("<f4").astype(np.float32)        # (BLOCKS, 1)
    q = blocks[:, 4:4 + QK_K].view(np.int8).astype(np.float32)      # (BLOCKS, 256)
    return (d * q).reshape(-1), "numpy d * q (the gguf package has no Q8_K)"


def main():
    rng = np.random.default_rng(SEED)
    out = {
        "generator": "tests/unit/weights/make_kquant_fixtures.py, gguf %s, numpy %s, seed %d"
                     % (version("gguf"), np.__version__, SEED),
        "types": [],
    }
    for name in SCALES:
        qtype = gguf.GGMLQuantizationType[name]
        data = make_blocks(rng, qtype, name)
        values, oracle = reference(data, qtype, name)
        assert values.shape == (BLOCKS * QK_K,) and np.all(np.isfinite(values)), name
        out["types"].append({
            "name": name,
            "type": int(qtype),
            "block_bytes": gguf.GGML_QUANT_SIZES[qtype][1],
            "oracle": oracle,
            "blocks": data.tobytes().hex(),
            "expected": values.astype("<f4").tobytes().hex(),
        })
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "testdata",
                        "kquant_fixtures.json")
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        json.dump(out, f, indent=1)
        f.write("\n")
    print("wrote %s (%d bytes)" % (path, os.path.getsize(path)))


if __name__ == "__main__":
    main()
