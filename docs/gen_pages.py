#!/usr/bin/env python3
"""The parts of the docs site that come from the tree and from measured data.

    gen_pages.py pages  --repo ROOT --out GEN
        Before Doxygen. Writes into GEN:
          include/stage_table.md  the stage map, one row per stages/NN_* folder (quoted
                                  into the main page and the stages page by \\includedoc)
          pages/stages.md         the page that holds every stage's notes as sub-pages
          pages/results.md        the results page: summary, figures, GPU check, a link to
                                  every CSV and log (the docs target copies docs/results/
                                  into the site as results/)
          images/*.svg            docs/results/figures/*.svg (scripts/results/plot_results.py draws
                                  them; a figure drawn from other data than the committed
                                  CSVs stops the build here)
          images/causal_tiles.svg docs/figures/*.svg (docs/figures.py draws them)
          notes/<path>            every note (stage README.md, docs/*.md, docs/concepts/*.md)
                                  converted from plain Markdown for Doxygen (docs/notes.py)
        A stage README.md whose first line is not "# Stage NN: Title {#stage_NN}" stops
        the build here, with a message that says so.

    gen_pages.py reader --repo ROOT --tag TAGFILE --html HTML --template docs/reader.html
        After Doxygen. Removes the pages of the build's folders (docs/build_folders.py), writes
        HTML/reader.html, the side-by-side reader (notes on the left,
        annotated source on the right), with the notes' page names read from Doxygen's tag
        file and the listings' from Doxygen's naming rule (docs/notes_tree.py).

Python standard library only: the docs build must not need numpy or matplotlib.
"""
import argparse
import csv
import html
import json
import re
import sys
import xml.etree.ElementTree as ET
from pathlib import Path


SOURCE_EXTS = (".h", ".hpp", ".cpp", ".cu", ".cuh")
# The title line of a stage's notes, in the plain-Markdown form (docs/notes.py) or, for notes
# not yet converted, Doxygen's.
TITLE_RE = re.compile(r"^#\s+(Stage\s+(\d\d)\s*:\s*.*?)\s*(?:\{#(stage_\d\d)\}|<a\s+id=\"(stage_\d\d)\"\s*>\s*</a>)\s*$")
# A stage's one-line idea: its register.cpp's `.idea = "…";`, or, for a stage outside the
# stage list (14: its own program), `kIdea = "…";` in its entry-point header.
IDEA_RE = re.compile(r"(?:\.idea|\bkIdea)\s*=\s*((?:\"(?:[^\"\\]|\\.)*\"\s*)+);", re.S)


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
        for f in [reg] if reg.exists() else [p for p in s.sources if p.suffix == ".h"]:
            m = IDEA_RE.search(f.read_text(encoding="utf-8", errors="replace"))
            if m:
                parts = re.findall(r"\"((?:[^\"\\]|\\.)*)\"", m.group(1))
                s.idea = "".join(parts).replace('\\"', '"')
                break
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
        if not m or m.group(2) != s.number or (m.group(3) or m.group(4)) != "stage_" + s.number:
            errors.append(
                f"{s.readme}: the first line must be '# Stage {s.number}: <title> "
                f"<a id=\"stage_{s.number}\"></a>' (the anchor is the page's name on the site); it is "
                f"{first[0] if first else '(empty file)'!r}")
            continue
        s.title, s.label = m.group(1), m.group(3) or m.group(4)
    return errors


def md_escape(text: str) -> str:
    """Text for a Markdown table cell that Doxygen reads as plain words."""
    text = text.replace("\\", "\\\\").replace("|", "\\|")
    for ch in "<>#@&$%":
        text = text.replace(ch, "\\" + ch)
    return text


def source_pages(repo: Path):
    """path → the page of that source's annotated listing (NAME_source.html), or None:
    Doxygen's own naming (docs/notes_tree.py), which the notes' code quotes use too."""
    import notes  # docs/notes.py, beside this script
    return notes.Tree(repo).source_page


def stage_table(stages, source_page) -> str:
    rows = ["| Stage | What it adds | Notes | Source (annotated) | Read |",
            "|:--|:--|:--|:--|:--|"]
    for s in stages:
        notes = (f"\\ref {s.label} \"{md_escape(s.title.split(':', 1)[1].strip())}\""
                 if s.label else "notes not written yet")
        src = "—"
        page = source_page(s.main_source.resolve()) if s.main_source else None
        if page:
            # The source listing, with every comment; tests/check_docs.py checks the link.
            src = f"<a href=\"{page}\">{s.main_source.name}</a>"
        elif s.main_source:
            src = f"`{s.main_source.name}`"
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
# The figures are drawn by scripts/results/plot_results.py (matplotlib) and committed as SVG under
# docs/results/figures/; the summary table and the figures' data come from
# scripts/results/results_data.py, which this script imports (standard library only).
DIGEST_RE = re.compile(r"inputs ([0-9a-f]{16})")

