#!/usr/bin/env python3
"""merge.py OURS.jsonl SDPA.jsonl OUT.json: merges bench_attn.cu and sdpa_bench.py results into
one JSON document (OUT.json) and prints a markdown table with ratios and the targets:
  decode   lazy TB/s >= 90% of SDPA TB/s; rotation overhead (lazy vs norot) within the spread
           (lazy vs lazy_again); batch-1 decode faster than SDPA;
  prefill  lazy TFLOP/s > 50% of SDPA; 64-token prefill over 32k >= 2.5x faster than
           Block-Attention (materialise + attention).
"""
import json
import sys


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
        key = (r["op"], r.get("batch", r.get("n_new")), r.get("ctx"), r.get("variant"))
        idx[key] = r
    copy = next((r for r in ours if r["op"] == "copy"), None)
    gemm = next((r for r in sdpa if r["op"] == "gemm"), None)
    tcopy = next((r for r in sdpa if r["op"] == "copy_torch"), None)
    lines = []
    targets = []
    if copy:
        lines.append(f"Bandwidth ceiling (cudaMemcpy D2D 4 GiB, read+write): {copy['tbps']:.2f} TB/s"
                     + (f"; torch copy {tcopy['tbps']:.2f} TB/s" if tcopy else ""))
    if gemm:
        lines.append(f"GEMM ceiling (torch.matmul bf16 8192^3): {gemm['tflops']:.0f} TFLOP/s")
    lines.append("")
    lines.append("Decode (Llama-3.1-8B heads 32/8, d=128, bf16, B=16, 5 documents per sequence; "
                 "TB/s = K+V bytes read / median time)")
    lines.append("")
    lines.append("| batch | ctx | lazy us | lazy TB/s | % of copy | norot us | rot. overhead | "
                 "spread (2nd run) | SDPA us | SDPA TB/s | lazy/SDPA TB/s |")
    lines.append("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    worst_ratio, b1_ok, rot_ok = 9.9, True, True
    for b in (1, 16, 64, 128):
        for c in (4096, 8192, 32768):
            lz = idx.get(("decode", b, c, "lazy"))
            if not lz:
                continue
            nr = idx.get(("decode", b, c, "norot"))
            l2 = idx.get(("decode", b, c, "lazy_again"))
            sd = idx.get(("decode", b, c, "sdpa"))
            rot = (lz["median_us"] / nr["median_us"] - 1) * 100 if nr else float("nan")
            spr = abs(l2["median_us"] / lz["median_us"] - 1) * 100 if l2 else float("nan")
            ratio = lz["tbps"] / sd["tbps"] if sd else float("nan")
            pct = lz["tbps"] / copy["tbps"] * 100 if copy else float("nan")
            if sd:
                worst_ratio = min(worst_ratio, ratio)
                if b == 1 and lz["median_us"] >= sd["median_us"]:
                    b1_ok = False
            if nr and l2 and rot > max(spr, 1.0) + 1.0:
                rot_ok = False
            lines.append(f"| {b} | {c} | {lz['median_us']:.1f} | {lz['tbps']:.2f} | {pct:.0f}% | "
                         f"{nr['median_us'] if nr else float('nan'):.1f} | {rot:+.1f}% | {spr:.1f}% | "
                         f"{sd['median_us'] if sd else float('nan'):.1f} | "
                         f"{sd['tbps'] if sd else float('nan'):.2f} | {ratio:.2f} |")
    targets.append(f"decode >= 90% of SDPA TB/s (worst case): {worst_ratio * 100:.0f}% -> "
                   f"{'MET' if worst_ratio >= 0.9 else 'MISSED'}")
    targets.append(f"rotation overhead within noise (lazy - norot <= spread + 1 pt, all cases): "
                   f"{'MET' if rot_ok else 'MISSED'}")
    targets.append(f"batch-1 decode under SDPA's time (all contexts): {'MET' if b1_ok else 'MISSED'}")
    lines.append("")
    lines.append("Prefill (new tokens against cached tokens in 5 documents; TFLOP/s = "
                 "4*n_new*Hq*d*(ctx+(n_new+1)/2) / median time)")
    lines.append("")
    lines.append("| n_new | ctx | lazy us | lazy TFLOP/s | norot us | SDPA us | SDPA TFLOP/s | "
                 "lazy/SDPA | Block-Attn us | Block-Attn / lazy |")
    lines.append("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    worst_pf, ba64 = 9.9, None
    for c in (8192, 32768):
        for n in (64, 512, 2048):
            lz = idx.get(("prefill", n, c, "lazy"))
            if not lz:
                continue
            nr = idx.get(("prefill", n, c, "norot"))
            sd = idx.get(("prefill", n, c, "sdpa"))
            ba = idx.get(("prefill", n, c, "block_attn"))
            ratio = lz["tflops"] / sd["tflops"] if sd else float("nan")
            if sd:
                worst_pf = min(worst_pf, ratio)
            sp = ba["median_us"] / lz["median_us"] if ba else float("nan")
            if n == 64 and c == 32768:
                ba64 = sp
            lines.append(f"| {n} | {c} | {lz['median_us']:.1f} | {lz['tflops']:.0f} | "
                         f"{nr['median_us'] if nr else float('nan'):.1f} | "
                         f"{sd['median_us'] if sd else float('nan'):.1f} | "
                         f"{sd['tflops'] if sd else float('nan'):.0f} | {ratio:.2f} | "
                         f"{ba['median_us'] if ba else float('nan'):.1f} | {sp:.2f}x |")
    mats = [r for r in ours if r["op"] == "materialise"]
    if mats:
        lines.append("")
        lines.append("Materialise alone (Block-Attention copy, one layer): " + "; ".join(
            f"ctx {r['ctx']}: {r['median_us']:.1f} us, {r['tbps']:.2f} TB/s" for r in mats))
    targets.append(f"prefill > 50% of SDPA TFLOP/s (worst case): {worst_pf * 100:.0f}% -> "
                   f"{'MET' if worst_pf > 0.5 else 'MISSED'}")
    if ba64 is not None:
        targets.append(f"64-token prefill over 32k vs Block-Attention: {ba64:.2f}x -> "
                       f"{'MET' if ba64 >= 2.5 else 'MISSED'} (target 2.5x)")
    lines.append("")
    lines.append("Targets:")
    lines.extend("- " + t for t in targets)
    print("\n".join(lines))
    with open(sys.argv[3], "w") as f:
        json.dump({"records": allr, "targets": targets}, f, indent=1)


if __name__ == "__main__":
    main()
