#!/usr/bin/env python3
"""The parts of the docs site that come from the tree and from measured data.

    gen_pages.py pages  --repo ROOT --out GEN
        Before Doxygen. Writes into GEN:
          include/stage_table.md  the stage map, one row per stages/NN_* folder (quoted
                                  into the main page and the stages page by \\includedoc)
          pages/stages.md         the page that holds every stage's notes as sub-pages
          pages/results.md        every CSV under docs/results/, as tables
          images/roofline.svg     the H200 roofline: measured ceilings and points
          images/causal_tiles.svg which tiles causal masking computes, masks or skips
        A stage README.md whose first line is not "# Stage NN: Title {#stage_NN}" stops
        the build here, with a message that says so.

    gen_pages.py reader --repo ROOT --tag TAGFILE --html HTML --template docs/reader.html
        After Doxygen. Writes HTML/reader.html, the side-by-side reader (notes on the left,
        annotated source on the right), with the page names read from Doxygen's tag file.

Python standard library only: the docs build must not need numpy or matplotlib.
"""
import argparse
import csv
import html
import json
import math
import re
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

SOURCE_EXTS = (".h", ".hpp", ".cpp", ".cu", ".cuh")
TITLE_RE = re.compile(r"^#\s+(Stage\s+(\d\d)\s*:\s*.*?)\s*\{#(stage_\d\d)\}\s*$")
IDEA_RE = re.compile(r"\.idea\s*=\s*((?:\"(?:[^\"\\]|\\.)*\"\s*)+);", re.S)


# ----------------------------------------------------------------------------- stages
class Stage:
    def __init__(self, folder: Path):
        self.folder = folder
        self.name = folder.name             # "05_one_pass_fused"
        self.number = folder.name[:2]       # "05"
        self.readme = folder / "README.md"
        self.title = None                   # "Stage 05: One fused pass"
        self.label = None                   # "stage_05"
        self.idea = ""
        self.sources = sorted(p for p in folder.iterdir()
                              if p.is_file() and p.suffix in SOURCE_EXTS)
        self.main_source = self._main_source()

    def _main_source(self):
        """The file a student reads: the .cpp/.cu named like the folder
        (05_one_pass_fused → one_pass_fused.cpp), else the first .cpp/.cu whose header starts
        "// Stage NN", else the first source that is not main.cpp, register.cpp or a header."""
        impl = [p for p in self.sources if p.suffix in (".cpp", ".cu")
                and p.name not in ("main.cpp", "register.cpp")]
        for p in impl:
            if p.stem == self.name[3:]:
                return p
        for p in impl:
            head = p.read_text(encoding="utf-8", errors="replace").lstrip()[:200]
            if re.match(r"//\s*Stage\s+%s\b" % self.number, head):
                return p
        rest = [p for p in self.sources if p.name not in ("main.cpp", "register.cpp")]
        return (impl or rest or self.sources or [None])[0]


def find_stages(repo: Path):
    stages = []
    for folder in sorted((repo / "stages").glob("[0-9][0-9]_*")):
        if not folder.is_dir():
            continue
        s = Stage(folder)
        reg = folder / "register.cpp"
        if reg.exists():
            m = IDEA_RE.search(reg.read_text(encoding="utf-8", errors="replace"))
            if m:
                parts = re.findall(r"\"((?:[^\"\\]|\\.)*)\"", m.group(1))
                s.idea = "".join(parts).replace('\\"', '"')
        stages.append(s)
    return stages


def read_titles(stages):
    """Fills title and label from each README's first line; returns a list of errors."""
    errors = []
    for s in stages:
        if not s.readme.exists():
            continue
        first = s.readme.read_text(encoding="utf-8").splitlines()[:1]
        m = TITLE_RE.match(first[0]) if first else None
        if not m or m.group(2) != s.number or m.group(3) != "stage_" + s.number:
            errors.append(
                f"{s.readme}: the first line must be '# Stage {s.number}: <title> "
                f"{{#stage_{s.number}}}' (a Doxygen page with that label); it is "
                f"{first[0] if first else '(empty file)'!r}")
            continue
        s.title, s.label = m.group(1), m.group(3)
    return errors


