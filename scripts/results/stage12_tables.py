#!/usr/bin/env python3
"""Stage 12's scaling tables (Markdown) from bench12's CSV (scripts/gpu/stage12_scaling.sh):
strong scaling (fixed N, P = 1, 2, 4, 8) and weak scaling (fixed N/P) of the plain and zigzag
rings, forward and forward+backward, with the fraction of the ideal 1/P and what the
exchanges cost, serialised and overlapped.

  python3 scripts/results/stage12_tables.py docs/results/stage12_scaling.csv

Definitions (stage 12's notes, "Measuring the ring"), per (N, mask, P, split, pass):
  of ideal   t_1 / (P · t_P), with t_1 the P = 1 time of the same N and mask
  exchanges  (t_serial − t_compute) / t_compute  and  (t_overlap − t_compute) / t_compute: the
             exchanges' cost, serialised and overlapped, as a share of the arithmetic alone
             (both can come out slightly negative: the run-to-run noise of the three times)
A CSV that does not exist yet prints one line saying so (the notes' block stays valid).
Standard library only; scripts/results/plot_results.py draws the figure from the same rows.
"""
import csv
import sys
from pathlib import Path


def load(path):
    """{(N, causal, P, split, pass): row} with floats for the times; {} when there is no file."""
    p = Path(path)
    if not p.is_file():
        return {}
    out = {}
    with p.open(newline="", encoding="utf-8") as f:
        for r in csv.DictReader(f):
            if not r.get("what", "").startswith("12_ring_attention_gpu") or not r.get("ms"):
                continue
            num = lambda k: float(r[k]) if r.get(k) else None  # noqa: E731
            key = (int(r["seq_q"]), r["causal"] == "1", int(r["ranks"]), r["split"], r["pass"])
            out[key] = dict(r, ms=num("ms"), ms_serial=num("ms_serial"), ms_compute=num("ms_compute"))
    return out


def step_ms(rows, N, causal, P, split, passes):
    """The summed time of `passes` ("fwd", or "fwd" and "bwd"); P = 1 has one split."""
    total = 0.0
    for ps in passes:
        r = rows.get((N, causal, P, split, ps)) or (P == 1 and next(
            (v for k, v in rows.items() if k[:3] == (N, causal, 1) and k[4] == ps), None))
        if not r:
            return None
        total += r["ms"]
    return total


def of_ideal(rows, N, causal, P, split, passes):
    t1, tp = step_ms(rows, N, causal, 1, split, passes), step_ms(rows, N, causal, P, split, passes)
    return t1 / (P * tp) if t1 and tp else None


def exchange_cost(row, mode):
    """(t_mode − t_compute) / t_compute for mode "ms_serial" or "ms" (overlapped), or None
    (P = 1: no exchange)."""
    if not row or row.get(mode) is None or row["ms_compute"] is None or row["ms_compute"] <= 0:
        return None
    return (row[mode] - row["ms_compute"]) / row["ms_compute"]


def exchanges(row):
    """'serial → overlapped' as signed percentages, or '—'."""
    serial, overlapped = exchange_cost(row, "ms_serial"), exchange_cost(row, "ms")
    if serial is None or overlapped is None:
        return "—"
    return f"{100 * serial:+.1f} % → {100 * overlapped:+.1f} %"


def pct(x):
    return "—" if x is None else f"{100 * x:.0f} %"


def ms(x):
    return "—" if x is None else (f"{x:.1f}" if x < 100 else f"{x:.0f}")


def tables(rows, source="docs/results/stage12_scaling.csv"):
    first = next(iter(rows.values()))
    kernels = "stages 10 and 11" if first["what"].endswith("[kernels=hopper]") else "stages 08 and 09"
    lines = [f"{first['device']} × {first['gpus']}, {first['dtype']}, d = {first['head_dim']}, "
             f"batch {first['batch']}, {first['heads']} heads, {first['transport']} transport, {kernels} on "
             f"each rank (`{source}`). Times in ms of a whole ring, from the first "
             "rank's start to the last rank's end (the median of the repetitions); *fwd+bwd* = "
             "the forward's ring and the backward's added; *of ideal* = t₁ / (P·t_P) of fwd+bwd; *exchanges* = what the exchanges add to the "
             "arithmetic alone, serialised → overlapped, as a share of it (t_compute).", ""]
    keys = sorted({(k[0], k[1], k[2], k[3]) for k in rows if k[2] > 1})
    lines += ["Strong scaling (fixed N):", "",
              "| N | causal | P | split | fwd | fwd+bwd | of ideal | exchanges, fwd | exchanges, bwd |",
              "|--:|:--|--:|:--|--:|--:|--:|:--|:--|"]
    for N in sorted({k[0] for k in rows}):
        for causal in (False, True):
            t1 = step_ms(rows, N, causal, 1, "", ("fwd",))
            if t1 is not None:
                lines.append(f"| {N // 1024}k | {'yes' if causal else 'no'} | 1 | — | {ms(t1)} | "
                             f"{ms(step_ms(rows, N, causal, 1, '', ('fwd', 'bwd')))} | 100 % | — | — |")
            for (n, c, P, split) in keys:
                if (n, c) != (N, causal):
                    continue
                h = f"{exchanges(rows.get((N, causal, P, split, 'fwd')))} | " \
                    f"{exchanges(rows.get((N, causal, P, split, 'bwd')))}"
                lines.append(f"| {N // 1024}k | {'yes' if causal else 'no'} | {P} | {split} | "
                             f"{ms(step_ms(rows, N, causal, P, split, ('fwd',)))} | "
                             f"{ms(step_ms(rows, N, causal, P, split, ('fwd', 'bwd')))} | "
                             f"{pct(of_ideal(rows, N, causal, P, split, ('fwd', 'bwd')))} | {h} |")
    ranks = sorted({k[2] for k in rows})
    lines += ["", "Weak scaling (fixed tokens per GPU; N = P · N/P), forward+backward ms (of ideal):", "",
              "| N/P | causal | split | " + " | ".join(f"P = {P}" for P in ranks) + " |",
              "|--:|:--|:--|" + "--:|" * len(ranks)]
    for n in sorted({k[0] // k[2] for k in rows}):
        for causal in (False, True):
            for split in ("plain", "zigzag"):
                cells = []
                for P in ranks:
                    t = step_ms(rows, n * P, causal, P, split, ("fwd", "bwd"))
                    e = of_ideal(rows, n * P, causal, P, split, ("fwd", "bwd"))
                    cells.append("—" if t is None else f"{ms(t)}" + ("" if P == 1 else f" ({pct(e)})"))
                if any(c != "—" for c in cells[1:]):
                    lines.append(f"| {n // 1024}k | {'yes' if causal else 'no'} | {split} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(path):
    rows = load(path)
    if not rows:
        print("Not measured yet: `scripts/gpu/stage12_scaling.sh OUT` on a machine with several GPUs writes "
              "`OUT/stage12_scaling.csv`; committed as `docs/results/stage12_scaling.csv`, it fills this table.")
        return 0
    print(tables(rows, path))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else "docs/results/stage12_scaling.csv"))
