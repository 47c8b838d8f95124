#!/usr/bin/env python3
"""Prints stage 10's notes tables (Markdown) from a bench_gpu.py --hopper CSV:
the steps table at one point and the results table against FlashAttention-2 and cuDNN.

  python3 scripts/stage10_tables.py docs/results/h200_stage10.csv
"""
import csv
import sys


def main(path):
    every = list(csv.DictReader(open(path)))
    gemm = next((float(r["tflops"]) for r in every if r["what"] == "ceiling_bf16_gemm"), float("nan"))
    rows = [r for r in every if r["pass"] == "fwd" and r["tflops"]]
    t = {}
    for r in rows:
        key = (r["dtype"], int(r["head_dim"]), int(r["seq_q"]), r["causal"] == "1")
        t.setdefault(key, {})[r["what"]] = float(r["tflops"])
    st = "10_hopper_fwd"
    names = [(f"{st}[step=1]", "10a"), (f"{st}[step=2]", "10b"), (f"{st}[step=3]", "10c"), (f"{st}[step=4]", "10d"),
             (f"{st}[step=5]", "10e"), (st, "10f")]
    print(f"Steps (bf16, N = 8192, batch 2, heads·d = 2048), TFLOP/s:\n")
    print("| step | d = 64 | d = 64 causal | d = 128 | d = 128 causal | d = 256 | d = 256 causal |")
    print("|:--|--:|--:|--:|--:|--:|--:|")
    for key, label in names:
        cells = [t.get(("bf16", d, 8192, c), {}).get(key, float("nan")) for d in (64, 128, 256) for c in (False, True)]
        print(f"| {label} | " + " | ".join(f"{x:.0f}" for x in cells) + " |")
    print(f"\nResults of 10f (the default), TFLOP/s and ratios (bf16 GEMM {gemm:.0f} TFLOP/s in the same run):\n")
    print("| dtype | d | N | causal | 10f | FA2 | cuDNN | × FA2 | × cuDNN | % GEMM |")
    print("|:--|--:|--:|:--|--:|--:|--:|--:|--:|--:|")
    for key in sorted(t):
        v = t[key]
        if st not in v:
            continue
        fl, cu = v.get("sdpa_flash", float("nan")), v.get("sdpa_cudnn", float("nan"))
        print(f"| {key[0]} | {key[1]} | {key[2]} | {'yes' if key[3] else 'no'} | {v[st]:.0f} | {fl:.0f} | {cu:.0f} | "
              f"{v[st] / fl:.2f} | {v[st] / cu:.2f} | {100 * v[st] / gemm:.0f}% |")


if __name__ == "__main__":
    main(sys.argv[1])