def md_escape(text: str) -> str:
    """Text for a Markdown table cell that Doxygen reads as plain words."""
    text = text.replace("\\", "\\\\").replace("|", "\\|")
    for ch in "<>#@&$%":
        text = text.replace(ch, "\\" + ch)
    return text


def doxygen_disk_name(name: str):
    """Doxygen's output name for a file with a unique name (CASE_SENSE_NAMES = YES,
    SHORT_NAMES = NO): naive.cpp → naive_8cpp. None for characters this does not cover."""
    if not re.fullmatch(r"[A-Za-z0-9_.\-]+", name):
        return None
    return name.replace("_", "__").replace(".", "_8")


def input_names(repo: Path):
    """How often each file name occurs among the sources Doxygen reads."""
    count = {}
    for top in (repo / "common", repo / "stages"):
        for p in top.rglob("*"):
            if p.is_file() and p.suffix in SOURCE_EXTS:
                count[p.name] = count.get(p.name, 0) + 1
    return count


def stage_table(stages, names) -> str:
    rows = ["| Stage | What it adds | Notes | Source (annotated) | Read |",
            "|:--|:--|:--|:--|:--|"]
    for s in stages:
        notes = (f"\\ref {s.label} \"{md_escape(s.title.split(':', 1)[1].strip())}\""
                 if s.label else "notes not written yet")
        src = "—"
        if s.main_source:
            # Link the source listing (with every comment) when its page name is certain;
            # tests/check_docs.py checks that the target exists. Otherwise the file's page.
            disk = doxygen_disk_name(s.main_source.name)
            if disk and names.get(s.main_source.name) == 1:
                src = f"<a href=\"{disk}_source.html\">{s.main_source.name}</a>"
            else:
                src = f"\\ref {s.name}/{s.main_source.name} \"{s.main_source.name}\""
        read = f"<a href=\"reader.html#{s.name}\">side by side</a>"
        rows.append(f"| `{s.name}` | {md_escape(s.idea) or '—'} | {notes} | {src} | {read} |")
    if not stages:
        rows.append("| — | no stage folders yet | | | |")
    return "\n".join(rows) + "\n"


def stages_page(stages) -> str:
    out = ["# The stages {#stages}", "",
           "Each stage changes one idea of the one before it, and each is checked against the "
           "same exact reference. A stage's notes (its `README.md`) are the pages below; its "
           "annotated source is one click away, or beside the notes in the "
           "<a href=\"reader.html\">side-by-side reader</a>.", "",
           "\\includedoc stage_table.md", ""]
    for s in stages:
        if s.label:
            out.append(f"- \\subpage {s.label}")
    out.append("")
    return "\n".join(out)


# ----------------------------------------------------------------------------- results
def read_csvs(results: Path):
    tables = []
    for path in sorted(results.glob("*.csv")):
        with path.open(newline="", encoding="utf-8") as f:
            rows = [r for r in csv.DictReader(f)]
        tables.append((path, rows))
    return tables


def num(x):
    try:
        v = float(x)
        return v if math.isfinite(v) else None
    except (TypeError, ValueError):
        return None


def truthy(x) -> bool:
    return str(x).strip().lower() in ("1", "true", "yes", "causal")


def get(row, *names):
    """The first non-empty value among several possible column names."""
    for n in names:
        for k, v in row.items():
            if k and k.strip().lower() == n and v not in (None, ""):
                return v
    return None


BYTES = {"bf16": 2, "f16": 2, "fp16": 2, "f32": 4, "fp32": 4}


