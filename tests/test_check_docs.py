"""tests/check_docs.py must fail on each class of fault it claims to catch (CTest:
docs_check_faults, after docs_build).

    test_check_docs.py --html BUILD/docs/html --repo ROOT [--chromium auto|yes|no]

For each fault, a copy of the built site (links to its files, the changed page a real file,
put back after) gets the fault planted in one page, check_docs runs on it, and must fail with the message of
that fault class. The untouched copy must pass first, so a failure is the plant's doing.
The HTML checks run in this process (one site copy after another); the faults only a
browser sees are planted each in its own copy and rendered (in one headless Chromium) with
the untouched pages they are planted in, which must pass (docs_check renders the whole site).
"""
import argparse
import contextlib
import io
import os
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import check_docs  # noqa: E402
import docs_render  # noqa: E402

# (name, page, text to insert before the page's </div><!-- contents -->, expected message);
# a page the site does not have is written with the text alone.
EMPTY_FILE_PAGE = ('<html><body><div class="header"><div class="headertitle"><div class="title">'
                   'README.md File Reference</div></div></div>\n<div class="contents">\n'
                   '</div><!-- contents -->\n</body></html>\n')
WIDE_FORMULA = "\\[" + " + ".join(f"a_{{{k}}} b_{{{k}}}" for k in range(60)) + "\\]"
FAULTS = [
    ("literal **", "stage_01.html", "<p>a <b>bold</b> word and a **bold** one</p>", "a literal **"),
    ("tag shown as text", "stage_01.html", "<h2>Variants (&lt;tt&gt;--variant&lt;/tt&gt;)</h2>",
     "an HTML tag shown as text, <tt>"),
    ("link text in backticks", "stage_04.html", '<p>see <a href="stage_01.html">`naive.cpp`</a></p>',
     "a literal `code span` in the text"),
    ("backticks around a code link", "index.html",
     '<p>notebook: `<a href="stage_01.html"><code>01_softmax_variants.ipynb</code></a>`</p>',
     "a literal `code span` in the text"),
    ("link to a missing page", "concept_io.html", '<p><a href="no_such_page.html">x</a></p>',
     "link to no_such_page.html, which is not in the site"),
    ("link to a missing anchor", "stage_02.html", '<p><a href="stage_01.html#no_such_anchor">x</a></p>',
     "stage_01.html has no anchor 'no_such_anchor'"),
    ("listing links a gone page", "naive_8cpp_source.html", '<p><a href="dir_no_such_folder.html">x</a></p>',
     "link to dir_no_such_folder.html, which is not in the site"),
    ("lab marker shown", "naive_8cpp_source.html",
     '<div class="fragment"><div class="line"><span class="lineno">   42</span>  '
     '<span class="comment">// LAB BEGIN: scores — hint: S = QK^T</span></div></div>', "shows the lab marker"),
    ("file:line autolink", "lab_guide.html", '<p>naming <a href="file:line">file:line</a></p>',
     "a link to 'file:line', which is no web address"),
    ("formula delimiter left", "stage_03.html", "<p>where $$x + y$$ stays raw</p>",
     "a formula delimiter left in the text"),
    ("TAB in a formula", "concept_io.html",  # the \t of \times read as a TAB
     "<p>add the \\(N \\times N\\) arrays</p>".replace("\\t", "\t"),
     "a control character ('\\t'"),
    ("notebook figure missing", "notebook_05_gpt_capstone.html", '<p><img src="no_such_figure.png" alt=""/></p>',
     "link to no_such_figure.png, which is not in the site"),
    ("notebook figure extra", "notebook_01_softmax_variants.html",
     '<p><img src="notebook_01_softmax_variants_1.png" alt=""/></p>', "figures, but notebooks/"),
    ("Markdown table printed", "notebook_05_gpt_capstone.html",
     '<div class="fragment"><div class="line">| run | loss |</div><div class="line">|---|---:|</div>'
     '<div class="line">| 06 | 2.31 |</div></div>', "a Markdown table printed as text"),
    ("empty File Reference page", "README_8md.html", None, "an empty page, 'README.md File Reference'"),
]
# Faults only headless Chromium sees: (name, page, old text, new text, expected message). The
# two formula faults bring their own formula: planted in the page with the fewest (6), they cost
# about 0.4 CPU-s a rendering, where a notes page of 200 or more costs 1.
RENDER_FAULTS = [
    ("figure shown too small", "results.html", '<object type="image/svg+xml" data="roofline.svg"',
     '<object style="width: 380px" type="image/svg+xml" data="roofline.svg"', "(unreadable)"),
    ("figure blank", "results.html", 'data="speed_bf16.svg"', 'data="blank.svg"',
     "figure blank.svg is blank in the screenshot"),
    ("image not scaled", "notebook_04_performance.html", '<img src="notebook_04_performance_1.png"',
     '<img style="max-width: none" src="notebook_04_performance_1.png"', "(not scaled to the page)"),
    ("display formula clipped", "concept_eigen.html", "</div><!-- contents -->",
     "<style>div.MathJax_Display { overflow: visible !important; }</style><p>" + WIDE_FORMULA
     + "</p></div><!-- contents -->", "a display formula"),
    ("MathJax error", "concept_eigen.html", "</div><!-- contents -->",
     "<p>\\(\\frac{1}{\\)</p></div><!-- contents -->", "MathJax reported"),
]
# Faults of the side-by-side reader: (name, change to reader.html, page to plant beside it
# (name, old text, new text) or None, expected message).
READER_FAULTS = [
    ("quote opens in the notes pane", ('window.addEventListener("message"', 'window.addEventListener("no-message"'),
     None, "did not open the source pane"),
    ("pane shows Doxygen's header", ('"notes": "stage_01.html"', '"notes": "planted_stage_01.html"'),
     ("stage_01.html", '<script type="text/javascript" src="pane.js"></script>', ""),
     "the notes pane shows Doxygen's"),
]
BLANK_SVG = '<svg xmlns="http://www.w3.org/2000/svg" width="800" height="600"></svg>\n'


