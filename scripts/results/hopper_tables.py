#!/usr/bin/env python3
"""The notes tables (Markdown) of the Hopper stages, 10 (forward) and 11 (backward), from a
bench_gpu.py --hopper CSV: the steps table at N = 8192 (or the longest N of a quick sweep) and
the results table of the default step against FlashAttention-2 and cuDNN.

  python3 scripts/results/hopper_tables.py 10 docs/results/h100_hopper_10f.csv
  python3 scripts/results/hopper_tables.py 11 docs/results/h100_stage11.csv
  python3 scripts/results/hopper_tables.py 11 docs/results/h200_stage11_d256.csv --results-only

--results-only prints the results table alone, with the deterministic mode's TFLOP/s beside
the default's where the CSV has it (stage 11 at d = 256, where no earlier step has a kernel).

The notes embed what it prints between `<!-- results: … -->` markers;
scripts/results/fill_results.py refreshes it.
"""
import argparse
import csv

NAN = float("nan")
# Per stage: the CSV's name of the stage, its pass, its head dims, the steps table's rows (the
# suffix of the CSV's name, the label; the bare name is the default) and the two tables' titles.
# The results table also has the share of the bf16 GEMM measured in the same run, where the
# CSV has that ceiling (issue 29 asks for it beside both ratios).
STAGES = {
    "10": dict(what="10_hopper_fwd", pass_="fwd", dims=(64, 128, 256),
               steps=[("[step=1]", "10a"), ("[step=2]", "10b"), ("[step=3]", "10c"), ("[step=4]", "10d"),
                      ("[step=5]", "10e"), ("", "10f")],
               steps_title="Steps (bf16, N = {n}, batch {batch}, heads·d = 2048), TFLOP/s:",
               results_title="Results of {default} (the default), TFLOP/s and ratios "
                             "(bf16 GEMM {gemm:.0f} TFLOP/s in the same run):"),
    "11": dict(what="11_hopper_bwd", pass_="bwd", dims=(64, 128),
               steps=[("[step=1]", "11a"), ("[step=2]", "11b"), ("[step=3]", "11c"), ("", "11d"),
                      ("[deterministic=1]", "11d, deterministic")],
               steps_title="Steps (bf16, N = {n}, batch {batch}, heads·d = 2048; {device}), backward TFLOP/s:",
               results_title="Results of {default} (the default), backward TFLOP/s (2.5 forwards' FLOPs) "
                             "and ratios, {device}{gemm_note}:"),
}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("stage", choices=sorted(STAGES))
    ap.add_argument("csv")
    ap.add_argument("--results-only", action="store_true", help="the results table alone (no steps table)")
    args = ap.parse_args()
    s = STAGES[args.stage]
    every = list(csv.DictReader(open(args.csv)))
    gemm = next((float(r["tflops"]) for r in every if r["what"] == "ceiling_bf16_gemm"), NAN)
    device = next((r["device"] for r in every if r.get("device")), "?")
    t = {}  # {(dtype, d, N, causal): {what: TFLOP/s}}
    for r in every:
        if r["pass"] == s["pass_"] and r["tflops"]:
            key = (r["dtype"], int(r["head_dim"]), int(r["seq_q"]), r["causal"] == "1")
            t.setdefault(key, {})[r["what"]] = float(r["tflops"])
    st, dims = s["what"], s["dims"]
    with_gemm = gemm == gemm  # the CSV has the ceiling (not NaN)
    default = next(label for suffix, label in s["steps"] if not suffix)
    lengths = sorted({k[2] for k in t})
    n = 8192 if 8192 in lengths else lengths[-1]  # a quick sweep has no 8192
    if not args.results_only:
        print(s["steps_title"].format(n=n, batch=16384 // n, device=device) + "\n")
        print("| step | " + " | ".join(f"d = {d}{c}" for d in dims for c in ("", " causal")) + " |")
        print("|:--|" + "--:|" * (2 * len(dims)))
        for suffix, label in s["steps"]:
            cells = [t.get(("bf16", d, n, c), {}).get(st + suffix, NAN) for d in dims for c in (False, True)]
            print(f"| {label} | " + " | ".join(f"{x:.0f}" for x in cells) + " |")
        print()
    determ = st + "[deterministic=1]"
    extra = args.results_only and any(determ in v for v in t.values())
    gemm_note = f" (bf16 GEMM {gemm:.0f} TFLOP/s in the same run)" if with_gemm else ""
    print(s["results_title"].format(default=default, gemm=gemm, device=device, gemm_note=gemm_note) + "\n")
    print(f"| dtype | d | N | causal | {default} |" + (" deterministic |" if extra else "") +
          " FA2 | cuDNN | × FA2 | × cuDNN |" + (" % GEMM |" if with_gemm else ""))
    print("|:--|--:|--:|:--|--:|" + ("--:|" if extra else "") + "--:|--:|--:|--:|" + ("--:|" if with_gemm else ""))
    for key in sorted(t):
        v = t[key]
        if st not in v:
            continue
        fl, cu = v.get("sdpa_flash", NAN), v.get("sdpa_cudnn", NAN)
        print(f"| {key[0]} | {key[1]} | {key[2]} | {'yes' if key[3] else 'no'} | {v[st]:.0f} |" +
              (f" {v.get(determ, NAN):.0f} |" if extra else "") + f" {fl:.0f} | {cu:.0f} | "
              f"{v[st] / fl:.2f} | {v[st] / cu:.2f} |" + (f" {100 * v[st] / gemm:.0f}% |" if with_gemm else ""))


if __name__ == "__main__":
    main()
