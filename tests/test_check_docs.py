#!/usr/bin/env python3
"""tests/check_docs.py must fail on each class of fault it claims to catch (CTest:
docs_check_faults, after docs_build).

    test_check_docs.py --html BUILD/docs/html --repo ROOT [--chromium auto|yes|no]

For each fault, a copy of the built site (links to its files, the changed page a real file)
gets the fault planted in one page, check_docs runs on it, and must fail with the message of
that fault class. The untouched copy must pass first, so a failure is the plant's doing.
"""
import argparse
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent

# (name, page, text to insert before the page's </div><!-- contents -->, expected message)
FAULTS = [
    ("literal **", "stage_01.html", "<p>a <b>bold</b> word and a **bold** one</p>", "a literal **"),
    ("tag shown as text", "stage_01.html", "<h2>Variants (&lt;tt&gt;--variant&lt;/tt&gt;)</h2>",
     "an HTML tag shown as text, <tt>"),
    ("link text in backticks", "stage_04.html", '<p>see <a href="stage_01.html">`naive.cpp`</a></p>',
     "a literal `code span` in the text"),
    ("link to a missing page", "concept_io.html", '<p><a href="no_such_page.html">x</a></p>',
     "link to no_such_page.html, which is not in the site"),
    ("link to a missing anchor", "stage_02.html", '<p><a href="stage_01.html#no_such_anchor">x</a></p>',
     "stage_01.html has no anchor 'no_such_anchor'"),
    ("file:line autolink", "lab_guide.html", '<p>naming <a href="file:line">file:line</a></p>',
     "a link to 'file:line', which is no web address"),
    ("formula delimiter left", "stage_03.html", "<p>where $$x + y$$ stays raw</p>",
     "a formula delimiter left in the text"),
    ("notebook figure missing", "notebook_05_gpt_capstone.html", '<p><img src="no_such_figure.png" alt=""/></p>',
     "link to no_such_figure.png, which is not in the site"),
    ("notebook figure extra", "notebook_01_softmax_variants.html",
     '<p><img src="notebook_01_softmax_variants_1.png" alt=""/></p>', "figures, but notebooks/"),
]
# Faults only headless Chromium sees: (name, page, old text, new text, expected message).
RENDER_FAULTS = [
    ("figure shown too small", "results.html", '<object type="image/svg+xml" data="roofline.svg"',
     '<object style="width: 380px" type="image/svg+xml" data="roofline.svg"', "(unreadable)"),
    ("figure blank", "results.html", 'data="speed_bf16.svg"', 'data="blank.svg"',
     "figure blank.svg is blank in the screenshot"),
]
BLANK_SVG = '<svg xmlns="http://www.w3.org/2000/svg" width="800" height="600"></svg>\n'


def site_copy(html: Path, tmp: Path, page: str, change) -> Path:
    site = tmp / "html"
    if site.exists():
        shutil.rmtree(site)
    site.mkdir()
    for entry in html.iterdir():
        if entry.name != page:
            os.symlink(entry.resolve(), site / entry.name)
    text = (html / page).read_text(encoding="utf-8")
    (site / page).write_text(change(text), encoding="utf-8")
    (site / "blank.svg").write_text(BLANK_SVG, encoding="utf-8")
    return site


def check(site: Path, repo: Path, chromium: str):
    if chromium == "figures":  # the part of check_docs that a rendering fault reaches
        sys.path.insert(0, str(HERE))
        import docs_render
        failures, _ = docs_render.check_figures(shutil.which("chromium") or shutil.which("chromium-browser")
                                                or shutil.which("google-chrome"), site)
        return (1 if failures else 0), "\n".join(failures)
    r = subprocess.run([sys.executable, str(HERE / "check_docs.py"), "--html", str(site), "--repo", str(repo),
                        "--chromium", chromium], capture_output=True, text=True, timeout=300)
    return r.returncode, r.stdout + r.stderr


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--html", required=True, type=Path)
    ap.add_argument("--repo", required=True, type=Path)
    ap.add_argument("--chromium", choices=("auto", "yes", "no"), default="auto")
    a = ap.parse_args()
    html, repo = a.html.resolve(), a.repo.resolve()
    browser = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
    if a.chromium == "yes" and not browser:
        print("test_check_docs: FAIL: --chromium yes, but no chromium on PATH")
        return 1
    render = browser is not None and a.chromium != "no"
    problems = []
    with tempfile.TemporaryDirectory(prefix="fa_docs_faults_") as tmp:
        tmp = Path(tmp)
        rc, out = check(site_copy(html, tmp, "index.html", lambda t: t), repo, "auto" if render else "no")
        if rc != 0:
            print(out)
            print("test_check_docs: FAIL: the untouched site does not pass check_docs")
            return 1
        print("test_check_docs: the untouched site passes")
        cases = [(n, p, (lambda ins: lambda t: t.replace("</div><!-- contents -->", ins + "</div><!-- contents -->", 1))(i), e, "no")
                 for n, p, i, e in FAULTS]
        if render:
            cases += [(n, p, (lambda o, w: lambda t: t.replace(o, w, 1))(old, new), e, "figures")
                      for n, p, old, new, e in RENDER_FAULTS]
        else:
            print("test_check_docs: no chromium: the rendering faults are not planted")
        for name, page, change, expected, chromium in cases:
            text = (html / page).read_text(encoding="utf-8")
            if change(text) == text:
                problems.append(f"{name}: could not plant it in {page} (the page changed shape?)")
                continue
            rc, out = check(site_copy(html, tmp, page, change), repo, chromium)
            caught = rc != 0 and expected in out
            print(f"test_check_docs: {name:<26} planted in {page:<16} "
                  f"{'caught' if caught else 'NOT CAUGHT'}")
            if not caught:
                problems.append(f"{name}: check_docs exited {rc} without '{expected}':\n{out[-1500:]}")
    for p in problems:
        print("test_check_docs: FAIL: " + p)
    print("test_check_docs: " + ("PASS" if not problems else f"{len(problems)} failure(s)"))
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
