#!/usr/bin/env python3
"""bench/serving/plot.py: the serving benchmark's PNG and markdown tables from its JSON.

    python3 plot.py serving.json serving.png      writes serving.png and serving.md beside it

One row of panels per (workload, alpha, budget): TTFT p50 (bar) and p99 (whisker) per mode at
one request at a time, and requests/s per mode for each batch limit B. Modes under the daemon's
default policy are solid, LRU rows hatched. serving.md: the table of every point, the per-mode
time breakdown of the headline point (paper, alpha 2.1, smallest budget), the correctness check
and the issue's targets (met or not), all from the same JSON.
"""
import json
import os
import sys

MODES = ["none", "prefix", "block", "lazy"]
COLORS = {"none": "#888888", "prefix": "#1f77b4", "block": "#ff7f0e", "lazy": "#2ca02c"}


def gib(b):
    return "%g GiB" % (b / 2**30) if b >= 2**30 else "%g MiB" % (b / 2**20)


def label(p):
    return p["mode"] + ("" if p["policy"] == "adaptive" else "/" + p["policy"])


def groups(points):
    """(workload, alpha, budget) -> points; the no-cache point of a workload joins every alpha and
    budget of it (it has no cache: neither changes what it computes)."""
    out = {}
    keys = sorted({(p["workload"], p["alpha"], p["budget_bytes"]) for p in points
                   if p["mode"] != "none"} | {(p["workload"], p["alpha"], p["budget_bytes"])
                                               for p in points if p["mode"] == "none"})
    for p in points:
        ks = [k for k in keys if k[0] == p["workload"]] if p["mode"] == "none" else \
            [(p["workload"], p["alpha"], p["budget_bytes"])]
        for k in ks:
            if p not in out.setdefault(k, []):
                out[k].append(p)
    return out


def p99(p):
    """The p99 as text, or '-' where it came from fewer than 100 samples (JSON null)."""
    return "-" if p.get("ttft_p99_ms") is None else "%.1f" % p["ttft_p99_ms"]


def tput(p, b, ab=False):
    """The throughput entry at batch b: the run's own prefill chunking, or with ab the A/B run
    beside it (prefill_chunk 0)."""
    for t in p["throughput"]:
        if t["batch"] == b and bool(t.get("ab", 0)) == ab:
            return t
    return None


def targets(points):
    """The issue's targets, measured in this run. Returns lines of markdown."""
    lines = []
    by = {(p["workload"], p["alpha"], p["budget_bytes"], p["mode"], p["policy"]): p for p in points}
    small = min(p["budget_bytes"] for p in points)  # The headline budget (1 GiB in the grid).
    lz = by.get(("paper", 2.1, small, "lazy", "adaptive")) if small == 2**30 else None
    bl = by.get(("paper", 2.1, small, "block", "adaptive"))
    bl_lru = by.get(("paper", 2.1, small, "block", "lru"))
    if lz and bl:
        r = bl["ttft_p50_ms"] / lz["ttft_p50_ms"]
        lines.append("| lazy TTFT p50 >= 1.5x lower than Block-Attention (paper, alpha 2.1, %s) | "
                     "%.2fx | %s |" % (gib(small), r, "met" if r >= 1.5 else "NOT met"))
        if bl_lru:
            r2 = bl_lru["ttft_p50_ms"] / lz["ttft_p50_ms"]
            lines.append("| the same against Block-Attention with LRU (the paper's setting) | "
                         "%.2fx | %s |" % (r2, "met" if r2 >= 1.5 else "NOT met"))
        for t in lz["throughput"]:
            if t.get("ab"):
                continue
            tb = tput(bl, t["batch"])
            if tb and tb["rps"] > 0:
                r = t["rps"] / tb["rps"]
                lines.append("| lazy throughput >= 1.5x Block-Attention at B=%d (same point) | "
                             "%.2fx | %s |" % (t["batch"], r, "met" if r >= 1.5 else "NOT met"))
    none = [p for p in points if p["mode"] == "none"]
    for p in points:
        if p["mode"] != "lazy" or p["policy"] != "adaptive":
            continue
        pr = by.get((p["workload"], p["alpha"], p["budget_bytes"], "prefix", "adaptive"))
        if pr:
            slack = max(p["ttft_split_half_ms"], pr["ttft_split_half_ms"])
            ok = p["ttft_p50_ms"] <= pr["ttft_p50_ms"] + slack
            okm = p["ttft_mean_ms"] <= pr["ttft_mean_ms"] + slack
            lines.append("| lazy never slower than prefix: %s alpha %g %s TTFT p50 (mean), n %d | "
                         "%.1f vs %.1f ms (%.1f vs %.1f; spread %.1f) | %s |" % (
                             p["workload"], p["alpha"], gib(p["budget_bytes"]), p["requests"],
                             p["ttft_p50_ms"], pr["ttft_p50_ms"], p["ttft_mean_ms"],
                             pr["ttft_mean_ms"], slack, "met" if ok and okm else "NOT met"))
            for t in p["throughput"]:
                if t.get("ab"):
                    continue
                tp = tput(pr, t["batch"])
                if tp:
                    lines.append("| ... throughput B=%d | %.3f vs %.3f r/s | %s |" % (
                        t["batch"], t["rps"], tp["rps"], "met" if t["rps"] >= 0.95 * tp["rps"]
                        else "NOT met"))
    for p in points:
        if p["mode"] == "lazy" and "all_hit_ttft_p50_ms" in p and none:
            n = [q for q in none if q["workload"] == p["workload"]]
            if n and p["all_hit_ttft_p50_ms"] > 0:
                r = n[0]["ttft_p50_ms"] / p["all_hit_ttft_p50_ms"]
                lines.append("| lazy TTFT >= 5x lower than no cache on all-hit requests (%s alpha %g "
                             "%s, %d requests) | %.1fx | %s |" % (
                                 p["workload"], p["alpha"], gib(p["budget_bytes"]),
                                 p["all_hit_requests"], r, "met" if r >= 5 else "NOT met"))
    return lines


