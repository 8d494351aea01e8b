#!/usr/bin/env python3
"""Token-for-token cross-check of duet against llama.cpp on one GGUF model.

  python3 -m venv /tmp/llamavenv
  CMAKE_ARGS="-DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TOOLS=OFF" \\
      /tmp/llamavenv/bin/pip install llama-cpp-python==0.3.36 numpy   # compiles llama.cpp
  scripts/get_model.sh smollm2          # and/or: scripts/get_model.sh gemma3
  cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DDUET_CUDA=OFF
  ninja -C build duet
  /tmp/llamavenv/bin/python scripts/compare_llamacpp.py \\
      --model models/smollm2-135m-instruct-q4_1.gguf --duet build/cli/duet --json /tmp/cmp.json
  /tmp/llamavenv/bin/python scripts/compare_llamacpp.py \\
      --model models/gemma-3-270m-q4_k_m.gguf --duet build/cli/duet --json /tmp/cmp_gemma3.json

For each prompt (by default ten fixed English prompts: a fact, a question, a story opening,
code, a list, JSON, a dialogue, arithmetic, a letter, and about 300 tokens of the GPL-3
preamble read from /usr/share/common-licenses/GPL-3; or the --prompt texts):

  - tokenizer: duet's prompt ids (`duet generate --prompt`) against llama.cpp's
    llm.tokenize(text, add_bos=True, special=True): equal, or the first difference. A duet
    that cannot tokenize the model's text is reported and the comparison goes on;
  - greedy: --tokens tokens from each engine after llama.cpp's prompt ids (duet gets them with
    --prompt-ids, so a tokenizer difference does not confound the model comparison), neither
    stopping at EOS; llama.cpp's are the argmax of its logits, one token per step. Reported:
    the length of the identical prefix;
  - teacher-forced: along duet's sequence, whether each duet token is llama.cpp's argmax given
    the same prefix. Where it is not: llama.cpp's margin (top-1 minus top-2 logit; in a near
    tie, say < 0.5, llama.cpp's quantised integer kernels and duet's fp32 product with the
    dequantised weights can round to different winners), the rank of duet's token under
    llama.cpp (#1 is the argmax) and duet's own margin (its top-1 minus top-2 logprob). Also
    reported: the largest difference between duet's logprob of its token and llama.cpp's
    log-softmax of it.

Both engines run on the CPU with --threads threads (duet with --device cpu and --weights-dtype,
f32 unless given: the dequantised weights). The summary
line totals the counts over the prompts; --json writes every id, logprob and margin.
"""
import argparse
import json
import os
import re
import subprocess
import sys

import llama_cpp
from llama_cpp import Llama

from llamacpp_util import greedy, teacher_forced

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GPL_PATH = "/usr/share/common-licenses/GPL-3"
GPL_WORDS = 230  # about 300 tokens
PROMPTS = [
    ("fact", "The capital of France is"),
    ("question", "Q: At what temperature does water boil at sea level?\nA:"),
    ("story", "Once upon a time, in a small village at the edge of a dark forest, there lived"),
    ("code", 'def fibonacci(n):\n    """Return the n-th Fibonacci number."""\n'),
    ("list", "Five fruits that are rich in vitamin C:\n1."),
    ("json", '{"name": "Ada Lovelace", "born": 1815, "known_for":'),
    ("dialogue", "Alice: Have you seen my keys anywhere?\nBob:"),
    ("arithmetic", "12 + 7 = 19\n23 + 15 = 38\n41 + 36 ="),
    ("letter", "Dear Mr. Smith,\n\nThank you for your letter of"),
]


class DuetError(Exception):
    pass


def gpl_paragraph():
    """The GPL-3 preamble as one paragraph: its first whole sentences, up to GPL_WORDS words."""
    with open(GPL_PATH, encoding="utf-8") as f:
        preamble = " ".join(f.read().split("Preamble", 1)[1].split())
    sentences, words = [], 0
    for sentence in re.split(r"(?<=[.!?]) ", preamble):
        sentences.append(sentence)
        words += len(sentence.split())
        if words >= GPL_WORDS:
            break
    return " ".join(sentences)


def prompts(args):
    if args.prompt:
        return [(f"prompt{i + 1}", text) for i, text in enumerate(args.prompt)]
    return PROMPTS + [("gpl", gpl_paragraph())]


