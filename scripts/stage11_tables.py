#!/usr/bin/env python3
"""Prints stage 11's notes tables (Markdown) from a bench_gpu.py --hopper CSV with stage 11:
the steps table at N = 8192 (the longest N of a quick sweep) and the results table against
FlashAttention-2 and cuDNN.

  python3 scripts/stage11_tables.py docs/results/h100_stage11.csv
"""
import csv
import sys


def main(path):
    every = list(csv.DictReader(open(path)))
    rows = [r for r in every if r["pass"] == "bwd" and r["tflops"]]
    device = next((r["device"] for r in every if r.get("device")), "?")
    t = {}
    for r in rows:
        key = (r["dtype"], int(r["head_dim"]), int(r["seq_q"]), r["causal"] == "1")
        t.setdefault(key, {})[r["what"]] = float(r["tflops"])
    st = "11_hopper_bwd"
    names = [(f"{st}[step=1]", "11a"), (f"{st}[step=2]", "11b"), (f"{st}[step=3]", "11c"), (st, "11d"),
             (f"{st}[deterministic=1]", "11d, deterministic")]
    lengths = sorted({k[2] for k in t})
    n = 8192 if 8192 in lengths else lengths[-1]  # a quick sweep has no 8192
    print(f"Steps (bf16, N = {n}, batch {16384 // n}, heads·d = 2048; {device}), backward TFLOP/s:\n")
    print("| step | d = 64 | d = 64 causal | d = 128 | d = 128 causal |")
    print("|:--|--:|--:|--:|--:|")
    for key, label in names:
        cells = [t.get(("bf16", d, n, c), {}).get(key, float("nan")) for d in (64, 128) for c in (False, True)]
        print(f"| {label} | " + " | ".join(f"{x:.0f}" for x in cells) + " |")
    print(f"\nResults of 11d (the default), backward TFLOP/s (2.5 forwards' FLOPs) and ratios, {device}:\n")
    print("| dtype | d | N | causal | 11d | FA2 | cuDNN | × FA2 | × cuDNN |")
    print("|:--|--:|--:|:--|--:|--:|--:|--:|--:|")
    for key in sorted(t):
        v = t[key]
        if st not in v:
            continue
        fl, cu = v.get("sdpa_flash", float("nan")), v.get("sdpa_cudnn", float("nan"))
        print(f"| {key[0]} | {key[1]} | {key[2]} | {'yes' if key[3] else 'no'} | {v[st]:.0f} | {fl:.0f} | {cu:.0f} | "
              f"{v[st] / fl:.2f} | {v[st] / cu:.2f} |")


if __name__ == "__main__":
    main(sys.argv[1])
