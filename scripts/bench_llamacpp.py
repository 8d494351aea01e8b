#!/usr/bin/env python3
"""duet vs llama.cpp on the same GGUF, in one run: prefill and decode tokens/s side by side,
plus a correctness cross-check (tokenizer ids and greedy continuation).

  scripts/get_model.sh smollm2
  python3 -m venv /tmp/llamavenv && /tmp/llamavenv/bin/pip install llama-cpp-python numpy
  /tmp/llamavenv/bin/python scripts/bench_llamacpp.py \
      --model models/smollm2-135m-instruct-q4_1.gguf --engine-bench build/bench/engine_bench \
      --threads 2 --prefill 128,512 --context 128 [--weights-dtype f32,native] [--gemm bf16]

duet's figures come from bench/engine_bench (--gemm, invariant by default; --weights-dtype: f32
weights dequantised at load, and/or native: the GGUF blocks kept, integer dot products (BF16
matrices as stored), one column each);
llama.cpp's from llama-cpp-python (its own quantised kernels on the Q4_1 weights). Both use the
same token ids (engine_bench's (i*7919+13) % vocab), the same thread count, best of --reps.
Decode: one sequence, --context tokens already cached, one token per step.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

from llama_cpp import Llama

from llamacpp_util import greedy, teacher_forced

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def token(i, vocab):
    return (i * 7919 + 13) % vocab


def duet_figures(args, prefill):
    with tempfile.NamedTemporaryFile(suffix=".json") as out:
        cmd = [args.engine_bench, "--model", args.model, "--prefill", ",".join(map(str, prefill)),
               "--decode_batch", "1", "--context", str(args.context), "--gemm", args.gemm,
               "--threads", str(args.threads), "--reps", str(args.reps),
               "--weights_dtype", args.weights_dtype, "--json", out.name]
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
        rows = json.load(open(out.name))["rows"]
    return {(r.get("weights_dtype", "f32"), r["phase"], r["size"]): r["tokens_per_s"] for r in rows}


def llama_figures(llm, args, prefill, vocab):
    res = {}
    llm.reset()
    llm.eval([token(i, vocab) for i in range(32)])  # warm-up
    for n in prefill:
        toks = [token(i, vocab) for i in range(n)]
        best = 1e30
        for _ in range(args.reps):
            llm.reset()
            t = time.perf_counter()
            llm.eval(toks)
            best = min(best, time.perf_counter() - t)
        res[("prefill", n)] = n / best
    llm.reset()
    llm.eval([token(i, vocab) for i in range(args.context)])
    best = 1e30
    for s in range(max(args.reps, 8)):
        t = time.perf_counter()
        llm.eval([token(s, vocab)])
        best = min(best, time.perf_counter() - t)
    res[("decode", 1)] = 1 / best
    return res


REFERENCE_MODEL = "smollm2-135m-instruct-q4_1.gguf"


def cross_check(llm):
    data = os.path.join(ROOT, "tests/unit/model_real/testdata")
    ids = json.load(open(os.path.join(data, "smollm2_token_ids.json"), encoding="utf-8"))["cases"]
    same = sum(llm.tokenize(c["text"].encode(), add_bos=False, special=True) == c["ids"]
               for c in ids)
    print(f"tokenizer: llama.cpp gives the committed reference ids for {same}/{len(ids)} strings")
    case = json.load(open(os.path.join(data, "smollm2_greedy.json")))["cases"][0]
    toks = llm.tokenize(case["prompt"].encode(), add_bos=False, special=True)
    out = greedy(llm, toks, len(case["ids"]))
    verdict = "same ids" if out == case["ids"] else "DIFFERENT ids"
    print(f"greedy '{case['prompt']}': llama.cpp {out}\n"
          f"                              duet      {case['ids']}  -> {verdict}")
    print("llama.cpp text:", repr(llm.detokenize(out).decode(errors="replace")))
    # Teacher-forced: llama.cpp's rank of each of duet's tokens, and its logit gap to the top.
    ranks = [f"{s['rank']}:{s['gap']:.3f}" for s in teacher_forced(llm, toks, case["ids"])]
    print("duet's greedy ids under llama.cpp (rank:logit gap to llama.cpp's top):", " ".join(ranks))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=os.path.join(ROOT, "models", REFERENCE_MODEL))
    ap.add_argument("--engine-bench", default=os.path.join(ROOT, "build/bench/engine_bench"))
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--prefill", default="128,512")
    ap.add_argument("--context", type=int, default=128)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--weights-dtype", default="f32",
                    help="duet's weights, comma-separated: f32, native and/or bf16")
    ap.add_argument("--gemm", default="invariant",
                    help="duet's CPU GEMM: invariant, or bf16 (bf16 matrices on bf16 dot "
                         "products; with native or bf16 weights)")
    args = ap.parse_args()
    prefill = [int(x) for x in args.prefill.split(",")]
    llm = Llama(model_path=args.model, n_ctx=max(prefill + [args.context]) + 64,
                n_batch=max(prefill), n_ubatch=max(prefill), n_threads=args.threads,
                n_threads_batch=args.threads, verbose=False)
    vocab = llm.n_vocab()
    # The committed references (tokenizer ids, duet's greedy ids) are SmolLM2 Q4_1's.
    if os.path.basename(args.model) == REFERENCE_MODEL:
        cross_check(llm)
    else:
        print(f"cross-check skipped: its references are for {REFERENCE_MODEL}, not "
              f"{os.path.basename(args.model)}")
    ours = duet_figures(args, prefill)
    theirs = llama_figures(llm, args, prefill, vocab)
    print(f"\nmodel {os.path.basename(args.model)}, {args.threads} threads, best of {args.reps}")
    dtypes = args.weights_dtype.split(",")
    print("| phase | tokens | " + " | ".join(f"duet {d} tok/s" for d in dtypes) +
          " | llama.cpp tok/s | " + " | ".join(f"duet {d} / llama.cpp" for d in dtypes) + " |")
    print("|---|---|" + "---|" * (2 * len(dtypes) + 1))
    for key in [("prefill", n) for n in prefill] + [("decode", 1)]:
        b = theirs[key]
        a = [ours[(d,) + key] for d in dtypes]
        size = key[1] if key[0] == "prefill" else f"1 (context {args.context})"
        print(f"| {key[0]} | {size} | " + " | ".join(f"{x:.1f}" for x in a) + f" | {b:.1f} | " +
              " | ".join(f"{x / b:.2f}" for x in a) + " |")


if __name__ == "__main__":
    sys.exit(main())
