#!/usr/bin/env python3
"""merge.py OURS.jsonl SDPA.jsonl OUT.json: merges bench_attn.cu and sdpa_bench.py results into
one JSON document (OUT.json) and prints a markdown table with ratios and the targets of issue 14
(Llama-3.1-8B heads, bf16, 5 documents a sequence, pages scattered over the arena):
  T1  batch 1 at 4k: at most 12 us per layer inside a replayed graph (32 layers in one graph);
  T2  batch 1 at 32k: at most 0.8x the best SDPA backend's time (single launch against the best
      single launch, and 32-layer graph against the best 32-layer graph);
  T3  at least 1.0x the best backend's TB/s at every batch of 16 and more;
  T4  rotation overhead (lazy vs norot) within the run-to-run spread (lazy vs lazy_again);
every figure also as a fraction of the copy bandwidth measured in the same run. The best backend
of a case is the fastest of sdpa_flash / sdpa_efficient / sdpa_cudnn (and the default
dispatcher) among those that accept the shape; plain launches against plain ones, graphs
against graphs (T1-T4 only when the run has decode records). Prefill (issue 15), against the
fastest SDPA backend of each shape and the GEMM rate of the same run:
  P1  at least 1.0x the best backend's TFLOP/s on every shape;
  P2  64 new tokens over 32k in at most 80 us, and at least 3x faster than Block-Attention;
  P3  (stretch) 500 TFLOP/s or more at 2048 new over 32k.
"""
import json
import sys

NAN = float("nan")


def load(path):
    recs = []
    with open(path) as f:
        for line in f:
            line = line.strip()
            if line:
                recs.append(json.loads(line))
    return recs


