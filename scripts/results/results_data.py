"""The measured H200 results as one list of points, for the figures, the notebook and the docs.

Python standard library only: docs/gen_pages.py imports it, and the docs build must not
need numpy or matplotlib. scripts/results/plot_results.py draws from it.

Two CSV schemas are read:
  - scripts/bench/bench_gpu.py's (Bench.COLUMNS): one row per (what, pass), `tflops`, `seq_q`,
    `head_dim`, `causal` 0/1, `device`, `commit`, `date`: h200_bench_gpu.csv (stages 07–09),
    h200_stageNN.csv (one later stage each: h200_stage10.csv, where `10_hopper_fwd[step=N]`
    are stage 10's earlier steps);
  - the anchors' (h200_anchors.csv): one row per what, `fwd_tflops` and `bwd_tflops`, `N`,
    `d`, `causal` True/False, and the ceilings `ceiling_*` (`tflops`, or `tbps` for the copy).

A new stage appears in every figure and table by adding its rows to one of these files, or
its own h200_stageNN.csv.
"""
import csv
import hashlib
import re
from pathlib import Path

RESULTS = Path(__file__).resolve().parents[2] / "docs" / "results"
ANCHORS = "h200_anchors.csv"
SCALING = "stage12_scaling.csv"  # bench12's rows (scripts/gpu/stage12_scaling.sh), once measured


def stage_files(results: Path = RESULTS):
    """The benchmark runs of the stages: the sweep of stages 07–09 and one file per later
    stage (h200_stage10.csv, h200_stage11.csv, …); the variant studies are not among them."""
    names = ["h200_bench_gpu.csv"] + sorted(p.name for p in results.glob("h200_stage[0-9][0-9].csv"))
    return [n for n in names if (results / n).exists()]

# What the stages are compared with, in the order they are drawn and tabulated.
BACKENDS = {"sdpa_flash": "FlashAttention-2", "sdpa_cudnn": "cuDNN"}
# One ceiling per element type. Every ceiling value comes from the anchors file: the one
# run that measured all three (the benchmark runs re-measure the GEMMs; those rows are
# shown in their tables but not used as ceilings).
CEILING_OF_DTYPE = {"bf16": "ceiling_bf16_gemm", "f16": "ceiling_bf16_gemm",
                    "f32": "ceiling_fp32_gemm_noTF32"}
CEILING_LABEL = {"ceiling_bf16_gemm": "bf16 GEMM", "ceiling_fp32_gemm_noTF32": "fp32 GEMM (no TF32)",
                 "ceiling_copy": "copy"}
DTYPE_NAME = {"fp16": "f16", "fp32": "f32"}  # the anchors' spelling → bench_gpu.py's


class Point:
    """One measured rate: `what` ran `direction` on (dtype, d, N, causal) at `tflops`."""

    def __init__(self, file, what, direction, dtype, d, N, causal, tflops, run):
        self.file, self.what, self.direction = file, what, direction
        self.dtype, self.d, self.N, self.causal = dtype, d, N, causal
        self.tflops, self.run = tflops, run     # run: (device, commit, date) or None

    @property
    def series(self):
        """The stage or backend without its variant: `10_hopper_fwd[step=2]` → `10_hopper_fwd`."""
        return self.what.split("[", 1)[0]

    @property
    def is_variant(self):
        return "[" in self.what

    @property
    def is_stage(self):
        return re.match(r"\d\d_", self.what) is not None

    @property
    def shape(self):
        return (self.dtype, self.direction, self.d, self.causal, self.N)


def _num(x):
    try:
        return float(x)
    except (TypeError, ValueError):
        return None


def read_rows(path: Path):
    with path.open(newline="", encoding="utf-8") as f:
        return list(csv.DictReader(f))


