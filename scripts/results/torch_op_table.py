#!/usr/bin/env python3
"""The PyTorch op's benchmark (scripts/bench/bench_torch_op.py's CSV) as the table of python/README.md:
per shape, mask and pass, the op's time beside torch's default attention and its cuDNN and flash
backends, the op's speed over each (× > 1: the op is faster), and the op on a model's
[b, n, h, d] layout (its copy to contiguous timed in); then issue #28's floors, read off the
same rows. Needs no torch.

  python3 scripts/results/torch_op_table.py docs/results/h100_torch_op.csv
"""
import csv
import sys


def main(path):
    rows = list(csv.DictReader(open(path)))
    by = {}
    for r in rows:
        key = (int(r["batch"]), int(r["heads"]), int(r["seq"]), int(r["head_dim"]), int(r["causal"]), r["pass"])
        by.setdefault(key, {})[r["impl"]] = r
    first = rows[0]
    print(f"{first['device']}, torch {first['torch']}, bf16, commit `{first['commit']}`, {first['date']}; GPU "
          f"time per call in µs ({first['timer']}: the implementations take turns call by call, median); "
          f"× = the op's speed over the other.\n")
    print("| (B, H, N, d) | causal | pass | op | default | cuDNN | flash | × default | × cuDNN | [b,n,h,d] × default |")
    print("|:--|:-:|:--|--:|--:|--:|--:|--:|--:|--:|")
    for key in sorted(by, key=lambda k: (k[2], k[3], k[4], k[5])):
        b, h, n, d, causal, pass_ = key
        m = by[key]
        t = {name: float(m[name]["time_us"]) for name in m}

        def x(other, ours="op"):
            return f"{t[other] / t[ours]:.2f}" if other in t and ours in t else ""
        print(f"| {b}, {h}, {n}, {d} | {'yes' if causal else 'no'} | {pass_} | {t.get('op', 0):.1f} | "
              f"{t.get('sdpa-default', 0):.1f} | {t.get('sdpa-cudnn', 0):.1f} | {t.get('sdpa-flash', 0):.1f} | "
              f"{x('sdpa-default')} | {x('sdpa-cudnn')} | {x('sdpa-default', 'op-bnhd')} |")

    def speed(b, h, n, d, causal, pass_):
        m = by.get((b, h, n, d, causal, pass_), {})
        return float(m["sdpa-default"]["time_us"]) / float(m["op"]["time_us"]) if "op" in m and "sdpa-default" in m else None

    print()
    small = [k for k in by if k[2] == 64 and k[5] == "fwd"]
    for k in sorted(small):
        m = by[k]
        host = float(m["op"]["host_us"]), float(m["sdpa-default"]["host_us"])
        print(f"- Per-call cost, forward at (1, 1, 64, 64), causal {'yes' if k[4] else 'no'}: host work "
              f"{host[0]:.1f} µs per call against sdpa's {host[1]:.1f} µs, {host[0] / host[1]:.2f}× "
              f"(floor: at most 1.5×).")
    gpt = [s for k in by if k[2] in (1024, 2048) and k[3] == 64 and k[5] == "fwd+bwd" and (s := speed(*k))]
    big = [s for k in by if k[2] >= 4096 and k[5] == "fwd+bwd" and (s := speed(*k))]
    if gpt:
        print(f"- Forward + backward at the two GPT-layer shapes: {min(gpt):.2f}–{max(gpt):.2f}× the default "
              f"(floor: at least 0.9×).")
    if big:
        print(f"- Forward + backward at N ≥ 4096: {min(big):.2f}–{max(big):.2f}× the default (floor: at least 1.0×).")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    main(sys.argv[1])
