#!/usr/bin/env python3
"""Compare two bench_gpu.py CSVs point by point: did a change move a stage against its baseline?

A stage's speed is read as its ratio to the library it is measured against in the same run
(stage 07, fp32: SDPA's math backend; stages 08 and 09, fp16/bf16: SDPA's flash backend,
FlashAttention-2), so that the clock and the machine cancel out. For every point that both
files hold, the script prints the two ratios and their change, then the median change and
the points that fell more than --max-drop below their old ratio.

  python3 scripts/results/compare_bench.py BEFORE.csv[,BEFORE2.csv…] AFTER.csv[,AFTER2.csv…] [--max-drop 0.04]

With several files a side (rounds of the same code, as scripts/gpu/bench_ab.sh writes them),
a point's ratio is the geometric mean of its ratios in those files; a file that holds several
runs gives each point the geometric mean of its TFLOP/s.

Exit status 0 when no point fell more than --max-drop and the median change is within
±--max-median or above it (a faster median is no regression; the thresholds of issue #14's
"performance must not move"), 1 otherwise.
"""
import argparse
import math
import statistics
import sys
from collections import defaultdict

from results_data import measured_rows

# The baseline each stage is read against, by stage prefix.
BASELINE = {"07": "sdpa_math", "08": "sdpa_flash", "09": "sdpa_flash"}


def load(path):
    """{(what, pass, dtype, batch, heads, seq_q, seq_k, head_dim, causal): tflops}; a point
    measured more than once (several runs in one file) gets the geometric mean."""
    table = defaultdict(list)
    for row in measured_rows(path):
        key = (row["what"], row["pass"], row["dtype"], row["batch"], row["heads"],
               row["seq_q"], row["seq_k"], row["head_dim"], row["causal"])
        table[key].append(row["tflops"])
    return {k: math.prod(v) ** (1 / len(v)) for k, v in table.items()}


def ratios(table):
    """{key: stage TFLOP/s ÷ baseline TFLOP/s at the same point} for the stages' defaults."""
    out = {}
    for key, t in table.items():
        what = key[0]
        base = BASELINE.get(what[:2])
        if base is None or "[" in what:  # not a stage, or a variant ([option=value])
            continue
        ref = table.get((base,) + key[1:])
        if ref:
            out[key] = t / ref
    return out


def pooled(paths):
    """ratios() of each comma-separated file, a point's ratios combined by geometric mean."""
    tables = [ratios(load(p)) for p in paths.split(",")]
    keys = set.intersection(*(set(t) for t in tables))
    return {k: math.prod(t[k] for t in tables) ** (1 / len(tables)) for k in keys}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("before")
    ap.add_argument("after")
    ap.add_argument("--max-drop", type=float, default=0.04)
    ap.add_argument("--max-median", type=float, default=0.01)
    args = ap.parse_args()

    before, after = pooled(args.before), pooled(args.after)
    common = sorted(set(before) & set(after))
    if not common:
        print("no point is in both files")
        return 1
    print(f"{'stage':20s} {'pass':4s} {'dtype':5s} {'d':>4s} {'N':>6s} {'causal':>6s} "
          f"{'before':>7s} {'after':>7s} {'change':>7s}")
    changes, low = [], []
    for key in common:
        what, pas, dtype, _, _, n, _, d, causal = key
        c = after[key] / before[key] - 1
        changes.append(c)
        flag = "  <-- below" if c < -args.max_drop else ""
        if flag:
            low.append(key)
        print(f"{what:20s} {pas:4s} {dtype:5s} {d:>4s} {n:>6s} {causal:>6s} "
              f"{before[key]:7.3f} {after[key]:7.3f} {100 * c:+6.1f}%{flag}")
    med = statistics.median(changes)
    print(f"\n{len(common)} points; median change {100 * med:+.2f}%; "
          f"range {100 * min(changes):+.1f}% … {100 * max(changes):+.1f}%; "
          f"{len(low)} point(s) more than {100 * args.max_drop:.0f}% below")
    for stage in sorted({k[0] for k in common}):
        cs = [after[k] / before[k] - 1 for k in common if k[0] == stage]
        print(f"  {stage:20s} {len(cs):3d} points, median {100 * statistics.median(cs):+.2f}%, "
              f"worst {100 * min(cs):+.1f}%")
    ok = not low and (abs(med) <= args.max_median or med > 0)
    print("verdict: " + ("holds" if ok else "does NOT hold") +
          f" (no point below −{100 * args.max_drop:.0f}%, median within ±{100 * args.max_median:.0f}% "
          "or above)")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
