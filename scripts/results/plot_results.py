#!/usr/bin/env python3
"""The results figures, drawn from the committed CSVs under docs/results/.

    scripts/results/plot_results.py                 write docs/results/figures/*.svg, and the summary
                                            table into README.md and docs/results/README.md
    scripts/results/plot_results.py --png DIR       also write PNG copies into DIR (to look at)
    scripts/results/plot_results.py --summary       print the summary table (Markdown), nothing else

Figures:
  speed_<dtype>.svg  one per element type with a FlashAttention-2 or cuDNN row: a grid of
                     panels, rows (pass, causal), columns head dim, N on the x axis. Upper
                     part: TFLOP/s of each stage and of the two backends, the GEMM ceiling
                     as a labelled line; lower part: each stage over each backend measured
                     in the same run. Variants (`what[option=value]`, stage 10's earlier
                     steps) are drawn grey.
  roofline.svg       every stage and backend at its compulsory intensity, one legend entry
                     each, variants grey, the roofs from the anchors' ceilings.
  stage12_scaling.svg  stage 12's ring over P GPUs (stage12_scaling.csv, once it exists): the
                     fraction of the ideal 1/P and the communication the overlap hides.

Run it after changing h200_bench_gpu.csv, h200_stageNN.csv or h200_anchors.csv: docs/gen_pages.py refuses figures drawn from other data (each SVG carries
a digest of its inputs). Needs matplotlib (notebooks/requirements.txt); notebook 4 imports
the same functions.
"""
import argparse
import math
import sys
from pathlib import Path

import matplotlib
import matplotlib.pyplot as plt
from matplotlib.lines import Line2D

sys.path.insert(0, str(Path(__file__).resolve().parent))
import results_data as rd  # noqa: E402  (found through the path above)

FIGURES = rd.RESULTS / "figures"
BACKEND_STYLE = {"sdpa_flash": dict(color="black", ls="-", marker="s"),
                 "sdpa_cudnn": dict(color="black", ls="--", marker="^")}
VARIANT_COLOR = "#bbbbbb"
# Distinct colours for stages and backends; grey is kept for variants.
PALETTE = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2",
           "#bcbd22", "#17becf", "#000000", "#1f3a93", "#ffd700"]


def style():
    plt.rcParams.update({"font.size": 9, "axes.grid": True, "grid.alpha": 0.3,
                         "svg.fonttype": "none", "svg.hashsalt": "fa-results"})


STAGE_MARKERS = ["o", "D", "v", "P", "X", "h"]  # shapes, so that stages on top of each other show


def stage_colors(points):
    stages = sorted({p.series for p in points if p.is_stage})
    return {s: PALETTE[k % len(PALETTE)] for k, s in enumerate(stages)}


def stage_markers(points):
    stages = sorted({p.series for p in points if p.is_stage})
    return {s: STAGE_MARKERS[k % len(STAGE_MARKERS)] for k, s in enumerate(stages)}


def newest(points):
    """Per (what, shape), the point of the latest run: the backend line drawn when several
    runs measured it."""
    best = {}
    for p in points:
        key = (p.what, p.shape)
        if key not in best or (p.run or ("", "", ""))[2] > (best[key].run or ("", "", ""))[2]:
            best[key] = p
    return list(best.values())


def _series(points, keep):
    """{what: [(N, value)]} sorted by N, for the points that `keep` accepts."""
    out = {}
    for p in points:
        if keep(p):
            out.setdefault(p.what, []).append(p)
    return {w: sorted(ps, key=lambda p: p.N) for w, ps in out.items()}


