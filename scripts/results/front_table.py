#!/usr/bin/env python3
"""The front page's results table: the progression of the stages at one problem size, from
bench_gpu.py CSVs (docs/mainpage.md embeds what it prints between `<!-- results: … -->`
markers; scripts/results/fill_results.py refreshes it, and CTest notes_tables checks it).

  python3 scripts/results/front_table.py docs/results/h100_bench_gpu.csv docs/results/h100_hopper_10f.csv

For each stage: its TFLOP/s, that rate as a share of the bf16 GEMM (cuBLAS) measured in the
same file, and its ratio to FlashAttention-2 (sdpa_flash) and cuDNN (sdpa_cudnn) measured in
the same file, non-causal and causal. Where a file holds several runs, a stage's rate is the mean
of its rows (as scripts/results/steps_tables.py does), and a reference's (FlashAttention-2, cuDNN, the
GEMM) the best of its rows: a slow timing of a reference never flatters a stage. A stage is
taken from the last file that has it at the problem size.
"""
import argparse
import statistics
from collections import defaultdict
from pathlib import Path

from results_data import measured_rows, read_rows

# The problem: bf16, d = 128, N = 4096, batch 4, heads 16 (batch·N = 16384, heads·d = 2048).
DTYPE, HEAD_DIM, SEQ, BATCH, HEADS = "bf16", 128, 4096, 4, 16
# (stage, what, pass, what the row shows, its notes); stage 07 computes in fp32 only.
STAGES = [("06", "06_tiled_cpu", "fwd", "forward, CPU", "../stages/06_tiled_cpu/README.md"),
          ("07", "07_smem_cuda", "fwd", "forward, fp32", "../stages/07_smem_cuda/README.md"),
          ("08", "08_tensor_core_fwd", "fwd", "forward", "../stages/08_tensor_core_fwd/README.md"),
          ("09", "09_tensor_core_bwd", "bwd", "backward", "../stages/09_tensor_core_bwd/README.md"),
          ("10", "10_hopper_fwd", "fwd", "forward", "../stages/10_hopper_fwd/README.md"),
          ("11", "11_hopper_bwd", "bwd", "backward", "../stages/11_hopper_bwd/README.md")]
GEMM, FA2, CUDNN = "ceiling_bf16_gemm", "sdpa_flash", "sdpa_cudnn"


def read(path):
    """{(what, pass, dtype, causal): mean TFLOP/s} at the problem size, the bf16 GEMM's mean
    rate, the devices and the number of runs of one CSV."""
    acc = defaultdict(list)
    for r in measured_rows(path):
        if (int(r["head_dim"]), int(r["seq_q"]), int(r["seq_k"]), int(r["batch"]), int(r["heads"])) \
                == (HEAD_DIM, SEQ, SEQ, BATCH, HEADS):
            acc[(r["what"], r["pass"], r["dtype"], r["causal"] == "1")].append(r["tflops"])
    rows = read_rows(Path(path))
    gemm = [float(r["tflops"]) for r in rows if r["what"] == GEMM and r["tflops"]]
    devices = sorted({r["device"] for r in rows})
    runs = len({r["date"] for r in rows})
    # A stage's rate is the mean of its rows; a reference's (a backend, the GEMM) is its best,
    # so that a slow timing of a backend never flatters a stage.
    best = lambda k, v: max(v) if k[0] in (FA2, CUDNN) else statistics.mean(v)  # noqa: E731
    return ({k: best(k, v) for k, v in acc.items()}, max(gemm) if gemm else None,
            devices, runs)


def cpu_note():
    """Why stage 06 is missing: what its committed CPU measurement is of."""
    path = Path("docs/results/cpu_stage06.csv")
    if not path.exists():
        return ""
    rows = [r for r in read_rows(path) if r["what"].startswith("forward_06")]
    ds = sorted({int(r["d"]) for r in rows})
    return (f" (it runs on the CPU in fp32; its committed measurement, `{path}`, is of one head "
            f"at $d = {', '.join(map(str, ds))}$ on an {rows[0]['device'].split(' (')[0]})" if rows else "")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("csv", nargs="+")
    args = ap.parse_args()
    files = [(path,) + read(path) for path in args.csv]
    print("| stage | pass | TFLOP/s | % of bf16 GEMM | × FA-2 | × cuDNN | TFLOP/s, causal | "
          "% of bf16 GEMM | × FA-2 | × cuDNN | card |")
    print("|:--|:--|--:|--:|--:|--:|--:|--:|--:|--:|:--|")
    used, missing = {}, []
    for stage, what, pas, label, note in STAGES:
        found = None
        for path, t, gemm, devices, runs in files:
            dtype = "f32" if stage == "07" else DTYPE
            if (what, pas, dtype, False) in t:
                found = (path, t, gemm, devices, runs, dtype)
        if not found:
            missing.append(stage)
            continue
        path, t, gemm, devices, runs, dtype = found
        used.setdefault(path, []).append(stage)
        cells = []
        for causal in (False, True):
            v = t.get((what, pas, dtype, causal))
            fa2, cudnn = t.get((FA2, pas, DTYPE, causal)), t.get((CUDNN, pas, DTYPE, causal))
            cells += [f"{v:.0f}" if v else "—", f"{100 * v / gemm:.0f}%" if v and gemm else "—",
                      f"{v / fa2:.2f}" if v and fa2 else "—", f"{v / cudnn:.2f}" if v and cudnn else "—"]
        card = ", ".join(d.replace("NVIDIA ", "") for d in devices)
        print(f"| [{stage}]({note}) | {label} | " + " | ".join(cells) + f" | {card} |")
    print()
    print(f"{DTYPE}, $d = {HEAD_DIM}$, $N = {SEQ}$, batch {BATCH}, {HEADS} heads "
          f"(batch·N = {BATCH * SEQ}, heads·d = {HEADS * HEAD_DIM}); "
          "TFLOP/s counts $4 N^2 d$ FLOPs per head forward and 2.5 times that backward "
          "(causal: half). Each stage is compared with the cuBLAS bf16 GEMM, FlashAttention-2 "
          "(`sdpa_flash`) and cuDNN (`sdpa_cudnn`) measured in the same file, on the same card: "
          "a stage's rate is the mean of the file's runs, a reference's the best of them. Measured on:")
    print()
    for path, stages in used.items():
        _, gemm, devices, runs = next(f[1:] for f in files if f[0] == path)
        stages = ", ".join(stages)
        mean = f"{runs} runs" if runs > 1 else "one run"
        print(f"- stages {stages}: one {', '.join(devices)}, `{path}` ({mean}; "
              f"bf16 GEMM {gemm:.0f} TFLOP/s);")
    if missing:
        print(f"- not in the table: stage{'s' if len(missing) > 1 else ''} {', '.join(missing)}, "
              f"which no file above measured at this size"
              + (cpu_note() if "06" in missing else "") + ".")


if __name__ == "__main__":
    main()