def points_from(path: Path, rows):
    """Roofline points (label, arithmetic intensity, TFLOP/s) from one H200 CSV.

    The x coordinate is the compulsory-traffic intensity: FLOPs by the papers' convention
    over the bytes of reading Q, K, V and writing O and L once (forward), or reading Q, K,
    V, O, dO, L and writing dQ, dK, dV once (backward). It depends only on N, d, the
    element size and the mask, so it is computed, not measured; the y coordinate is the
    measured TFLOP/s from the CSV.
    """
    pts = []
    for r in rows:
        what = get(r, "stage", "what", "name", "kernel")
        if not what or what.startswith("ceiling"):
            continue
        N, d = num(get(r, "n", "seq", "seq_q")), num(get(r, "d", "head_dim"))
        dtype = (get(r, "dtype") or "bf16").lower()
        if N is None or d is None or dtype not in BYTES:
            continue
        causal = truthy(get(r, "causal") or "")
        size = BYTES[dtype]
        flops = 4 * N * N * d * (0.5 if causal else 1.0)
        direction = (get(r, "pass", "direction", "kind") or "").lower()
        candidates = []
        if get(r, "fwd_tflops"):
            candidates.append(("fwd", num(get(r, "fwd_tflops"))))
        if get(r, "bwd_tflops"):
            candidates.append(("bwd", num(get(r, "bwd_tflops"))))
        if not candidates and get(r, "tflops"):
            candidates.append(("bwd" if "b" in direction[:1] else "fwd", num(get(r, "tflops"))))
        for dirn, tf in candidates:
            if tf is None or tf <= 0:
                continue
            if dirn == "fwd":
                nbytes = 4 * N * d * size + 4 * N
                ai = flops / nbytes
            else:
                nbytes = 8 * N * d * size + 8 * N
                ai = 2.5 * flops / nbytes
            # Rows of the project's own stages (any H200 file but the anchors) are drawn as
            # diamonds; the anchors as circles.
            stage = path.name != "h200_anchors.csv" and re.match(r"\d\d_", what) is not None
            series = f"{what} {dirn}" + (" (stage)" if stage else "")
            pts.append((series, ai, tf, dtype, f"{path.name}: {what} {dtype} d={int(d)} "
                        f"N={int(N)}{' causal' if causal else ''} {dirn} {tf:g} TFLOP/s"))
    return pts


def ceilings_from(tables):
    ceil = {}
    for path, rows in tables:
        for r in rows:
            what = get(r, "what") or ""
            if what.startswith("ceiling"):
                v = num(get(r, "tflops")) or num(get(r, "tbps"))
                if v:
                    ceil[what] = (v, path.name)
    return ceil


def marker(x, y, diamond, fill, stroke, title):
    """A circle (anchors) or a larger diamond (the project's stages), with a hover title."""
    t = f"<title>{html.escape(title)}</title>"
    if diamond:
        return (f'<path d="M{x:.1f},{y - 6:.1f} L{x + 6:.1f},{y:.1f} L{x:.1f},{y + 6:.1f} '
                f'L{x - 6:.1f},{y:.1f} Z" fill="{fill}" stroke="{stroke}">{t}</path>')
    return f'<circle cx="{x:.1f}" cy="{y:.1f}" r="3.5" fill="{fill}" stroke="{stroke}">{t}</circle>'