def run_duet(args, prompt_flag, max_tokens):
    """`duet generate ... --json` with prompt_flag (--prompt=TEXT or --prompt-ids=IDS)."""
    cmd = [args.duet, "generate", f"--model={args.model}", prompt_flag,
           f"--max-tokens={max_tokens}", "--ignore-eos", "--logprobs=2", "--json",
           "--device=cpu", f"--threads={args.threads}", f"--weights-dtype={args.weights_dtype}"]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise DuetError(proc.stderr.strip() or f"exit status {proc.returncode}")
    return json.loads(proc.stdout)


def first_difference(a, b):
    """The first index where the id lists differ (one ending counts), or None if equal."""
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def compare_prompt(llm, args, name, text):
    llama_prompt = llm.tokenize(text.encode(), add_bos=True, special=True)
    if len(llama_prompt) + args.tokens > args.n_ctx:
        raise SystemExit(f"prompt '{name}': {len(llama_prompt)} + {args.tokens} tokens "
                         f"exceed --n-ctx {args.n_ctx}")
    try:
        duet_prompt, tokenizer_error = run_duet(args, f"--prompt={text}", 1)["prompt_ids"], None
    except DuetError as e:
        duet_prompt, tokenizer_error = None, str(e)
    gen = run_duet(args, "--prompt-ids=" + ",".join(map(str, llama_prompt)), args.tokens)
    duet_out = gen["generated_ids"]
    llama_out = greedy(llm, llama_prompt, args.tokens)
    steps = teacher_forced(llm, llama_prompt, duet_out)
    for i, (step, lp) in enumerate(zip(steps, gen["logprobs"])):
        top = lp["top"]
        step.update(step=i, duet=lp["id"], duet_logprob=lp["logprob"],
                    duet_margin=top[0]["logprob"] - top[1]["logprob"] if len(top) > 1 else None)
    prefix = first_difference(duet_out, llama_out)
    return {
        "name": name, "text": text,
        "llama_prompt_ids": llama_prompt, "duet_prompt_ids": duet_prompt,
        "duet_tokenizer_error": tokenizer_error,
        "tokenizer_first_difference":
            None if duet_prompt is None else first_difference(duet_prompt, llama_prompt),
        "duet_ids": duet_out, "llama_ids": llama_out,
        "identical_prefix": len(duet_out) if prefix is None else prefix,
        "teacher_forced": steps,
        "agree": sum(s["argmax"] == s["duet"] for s in steps),
        "max_logprob_diff": max(abs(s["duet_logprob"] - s["logprob"]) for s in steps),
    }


def id_at(ids, i):
    return ids[i] if i < len(ids) else "end"


def tokenizer_cell(r):
    if r["duet_tokenizer_error"] is not None:
        return "duet failed"
    i = r["tokenizer_first_difference"]
    if i is None:
        return "equal"
    return (f"differ at {i}: duet {id_at(r['duet_prompt_ids'], i)}, "
            f"llama.cpp {id_at(r['llama_prompt_ids'], i)}")


def disagreement_cell(r):
    cells = []
    for s in r["teacher_forced"]:
        if s["argmax"] != s["duet"]:
            duet = "" if s["duet_margin"] is None else f"; duet {s['duet_margin']:.3f}"
            cells.append(f"{s['step']} ({s['margin']:.3f}, #{s['rank'] + 1}{duet})")
    return ", ".join(cells)


def piece(llm, ids):
    return repr(llm.detokenize(ids).decode(errors="replace"))


