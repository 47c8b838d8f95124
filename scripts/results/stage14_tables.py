#!/usr/bin/env python3
"""Prints stage 14's results table (Markdown) from scripts/gpu/stage14.sh's two CSVs: the K/V
bytes each step reads per second, as GB/s and as a share of the copy bandwidth measured in the
same run, beside the fastest of PyTorch's SDPA backends on the same shapes, and the final
step's speed as a multiple of that backend's.

  python3 scripts/results/stage14_tables.py docs/results/h200_stage14_steps.csv docs/results/h200_stage14_sdpa.csv

The columns are the (step, cache layout) pairs the steps CSV holds, in step order; a shape a
step was not timed on shows "–".
"""
import csv
import sys


def main(steps_csv, sdpa_csv):
    rows = list(csv.DictReader(open(steps_csv)))
    sdpa = list(csv.DictReader(open(sdpa_csv)))
    device, copy = rows[0]["device"], float(rows[0]["copy_gbs"])
    columns = sorted({(r["step"], int(r["block_size"])) for r in rows})
    final = max(columns)[0]  # the last step, contiguous
    shapes = sorted({(int(r["batch"]), int(r["q_len"]), int(r["cache"])) for r in rows})
    name = lambda step, block: f"{step} paged {block}" if block else step  # noqa: E731
    print(f"{device}, bf16, d = 128, 32 query heads over 8 KV heads; GB/s of K and V read "
          f"(share of the {copy:.0f} GB/s copy measured in the same run):\n")
    print("| batch | q_len | cache | " + " | ".join(name(*c) for c in columns) + f" | best SDPA | {final} ÷ best SDPA |")
    print("|--:|--:|--:|" + "--:|" * (len(columns) + 2))
    for b, q, n in shapes:
        def gbs(step, block):
            r = [x for x in rows if (int(x["batch"]), int(x["q_len"]), int(x["cache"])) == (b, q, n)
                 and x["step"] == step and int(x["block_size"]) == block]
            return float(r[0]["kv_gbs"]) if r else None

        def cell(step, block):
            g = gbs(step, block)
            return f"{g:.0f} ({100 * g / copy:.0f}%)" if g is not None else "–"
        best = max((x for x in sdpa if (int(x["batch"]), int(x["q_len"]), int(x["cache"])) == (b, q, n)),
                   key=lambda x: float(x["kv_gbs"]), default=None)
        best_cell = f"{float(best['kv_gbs']):.0f} ({best['backend']})" if best else "–"
        ours = gbs(final, 0)
        ratio = f"{ours / float(best['kv_gbs']):.2f}" if best and ours else "–"
        print(f"| {b} | {q} | {n} | " + " | ".join(cell(*c) for c in columns) + f" | {best_cell} | {ratio} |")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
