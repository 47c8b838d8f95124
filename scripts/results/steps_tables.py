#!/usr/bin/env python3
"""The steps tables of stages 07, 08 and 09's notes, from bench_gpu.py CSVs.

  python3 scripts/results/steps_tables.py 07 docs/results/h100_bench_gpu.csv
  python3 scripts/results/steps_tables.py 08 docs/results/h100_steps_0809.csv

A step is the stage run with its option `step` = k ("07_smem_cuda[step=1]" is 07a); the stage
name alone is the default (auto). Where the file holds several runs, a point's TFLOP/s is
their mean. Prints Markdown (the notes embed it between
`<!-- results: … -->` markers; scripts/results/fill_results.py refreshes it).
"""
import argparse
import statistics
from collections import defaultdict

from results_data import measured_rows

STAGES = {"07": ("07_smem_cuda", ["07a", "07b", "07c"]),
          "08": ("08_tensor_core_fwd", ["08a", "08b"]),
          "09": ("09_tensor_core_bwd", ["09a", "09b", "09c"])}


def read(path):
    """{(what, pass, d, N, causal): mean TFLOP/s over the file's runs}, the devices, the runs."""
    acc, devices, dates = defaultdict(list), set(), set()
    for r in measured_rows(path):
        acc[(r["what"], r["pass"], int(r["head_dim"]), int(r["seq_q"]), r["causal"] == "1")].append(r["tflops"])
        devices.add(r["device"])
        dates.add(r["date"])  # one date per run of bench_gpu.py
    return {k: statistics.mean(v) for k, v in acc.items()}, sorted(devices), len(dates)


def step_name(stage, k):
    """The CSV's name of step k. Stage 07's benchmark times its last step as the default
    (auto is 07c at both head dims), not as a variant."""
    if stage == "07" and k == len(STAGES[stage][1]):
        return STAGES[stage][0]
    return f"{STAGES[stage][0]}[step={k}]"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("stage", choices=sorted(STAGES))
    ap.add_argument("csv")
    args = ap.parse_args()
    t, devices, runs = read(args.csv)
    name, steps = STAGES[args.stage]
    pas = "bwd" if args.stage == "09" else "fwd"
    points = sorted({(d, n, c) for (w, p, d, n, c) in t if w == name and p == pas})
    ref = "sdpa_math" if args.stage == "07" else "sdpa_flash"
    ref_label = "SDPA math" if args.stage == "07" else "FlashAttention-2"
    mean = "the mean of %d runs" % runs if runs > 1 else "one run"
    print(f"Measured on one {', '.join(devices)} ({mean}; "
          f"`{args.csv}`), {'fp32' if args.stage == '07' else 'bf16'}, "
          f"{'batch 4, heads 2048/d' if args.stage == '07' else 'batch·N = 16384, heads·d = 2048'}; "
          f"{'forward' if pas == 'fwd' else 'backward'} TFLOP/s, in parentheses the ratio to the step before; "
          f"the last column: the default (`auto`) against {ref_label} in the same run:")
    print()
    print("| $d$ | $N$ | causal | " + " | ".join(f"`{s}`" for s in steps) + " | auto ×" + ref_label + " |")
    print("|--:|--:|:--|" + "--:|" * len(steps) + "--:|")
    for d, n, c in points:
        cells, prev = [], None
        for k, s in enumerate(steps, 1):
            v = t.get((step_name(args.stage, k), pas, d, n, c))
            if v is None:
                cells.append("—")
                continue
            cells.append(f"{v:.1f}" + (f" ({v / prev:.2f})" if prev else ""))
            prev = v
        auto = t.get((name, pas, d, n, c))  # the default: auto picks the step
        base = t.get((ref, pas, d, n, c))
        vs = f"{auto / base:.2f}" if auto and base else "—"
        print(f"| {d} | {n} | {'yes' if c else 'no'} | " + " | ".join(cells) + f" | {vs} |")


if __name__ == "__main__":
    main()