def results_data(repo: Path):
    sys.path.insert(0, str(repo / "scripts" / "results"))
    import results_data as rd  # noqa: E402  (found through the path above)
    return rd


def read_csvs(results: Path):
    tables = []
    for path in sorted(results.glob("*.csv")):
        with path.open(newline="", encoding="utf-8") as f:
            rows = [r for r in csv.DictReader(f)]
        tables.append((path, rows))
    return tables


def check_figures(repo: Path, rd):
    """Errors for figures that are missing or were drawn from other data than the CSVs."""
    errors, digest = [], rd.inputs_digest(repo / "docs" / "results")
    folder = repo / "docs" / "results" / "figures"
    if not (folder / "roofline.svg").exists() or not list(folder.glob("speed_*.svg")):
        errors.append(f"{folder} lacks roofline.svg or speed_*.svg: run scripts/results/plot_results.py")
    for path in sorted(folder.glob("*.svg")):
        m = DIGEST_RE.search(path.read_text(encoding="utf-8")[:4000])
        if not m or m.group(1) != digest:
            errors.append(f"{path} was drawn from other data than docs/results/{{"
                          f"{', '.join(rd.stage_files(repo / 'docs' / 'results') + [rd.ANCHORS])}}}: "
                          f"run scripts/results/plot_results.py and commit the figures")
    return errors


def folded(summary: str, body: list) -> list:
    """Markdown lines shown only when the reader opens them (HTML <details>)."""
    return (["\\htmlonly", f"<details><summary>{html.escape(summary)}</summary>", "\\endhtmlonly", ""]
            + body + ["", "\\htmlonly", "</details>", "\\endhtmlonly", ""])


def file_link(path: Path) -> str:
    """A link to a file of docs/results/ as the site holds it (results/NAME)."""
    return f'<a href="results/{html.escape(path.name)}">{html.escape(path.name)}</a>'


def provenance(run) -> str:
    """'Measured on NVIDIA H200, at commit `7c363570f339`, 2026-11-21; 318 rows.'"""
    devices, commits, first, last, count = run
    when = first[:10] if first[:10] == last[:10] else f"{first[:10]} to {last[:10]}"
    return (f"Measured on {md_escape(', '.join(devices)) or 'an unnamed device'}, at commit "
            f"{', '.join('`' + c + '`' for c in commits) or '(not recorded)'}, {when}; {count} rows.")


