#!/usr/bin/env python3
"""Stage 13's timing tables (scripts/bench/bench_masks.py's CSVs) for its notes: with --forward,
per N and case the stage's forward beside flex_attention's and SDPA cuDNN's with a dense mask or
bias, the stage's TFLOP/s and its speed over flex; with --backward, forward + backward and the
backward alone, the stage's beside flex_attention's (a CSV from before the backward-alone rows
*_bwd gives the stage's from its note, and flex's as n/a). × = flex's time over the stage's
(> 1: the stage is faster). Needs no torch.

  python3 scripts/results/stage13_tables.py --forward docs/results/h100_stage13_masks.csv
  python3 scripts/results/stage13_tables.py --backward docs/results/h100_stage13_masks_bwd.csv
"""
import csv
import math
import re
import sys


def case_label(mask, n):
    """The CSV's case as the notes name it (every case is causal)."""
    label = re.sub(r"(\d)-(\d)", r"\1–\2", mask.replace("causal + ", ""))
    window = re.fullmatch(r"window (\d+)", mask)
    if window and int(window.group(1)) >= n:
        label += " (= causal)"
    return label


def ms(row):
    return f"{float(row['ms']):.3f}" if row and not math.isnan(float(row["ms"])) else "n/a"


def main(mode, path):
    rows = list(csv.DictReader(open(path)))
    by, order = {}, []
    for r in rows:
        key = (int(r["seq"]), r["mask"])
        if key not in by:
            order.append(key)
        by.setdefault(key, {})[r["impl"]] = r
    devices = sorted({r["device"] for r in rows})
    print(f"{', '.join(devices)}, bf16, $d = 128$, 16 heads, batch 1, causal; ms per call.\n")
    if mode == "--forward":
        print("| $N$ | case | stage 13 | `flex_attention` | SDPA cuDNN, dense mask or bias | stage 13 TFLOP/s | × flex |")
        print("|--:|:--|--:|--:|--:|--:|--:|")
    else:
        print("| $N$ | case | stage 13 fwd + bwd | `flex_attention` fwd + bwd | × flex | stage 13 bwd "
              "| `flex_attention` bwd | × flex, bwd |")
        print("|--:|:--|--:|--:|--:|--:|--:|--:|")
    for n, mask in sorted(order, key=lambda k: k[0]):  # by N, cases in the run's order
        m = by[(n, mask)]
        ours, flex = m["stage13_hopper"], m["flex_attention"]
        speed = f"{float(flex['ms']) / float(ours['ms']):.2f}×"
        if mode == "--forward":
            print(f"| {n} | {case_label(mask, n)} | {ms(ours)} | {ms(flex)} | {ms(m.get('sdpa_cudnn_dense_mask'))} | "
                  f"{float(ours['tflops']):.0f} | {speed} |")
        else:
            if "stage13_hopper_bwd" in m:
                alone = float(m["stage13_hopper_bwd"]["ms"])
            else:
                alone = float(re.search(r"backward alone ([0-9.]+) ms", ours["note"]).group(1))
            flex_bwd = m.get("flex_attention_bwd")
            bwd_speed = f"{float(flex_bwd['ms']) / alone:.2f}×" if flex_bwd else "n/a"
            print(f"| {n} | {case_label(mask, n)} | {ms(ours)} | {ms(flex)} | {speed} | {alone:.3f} | {ms(flex_bwd)} "
                  f"| {bwd_speed} |")


if __name__ == "__main__":
    if len(sys.argv) != 3 or sys.argv[1] not in ("--forward", "--backward"):
        sys.exit(__doc__)
    main(sys.argv[1], sys.argv[2])
