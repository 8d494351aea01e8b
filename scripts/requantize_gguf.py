#!/usr/bin/env python3
"""Writes a GGUF requantized to another llama.cpp file type with llama.cpp's own quantizer
(llama-cpp-python's llama_model_quantize), for measuring block types the shipped files lack.

  python3 -m venv /tmp/llamavenv && /tmp/llamavenv/bin/pip install llama-cpp-python numpy
  /tmp/llamavenv/bin/python scripts/requantize_gguf.py \
      models/smollm2-135m-instruct-q4_1.gguf models/smollm2-135m-instruct-q4_k_m.gguf Q4_K_M

Requantizing already-quantized weights compounds their error: the result is a file of the
target's block types (Q4_K_M: Q4_K, Q6_K, and Q5_0 / Q8_0 where a row is not whole 256-element
super-blocks), not a model of the target's quality. Benchmarks compare duet's ways of holding
the same file, so this does not bias them.
"""
import argparse
import ctypes
import sys

import llama_cpp


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("src")
    ap.add_argument("dst")
    ap.add_argument("ftype", help="a llama.cpp file type: Q4_K_M, Q5_K_M, Q6_K, Q8_0, ...")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--pure", action="store_true",
                    help="every matrix in the target's base type (no per-tensor mix: Q2_K's "
                    "ffn_down would otherwise be Q3_K)")
    args = ap.parse_args()
    ftype = getattr(llama_cpp, "LLAMA_FTYPE_MOSTLY_" + args.ftype.upper(), None)
    if ftype is None:
        sys.exit(f"requantize_gguf: unknown file type '{args.ftype}'")
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = ftype
    params.allow_requantize = True
    params.nthread = args.threads
    params.pure = args.pure
    rc = llama_cpp.llama_model_quantize(args.src.encode(), args.dst.encode(), ctypes.byref(params))
    if rc != 0:
        sys.exit(f"requantize_gguf: llama_model_quantize returned {rc}")
    print(args.dst)


if __name__ == "__main__":
    main()