def results_page(tables, repo: Path, rd) -> str:
    results = repo / "docs" / "results"
    ceil = rd.ceilings(results)
    out = ["# Measured results {#results}", "",
           "Every number and figure on this page comes from the CSVs committed under "
           "`docs/results/`: the figures are drawn from them by `scripts/results/plot_results.py`, the "
           "files are linked at the end of the page. Notebook 4 (`notebooks/04_performance.ipynb`) "
           "draws the same figures.", "",
           "## Summary", "",
           "Where each GPU stage stands on the H200: per stage and pass, over every measured point "
           "(element type, head dim, N, causal or not), the range of its TFLOP/s and of its rate "
           "over that of FlashAttention-2 (PyTorch's `sdpa_flash`) and of cuDNN (`sdpa_cudnn`), "
           "each measured in the same run on the same inputs. Stage 07 (fp32) has neither to "
           "compare with: its reference is PyTorch's fp32 math path, in `h200_bench_gpu.csv`. "
           "Variants and earlier steps are left out here and drawn grey in the figures. TFLOP/s "
           "follow the FlashAttention papers: forward \\f$4\\,b\\,h\\,N^2 d\\f$, halved when causal, "
           "backward 2.5× the forward.", "",
           rd.summary_markdown(rd.stage_points(results)), ""]
    if ceil:
        out += ["The ceilings, everywhere on this site, are those of `h200_anchors.csv`: "
                + ", ".join(f"{rd.CEILING_LABEL.get(k, k)} {v:g} {'TB/s' if k == 'ceiling_copy' else 'TFLOP/s'}"
                            for k, v in sorted(ceil.items())) + ".", ""]
    out += ["## The stages against FlashAttention-2 and cuDNN", "",
            "One figure per element type. Rows: forward and backward, without and with the causal "
            "mask; columns: head dim; x: the sequence length N (batch·N = 16384 tokens, "
            "heads·d = 2048). The upper part of each panel is the rate, with the GEMM ceiling "
            "dotted; the lower part is each stage's rate over FlashAttention-2's (solid) and "
            "cuDNN's (dashed) from the same run. Where two runs measured a backend, the newer "
            "one is drawn.", ""]
    for fig in sorted((results / "figures").glob("speed_*.svg")):
        dtype = fig.stem.split("_", 1)[1]
        out += [f"\\image html {fig.name} \"H200, {dtype}: TFLOP/s and ratio to each backend\"", ""]
    out += ["## The H200 roofline", "",
            f"Every stage and backend of `{'`, `'.join([rd.ANCHORS] + rd.stage_files(results))}` "
            "at its compulsory-traffic intensity (each tensor read or written "
            "once; see \\ref concept_performance), under the roofs of the measured ceilings. "
            "Filled markers are forward passes, hollow ones backward passes; diamonds are the "
            "project's stages, grey points their variants and earlier steps.", "",
            "\\image html roofline.svg \"H200 roofline: measured ceilings and measured points\"", ""]
    check = results / "h200_gpu_check_summary.txt"
    if check.exists():
        text = check.read_text(encoding="utf-8")
        first = text.splitlines()[0].strip("= ") if text.strip() else ""
        out += ["## The last GPU check", "",
                "`scripts/gpu/check.sh` builds for sm_90, runs every test, the compute-sanitizer "
                "tools over the GPU tests and the benchmark sweep, and writes a summary "
                f"(`docs/results/{check.name}`; {md_escape(first)}):", ""]
        own = re.search(r"share of the bf16 GEMM rate \(([0-9.]+) TFLOP/s\)", text)
        if own and ceil.get("ceiling_bf16_gemm") and float(own.group(1)) != ceil["ceiling_bf16_gemm"]:
            out += [f"Its benchmark table gives each step's share of the bf16 GEMM rate that the same "
                    f"run measured ({own.group(1)} TFLOP/s); every other figure and table on this "
                    f"site uses the anchors' {ceil['ceiling_bf16_gemm']:g}.", ""]
        # The steps and their results in view, the per-test and benchmark lines folded.
        lines = text.replace("\\endverbatim", "\\ endverbatim").rstrip().splitlines()
        cut = next((k for k, line in enumerate(lines) if k and line.startswith("--")), len(lines))
        out += ["\\verbatim", *lines[:cut], "\\endverbatim", ""]
        if cut < len(lines):
            out += folded(f"the rest of the summary ({len(lines) - cut} lines)",
                          ["\\verbatim", *lines[cut:], "\\endverbatim"])
    out += ["## The files", "",
            "Each file: what it measured, on what and when (from its `device`, `commit` and "
            "`date` columns, where it has them), and a link to the file itself.", ""]
    runs = rd.runs(results)
    if not tables:
        out += ["No CSV under `docs/results/` yet.", ""]
    for path, rows in tables:
        out += [f"### {path.name}", ""]
        note = path.with_suffix(".md")
        if note.exists():
            # The file's own note (what, how and where it measured), under this file's heading.
            text = note.read_text(encoding="utf-8")
            out += [re.sub(r"^(#+)", r"###\1", line) for line in text.splitlines()] + [""]
        if path.name in runs:
            out += [provenance(runs[path.name]), ""]
        columns = len(rows[0]) if rows else 0
        out += [f"The file: {file_link(path)} ({len(rows)} rows of {columns} columns).", ""]
    logs = sorted(p for p in results.glob("*") if p.suffix == ".txt" or p.name.endswith("_log.md"))
    if logs:
        out += ["## Logs", "",
                "The GPU checks' output and the stages' measurement logs, as they were written:", ""]
        out += [f"- {file_link(p)}" for p in logs] + [""]
    return "\n".join(out)


def stage_nav(stage, stages, source_page) -> str:
    """The line at the top and the bottom of a stage's notes on the site: the previous and
    the next stage, the stage's annotated main source, its notes beside its source."""
    noted = [s for s in stages if s.label]
    k = noted.index(stage)
    parts = [f'\\ref {noted[k - 1].label} "← {md_escape(noted[k - 1].title)}"'] if k else []
    page = source_page(stage.main_source.resolve()) if stage.main_source else None
    if page:
        parts.append(f'source: <a href="{page}">{stage.main_source.name}</a>')
    parts.append(f'<a href="reader.html#{stage.name}">notes and source side by side</a>')
    if k + 1 < len(noted):
        parts.append(f'\\ref {noted[k + 1].label} "{md_escape(noted[k + 1].title)} →"')
    return '<div class="stagenav">' + " · ".join(parts) + "</div>"