def site_copy(html: Path, site: Path) -> Path:
    """A copy of the site made of links to its files (made once: on some file systems a
    link costs a millisecond), with a blank figure beside them."""
    site.mkdir(parents=True)
    for entry in html.iterdir():
        os.symlink(entry.resolve(), site / entry.name)
    (site / "blank.svg").write_text(BLANK_SVG, encoding="utf-8")
    return site


@contextlib.contextmanager
def planted(html: Path, site: Path, page: str, text: str):
    """The copy with `page` (a link to the site's) replaced by a file holding `text`, for
    the time of the with block."""
    target = site / page
    if target.is_symlink() or target.exists():
        target.unlink()
    target.write_text(text, encoding="utf-8")
    try:
        yield site
    finally:
        target.unlink()
        if (html / page).exists():
            os.symlink((html / page).resolve(), target)


def check_html(site: Path, repo: Path):
    """check_docs on a site without the browser, in this process: (exit status, output)."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
        rc = check_docs.main(["--html", str(site), "--repo", str(repo), "--chromium", "no"])
    return rc, out.getvalue()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--html", required=True, type=Path)
    ap.add_argument("--repo", required=True, type=Path)
    ap.add_argument("--chromium", choices=("auto", "yes", "no"), default="auto")
    a = ap.parse_args()
    html, repo = a.html.resolve(), a.repo.resolve()
    browser = docs_render.find_chromium()
    if a.chromium == "yes" and not browser:
        print("test_check_docs: FAIL: --chromium yes, but no chromium on PATH")
        return 1
    render = browser is not None and a.chromium != "no"
    problems = []
    with tempfile.TemporaryDirectory(prefix="fa_docs_faults_") as tmp:
        tmp = Path(tmp)
        site = site_copy(html, tmp / "site")
        rc, out = check_html(site, repo)
        if rc != 0:
            print(out)
            print("test_check_docs: FAIL: the untouched site does not pass check_docs")
            return 1
        print("test_check_docs: the untouched site passes (HTML)")
        for name, page, insert, expected in FAULTS:
            text = (html / page).read_text(encoding="utf-8") if (html / page).exists() else ""
            if insert is None:
                new = EMPTY_FILE_PAGE
            else:
                new = text.replace("</div><!-- contents -->", insert + "</div><!-- contents -->", 1)
                if new == text:
                    problems.append(f"{name}: could not plant it in {page} (the page changed shape?)")
                    continue
            with planted(html, site, page, new):
                rc, out = check_html(site, repo)
            report(problems, name, page, rc != 0 and expected in out, rc, expected, out)
        if not render:
            print("test_check_docs: no chromium: the rendering faults are not planted")
        else:
            render_faults(problems, html, site, browser)
    for p in problems:
        print("test_check_docs: FAIL: " + p)
    print("test_check_docs: " + ("PASS" if not problems else f"{len(problems)} failure(s)"))
    return 1 if problems else 0


def report(problems, name, page, caught, rc, expected, out):
    print(f"test_check_docs: {name:<30} planted in {page:<30} {'caught' if caught else 'NOT CAUGHT'}")
    if not caught:
        problems.append(f"{name}: check_docs exited {rc} without '{expected}':\n{out[-1500:]}")


def render_faults(problems, html: Path, site: Path, browser: str):
    """The untouched pages, then each planted copy (planted<k>_<page>, beside the pages it
    links), rendered by one Chromium. (A second one, for the other core, costs about 2 CPU-s, its
    own start and MathJax's first load among them, and saves about 1 s: the reader's faults come
    last in one browser either way.)"""
    width = {"results.html": docs_render.PAGE_WIDTH}
    untouched = sorted({page for _, page, _, _, _ in RENDER_FAULTS})
    planted_pages = []
    for k, (name, page, old, new, expected) in enumerate(RENDER_FAULTS):
        text = (html / page).read_text(encoding="utf-8")
        if old not in text:
            problems.append(f"{name}: could not plant it in {page} (the page changed shape?)")
            continue
        path = site / f"planted{k}_{page}"
        path.write_text(text.replace(old, new, 1), encoding="utf-8")
        planted_pages.append((name, page, expected, path))
    jobs = [(html / page, width.get(page, docs_render.READER_WIDTH)) for page in untouched]
    jobs += [(path, width.get(page, docs_render.READER_WIDTH)) for _, page, _, path in planted_pages]
    reader_results = []
    results = docs_render.render_each(browser, jobs, workers=1, then=lambda b: reader_results.extend(
        reader_faults(html, site, b)) or ([], []))
    bad = [f for failures, _ in results[:len(untouched)] for f in failures]
    if bad:
        problems.append("the untouched pages do not pass in Chromium: " + "; ".join(bad))
        return
    print(f"test_check_docs: the untouched {', '.join(untouched)} pass (Chromium)")
    for (name, page, expected, _), (failures, _) in zip(planted_pages, results[len(untouched):]):
        out = "\n".join(failures)
        report(problems, name, page, expected in out, 1 if failures else 0, expected, out)
    for failure in results[-1][0]:
        problems.append(failure)
    for r in reader_results:
        if r[0] == "untouched":
            if r[1]:
                problems.append("the untouched reader does not pass in Chromium: " + "; ".join(r[1]))
                return
            print(f"test_check_docs: the untouched reader.html#{r[2]} passes (Chromium)")
        elif r[0] == "unplanted":
            problems.append(r[1])
        else:
            name, out, expected = r[1], r[2], r[3]
            report(problems, name, "reader.html", expected in out, 1 if out else 0, expected, out)


def reader_faults(html: Path, site: Path, b):
    """The side-by-side reader on stage 01 in browser b, untouched and with each fault (a
    changed copy, planted<k>_reader.html, and the page it shows planted beside it): a list of
    ("untouched", failures, stage), ("unplanted", message) and ("planted", name, output,
    expected)."""
    stage = next(d.name for d in sorted(Path(check_docs.__file__).resolve().parent.parent.glob("stages/01_*")))
    reader = (html / "reader.html").read_text(encoding="utf-8")
    failures = docs_render.check_reader(b, html / "reader.html", stage)
    out = [("untouched", failures, stage)]
    if failures:
        return out
    for k, (name, (old, new), page, expected) in enumerate(READER_FAULTS):
        if old not in reader:
            out.append(("unplanted", f"{name}: could not plant it in reader.html (the page changed shape?)"))
            continue
        if page:
            source, old_text, new_text = page
            text = (html / source).read_text(encoding="utf-8")
            if old_text not in text:
                out.append(("unplanted", f"{name}: could not plant it in {source} (the page changed shape?)"))
                continue
            (site / f"planted_{source}").write_text(text.replace(old_text, new_text), encoding="utf-8")
        path = site / f"planted{k}_reader.html"
        path.write_text(reader.replace(old, new), encoding="utf-8")
        out.append(("planted", name, "\n".join(docs_render.check_reader(b, path, stage)), expected))
    return out


if __name__ == "__main__":
    sys.exit(main())