def main():
    ours, sdpa = load(sys.argv[1]), load(sys.argv[2])
    allr = ours + sdpa
    idx = {}
    for r in allr:
        if "median_us" not in r:
            continue
        key = (r["op"], r.get("batch", r.get("n_new")), r.get("ctx"), r.get("variant"))
        idx[key] = r
    copy = next((r for r in ours if r["op"] == "copy"), None)
    gemm = next((r for r in sdpa if r["op"] == "gemm"), None)
    tcopy = next((r for r in sdpa if r["op"] == "copy_torch"), None)
    cbw = copy["tbps"] if copy else NAN

    def best(b, c, suffix):
        cands = [(k[3], v) for k, v in idx.items()
                 if k[0] == "decode" and k[1] == b and k[2] == c and k[3].startswith("sdpa_")
                 and k[3].endswith(suffix)
                 and (suffix or not (k[3].endswith("_graph") or k[3].endswith("_graph32")))]
        if not cands:
            return None, None
        name, r = min(cands, key=lambda t: t[1]["median_us"])
        return name, r

    lines, targets = [], []
    if copy:
        lines.append(f"Bandwidth ceiling (cudaMemcpy D2D 4 GiB, read+write): {copy['tbps']:.2f} TB/s"
                     + (f"; torch copy {tcopy['tbps']:.2f} TB/s" if tcopy else ""))
    if gemm:
        lines.append(f"GEMM ceiling (torch.matmul bf16 8192^3): {gemm['tflops']:.0f} TFLOP/s")
    lines.append("")
    lines.append("Decode, one launch (L2 flushed before each; TB/s = K+V bytes / median time; "
                 "% = of the copy bandwidth)")
    lines.append("")
    lines.append("| batch | ctx | splits | lazy us | TB/s | % copy | in graph us | norot us | rot. "
                 "overhead | spread | best SDPA | us | TB/s | best SDPA graph | us | lazy/best TB/s |")
    lines.append("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|---:|---|---:|---:|")
    t3_ok, t3_worst, t4_ok = True, 9.9, True
    t4_rows = []
    for b in (1, 16, 64, 128):
        for c in (4096, 8192, 32768):
            lz = idx.get(("decode", b, c, "lazy"))
            if not lz:
                continue
            nr = idx.get(("decode", b, c, "norot"))
            l2 = idx.get(("decode", b, c, "lazy_again"))
            lg = idx.get(("decode", b, c, "lazy_graph"))
            bn, bs = best(b, c, "")
            gn, gs = best(b, c, "_graph")
            rot = (lz["median_us"] / nr["median_us"] - 1) * 100 if nr else NAN
            spr = abs(l2["median_us"] / lz["median_us"] - 1) * 100 if l2 else NAN
            ratio = lz["tbps"] / bs["tbps"] if bs else NAN
            if b >= 16 and bs:
                t3_worst = min(t3_worst, ratio)
                if ratio < 1.0:
                    t3_ok = False
            if nr and l2:
                t4_rows.append((b, c, rot, spr))
                if rot > spr:
                    t4_ok = False
            lines.append(
                f"| {b} | {c} | {lz.get('splits', '')} | {lz['median_us']:.1f} | {lz['tbps']:.2f} | "
                f"{lz['tbps'] / cbw * 100:.0f}% | {lg['median_us'] if lg else NAN:.1f} | "
                f"{nr['median_us'] if nr else NAN:.1f} | {rot:+.1f}% | {spr:.1f}% | "
                f"{bn or '-'} | {bs['median_us'] if bs else NAN:.1f} | {bs['tbps'] if bs else NAN:.2f} | "
                f"{gn or '-'} | {gs['median_us'] if gs else NAN:.1f} | {ratio:.2f} |")
    lines.append("")
    lines.append("Every SDPA backend, decode (us; 'refused' = the backend rejects the shape; "
                 "'repeat' = no GQA support, K/V expanded outside the timing)")
    lines.append("")
    names = sorted({k[3] for k in idx if k[0] == "decode" and k[3].startswith("sdpa_")})
    lines.append("| batch | ctx | " + " | ".join(names) + " |")
    lines.append("|---:|---:|" + "---:|" * len(names))
    for b in (1, 16, 64, 128):
        for c in (4096, 8192, 32768):
            row = [idx.get(("decode", b, c, n)) for n in names]
            if not any(row):
                continue
            cells = [f"{r['median_us']:.1f}{' (repeat)' if r.get('mode') == 'repeat' else ''}"
                     if r else "-" for r in row]
            lines.append(f"| {b} | {c} | " + " | ".join(cells) + " |")
    refused = [r for r in sdpa if r.get("refused")]
    for r in refused:
        lines.append(f"- {r['variant']} b={r['batch']} ctx={r['ctx']}: {r['refused']}")
    lines.append("")
    lines.append("Batch 1, 32 layers of one decode step in one CUDA graph (per-layer time = "
                 "replay / 32)")
    lines.append("")
    lines.append("| ctx | lazy us/layer | TB/s | % copy | norot | again | with PDL | TB/s | % copy | "
                 "best SDPA graph32 | us | ours (best) / SDPA time | single launch lazy us | "
                 "best SDPA single us |")
    lines.append("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|---:|---:|---:|")
    t1, t2 = None, []
    for c in (4096, 8192, 32768):
        g = idx.get(("decode", 1, c, "lazy_graph32"))
        if not g:
            continue
        gn_ = idx.get(("decode", 1, c, "norot_graph32"))
        ga = idx.get(("decode", 1, c, "lazy_graph32_again"))
        gp = idx.get(("decode", 1, c, "lazy_graph32_pdl"))
        gb = min([x for x in (g, gp) if x], key=lambda r: r["median_us"])
        bn, bs = best(1, c, "_graph32")
        sn, ss = best(1, c, "")
        lz = idx.get(("decode", 1, c, "lazy"))
        rt = gb["median_us"] / bs["median_us"] if bs else NAN
        if gn_ and ga:
            rot = (g["median_us"] / gn_["median_us"] - 1) * 100
            spr = abs(ga["median_us"] / g["median_us"] - 1) * 100
            t4_rows.append((1, f"{c} graph32", rot, spr))
            if rot > spr:
                t4_ok = False
        lines.append(f"| {c} | {g['median_us']:.2f} | {g['tbps']:.2f} | {g['tbps'] / cbw * 100:.0f}% | "
                     f"{gn_['median_us'] if gn_ else NAN:.2f} | {ga['median_us'] if ga else NAN:.2f} | "
                     f"{gp['median_us'] if gp else NAN:.2f} | {gp['tbps'] if gp else NAN:.2f} | "
                     f"{gp['tbps'] / cbw * 100 if gp else NAN:.0f}% | "
                     f"{bn or '-'} | {bs['median_us'] if bs else NAN:.2f} | {rt:.2f} | "
                     f"{lz['median_us'] if lz else NAN:.1f} | {ss['median_us'] if ss else NAN:.1f} |")
        gname = "with PDL" if gb is gp else "plain launches"
        if c == 4096:
            t1 = (gb["median_us"], lz["median_us"] if lz else NAN, gname, g["median_us"])
        if c == 32768:
            if bs:
                t2.append((f"32-layer graph, {gname}", gb["median_us"], bs["median_us"], bn))
            if lz and ss:
                t2.append(("single launch", lz["median_us"], ss["median_us"], sn))
    if t1:
        targets.append(f"T1 batch 1 at 4k <= 12 us per layer in a replayed graph: {t1[0]:.2f} us "
                       f"({t1[2]}; plain {t1[3]:.2f}) -> {'MET' if t1[0] <= 12.0 else 'MISSED'} "
                       f"(single launch {t1[1]:.1f} us)")
    for what, us, ref, name in t2:
        targets.append(f"T2 batch 1 at 32k <= 0.8x best backend ({what}): {us:.1f} us vs {name} "
                       f"{ref:.1f} us = {us / ref:.2f}x -> {'MET' if us <= 0.8 * ref else 'MISSED'}")
    has_decode = any(r["op"] == "decode" for r in allr)
    if has_decode:
        targets.append(f"T3 >= 1.0x best backend TB/s at batch >= 16 (single launch; worst "
                       f"{t3_worst:.2f}x) -> {'MET' if t3_ok else 'MISSED'}")
        targets.append("T4 rotation overhead within run-to-run spread at every batch -> "
                       f"{'MET' if t4_ok else 'MISSED'} (" + "; ".join(
                           f"b{b}/{c}: {rot:+.1f}% vs {spr:.1f}%" for b, c, rot, spr in t4_rows) + ")")
    lines.append("")
    gemm = next((r for r in sdpa if r["op"] == "gemm"), None)
    gtf = gemm["tflops"] if gemm else NAN
    lines.append("Prefill (new tokens against cached tokens in 5 documents; TFLOP/s = "
                 "4*n_new*Hq*d*(ctx+(n_new+1)/2) / median time; best = the fastest SDPA backend "
                 f"that accepts the shape; GEMM rate of the same run {gtf:.0f} TFLOP/s)")
    lines.append("")
    lines.append("| n_new | ctx | lazy us | TFLOP/s | of GEMM | again us | norot us | mma.sync us "
                 "| best SDPA | its us | its TFLOP/s | lazy/best | Block-Attn us | BA / lazy |")
    lines.append("|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|---:|---:|---:|---:|")
    pf_ok, pf_rows, s2048 = True, 0, None
    for c in (8192, 32768):
        for n in (64, 512, 2048):
            lz = idx.get(("prefill", n, c, "lazy"))
            if not lz:
                continue
            la = idx.get(("prefill", n, c, "lazy_again"))
            nr = idx.get(("prefill", n, c, "norot"))
            mm = idx.get(("prefill", n, c, "mma_sync"))
            ba = idx.get(("prefill", n, c, "block_attn"))
            cands = [(r["median_us"], r["variant"][5:], r) for (op, nn, cc, var), r in idx.items()
                     if op == "prefill" and nn == n and cc == c and var.startswith("sdpa_")]
            best = min(cands, key=lambda t: t[0]) if cands else None
            ratio = lz["tflops"] / best[2]["tflops"] if best else NAN
            pf_ok = pf_ok and ratio >= 1.0
            pf_rows += 1
            sp = ba["median_us"] / lz["median_us"] if ba else NAN
            g = lambda r: f"{r['median_us']:.1f}" if r else "-"
            lines.append(f"| {n} | {c} | {lz['median_us']:.1f} | {lz['tflops']:.0f} | "
                         f"{lz['tflops'] / gtf:.2f} | {g(la)} | {g(nr)} | {g(mm)} | "
                         f"{best[1] if best else '-'} | {best[0] if best else NAN:.1f} | "
                         f"{best[2]['tflops'] if best else NAN:.0f} | {ratio:.2f} | {g(ba)} | "
                         f"{sp:.2f}x |")
            if n == 64 and c == 32768:
                targets.append(f"P2 64 new over 32k <= 80 us: {lz['median_us']:.1f} us -> "
                               f"{'MET' if lz['median_us'] <= 80.0 else 'MISSED'}; >= 3x faster "
                               f"than Block-Attention: {sp:.2f}x -> {'MET' if sp >= 3.0 else 'MISSED'}")
            if n == 2048 and c == 32768:
                s2048 = lz["tflops"]
    if pf_rows:  # a decode-only run has no prefill rows: say nothing rather than "MET"
        targets.append(f"P1 prefill >= 1.0x the best SDPA backend's TFLOP/s on every shape "
                       f"({pf_rows} shapes) -> {'MET' if pf_ok else 'MISSED'}")
    if s2048 is not None:
        targets.append(f"P3 (stretch) 2048 new over 32k >= 500 TFLOP/s: {s2048:.0f} "
                       f"({s2048 / gtf:.2f} of GEMM) -> {'MET' if s2048 >= 500 else 'MISSED'}")
    lines.append("")
    lines.append("Targets:")
    lines.extend("- " + t for t in targets)
    print("\n".join(lines))
    with open(sys.argv[3], "w") as f:
        json.dump({"records": allr, "targets": targets}, f, indent=1)


if __name__ == "__main__":
    main()
