#!/usr/bin/env python3
"""Formats bench/out/service.json (written by svcbench) as the Markdown table of bench/RESULTS.md.

usage: python3 bench/service/results_md.py [bench/out/service.json]

Prints to stdout; nothing is written. GB = 1e9 bytes. Ratio: throughput rows are lazykv GB/s
over ceiling GB/s; latency rows are lazykv p50 over ceiling p50 (medians over repetitions).
"""
import json
import sys


def fmt_us(v):
    if v == 0:
        return "-"
    if v >= 10000:
        return "%.0f ms" % (v / 1000.0)
    if v >= 1000:
        return "%.1f ms" % (v / 1000.0)
    return "%.0f us" % v


def main():
    path = sys.argv[1] if len(sys.argv) > 1 else "bench/out/service.json"
    with open(path) as f:
        d = json.load(f)
    print("| bench | clients | ops/s | GB/s | p50 | p99 | ceiling | ceiling GB/s | ceiling p50 "
          "| ceiling p99 | ratio |")
    print("|---|---:|---:|---:|---:|---:|---|---:|---:|---:|---:|")
    for r in d["rows"]:
        thr = r["kind"] == "throughput"
        ratio = ("%.2f of ceiling" % r["ratio"]) if thr else ("%.1fx ceiling" % r["ratio"])
        gbps = "%.3f" % r["gbps"] if thr else "-"
        cgbps = "%.3f" % r["ceiling_gbps"] if thr else "-"
        print("| %s | %d | %.1f | %s | %s | %s | %s | %s | %s | %s | %s |" % (
            r["name"], r["clients"], r["ops_s"], gbps, fmt_us(r["p50_us"]), fmt_us(r["p99_us"]),
            r["ceiling"], cgbps, fmt_us(r["ceiling_p50_us"]), fmt_us(r["ceiling_p99_us"]), ratio))
    if d.get("attach", "") != "measured":
        print("| attach | - | %s | | | | | | | | |" % d.get("attach", ""))
    print()
    handles = d.get("handles", "own" if "--handles shared" not in d["command"] else "shared")
    print("Finished %s; load average at start %s, at end %s; %s CPUs; %s; client handles: %s." % (
        d["date"], " ".join("%.2f" % x for x in d["loadavg_start"]),
        " ".join("%.2f" % x for x in d["loadavg_end"]), d["cpus_online"], d["daemon"], handles))


if __name__ == "__main__":
    main()
