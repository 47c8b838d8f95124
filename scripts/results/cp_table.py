#!/usr/bin/env python3
"""The capstone's context-parallel runs (python/examples/gpt/train_cp.py) as one Markdown table:
per CSV, the ranks, the sequence length, the mean training loss of the last 10% of the steps,
the last validation loss and accuracy, tokens/s at the full length (the median of the timed
steps), and the loss curves' distance from the first file's where they share a length.

  python3 scripts/results/cp_table.py docs/results/h200x4_gpt_cp_P1_N65536.csv [more CSVs]

Standard library only. A missing file prints one line saying so.
"""
import csv
import math
import statistics
import sys
from pathlib import Path


def load(path):
    with Path(path).open(newline="", encoding="utf-8") as f:
        return list(csv.DictReader(f))


def summary(rows):
    n = max(1, len(rows) // 10)
    last = [r for r in rows if r["val_loss"]][-1]
    N = max(int(r["seq"]) for r in rows)
    timed = [float(r["tokens_per_s"]) for r in rows if r["tokens_per_s"] and int(r["seq"]) == N]
    return dict(ranks=int(rows[0]["ranks"]), N=N, steps=len(rows),
                final=statistics.fmean(float(r["loss"]) for r in rows[-n:]),
                val=float(last["val_loss"]), acc=float(last["val_accuracy"]),
                tokens=statistics.median(timed) if timed else math.nan)


def first_divergence(a, b, rel=1e-2):
    """The first step at which two runs' training losses differ by more than `rel` (relative)."""
    for ra, rb in zip(a, b):
        x, y = float(ra["loss"]), float(rb["loss"])
        if abs(x - y) > rel * abs(y):
            return int(ra["step"])
    return None


def main(paths):
    missing = [p for p in paths if not Path(p).is_file()]
    if missing:
        print(f"Not measured yet: {', '.join(missing)} (torchrun python/examples/gpt/train_cp.py --out OUT).")
        return 0
    runs = [load(p) for p in paths]
    base = summary(runs[0])
    print(f"{runs[0][0]['device']}, commit {runs[0][0]['commit']}: the recall model (2 layers × 4 heads of 64), "
          f"one sequence per step, {base['steps']} steps; chance is a loss of ln 64 = 4.16 and an accuracy of 1/64.")
    print()
    print("| GPUs | N | final loss | val loss | val accuracy | tokens/s | × 1 GPU | loss within 1% of 1 GPU's until |")
    print("|--:|--:|--:|--:|--:|--:|--:|:--|")
    for i, rows in enumerate(runs):
        s = summary(rows)
        same_n = s["N"] == base["N"]
        speed = f"{s['tokens'] / base['tokens']:.2f}" if same_n else "—"
        if i == 0 or not same_n:
            until = "—"
        else:
            step = first_divergence(rows, runs[0])
            until = "every step" if step is None else f"step {step}"
        print(f"| {s['ranks']} | {s['N'] // 1024}k | {s['final']:.3f} | {s['val']:.3f} | {s['acc']:.3f} | "
              f"{s['tokens']:,.0f} | {speed} | {until} |")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:] or ["docs/results/h200x4_gpt_cp_P1_N65536.csv"]))
