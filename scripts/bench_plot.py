#!/usr/bin/env python3
"""Summarises `duet bench serve` reports from scripts/bench_compare.sh and plots them.

  python3 scripts/bench_plot.py --raw bench/results/raw --out bench/results --machine "..."

Reads every RAW/*.json (one per setup and rate), writes OUT/summary.json, OUT/summary.md (a
Markdown table) and, with gnuplot, OUT/ttft.png, OUT/gap.png, OUT/tpot.png, OUT/breakdown.png.
Standard library only.
"""
import argparse
import glob
import json
import os
import shutil
import subprocess
import tempfile

SETUPS = ["colocated", "disagg-pipelined", "disagg-bulk"]
BREAKDOWN = ["queue", "reserve", "prefill_compute", "transfer_tail", "decode_admission"]


def load(raw):
    rows = []
    for path in sorted(glob.glob(os.path.join(raw, "*.json"))):
        with open(path) as f:
            r = json.load(f)
        cfg = r["config"]
        main = r["classes"].get("main", {})
        bg = r["classes"].get("background", {})
        if not main:
            continue
        lat, srv = main["latency_ms"], main["server_ms"]
        row = {
            "setup": cfg["label"],
            "note": cfg.get("note", ""),
            "rate": cfg["request_rate"],
            "duration_s": r["duration_s"],
            "completed": main["requests"]["completed"],
            "failed": main["requests"]["failed"],
            "ttft_p50": lat["ttft"]["p50"], "ttft_p99": lat["ttft"]["p99"],
            "gap_p50": lat["first_to_second_gap"]["p50"],
            "gap_p99": lat["first_to_second_gap"]["p99"],
            "tpot_p50": lat["tpot"]["p50"], "tpot_p99": lat["tpot"]["p99"],
            "tail_pct_p50": main["transfer_tail_pct_of_ttft"]["p50"],
            "tail_pct_max": main["transfer_tail_pct_of_ttft"]["max"],
            "req_per_s": main["throughput"]["requests_per_s"],
            "goodput_fraction": main["goodput"]["fraction"],
            "server_mean_ms": {k: srv[k]["mean"] for k in BREAKDOWN},
            "tail_ms_p50": srv["transfer_tail"]["p50"],
            "last_layer_ms_p50": srv.get("last_layer_transfer", {}).get("p50", 0),
            "last_layer_ms_max": srv.get("last_layer_transfer", {}).get("max", 0),
            "last_layer_pct_max": 100 * srv.get("last_layer_transfer", {}).get("max", 0) /
                                  max(1e-9, srv["ttft"]["min"]),
            "prompt_tokens_mean": main["prompt_tokens"]["mean"],
        }
        if bg:
            row.update({
                "bg_completed": bg["requests"]["completed"],
                "bg_failed": bg["requests"]["failed"],
                "bg_tpot_p50": bg["latency_ms"]["tpot"]["p50"],
                "bg_tpot_p99": bg["latency_ms"]["tpot"]["p99"],
                "bg_itl_p99": bg["latency_ms"]["itl"]["p99"],
                "out_tok_per_s": r["classes"]["all"]["throughput"]["output_tokens_per_s"],
            })
        rows.append(row)
    order = {s: i for i, s in enumerate(SETUPS)}
    rows.sort(key=lambda x: (order.get(x["setup"], 99), x["rate"]))
    return rows


