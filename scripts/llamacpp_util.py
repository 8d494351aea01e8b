"""llama.cpp (llama-cpp-python) helpers shared by bench_llamacpp.py and compare_llamacpp.py:
its logits, its greedy continuation and its view of another engine's tokens (teacher forcing).
All of them evaluate one token per step after the prompt, as llama.cpp decodes."""
import llama_cpp
import numpy as np


def last_logits(llm):
    """A copy of llama.cpp's logits at the last position evaluated (works without logits_all)."""
    return np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(llm._ctx.ctx, -1),
                                 shape=(llm.n_vocab(),)).copy()


def greedy(llm, prompt_ids, n):
    """llama.cpp's n greedy tokens after prompt_ids: the argmax of its logits at each step
    (ties to the lowest id), never stopping at EOS."""
    llm.reset()
    llm.eval(prompt_ids)
    out = []
    for _ in range(n):
        out.append(int(np.argmax(last_logits(llm))))
        if len(out) < n:
            llm.eval([out[-1]])
    return out


def teacher_forced(llm, prompt_ids, ids):
    """llama.cpp's logits at each step of the sequence prompt_ids + ids: for each ids[i], given
    prompt_ids + ids[:i], a dict with llama.cpp's argmax, its margin (top-1 minus top-2 logit),
    the rank of ids[i] (how many tokens have a larger logit; 0: it is the argmax), the gap
    (the argmax's logit minus that of ids[i]) and the logprob of ids[i] (log-softmax)."""
    llm.reset()
    llm.eval(prompt_ids)
    steps = []
    for i, want in enumerate(ids):
        logits = last_logits(llm)
        top2 = np.partition(logits, -2)[-2:]
        log_z = logits.max() + np.log(np.exp(logits - logits.max()).sum())
        steps.append({"argmax": int(np.argmax(logits)),
                      "margin": float(top2[1] - top2[0]),
                      "rank": int((logits > logits[want]).sum()),
                      "gap": float(logits.max() - logits[want]),
                      "logprob": float(logits[want] - log_z)})
        if i + 1 < len(ids):
            llm.eval([want])
    return steps
