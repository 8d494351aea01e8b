#!/usr/bin/env python3
"""n > 1 against n separate requests, side by side on one loopback cluster (1 prefill + 1
decode node), alternating per repetition: one completions request with `n` choices versus `n`
concurrent requests with n = 1 (the same prompt, seeds seed + j, as the n choices draw), each
repetition on a prompt no earlier request began with. Reports, per mode, the wall time of the
whole answer and what the nodes did (prompt tokens computed on the prefill node, KV bytes it
sent, prompt tokens the decode node took from its cache), from their /metrics.

  scripts/bench_n_choices.py --model models/smollm2-135m-instruct-q4_1.gguf \
      --prompt_len 1024 --n 4 --max_tokens 16 --reps 3
"""
import argparse
import json
import os
import random
import signal
import statistics
import subprocess
import threading
import time
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def post(url, body):
    req = urllib.request.Request(url, data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=600) as r:
        return json.loads(r.read())


def counters(url, names):
    out = dict.fromkeys(names, 0.0)
    with urllib.request.urlopen(url, timeout=30) as r:
        for line in r.read().decode().splitlines():
            for n in names:
                if line.startswith(n + " ") or line.startswith(n + "{"):
                    out[n] += float(line.rsplit(" ", 1)[1])
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--duet", default=os.path.join(ROOT, "build", "cli", "duet"))
    ap.add_argument("--prompt_len", type=int, default=1024)
    ap.add_argument("--n", type=int, default=4)
    ap.add_argument("--max_tokens", type=int, default=16)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args()

    proc = subprocess.Popen(
        [a.duet, "serve", "--loopback", "--prefill=1", "--decode=1", "--model=" + a.model,
         "--transport=shm", "--threads=%d" % a.threads, "--http_port=0", "--node_metrics"],
        stdout=subprocess.PIPE, text=True, start_new_session=True)
    try:
        http, metrics = None, {}
        for line in proc.stdout:
            f = line.split()
            if f and f[0] == "http":
                http = f[1]
            elif f and f[0] == "metrics":
                metrics[f[1]] = f[2]
            elif f and f[0] == "ready":
                break
        if not http:
            raise SystemExit("the cluster did not start")
        names_p = ["duet_prefill_kv_transfer_bytes_total", "duet_prefill_prefix_cache_queries_total",
                   "duet_prefill_prefix_cache_hits_total"]
        names_d = ["duet_decode_prefix_cache_hits_total"]
        rng = random.Random(a.seed)
        rows = {"n": [], "separate": []}
        for rep in range(a.reps):
            for mode in (("n", "separate") if rep % 2 == 0 else ("separate", "n")):
                prompt = [rng.randrange(17, 8000) for _ in range(a.prompt_len)]
                body = {"prompt": prompt, "max_tokens": a.max_tokens, "temperature": 1.0,
                        "ignore_eos": True}
                p0, d0 = counters(metrics["prefill-0"], names_p), counters(metrics["decode-0"],
                                                                           names_d)
                t0 = time.time()
                if mode == "n":
                    post(http + "/v1/completions", dict(body, n=a.n, seed=a.seed))
                else:
                    ts = [threading.Thread(target=post, args=(http + "/v1/completions",
                                                              dict(body, seed=a.seed + j)))
                          for j in range(a.n)]
                    for t in ts:
                        t.start()
                    for t in ts:
                        t.join()
                wall = time.time() - t0
                p1, d1 = counters(metrics["prefill-0"], names_p), counters(metrics["decode-0"],
                                                                           names_d)
                d = {k: p1[k] - p0[k] for k in names_p}
                rows[mode].append({
                    "wall_s": wall,
                    "computed": d["duet_prefill_prefix_cache_queries_total"] -
                    d["duet_prefill_prefix_cache_hits_total"],
                    "kv_mb": d["duet_prefill_kv_transfer_bytes_total"] / 1e6,
                    "d_hits": d1["duet_decode_prefix_cache_hits_total"] -
                    d0["duet_decode_prefix_cache_hits_total"]})
        print("prompt %d tokens, n = %d, %d output tokens each, %d repetitions (alternating)" %
              (a.prompt_len, a.n, a.max_tokens, a.reps))
        print("| mode | wall s (median) | prompt tokens computed on P | KV MB sent | "
              "prompt tokens from D's cache |")
        print("|---|---|---|---|---|")
        for mode, label in (("n", "one request, n = %d" % a.n),
                            ("separate", "%d requests, n = 1" % a.n)):
            r = rows[mode]
            print("| %s | %.2f | %d | %.1f | %d |" % (
                label, statistics.median(x["wall_s"] for x in r),
                statistics.median(x["computed"] for x in r),
                statistics.median(x["kv_mb"] for x in r),
                statistics.median(x["d_hits"] for x in r)))
        ratio = [s["wall_s"] / n["wall_s"] for n, s in zip(rows["n"], rows["separate"])]
        print("wall time, separate / n, per repetition: %s" %
              ", ".join("%.2f" % x for x in ratio))
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=30)


if __name__ == "__main__":
    main()