def measured_rows(path):
    """The rows of a bench_gpu.py CSV that hold a timing whose output passed its check (not a
    backend that refused the shape, `n/a`, nor a failed check), with `tflops` as a float."""
    rows = []
    for r in read_rows(Path(path)):
        if r["tflops"] and r["check"] not in ("n/a", "FAIL"):
            rows.append(dict(r, tflops=float(r["tflops"])))
    return rows


def stage_points(results: Path = RESULTS):
    """Every row of the stage files that is not a ceiling, as Points."""
    points = []
    for name in stage_files(results):
        for r in read_rows(results / name):
            t = _num(r.get("tflops"))
            if r["what"].startswith("ceiling") or t is None or not r.get("pass"):
                continue
            points.append(Point(name, r["what"], r["pass"], DTYPE_NAME.get(r["dtype"], r["dtype"]),
                                int(r["head_dim"]), int(r["seq_q"]), r["causal"] == "1", t,
                                (r["device"], r["commit"], r["date"])))
    return points


def anchor_points(results: Path = RESULTS):
    """The anchors' rows (PyTorch backends, the educational kernels), one Point per pass."""
    points = []
    path = results / ANCHORS
    if not path.exists():
        return points
    for r in read_rows(path):
        if r["what"].startswith("ceiling"):
            continue
        for direction in ("fwd", "bwd"):
            t = _num(r.get(f"{direction}_tflops"))
            if t:
                points.append(Point(ANCHORS, r["what"], direction, DTYPE_NAME.get(r["dtype"], r["dtype"]),
                                    int(r["d"]), int(r["N"]), r["causal"] == "True", t, None))
    return points


def ceilings(results: Path = RESULTS):
    """{ceiling name: value} from the anchors file: TFLOP/s for the GEMMs, TB/s for the copy."""
    out = {}
    path = results / ANCHORS
    if path.exists():
        for r in read_rows(path):
            if r["what"].startswith("ceiling"):
                out[r["what"]] = _num(r.get("tflops")) or _num(r.get("tbps"))
    return out


def backend_reference(points):
    """{(file, shape): {backend: tflops}}: each stage is compared with the backends measured
    in the same run (the same file), never with another day's run."""
    ref = {}
    for p in points:
        if p.what in BACKENDS:
            ref.setdefault((p.file, p.shape), {})[p.what] = p.tflops
    return ref


def ratios(points):
    """[(Point, {backend: stage TFLOP/s over backend TFLOP/s})] for every stage point."""
    ref = backend_reference(points)
    out = []
    for p in points:
        if p.is_stage:
            out.append((p, {b: p.tflops / t for b, t in ref.get((p.file, p.shape), {}).items()}))
    return out


def span(values, fmt):
    """'0.93–1.15', or one value when all are equal."""
    lo, hi = fmt.format(min(values)), fmt.format(max(values))
    return lo if lo == hi else f"{lo}–{hi}"


def summary_rows(points):
    """One row per (stage, pass) without variants: the number of points, the TFLOP/s range,
    and the range of the ratio to each backend over the points that have one."""
    groups = {}
    for p, r in ratios(points):
        if not p.is_variant:
            groups.setdefault((p.what, p.direction), []).append((p, r))
    rows = []
    for (what, direction), items in sorted(groups.items(), key=lambda kv: (kv[0][0], kv[0][1] == "bwd")):
        tf = [p.tflops for p, _ in items]
        row = {"stage": what, "pass": direction, "points": len(items),
               "dtypes": "/".join(sorted({p.dtype for p, _ in items})),
               "head dims": "/".join(str(d) for d in sorted({p.d for p, _ in items})),
               "N": "…".join(str(n) for n in (min(p.N for p, _ in items), max(p.N for p, _ in items)))
                    if len({p.N for p, _ in items}) > 1 else str(items[0][0].N),
               "TFLOP/s": span(tf, "{:.1f}")}
        for b, name in BACKENDS.items():
            rs = [r[b] for _, r in items if b in r]
            row[f"× {name}"] = span(rs, "{:.2f}") if rs else "—"
        rows.append(row)
    return rows