def speed_figure(points, dtype, ceilings):
    """The grid for one element type; returns the figure."""
    mine = [p for p in points if p.dtype == dtype]
    stage_pts = [p for p in mine if p.is_stage]
    rows = sorted({(p.direction, p.causal) for p in stage_pts}, key=lambda k: (k[0] == "bwd", k[1]))
    cols = sorted({p.d for p in stage_pts})
    colors, markers = stage_colors(points), stage_markers(points)
    ratio_of = {id(p): r for p, r in rd.ratios(mine)}
    backends = newest([p for p in mine if p.what in rd.BACKENDS])
    ceiling_name = rd.CEILING_OF_DTYPE.get(dtype)
    ceiling = ceilings.get(ceiling_name)

    fig = plt.figure(figsize=(3.6 * len(cols) + 0.6, 3.5 * len(rows) + 1.2))
    outer = fig.add_gridspec(len(rows), len(cols), hspace=0.42, wspace=0.22,
                             left=0.07, right=0.98, top=1 - 1.1 / (3.5 * len(rows) + 1.2), bottom=0.05)
    ns = sorted({p.N for p in mine})
    for i, (direction, causal) in enumerate(rows):
        for j, d in enumerate(cols):
            inner = outer[i, j].subgridspec(2, 1, height_ratios=(2.2, 1), hspace=0.08)
            ax, axr = fig.add_subplot(inner[0]), fig.add_subplot(inner[1])
            here = lambda p: p.direction == direction and p.causal == causal and p.d == d  # noqa: E731
            for what, ps in _series(stage_pts, lambda p: here(p) and p.is_variant).items():
                ax.plot([p.N for p in ps], [p.tflops for p in ps], color=VARIANT_COLOR, lw=1, zorder=1)
            for what, ps in _series(stage_pts, lambda p: here(p) and not p.is_variant).items():
                ax.plot([p.N for p in ps], [p.tflops for p in ps], color=colors[what], marker=markers[what],
                        ms=4.5, mfc="none", lw=1.4, zorder=3)
                for b in rd.BACKENDS:
                    pr = [(p.N, ratio_of[id(p)][b]) for p in ps if b in ratio_of[id(p)]]
                    if pr:
                        axr.plot(*zip(*pr), color=colors[what], ls=BACKEND_STYLE[b]["ls"],
                                 marker=markers[what], ms=3.5, mfc="none", lw=1.2)
            for what, ps in _series(backends, here).items():
                ax.plot([p.N for p in ps], [p.tflops for p in ps], lw=1.2, ms=3.5, zorder=2,
                        **BACKEND_STYLE[what])
            if ceiling:
                ax.axhline(ceiling, color="#c0392b", lw=1, ls=":")
                ax.text(ns[0], ceiling * 0.97, f"{rd.CEILING_LABEL[ceiling_name]} {ceiling:g}",
                        color="#c0392b", fontsize=7.5, va="top")
                ax.set_ylim(0, ceiling * 1.08)
            axr.axhline(1.0, color="#666", lw=0.8)
            for a in (ax, axr):
                a.set_xscale("log", base=2)
                a.set_xticks(ns)
                a.set_xlim(ns[0] / 1.25, ns[-1] * 1.25)
                a.minorticks_off()
            ax.set_xticklabels([])
            axr.set_xticklabels([f"{n // 1024}k" if n >= 1024 else str(n) for n in ns])
            ax.set_title(f"{'forward' if direction == 'fwd' else 'backward'}, d = {d}"
                         f"{', causal' if causal else ''}", fontsize=9.5)
            if j == 0:
                ax.set_ylabel("TFLOP/s")
                axr.set_ylabel("stage ÷ backend")
            if i == len(rows) - 1:
                axr.set_xlabel("N (sequence length; batch·N = 16k tokens)")
            if not any(here(p) for p in stage_pts):
                ax.clear()
                axr.clear()
                ax.axis("off")
                axr.axis("off")
                ax.text(0.5, 0.5, f"{'forward' if direction == 'fwd' else 'backward'}, d = {d}"
                        f"{', causal' if causal else ''}:\nno stage measured", transform=ax.transAxes,
                        ha="center", va="center", color="#888")

    handles = [Line2D([], [], color=c, marker=markers[s], ms=5, mfc="none", lw=1.4, label=s)
               for s, c in colors.items() if any(p.series == s and not p.is_variant for p in stage_pts)]
    handles += [Line2D([], [], lw=1.2, ms=4, label=f"{rd.BACKENDS[b]} ({b})", **BACKEND_STYLE[b])
                for b in rd.BACKENDS if any(p.what == b for p in backends)]
    if any(p.is_variant for p in stage_pts):
        handles.append(Line2D([], [], color=VARIANT_COLOR, lw=1, label="variants, earlier steps"))
    handles += [Line2D([], [], color="#444", ls="-", label="ratio to FlashAttention-2"),
                Line2D([], [], color="#444", ls="--", label="ratio to cuDNN")]
    fig.legend(handles=handles, loc="upper center", ncol=min(len(handles), 5), fontsize=8.5,
               frameon=False, bbox_to_anchor=(0.5, 1 - 0.35 / (3.5 * len(rows) + 1.2)))
    fig.suptitle(f"H200, {dtype}: the GPU stages against FlashAttention-2 and cuDNN "
                 f"(ratios: same run, same shape)", fontsize=11, y=0.995)
    return fig