def markdown(d):
    pts = d["points"]
    out = ["| workload | alpha | budget | mode | policy | n | TTFT p50 ms | p99 ms | split-half "
           "ms | hit % tokens | sim % | copies refused | cache max GiB | " +
           " | ".join("B=%d r/s (tok/s)" % b for b in sorted({t["batch"] for p in pts
                                                              for t in p["throughput"]})) + " |"]
    bs = sorted({t["batch"] for p in pts for t in p["throughput"]})
    out.append("|" + "---|" * (13 + len(bs)))
    for p in pts:
        cells = [p["workload"], "%g" % p["alpha"], gib(p["budget_bytes"]), p["mode"], p["policy"],
                 str(p["requests"]), "%.1f" % p["ttft_p50_ms"], p99(p),
                 "%.1f" % p["ttft_split_half_ms"], "%.1f" % p["hit_rate_tokens"],
                 "%.1f" % p["sim_hit_rate_tokens"], str(p["copies_refused"]),
                 "%.2f" % (p["cache_bytes_max"] / 2**30)]
        for b in bs:
            t = tput(p, b)
            cells.append("%.3f (%.0f)" % (t["rps"], t["tok_s"]) if t else "")
        out.append("| " + " | ".join(cells) + " |")
    rows = [(p, t) for p in pts for t in p["throughput"] if "hit_rate_tokens" in t]
    if rows:
        out += ["", "Throughput phase (the engine; prefill chunk in tokens, 0 = whole segments; hit "
                "% of its requests, Reserves answered 'being computed' by another request in "
                "flight, prefill units, decode steps, largest step in tokens):", "",
                "| workload | alpha | budget | mode | policy | B | chunk | n | r/s | TTFT p50 ms | "
                "hit % | busy | prefill units | decode steps | max step |", "|" + "---|" * 15]
        for p, t in rows:
            out.append("| %s | %g | %s | %s | %s | %d | %d | %d | %.3f | %.0f | %.1f | %d | %d | %d "
                       "| %d |" % (
                           p["workload"], p["alpha"], gib(p["budget_bytes"]), p["mode"],
                           p["policy"], t["batch"], t.get("prefill_chunk", d["prefill_chunk"]
                                                          if t["batch"] > 1 else 0),
                           t["requests"], t["rps"], t.get("ttft_p50_ms", 0), t["hit_rate_tokens"],
                           t["reserve_busy"], t["prefill_units"], t["decode_steps"],
                           t["max_step_tokens"]))
    ab = [(p, t, tput(p, t["batch"])) for p in pts for t in p["throughput"] if t.get("ab")]
    if ab:
        out += ["", "Chunked prefill A/B (same point, same warm cache, the two phases back to back "
                "on consecutive requests of the trace; chunked first):", "",
                "| workload | alpha | budget | mode | B | chunk %d r/s | chunk 0 r/s | chunked / "
                "unchunked | hit %% chunked / unchunked | decode steps chunked / unchunked |" %
                d["prefill_chunk"], "|" + "---|" * 10]
        for p, u, c in ab:
            if c is None:
                continue
            out.append("| %s | %g | %s | %s | %d | %.3f | %.3f | %.3f | %.1f / %.1f | %d / %d |" % (
                p["workload"], p["alpha"], gib(p["budget_bytes"]), p["mode"], u["batch"],
                c["rps"], u["rps"], c["rps"] / u["rps"] if u["rps"] else 0,
                c["hit_rate_tokens"], u["hit_rate_tokens"], c["decode_steps"],
                u["decode_steps"]))
    small = min(p["budget_bytes"] for p in pts)
    head = [p for p in pts if p["workload"] == "paper" and p["alpha"] == 2.1 and
            p["policy"] == "adaptive" and (p["budget_bytes"] == small or p["mode"] == "none")]
    if head:
        out += ["", "Breakdown (paper, alpha 2.1, %s; means over the counted requests, ms):" % gib(small),
                "", "| mode | TTFT mean | lookup | attach | reserve | miss prefill | copy | question "
                "prefill | other (host) | outside the GPU % | decode (31 tokens) |", "|" + "---|" * 11]
        for p in head:
            b = p["breakdown_ms"]
            outside = b["lookup"] + b["attach"] + b["reserve"] + b["other"]
            out.append("| %s | %.1f | %.2f | %.2f | %.2f | %.1f | %.2f | %.1f | %.2f | %.1f | %.1f |" % (
                p["mode"], p["ttft_mean_ms"], b["lookup"], b["attach"], b["reserve"],
                b["miss_prefill"], b["copy"], b["question_prefill"], b["other"],
                100 * outside / p["ttft_mean_ms"] if p["ttft_mean_ms"] else 0, b["decode"]))
    c = d.get("check")
    if c:
        out += ["", "Correctness (first %d requests of %s, %d tokens; greedy vs no cache): " % (
            c["requests"], c["workload"], c["tokens"]) + "; ".join(
                "%s cold %d/%d requests (%.1f%% tokens), warm %d/%d (%.1f%%), first-token logits "
                "rel L2 <= %.1e" % (
                    m, c[m]["cold_same_requests"], c["requests"], 100 * c[m]["cold_token_agreement"],
                    c[m]["warm_same_requests"], c["requests"], 100 * c[m]["warm_token_agreement"],
                    max(c[m]["cold_first_logits_rel_l2"], c[m]["warm_first_logits_rel_l2"]))
                for m in ("prefix", "block", "lazy") if m in c) +
            "; lazy warm == cold bitwise %d/%d (%d hits warm)." % (
                c["lazy_warm_eq_cold"], c["lazy_pairs"], c["lazy_warm_hits"])]
    t = targets(pts)
    if t:
        out += ["", "| target | measured | |", "|---|---|---|"] + t
    return "\n".join(out) + "\n"