def svg_roofline(tables) -> str:
    """A log-log roofline drawn by hand (no plotting library)."""
    ceil = ceilings_from(tables)
    pts = []
    for path, rows in tables:
        if path.name.startswith("h200"):
            pts += points_from(path, rows)
    W, H, L_, R_, T_, B_ = 860, 520, 70, 250, 30, 60
    x0, x1, y0, y1 = 0.1, 1e5, 1e-2, 2e3

    def X(v):
        return L_ + (math.log10(v) - math.log10(x0)) / (math.log10(x1) - math.log10(x0)) * (W - L_ - R_)

    def Y(v):
        return H - B_ - (math.log10(v) - math.log10(y0)) / (math.log10(y1) - math.log10(y0)) * (H - T_ - B_)

    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" '
           f'viewBox="0 0 {W} {H}" font-family="sans-serif" font-size="12">',
           f'<rect width="{W}" height="{H}" fill="white"/>']
    for e in range(-1, 6):
        x = X(10 ** e)
        out.append(f'<line x1="{x:.1f}" y1="{T_}" x2="{x:.1f}" y2="{H - B_}" stroke="#ddd"/>')
        out.append(f'<text x="{x:.1f}" y="{H - B_ + 16}" text-anchor="middle">1e{e}</text>')
    for e in range(-2, 4):
        y = Y(10 ** e)
        out.append(f'<line x1="{L_}" y1="{y:.1f}" x2="{W - R_}" y2="{y:.1f}" stroke="#ddd"/>')
        out.append(f'<text x="{L_ - 6}" y="{y + 4:.1f}" text-anchor="end">1e{e}</text>')
    out.append(f'<rect x="{L_}" y="{T_}" width="{W - L_ - R_}" height="{H - T_ - B_}" '
               f'fill="none" stroke="black"/>')
    out.append(f'<text x="{(L_ + W - R_) / 2}" y="{H - 18}" text-anchor="middle">arithmetic '
               f'intensity (FLOP per byte of compulsory HBM traffic)</text>')
    out.append(f'<text transform="translate(18 {(T_ + H - B_) / 2}) rotate(-90)" '
               f'text-anchor="middle">TFLOP/s</text>')
    bw = ceil.get("ceiling_copy", (None,))[0]
    legend = []
    if bw:
        for key, color, label in (("ceiling_bf16_gemm", "#c0392b", "bf16 GEMM"),
                                  ("ceiling_fp32_gemm_noTF32", "#2c3e50", "fp32 GEMM (no TF32)")):
            if key not in ceil:
                continue
            peak = ceil[key][0]
            ridge = peak / bw
            xa, xb = x0, min(x1, ridge)
            out.append(f'<polyline fill="none" stroke="{color}" stroke-width="2" points="'
                       f'{X(xa):.1f},{Y(max(y0, bw * xa)):.1f} {X(xb):.1f},{Y(bw * xb):.1f} '
                       f'{X(x1):.1f},{Y(peak):.1f}"/>')
            out.append(f'<text x="{L_ + 8}" y="{Y(peak) - 6:.1f}" '
                       f'fill="{color}">{label}: {peak:g} TFLOP/s, ridge {ridge:.1f} FLOP/B</text>')
        out.append(f'<text x="{X(0.3):.1f}" y="{Y(bw * 0.3) - 8:.1f}" fill="#555" '
                   f'transform="rotate(-33 {X(0.3):.1f} {Y(bw * 0.3) - 8:.1f})">copy '
                   f'{bw:g} TB/s</text>')
    palette = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2",
               "#7f7f7f", "#bcbd22", "#17becf", "#393b79", "#637939", "#8c6d31", "#843c39"]
    series = sorted({p[0] for p in pts})
    for k, name in enumerate(series):
        color = palette[k % len(palette)]
        hollow = name.endswith("bwd")
        for s, ai, tf, _, title in pts:
            if s != name or not (x0 <= ai <= x1 and y0 <= tf <= y1):
                continue
            fill = "white" if hollow else color
            out.append(marker(X(ai), Y(tf), name.endswith("(stage)"), fill, color, title))
        legend.append((name, color, hollow))
    for k, (name, color, hollow) in enumerate(legend):
        y = T_ + 14 + 16 * k
        out.append(marker(W - R_ + 16, y - 4, name.endswith("(stage)"),
                          "white" if hollow else color, color, name))
        out.append(f'<text x="{W - R_ + 26}" y="{y}">{html.escape(name)}</text>')
    if not pts:
        out.append(f'<text x="{(L_ + W - R_) / 2}" y="{T_ + 20}" text-anchor="middle">'
                   f'no measured points yet (docs/results/h200_*.csv)</text>')
    out.append("</svg>")
    return "\n".join(out) + "\n"