def write_notes(repo: Path, out: Path, stages, source_page) -> list:
    """Every note (docs/notes.py) converted for Doxygen into GEN/notes/<its path>, line for
    line; a stage's notes get the navigation line under the title and at the end."""
    import notes  # docs/notes.py, beside this script
    tree, errors = notes.Tree(repo), []
    for note in tree.notes.values():
        text, errs = notes.to_doxygen(tree, note)
        errors += errs
        stage = next((s for s in stages if s.label and s.readme.resolve() == note.path), None)
        if stage:
            nav, lines = stage_nav(stage, stages, source_page), text.split("\n")
            if len(lines) > 1 and not lines[1].strip():
                lines[1] = nav  # the blank line under the title: line numbers stay
            text = "\n".join(lines).rstrip("\n") + "\n\n" + nav + "\n"
        (out / "notes" / note.rel).parent.mkdir(parents=True, exist_ok=True)
        write_if_changed(out / "notes" / note.rel, text)
    for old in (out / "notes").rglob("*.md"):  # a note that was removed or renamed
        if old.relative_to(out / "notes").as_posix() not in tree.notes:
            old.unlink()
    return errors


def write_if_changed(path: Path, text: str):
    if not path.exists() or path.read_text(encoding="utf-8") != text:
        path.write_text(text, encoding="utf-8")


def cmd_pages(args) -> int:
    repo, out = Path(args.repo).resolve(), Path(args.out)
    for sub in ("pages", "include", "images", "notes", "notebooks"):
        (out / sub).mkdir(parents=True, exist_ok=True)
    stages = find_stages(repo)
    errors = read_titles(stages)
    if errors:
        for e in errors:
            print("docs: " + e, file=sys.stderr)
        return 1
    rd = results_data(repo)
    import figures  # docs/figures.py, beside this script
    errors = check_figures(repo, rd) + [f"docs/figures/{n} is not what docs/figures.py draws: run "
                                        f"python3 docs/figures.py and commit it" for n in figures.stale()]
    errors += [f"{rel}: its summary table differs from the CSVs': run scripts/results/plot_results.py and "
               f"commit it" for rel in rd.stale_summaries(repo)]
    errors += write_notes(repo, out, stages, source_pages(repo))
    import notebook_pages  # docs/notebook_pages.py, beside this script
    errors += notebook_pages.write_notebook_pages(repo, out)
    if errors:
        for e in errors:
            print("docs: " + e, file=sys.stderr)
        return 1
    tables = read_csvs(repo / "docs" / "results")
    write_if_changed(out / "include" / "stage_table.md", stage_table(stages, source_pages(repo)))
    write_if_changed(out / "pages" / "stages.md", stages_page(stages))
    write_if_changed(out / "pages" / "results.md", results_page(tables, repo, rd))
    for fig in sorted((repo / "docs" / "results" / "figures").glob("*.svg")):
        write_if_changed(out / "images" / fig.name, fig.read_text(encoding="utf-8"))
    for fig in sorted((repo / "docs" / "figures").glob("*.svg")):
        write_if_changed(out / "images" / fig.name, fig.read_text(encoding="utf-8"))
    print(f"docs: {len(stages)} stage folders, {sum(1 for s in stages if s.label)} with notes, "
          f"{len(tables)} result files")
    return 0


# ----------------------------------------------------------------------------- reader
def cmd_reader(args) -> int:
    repo = Path(args.repo).resolve()
    tag = ET.parse(args.tag).getroot()
    pages = {c.findtext("name"): c.findtext("filename")
             for c in tag.findall("compound") if c.get("kind") == "page"}
    source_page = source_pages(repo)
    stages = find_stages(repo)
    read_titles(stages)
    data = []
    for s in stages:
        entries = []
        for p in s.sources:
            page = source_page(p.resolve())
            if page and Path(args.html, page).exists():
                entries.append({"name": p.name, "href": page, "main": p == s.main_source})
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
    from build_folders import remove_build_folders  # docs/build_folders.py, beside this script
    removed = remove_build_folders(repo, Path(args.html), Path(args.gen or Path(args.html).parent / "generated"))
    print(f"docs: reader.html with {len(data)} stages" + (f"; the pages of {removed} of the build's "
                                                          f"folders removed" if removed else ""))
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
    r.add_argument("--gen", help="the pages generated for Doxygen (default: HTML/../generated)")
    args = ap.parse_args()
    return cmd_pages(args) if args.cmd == "pages" else cmd_reader(args)


if __name__ == "__main__":
    sys.exit(main())