def roofline_figure(points, ceilings):
    """Stages and backends at their compulsory intensity under the measured roofs."""
    fig, ax = plt.subplots(figsize=(10.5, 5.6))
    fig.subplots_adjust(left=0.08, right=0.68, top=0.93, bottom=0.1)
    bw = ceilings.get("ceiling_copy")
    xs = [10 ** (k / 20) for k in range(-20, 121)]
    handles = []
    for name, color in (("ceiling_bf16_gemm", "#c0392b"), ("ceiling_fp32_gemm_noTF32", "#2c3e50")):
        peak = ceilings.get(name)
        if peak and bw:
            ax.plot(xs, [min(peak, bw * x) for x in xs], color=color, lw=2)
            handles.append(Line2D([], [], color=color, lw=2, label=f"{rd.CEILING_LABEL[name]}: {peak:g} TFLOP/s"))
    if bw:
        ax.annotate(f"copy {bw:g} TB/s", (0.3, bw * 0.3), xytext=(6, -16), textcoords="offset points",
                    rotation=30, color="#555", fontsize=8)
    series = sorted({p.series for p in points if not p.is_variant},
                    key=lambda s: (not rd.re.match(r"\d\d_", s), s))
    colors = {s: PALETTE[k % len(PALETTE)] for k, s in enumerate(series)}
    variants = [p for p in points if p.is_variant]
    if variants:
        ax.scatter([rd.intensity(p) for p in variants], [p.tflops for p in variants], s=12,
                   color=VARIANT_COLOR, zorder=1)
        handles.append(Line2D([], [], color=VARIANT_COLOR, marker="o", ls="none", ms=4,
                              label="variants, earlier steps"))
    for s in series:
        stage = rd.re.match(r"\d\d_", s) is not None
        mk = "D" if stage else "o"
        for direction in ("fwd", "bwd"):
            ps = [p for p in points if p.what == s and p.direction == direction]
            if ps:
                ax.scatter([rd.intensity(p) for p in ps], [p.tflops for p in ps], marker=mk,
                           s=42 if stage else 14, zorder=4 if stage else 3, edgecolors=colors[s],
                           facecolors=colors[s] if direction == "fwd" else "white", linewidths=1.2)
        label = f"{s} ({rd.BACKENDS[s]})" if s in rd.BACKENDS else s
        handles.append(Line2D([], [], color=colors[s], marker=mk, ls="none", ms=6, label=label))
    handles += [Line2D([], [], color="#444", marker="o", ls="none", ms=6, label="filled: forward"),
                Line2D([], [], color="#444", marker="o", ls="none", ms=6, mfc="white", label="hollow: backward")]
    x_max = 10 ** math.ceil(math.log10(max(rd.intensity(p) for p in points) * 1.2))
    ax.set(xscale="log", yscale="log", xlim=(0.1, x_max), ylim=(0.1, 2000),
           xlabel="compulsory arithmetic intensity (FLOP per byte of HBM traffic)", ylabel="TFLOP/s",
           title="H200 roofline: measured ceilings (h200_anchors.csv), measured points")
    ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.02, 1.0), fontsize=8, frameon=False)
    return fig