def svg_causal_tiles() -> str:
    """Two tile maps: N_q = N_k (8 × 8 tiles) and N_q < N_k (3 × 8), bottom-right causal."""
    cell, gap = 26, 60
    maps = [("N_q = N_k = 8 tiles", 8, 8), ("N_q = 3 tiles, N_k = 8 tiles", 3, 8)]
    colors = {"full": "#4c9be8", "band": "#f5b041", "skip": "#eeeeee"}
    W = 40 + sum(nk * cell for _, _, nk in maps) + gap * (len(maps) - 1) + 40
    legend_y = 52 + max(nq for _, nq, _ in maps) * cell + 20
    H = legend_y + 3 * 20 + 10
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" '
           f'viewBox="0 0 {W} {H}" font-family="sans-serif" font-size="12">',
           f'<rect width="{W}" height="{H}" fill="white"/>']
    x_off = 40
    for title, nq, nk in maps:
        out.append(f'<text x="{x_off}" y="24">{title}</text>')
        out.append(f'<text x="{x_off}" y="42" fill="#555">key tiles j →, query tiles i ↓</text>')
        for i in range(nq):
            for j in range(nk):
                # Tile size B on both sides, N_q = nq·B, N_k = nk·B: row r sees keys
                # c ≤ r + (N_k − N_q). Tile (i, j) is fully visible when its last key is
                # visible to its first row, (j+1)B − 1 ≤ iB + (nk − nq)B, i.e. j < i + t;
                # fully hidden when its first key is hidden from its last row, j > i + t.
                t = nk - nq
                kind = "full" if j < i + t else ("skip" if j > i + t else "band")
                x, y = x_off + j * cell, 52 + i * cell
                out.append(f'<rect x="{x}" y="{y}" width="{cell - 2}" height="{cell - 2}" '
                           f'fill="{colors[kind]}" stroke="#888"/>')
        x_off += nk * cell + gap
    for k, (kind, text) in enumerate((("full", "computed, no mask (off-band)"),
                                      ("band", "computed with the element mask (on-band)"),
                                      ("skip", "skipped: every key is in the future"))):
        x, y = 40, legend_y + 20 * k
        out.append(f'<rect x="{x}" y="{y}" width="14" height="14" fill="{colors[kind]}" stroke="#888"/>')
        out.append(f'<text x="{x + 20}" y="{y + 12}">{text}</text>')
    out.append("</svg>")
    return "\n".join(out) + "\n"


def results_page(tables, results: Path) -> str:
    out = ["# Measured results {#results}", "",
           "Every CSV committed under `docs/results/`, as measured: nothing on this page is "
           "typed in by hand. The H200 anchors (PyTorch's attention backends, the "
           "educational fp32 kernel and the GEMM and copy ceilings) were measured in one run "
           "on one H200; the stages' rows come from the project's benchmark script "
           "(`scripts/`) on the GPU machine and from the CPU stages' own `--bench` runs. "
           "Notebook 4 (`notebooks/04_performance.ipynb`) plots the same files.", "",
           "## The H200 roofline", "",
           "Ceilings: the measured bf16 and fp32 GEMM rates and the measured copy bandwidth. "
           "Points: every H200 row with a sequence length, a head dim and a TFLOP/s figure, "
           "placed at its compulsory-traffic intensity (each tensor read or written once; "
           "see \\ref concept_performance). Filled markers are forward passes, hollow ones "
           "backward passes.", "",
           "\\image html roofline.svg \"H200 roofline: measured ceilings and measured points\"",
           ""]
    if not tables:
        out += ["No CSV under `docs/results/` yet.", ""]
    for note in sorted(results.glob("*.md")):
        # The notes that describe the files (how and where they were measured), one heading
        # level down so that they sit under this page's title.
        text = note.read_text(encoding="utf-8")
        out += [re.sub(r"^(#+)", r"#\1", line) for line in text.splitlines()] + [""]
    for path, rows in tables:
        out += [f"## {path.name}", ""]
        if not rows:
            out += ["(empty)", ""]
            continue
        cols = [c for c in rows[0].keys() if c and any((r.get(c) or "") != "" for r in rows)]
        out.append("| " + " | ".join(md_escape(c) for c in cols) + " |")
        out.append("|" + "|".join(":--" for _ in cols) + "|")
        for r in rows:
            out.append("| " + " | ".join(md_escape(str(r.get(c) or "")) for c in cols) + " |")
        out += ["", f"{len(rows)} rows.", ""]
    return "\n".join(out)