def summary_markdown(points):
    rows = summary_rows(points)
    if not rows:
        return "No measured stage rows yet.\n"
    cols = list(rows[0])
    out = ["| " + " | ".join(cols) + " |", "|" + "|".join(":--" for _ in cols) + "|"]
    out += ["| " + " | ".join(str(r[c]) for c in cols) + " |" for r in rows]
    return "\n".join(out) + "\n"


def runs(results: Path = RESULTS):
    """{file: (devices, commits, first date, last date, rows)} for the files with those columns."""
    out = {}
    for path in sorted(results.glob("*.csv")):
        rows = read_rows(path)
        if rows and "date" in rows[0]:
            dates = sorted(r["date"] for r in rows if r.get("date"))
            out[path.name] = (sorted({r["device"] for r in rows if r.get("device")}),
                              sorted({r["commit"] for r in rows if r.get("commit")}),
                              dates[0] if dates else "", dates[-1] if dates else "", len(rows))
    return out


# The files that carry the summary table as a copy (plain Markdown has no include), each
# kept equal to summary_markdown() by scripts/results/plot_results.py; the docs build checks them.
SUMMARY_COPIES = ("README.md", "docs/results/README.md")


def with_summary(text: str, table: str):
    """`text` with its summary table (the block of lines from the one that starts
    '| stage | pass |' to the last table line) replaced by `table`; None if it has none."""
    lines = text.split("\n")
    start = next((k for k, ln in enumerate(lines) if ln.startswith("| stage | pass |")), None)
    if start is None:
        return None
    end = start
    while end < len(lines) and lines[end].startswith("|"):
        end += 1
    return "\n".join(lines[:start] + table.rstrip("\n").split("\n") + lines[end:])


def stale_summaries(repo: Path):
    """The SUMMARY_COPIES whose table differs from the one the CSVs give now."""
    table = summary_markdown(stage_points(repo / "docs" / "results"))
    return [rel for rel in SUMMARY_COPIES
            if (repo / rel).is_file() and with_summary((repo / rel).read_text(encoding="utf-8"), table)
            != (repo / rel).read_text(encoding="utf-8")]


def inputs_digest(results: Path = RESULTS):
    """A digest of the files the figures are drawn from: plot_results.py writes it into each
    SVG, and gen_pages.py refuses figures drawn from other data."""
    h = hashlib.sha256()
    # Stage 12's scaling rows count once they exist (the figures drawn before them stay valid).
    scaling = [SCALING] if (results / SCALING).exists() else []
    for name in stage_files(results) + [ANCHORS] + scaling:
        path = results / name
        h.update(name.encode())
        h.update(path.read_bytes() if path.exists() else b"")
    return h.hexdigest()[:16]


BYTES = {"bf16": 2, "f16": 2, "f32": 4}


def intensity(p: Point):
    """Compulsory arithmetic intensity (FLOP per byte): FLOPs by the papers' convention over
    the bytes of reading Q, K, V and writing O and L once (forward), or reading Q, K, V, O,
    dO, L and writing dQ, dK, dV once (backward); 4-byte L. Computed, not measured."""
    s = BYTES[p.dtype]
    flops = 4.0 * p.N * p.N * p.d * (0.5 if p.causal else 1.0)
    if p.direction == "fwd":
        return flops / (4 * p.N * p.d * s + 4 * p.N)
    return 2.5 * flops / (8 * p.N * p.d * s + 8 * p.N)


def above_roof(points, ceils):
    """The points that beat their roof, min(GEMM ceiling, copy bandwidth × intensity): none
    should, and one that does says a ceiling was measured low."""
    bw = ceils.get("ceiling_copy")
    out = []
    for p in points:
        peak = ceils.get(CEILING_OF_DTYPE.get(p.dtype))
        if peak and bw and p.tflops > min(peak, bw * intensity(p)):
            out.append(p)
    return out