def markdown(rows, machine):
    out = [f"Machine: {machine}", ""]
    notes = sorted({(r["setup"], r["note"]) for r in rows})
    out += [f"- {s}: {n}" for s, n in notes] + [""]
    out.append("| setup | rate req/s | long done/failed | TTFT p50 / p99 ms | 1st->2nd gap p50 / p99 ms"
               " | transfer tail % of TTFT p50 (max) | TPOT p99 ms (long) | running decodes:"
               " TPOT p50 / p99 ms | ITL p99 ms | out tok/s |")
    out.append("|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        out.append(
            f"| {r['setup']} | {r['rate']:g} | {r['completed']}/{r['failed']} | "
            f"{r['ttft_p50']:.0f} / {r['ttft_p99']:.0f} | {r['gap_p50']:.1f} / {r['gap_p99']:.1f} | "
            f"{r['tail_pct_p50']:.2f} ({r['tail_pct_max']:.2f}) | {r['tpot_p99']:.1f} | "
            f"{r.get('bg_tpot_p50', 0):.1f} / {r.get('bg_tpot_p99', 0):.1f} | "
            f"{r.get('bg_itl_p99', 0):.0f} | {r.get('out_tok_per_s', 0):.1f} |")
    out += ["", "Exposed tail of the long prompts (the nodes' transfer_tail: the prefill node's"
            " forward pass done, first token sampled -> the request ready on the decode node: the"
            " completion notice and any KV still in flight), and when the last layer's KV landed,"
            " counted from that layer's K/V write (which comes before its attention, MLP, the LM"
            " head and sampling):", "",
            "| setup | rate | tail p50 ms | last layer landed after p50 / max ms |"
            " max as % of the shortest TTFT |", "|---|---|---|---|---|"]
    for r in rows:
        if r["setup"] == "colocated":
            continue
        out.append(f"| {r['setup']} | {r['rate']:g} | {r['tail_ms_p50']:.1f} | "
                   f"{r['last_layer_ms_p50']:.2f} / {r['last_layer_ms_max']:.2f} | "
                   f"{r['last_layer_pct_max']:.3f} |")
    out += ["", "Server-side breakdown of the time to the second token (long prompts, mean ms):", "",
            "| setup | rate | queue | reserve | prefill compute | transfer tail | decode admission |",
            "|---|---|---|---|---|---|---|"]
    for r in rows:
        m = r["server_mean_ms"]
        out.append(f"| {r['setup']} | {r['rate']:g} | " +
                   " | ".join(f"{m[k]:.1f}" for k in BREAKDOWN) + " |")
    return "\n".join(out) + "\n"


def plot(rows, out):
    if shutil.which("gnuplot") is None:
        print("bench_plot.py: gnuplot not found (apt-get install gnuplot-nox): no plots")
        return
    setups = [s for s in SETUPS if any(r["setup"] == s for r in rows)]
    tmp = tempfile.mkdtemp()
    for s in setups:
        with open(os.path.join(tmp, s + ".dat"), "w") as f:
            for r in rows:
                if r["setup"] == s:
                    f.write(f"{r['rate']} {r['ttft_p50']} {r['ttft_p99']} {r['gap_p50']} "
                            f"{r['gap_p99']} {r['tpot_p99']} {r.get('bg_tpot_p99', 0)}\n")
    with open(os.path.join(tmp, "breakdown.dat"), "w") as f:
        f.write("label " + " ".join(BREAKDOWN) + "\n")
        for r in rows:
            m = r["server_mean_ms"]
            f.write(f"\"{r['setup'].replace('disagg-', '')}\\n{r['rate']:g}/s\" " +
                    " ".join(f"{m[k]:.3f}" for k in BREAKDOWN) + "\n")
    term = "set terminal pngcairo noenhanced size 720,420 font ',10'\nset key top left\nset grid\n"
    lines = lambda cols: ", ".join(
        f"'{tmp}/{s}.dat' using 1:{c} with linespoints title '{s} {t}'"
        for s in setups for c, t in cols)
    script = term + f"""
set logscale y
set output '{out}/ttft.png'
set title 'TTFT of long prompts (512-1024 tokens)'
set xlabel 'request rate (req/s)'; set ylabel 'ms (log scale)'
plot {lines([(2, 'p50'), (3, 'p99')])}
set output '{out}/gap.png'
set title 'First-to-second-token gap (long prompts)'
plot {lines([(4, 'p50'), (5, 'p99')])}
set output '{out}/tpot.png'
set title 'TPOT p99: long prompts and the running decodes'
plot {lines([(6, 'long'), (7, 'running decodes')])}
unset logscale y
set output '{out}/breakdown.png'
set title 'Server-side time to the second token (long prompts, mean)'
set style data histograms; set style histogram rowstacked; set style fill solid 0.8 border -1
set boxwidth 0.7; set xlabel ''; set ylabel 'ms'; set xtics font ',8'; set key top left
plot for [i=2:6] '{tmp}/breakdown.dat' using i:xtic(1) title columnheader(i)
"""
    subprocess.run(["gnuplot"], input=script, text=True, check=True)
    shutil.rmtree(tmp)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--raw", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--machine", default="")
    a = ap.parse_args()
    rows = load(a.raw)
    if not rows:
        raise SystemExit(f"bench_plot.py: no reports in {a.raw}")
    with open(os.path.join(a.out, "summary.json"), "w") as f:
        json.dump({"machine": a.machine, "runs": rows}, f, indent=1)
    md = markdown(rows, a.machine)
    with open(os.path.join(a.out, "summary.md"), "w") as f:
        f.write(md)
    print(md)
    plot(rows, a.out)


if __name__ == "__main__":
    main()