def scaling_figure(rows):
    """Stage 12 (bench12's rows): per mask, the fraction of the ideal 1/P of forward+backward
    against P for every N (strong scaling; solid zigzag, dashed plain), and what the
    exchanges add to the forward's arithmetic, serialised (open markers) and overlapped."""
    import stage12_tables as st  # noqa: E402  (beside this script)
    fig, axes = plt.subplots(2, 2, figsize=(10, 7), sharex=True)
    ranks = sorted({k[2] for k in rows})
    lengths = sorted({k[0] for k in rows})
    colors = {N: PALETTE[k % len(PALETTE)] for k, N in enumerate(lengths)}
    for i, causal in enumerate((False, True)):
        for N in lengths:
            for split, ls in (("zigzag", "-"), ("plain", "--")):
                eff = [(P, st.of_ideal(rows, N, causal, P, split, ("fwd", "bwd"))) for P in ranks]
                eff = [(P, e) for P, e in eff if e is not None]
                cost = {mode: [(P, st.exchange_cost(rows.get((N, causal, P, split, "fwd")), mode)) for P in ranks
                               if P > 1] for mode in ("ms_serial", "ms")}
                cost = {mode: [(P, 100 * c) for P, c in pts if c is not None] for mode, pts in cost.items()}
                label = f"N = {N // 1024}k, {split}"
                if eff:
                    axes[i, 0].plot(*zip(*eff), color=colors[N], ls=ls, marker="o", ms=4, label=label)
                if cost["ms_serial"]:
                    axes[i, 1].plot(*zip(*cost["ms_serial"]), color=colors[N], ls="none", marker="o", ms=5,
                                    mfc="none")
                if cost["ms"]:
                    axes[i, 1].plot(*zip(*cost["ms"]), color=colors[N], ls=ls, marker="o", ms=4, label=label)
        mask = "causal" if causal else "no mask"
        axes[i, 0].set(ylabel="t₁ / (P·t_P)", ylim=(0, 1.1), title=f"fraction of ideal 1/P, fwd+bwd, {mask}")
        axes[i, 1].axhline(0, color="0.6", lw=0.8)
        axes[i, 1].set(ylabel="% of t_compute", title=f"exchanges' cost, fwd, {mask} (open: serialised)")
    for ax in axes.flat:
        ax.set_xscale("log", base=2)
        ax.set_xticks(ranks, [str(P) for P in ranks])
        ax.minorticks_off()
    for ax in axes[1]:
        ax.set_xlabel("P (GPUs)")
    axes[0, 0].legend(fontsize=7.5, frameon=False)
    first = next(iter(rows.values()))
    fig.suptitle(f"Stage 12, ring attention: {first['device']} × {first['gpus']}, {first['dtype']}, "
                 f"d = {first['head_dim']}, {first['heads']} heads", fontsize=11)
    fig.tight_layout()
    return fig


def all_points():
    return rd.stage_points() + rd.anchor_points()


def save(fig, path: Path, digest: str):
    fig.savefig(path, format="svg", metadata={"Date": None, "Creator": "scripts/results/plot_results.py",
                                              "Description": f"inputs {digest}"})


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=str(FIGURES), help="folder for the SVGs (default: %(default)s)")
    ap.add_argument("--png", help="also write PNG copies into this folder")
    ap.add_argument("--summary", action="store_true", help="print the summary table and exit")
    args = ap.parse_args()
    stages, ceilings = rd.stage_points(), rd.ceilings()
    if args.summary:
        print(rd.summary_markdown(stages), end="")
        return 0
    matplotlib.use("Agg")  # files only; the notebook keeps its own backend
    style()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    digest = rd.inputs_digest()
    figures = {f"speed_{t}": speed_figure(stages, t, ceilings)
               for t in sorted({p.dtype for p in stages if p.what in rd.BACKENDS})}
    figures["roofline"] = roofline_figure(all_points(), ceilings)
    import stage12_tables  # noqa: E402  (beside this script)
    scaling = stage12_tables.load(rd.RESULTS / rd.SCALING)
    if scaling:  # drawn once bench12's rows are committed
        figures["stage12_scaling"] = scaling_figure(scaling)
    for p in rd.above_roof(all_points(), ceilings):
        print(f"plot_results: {p.file}: {p.what} {p.direction} {p.dtype} d={p.d} N={p.N} at "
              f"{p.tflops:g} TFLOP/s is above its roof: is a ceiling of {rd.ANCHORS} low?", file=sys.stderr)
    for name, fig in figures.items():
        save(fig, out / f"{name}.svg", digest)
        if args.png:
            Path(args.png).mkdir(parents=True, exist_ok=True)
            fig.savefig(Path(args.png) / f"{name}.png", dpi=100)
        print(f"plot_results: {out / (name + '.svg')}")
    table = rd.summary_markdown(stages)
    for rel in rd.SUMMARY_COPIES:
        path = rd.RESULTS.parent.parent / rel
        text = path.read_text(encoding="utf-8")
        new = rd.with_summary(text, table)
        if new is None:
            print(f"plot_results: {rel} has no summary table (a line starting '| stage | pass |')",
                  file=sys.stderr)
        elif new != text:
            path.write_text(new, encoding="utf-8")
            print(f"plot_results: the summary table of {rel}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
