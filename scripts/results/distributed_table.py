#!/usr/bin/env python3
"""Prints the table of fa_attention.distributed's measured strategies (Markdown) from the CSV
of scripts/bench/bench_distributed.py: forward + backward time of each strategy and its share
of the ideal, t_1 / (P · t_P), where t_1 is the op on the whole sequence on one GPU of the
same run.

  python3 scripts/results/distributed_table.py docs/results/h200x4_distributed.csv
"""
import csv
import sys


def main(path):
    rows = list(csv.DictReader(open(path)))
    first = rows[0]
    P = int(first["gpus"])
    print(f"{P} × {first['device']}, NCCL, torch {first['torch']}, stage {first['stage']} per block, "
          f"{first['dtype']}, batch {first['batch']}, {first['heads']} heads, d = {first['head_dim']}; "
          f"forward + backward ms (share of the ideal t₁ / ({P} · t_{P})):\n")
    strategies = [s for s in dict.fromkeys(r["strategy"] for r in rows) if s != "one-gpu"]
    print("| N | causal | one GPU | " + " | ".join(strategies) + " |")
    print("|--:|:--|--:|" + "--:|" * len(strategies))
    shapes = list(dict.fromkeys((r["seq"], r["causal"]) for r in rows))
    for seq, causal in shapes:
        def t(strategy):
            r = [x for x in rows if (x["seq"], x["causal"], x["strategy"]) == (seq, causal, strategy)]
            return float(r[0]["fwd_bwd_ms"]) if r and r[0]["fwd_bwd_ms"] else None
        t1 = t("one-gpu")
        cells = []
        for s in strategies:
            tp = t(s)
            cells.append(f"{tp:.1f} ({100 * t1 / (P * tp):.0f}%)" if tp and t1 else "–")
        print(f"| {int(seq) // 1024}k | {'yes' if causal == 'True' else 'no'} | {t1:.1f} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main(sys.argv[1])