def main():
    src, png = sys.argv[1], sys.argv[2]
    text = open(src).read()
    try:
        d = json.loads(text)
    except ValueError:  # Cut short (a timeout): close the points list.
        d = json.loads(text.rstrip().rstrip(",") + "\n]}\n")
    md = markdown(d)
    open(os.path.splitext(png)[0] + ".md", "w").write(md)
    print(md)
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    g = groups(d["points"])
    keys = sorted(g)
    fig, axes = plt.subplots(len(keys), 2, figsize=(12, 3.2 * len(keys)), squeeze=False)
    for row, k in enumerate(keys):
        pts = g[k]
        ax = axes[row][0]
        for i, p in enumerate(pts):
            ax.bar(i, p["ttft_p50_ms"], color=COLORS[p["mode"]],
                   hatch="//" if p["policy"] != "adaptive" else None)
            if p.get("ttft_p99_ms") is not None:
                ax.plot([i, i], [p["ttft_p50_ms"], p["ttft_p99_ms"]], color="black", lw=1)
        ax.set_xticks(range(len(pts)))
        ax.set_xticklabels([label(p) for p in pts], fontsize=8)
        ax.set_ylabel("TTFT ms (p50 bar, p99 line if n >= 100)")
        ax.set_title("%s alpha %g, %s: TTFT, one at a time" % (k[0], k[1], gib(k[2])), fontsize=9)
        ax = axes[row][1]
        bs = sorted({t["batch"] for p in pts for t in p["throughput"]})
        w = 0.8 / max(1, len(pts))
        for i, p in enumerate(pts):
            ys = [(tput(p, b) or {"rps": 0})["rps"] for b in bs]  # The run's own chunking.
            ax.bar([j + i * w for j in range(len(bs))], ys, w, color=COLORS[p["mode"]],
                   hatch="//" if p["policy"] != "adaptive" else None, label=label(p))
        ax.set_xticks([j + 0.4 - w / 2 for j in range(len(bs))])
        ax.set_xticklabels(["B=%d" % b for b in bs])
        ax.set_ylabel("requests/s")
        ax.set_title("throughput", fontsize=9)
        ax.legend(fontsize=7)
    fig.suptitle("serving benchmark, %s, %s (%s)" % (d["model"], d["backend"], d["date"]))
    fig.tight_layout()
    fig.savefig(png, dpi=90)


if __name__ == "__main__":
    main()