def write_if_changed(path: Path, text: str):
    if not path.exists() or path.read_text(encoding="utf-8") != text:
        path.write_text(text, encoding="utf-8")


def cmd_pages(args) -> int:
    repo, out = Path(args.repo).resolve(), Path(args.out)
    for sub in ("pages", "include", "images"):
        (out / sub).mkdir(parents=True, exist_ok=True)
    stages = find_stages(repo)
    errors = read_titles(stages)
    if errors:
        for e in errors:
            print("docs: " + e, file=sys.stderr)
        return 1
    tables = read_csvs(repo / "docs" / "results")
    write_if_changed(out / "include" / "stage_table.md", stage_table(stages, input_names(repo)))
    write_if_changed(out / "pages" / "stages.md", stages_page(stages))
    write_if_changed(out / "pages" / "results.md", results_page(tables, repo / "docs" / "results"))
    write_if_changed(out / "images" / "roofline.svg", svg_roofline(tables))
    write_if_changed(out / "images" / "causal_tiles.svg", svg_causal_tiles())
    print(f"docs: {len(stages)} stage folders, {sum(1 for s in stages if s.label)} with notes, "
          f"{len(tables)} result files")
    return 0


# ----------------------------------------------------------------------------- reader
def cmd_reader(args) -> int:
    repo = Path(args.repo).resolve()
    tag = ET.parse(args.tag).getroot()
    files, pages = {}, {}
    for c in tag.findall("compound"):
        kind = c.get("kind")
        if kind == "file":
            path = Path((c.findtext("path") or "")) / (c.findtext("name") or "")
            files[path.resolve()] = c.findtext("filename")
        elif kind == "page":
            pages[c.findtext("name")] = c.findtext("filename")
    stages = find_stages(repo)
    read_titles(stages)
    data = []
    for s in stages:
        entries = []
        for p in s.sources:
            page = files.get(p.resolve())
            if not page:
                continue
            page = page if page.endswith(".html") else page + ".html"
            entries.append({"name": p.name, "href": page[:-len(".html")] + "_source.html",
                            "main": p == s.main_source})
        entries.sort(key=lambda e: (not e["main"], e["name"]))
        notes = pages.get(s.label) if s.label else None
        if notes and not notes.endswith(".html"):
            notes += ".html"
        data.append({"id": s.name, "title": s.title or s.name, "notes": notes,
                     "files": entries})
    template = Path(args.template).read_text(encoding="utf-8")
    marker = "/*@READER_DATA@*/"
    if marker not in template:
        print(f"docs: {args.template} lacks the marker {marker}", file=sys.stderr)
        return 1
    page = template.replace(marker, "const STAGES = " + json.dumps(data, indent=1) + ";")
    Path(args.html, "reader.html").write_text(page, encoding="utf-8")
    print(f"docs: reader.html with {len(data)} stages")
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("pages")
    p.add_argument("--repo", required=True)
    p.add_argument("--out", required=True)
    r = sub.add_parser("reader")
    r.add_argument("--repo", required=True)
    r.add_argument("--tag", required=True)
    r.add_argument("--html", required=True)
    r.add_argument("--template", required=True)
    args = ap.parse_args()
    return cmd_pages(args) if args.cmd == "pages" else cmd_reader(args)


if __name__ == "__main__":
    sys.exit(main())
