#!/usr/bin/env python3
"""Prints stage 14's results table (Markdown) from scripts/gpu/stage14.sh's two CSVs: the K/V
bytes each step reads per second, as GB/s and as a share of the copy bandwidth measured in the
same run, beside the fastest of PyTorch's SDPA backends on the same shapes.

  python3 scripts/results/stage14_tables.py docs/results/h200_stage14_quick.csv docs/results/h200_stage14_sdpa_quick.csv
"""
import csv
import sys


def main(steps_csv, sdpa_csv):
    rows = list(csv.DictReader(open(steps_csv)))
    sdpa = list(csv.DictReader(open(sdpa_csv)))
    device, copy = rows[0]["device"], float(rows[0]["copy_gbs"])
    columns = [("14a", "0"), ("14b", "0"), ("14c", "0"), ("14d", "0"), ("14d", "16"), ("14d", "256")]
    shapes = sorted({(int(r["batch"]), int(r["q_len"]), int(r["cache"])) for r in rows})
    print(f"{device}, bf16, d = 128, 32 query heads over 8 KV heads; GB/s of K and V read "
          f"(share of the {copy:.0f} GB/s copy measured in the same run):\n")
    print("| batch | q_len | cache | 14a | 14b | 14c | 14d | 14d paged 16 | 14d paged 256 | best SDPA |")
    print("|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|")
    for b, q, n in shapes:
        def cell(step, block):
            r = [x for x in rows if (int(x["batch"]), int(x["q_len"]), int(x["cache"])) == (b, q, n)
                 and x["step"] == step and x["block_size"] == block]
            return f"{float(r[0]['kv_gbs']):.0f} ({100 * float(r[0]['kv_gbs']) / copy:.0f}%)" if r else "–"
        best = max((x for x in sdpa if (int(x["batch"]), int(x["q_len"]), int(x["cache"])) == (b, q, n)),
                   key=lambda x: float(x["kv_gbs"]), default=None)
        best_cell = f"{float(best['kv_gbs']):.0f} ({best['backend']})" if best else "–"
        print(f"| {b} | {q} | {n} | " + " | ".join(cell(s, k) for s, k in columns) + f" | {best_cell} |")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