def print_report(llm, args, results):
    n = sum(len(r["duet_ids"]) for r in results)
    print(f"\nmodel {os.path.basename(args.model)}, llama-cpp-python {llama_cpp.__version__}, "
          f"{args.threads} threads, {args.tokens} greedy tokens per prompt")
    print("| prompt | prompt tokens | tokenizer | greedy prefix | teacher-forced | "
          "max Δlogprob | disagreements |")
    print("|---|---|---|---|---|---|---|")
    for r in results:
        t = len(r["duet_ids"])
        print(f"| {r['name']} | {len(r['llama_prompt_ids'])} | {tokenizer_cell(r)} | "
              f"{r['identical_prefix']}/{t} | {r['agree']}/{t} | {r['max_logprob_diff']:.4f} | "
              f"{disagreement_cell(r)} |")
    print("max Δlogprob: largest |duet's logprob - llama.cpp's| of duet's tokens, teacher-forced;"
          "\ndisagreements: step (llama.cpp's top-1 minus top-2 logit, rank of duet's token under "
          "llama.cpp; duet's top-1 minus top-2 logprob)")
    for r in results:
        if r["duet_tokenizer_error"] is not None:
            print(f"{r['name']}: duet tokenizer: {r['duet_tokenizer_error']}")
        k = r["identical_prefix"]
        if k < len(r["duet_ids"]):
            before = llm.detokenize(r["llama_prompt_ids"] + r["duet_ids"][:k])
            print(f"{r['name']} diverges at {k} after "
                  f"{before[-40:].decode(errors='replace')!r}: "
                  f"duet {piece(llm, r['duet_ids'][k:k + 1])} ({r['duet_ids'][k]}), "
                  f"llama.cpp {piece(llm, r['llama_ids'][k:k + 1])} ({r['llama_ids'][k]})")
    equal = sum(r["tokenizer_first_difference"] is None and r["duet_tokenizer_error"] is None
                for r in results)
    print(f"tokenizer: duet's prompt ids equal llama.cpp's for {equal}/{len(results)} prompts")
    margins = [round(s["margin"], 3) for r in results for s in r["teacher_forced"]
               if s["argmax"] != s["duet"]]
    print(f"prompts {len(results)}, tokens {n}: greedy prefix identical for "
          f"{sum(r['identical_prefix'] for r in results)}/{n} tokens; teacher-forced top-1 "
          f"agreement {sum(r['agree'] for r in results)}/{n}; disagreements at llama.cpp "
          f"margins {margins}")


def write_fixture(args, results):
    """Per prompt: llama.cpp's prompt ids and its greedy ids up to the first step where its
    top-1 minus top-2 logit margin is below --clear-margin or duet's sequence left llama.cpp's
    (past a near tie the two engines may rightly differ). A test that duet reproduces these ids
    checks it against llama.cpp without depending on llama.cpp at test time."""
    cases = []
    for r in results:
        n = r["identical_prefix"]
        margins = [t["margin"] for t in r["teacher_forced"][:n]]
        clear = next((i for i, m in enumerate(margins) if m < args.clear_margin), n)
        if clear == 0:
            continue
        cases.append({"name": r["name"], "prompt_ids": r["llama_prompt_ids"],
                      "ids": r["llama_ids"][:clear],
                      "min_margin": round(min(margins[:clear]), 4)})
    with open(args.fixture, "w", encoding="utf-8") as f:
        json.dump({"made_by": "scripts/compare_llamacpp.py --fixture",
                   "model": os.path.basename(args.model),
                   "llama_cpp_python": llama_cpp.__version__,
                   "clear_margin": args.clear_margin, "cases": cases}, f, indent=1)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=os.path.join(ROOT, "models/smollm2-135m-instruct-q4_1.gguf"))
    ap.add_argument("--duet", default=os.path.join(ROOT, "build/cli/duet"))
    ap.add_argument("--tokens", type=int, default=32, help="greedy tokens per prompt")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--weights-dtype", default="f32",
                    help="duet's --weights-dtype (f32: the dequantised weights the committed "
                         "fixtures and docs/models.md's table were measured with; auto, native)")
    ap.add_argument("--n-ctx", type=int, default=1024, help="llama.cpp context length")
    ap.add_argument("--prompt", action="append",
                    help="a prompt text (repeatable; replaces the default prompts)")
    ap.add_argument("--json", metavar="OUT", help="write every id, logprob and margin to OUT")
    ap.add_argument("--fixture", metavar="OUT",
                    help="write llama.cpp's greedy ids where its choice is clear (see "
                         "write_fixture) for duet's real-model tests")
    ap.add_argument("--clear-margin", type=float, default=0.1,
                    help="with --fixture: the llama.cpp margin below which a step is a near tie")
    args = ap.parse_args()
    llm = Llama(model_path=args.model, n_ctx=args.n_ctx, n_threads=args.threads,
                n_threads_batch=args.threads, verbose=False)
    results = []
    for i, (name, text) in enumerate(prompts(args)):
        print(f"[{i + 1}] {name}", file=sys.stderr, flush=True)
        results.append(compare_prompt(llm, args, name, text))
    print_report(llm, args, results)
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump({"model": args.model, "llama_cpp_python": llama_cpp.__version__,
                       "threads": args.threads, "tokens": args.tokens, "prompts": results},
                      f, indent=1)
    if args.fixture:
        write_fixture(args, results)


if __name__ == "__main__":
    sys.exit(main())
