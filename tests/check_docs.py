#!/usr/bin/env python3
"""Checks the generated docs site (CTest: docs_check, after docs_build).

    check_docs.py --html BUILD/docs/html --repo ROOT [--chromium auto|yes|no]

By parsing the HTML (Python standard library only):
  - the main page exists, holds the stage map with one row per stages/NN_* folder, and
    links every stage that has notes;
  - every stages/NN_*/README.md and docs/concepts/*.md became a page (its {#label}.html);
  - every notebooks/NN_*.ipynb became a page (notebook_NN_*.html) that the main page links,
    with one figure per figure output the notebook was committed with;
  - every \\snippet in a page's source produced a code block with at least one non-blank
    line, and every \\f$ \\f$ and \\f[ \\f] formula became MathJax markup (\\( \\), \\[ \\]);
  - every page loads MathJax from the local copy (a relative src, no network), and the
    MathJax files its configuration names are in the site;
  - no lab marker (LAB BEGIN / LAB END) reached any page or source listing;
  - every link on those pages and in the side-by-side reader leads to a file of the site,
    and to an anchor that exists there (a link with a scheme other than http(s), mailto or
    javascript, such as Doxygen's autolink of `file:line`, fails); every link of the other
    pages (the source listings, the folder pages) leads to a file of the site;
  - no rendering fault shows in their text: a literal ** (Markdown emphasis Doxygen left),
    an HTML tag shown as text (`<tt>` in a heading), a code span left in its backticks (the
    text of a link [`x`](page.md), or backticks around a link whose text is code), a formula
    delimiter left over, a control character in a formula (the TAB of a \\t that was \\times);
  - no notebook page shows a Markdown table printed as text (a |---| row in an output);
  - no page is an empty reference page (a "File Reference" with neither a description nor
    a member: Doxygen's page of a generated file).
With headless Chromium (when installed, or --chromium yes), every page with formulas or
figures is rendered (tests/docs_render.py: one Chromium process per core, or --browsers N,
driven over the DevTools pipe), the notes at the width of a pane of the side-by-side reader: its formulas
must come out as typeset MathJax without errors, no display formula clipped at the edge of
the text column; every figure loaded, inside the text column (scaled to the page), readable
(text at least 8 px high) and, for an SVG, not blank in a screenshot. The side-by-side reader
is opened on a stage: its notes pane must show no Doxygen header or tree, and a click on a
code quote's file label must open the source pane at the quoted line.

Exit status 0 when everything holds; otherwise 1, after listing every failure.
"""
import argparse
import html as htmllib
import json
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "docs"))
sys.path.insert(0, str(Path(__file__).resolve().parent))
import notes  # noqa: E402  (docs/notes.py: the notes' plain-Markdown format)
import docs_render  # noqa: E402  (tests/docs_render.py: the pages in headless Chromium)
from docs_html import LinksOnly, Page, anchors, links, parse, visible_text  # noqa: E402  (tests/docs_html.py)

LABEL_RE = re.compile(r"\{#([A-Za-z0-9_]+)\}\s*$")


TABLE_RULE_RE = re.compile(r"^\s*\|?\s*:?-{3,}:?\s*(\|\s*:?-{3,}:?\s*)+\|?\s*$")
TITLE_RE = re.compile(r'<div class="title">(.*?)</div>', re.S)
LITERAL_TAG_RE = re.compile(r"</?[a-zA-Z][a-zA-Z0-9]*(?:\s[^<>]*)?/?>")
ALLOWED_SCHEMES = ("http", "https", "mailto", "javascript")


_CONVERTED = {}


def strip_code(md: str) -> str:
    """Markdown source without fenced code and inline code spans (formulas and commands in
    them are not Doxygen's)."""
    md = re.sub(r"^( {0,3})(```|~~~).*?^\1\2[^\n]*$", "", md, flags=re.S | re.M)
    return re.sub(r"`[^`\n]*`", "", md)


class Checker:
    def __init__(self, html_dir: Path, repo: Path):
        self.html = html_dir
        self.repo = repo
        self.tree = notes.Tree(repo)
        self.failures = []
        self.checked_pages = 0
        self.have_mathjax = self.have_reader = True
        self._link_checked = set()

    def fail(self, msg):
        self.failures.append(msg)

    def converted(self, md_path: Path) -> str:
        """The note as Doxygen read it (docs/notes.py; kept per note and modification time)."""
        key = (str(md_path), md_path.stat().st_mtime_ns)
        if key not in _CONVERTED:
            _CONVERTED[key] = notes.to_doxygen(self.tree, notes.read_note(md_path, self.repo))[0]
        return _CONVERTED[key]

    # ------------------------------------------------------------------ one page
    def check_source_page(self, md_path: Path, role: str):
        """A Markdown page (stage notes or concept page): exists, snippets, formulas. The
        counts come from the note as Doxygen reads it (docs/notes.py converts it)."""
        text = self.converted(md_path)
        first = text.splitlines()[0] if text.strip() else ""
        m = LABEL_RE.search(first)
        rel = md_path.relative_to(self.repo)
        if not m:
            self.fail(f"{rel}: its title has no anchor (<a id=\"...\"></a>), so it has no stable "
                      f"page name")
            return None
        label = m.group(1)
        page_file = self.html / f"{label}.html"
        if not page_file.exists():
            self.fail(f"{rel}: {role} page {page_file.name} was not generated")
            return None
        page = parse(page_file)
        self.checked_pages += 1
        src = strip_code(text)

        # Snippets: one non-empty code block per \snippet (and per \include*).
        n_snippets = len(re.findall(r"^[ \t]*[\\@](?:snippet|snippetlineno|include|includelineno)\b",
                                    src, flags=re.M))
        nonempty = [f for f in page.fragments if any(line.strip() for line in f)]
        empty = len(page.fragments) - len(nonempty)
        if len(nonempty) < n_snippets:
            self.fail(f"{rel}: {n_snippets} \\snippet commands but {len(nonempty)} non-empty "
                      f"code blocks in {page_file.name} ({empty} empty)")
        if empty:
            self.fail(f"{rel}: {page_file.name} has {empty} empty code block(s) (a snippet "
                      f"marker that encloses nothing?)")

        # Formulas: every \f$...\f$ and \f[...\f] became \( \) or \[ \] markup.
        raw = page_file.read_text(encoding="utf-8", errors="replace")
        n_inline = len(re.findall(r"\\f\$", src)) // 2
        n_display = len(re.findall(r"\\f\[", src))
        got_inline = raw.count("\\(")
        got_display = raw.count("\\[")
        if got_inline < n_inline:
            self.fail(f"{rel}: {n_inline} inline formulas in the source, {got_inline} in "
                      f"{page_file.name}")
        if got_display < n_display:
            self.fail(f"{rel}: {n_display} display formulas in the source, {got_display} in "
                      f"{page_file.name}")
        if "\\f$" in raw or "\\f[" in raw:
            self.fail(f"{page_file.name}: raw \\f$ or \\f[ left in the page (a formula Doxygen "
                      f"did not convert)")
        self.check_mathjax_refs(page_file, page)
        self.check_links(page_file, page)
        self.check_text(page_file)
        return label

    def check_mathjax_refs(self, page_file: Path, page: Page):
        if not self.have_mathjax:
            return  # reported once, in run()
        srcs = [s for s, _ in page.scripts if s and "mathjax" in s.lower()]
        if not srcs:
            self.fail(f"{page_file.name}: does not load MathJax")
            return
        for s in srcs:
            if re.match(r"^(https?:)?//", s):
                self.fail(f"{page_file.name}: loads MathJax from the network ({s}); the site "
                          f"must work offline")
                continue
            target = (page_file.parent / s.split("?")[0]).resolve()
            if not target.exists():
                self.fail(f"{page_file.name}: MathJax script {s} is not in the site")
        for _, inline in page.scripts:
            if "MathJax.Hub.Config" not in inline:
                continue
            root = self.html / "mathjax"
            for ext in re.findall(r"\"([A-Za-z0-9_/]+\.js)\"", inline):
                if not (root / "extensions" / ext).exists():
                    self.fail(f"{page_file.name}: MathJax extension {ext} is missing from "
                              f"mathjax/extensions")
            for jax in re.findall(r"\"((?:input|output)/[A-Za-z-]+)\"", inline):
                if not (root / "jax" / jax / "config.js").exists():
                    self.fail(f"{page_file.name}: MathJax {jax} is missing from mathjax/jax")

    def check_text(self, page_file: Path):
        """Rendering faults a reader would see: Markdown emphasis left as literal ** (Doxygen
        1.9 does so next to a formula), an HTML tag shown as text (`<tt>` in a heading), a
        code span left in backticks (Doxygen keeps them in a link's text: [`x`](page.md)),
        formula delimiters MathJax will not read."""
        text = visible_text(page_file)
        for m in re.finditer(r"\*\*", text):
            around = " ".join(text[max(0, m.start() - 30):m.end() + 30].split())
            self.fail(f"{page_file.name}: a literal ** in the text: '{around}'")
            break
        for m in LITERAL_TAG_RE.finditer(text):
            around = " ".join(text[max(0, m.start() - 30):m.end() + 30].split())
            self.fail(f"{page_file.name}: an HTML tag shown as text, {m.group(0)}: '{around}'")
            break
        # (`[^`]*`: a code span in backticks leaves them side by side: `<code>x</code>`)
        for m in re.finditer(r"`[^`\n]*`", text):
            around = " ".join(text[max(0, m.start() - 30):m.end() + 30].split())
            self.fail(f"{page_file.name}: a literal `code span` in the text (backticks Doxygen left, "
                      f"as around a link's text): '{around}'")
            break
        for m in re.finditer(r"\\f[$\[\]]|(?<![\\$])\$\$?(?=[A-Za-z\\{])", text):
            around = " ".join(text[max(0, m.start() - 30):m.end() + 30].split())
            self.fail(f"{page_file.name}: a formula delimiter left in the text: '{around}'")
            break
        # A control character in a formula: a TAB where the \t of \times was (a Python string
        # that was not raw), a form feed for \f of \frac: MathJax shows "N imes N".
        raw = page_file.read_text(encoding="utf-8", errors="replace")
        for m in re.finditer(r"\\\((.*?)\\\)|\\\[(.*?)\\\]", raw, flags=re.S):
            formula = m.group(1) if m.group(1) is not None else m.group(2)
            bad = re.search(r"[\x00-\x09\x0b\x0c\x0e-\x1f]", formula)
            if bad:
                self.fail(f"{page_file.name}: a control character ({bad.group(0)!r}: an escape such as "
                          f"the \\t of \\times eaten?) in the formula '{' '.join(formula.split())[:60]}'")
                break

    def check_links(self, page_file: Path, page: Page):
        """Every link on a page leads somewhere: a file of the site, an anchor that exists
        there, or a URL with a web scheme (Doxygen turns text such as `file:line` into a
        link to the scheme file:, which leads nowhere)."""
        self._link_checked.add(page_file.name)
        for href in page.hrefs:
            scheme = re.match(r"^([a-zA-Z][a-zA-Z0-9+.-]*):", href)
            if scheme:
                if scheme.group(1).lower() not in ALLOWED_SCHEMES:
                    self.fail(f"{page_file.name}: a link to '{href}', which is no web address "
                              f"(text Doxygen took for a URL?)")
                continue
            target, _, anchor = href.partition("#")
            target = target.split("?")[0]
            if target == "reader.html" and not self.have_reader:
                continue
            path = page_file.parent / htmllib.unescape(target) if target else page_file
            if not path.exists():
                self.fail(f"{page_file.name}: link to {href}, which is not in the site")
            elif anchor and path.suffix == ".html" and path.name != "reader.html" \
                    and htmllib.unescape(anchor) not in anchors(path):
                self.fail(f"{page_file.name}: link to {href}: {path.name} has no anchor '{anchor}'")

    def check_notebook_page(self, notebook: Path, main_text: str):
        """A notebook's page (docs/notebook_pages.py): there, linked from the main page,
        its links, text and MathJax sound, and one figure on it per figure the notebook
        was committed with."""
        label = "notebook_" + re.sub(r"[^A-Za-z0-9_]", "_", notebook.stem)
        page_file = self.html / f"{label}.html"
        if not page_file.exists():
            self.fail(f"notebooks/{notebook.name} has no page {page_file.name} (docs/notebook_pages.py)")
            return
        if f'href="{label}.html"' not in main_text:
            self.fail(f"index.html does not link {page_file.name} (notebooks/{notebook.name})")
        page = parse(page_file)
        self.check_mathjax_refs(page_file, page)
        self.check_links(page_file, page)
        self.check_text(page_file)
        # A Markdown table printed as text (print() of a table instead of display(Markdown())):
        # a code block of the page with a |---|---| line.
        for frag in page.fragments:
            if any(TABLE_RULE_RE.match(line) for line in frag):
                self.fail(f"{page_file.name}: a Markdown table printed as text (an output of "
                          f"notebooks/{notebook.name} that shows '|---|' rows; display it as Markdown)")
                break
        cells = json.loads(notebook.read_text(encoding="utf-8")).get("cells", [])
        figures = sum(1 for c in cells for o in c.get("outputs", []) if "image/png" in o.get("data", {}))
        shown = len(re.findall(r'<img src="' + label + r'_[0-9]+\.png"',
                               page_file.read_text(encoding="utf-8", errors="replace")))
        if shown != figures:
            self.fail(f"{page_file.name}: {shown} figures, but notebooks/{notebook.name} has {figures}")

    # ------------------------------------------------------------------ the site
    def run(self):
        index = self.html / "index.html"
        if not index.exists():
            self.fail(f"{index} does not exist: was the docs target built?")
            return
        # Site-level pieces the docs target adds after Doxygen; when they are missing the
        # target did not finish, and every page would repeat the same failure.
        self.have_mathjax = (self.html / "mathjax" / "MathJax.js").exists()
        self.have_reader = (self.html / "reader.html").exists()
        if not self.have_mathjax:
            self.fail("mathjax/MathJax.js is not in the site: the docs target did not finish "
                      "(the local MathJax copy is made after Doxygen succeeds)")
        main = parse(index)
        self.check_mathjax_refs(index, main)
        self.check_links(index, main)
        self.check_text(index)
        main_text = index.read_text(encoding="utf-8", errors="replace")

        stage_dirs = sorted(d for d in (self.repo / "stages").glob("[0-9][0-9]_*") if d.is_dir())
        for d in stage_dirs:
            if d.name not in main_text:
                self.fail(f"index.html: the stage map has no row for {d.name}")
            readme = d / "README.md"
            if readme.exists():
                label = self.check_source_page(readme, "stage")
                if label and f'href="{label}.html"' not in main_text:
                    self.fail(f"index.html: the stage map does not link {label}.html "
                              f"({d.name}'s notes)")
        concepts = sorted((self.repo / "docs" / "concepts").glob("*.md"))
        if not concepts:
            self.fail("docs/concepts/ holds no page")
        for c in concepts:
            self.check_source_page(c, "concept")
        for page in sorted((self.repo / "docs").glob("*.md")):
            if page.name != "mainpage.md":
                self.check_source_page(page, "docs")
        mainpage = self.repo / "docs" / "mainpage.md"
        if mainpage.exists():
            text = strip_code(mainpage.read_text(encoding="utf-8"))
            if len(re.findall(r"\\f\$", text)) // 2 > main_text.count("\\("):
                self.fail("index.html: inline formulas of docs/mainpage.md were not converted")
        for extra in ("stages.html", "results.html"):
            p = self.html / extra
            if not p.exists():
                self.fail(f"{extra} was not generated (docs/gen_pages.py)")
            else:
                self.check_links(p, parse(p))
                self.check_text(p)
        for notebook in sorted((self.repo / "notebooks").glob("[0-9][0-9]_*.ipynb")):
            self.check_notebook_page(notebook, main_text)

        # The side-by-side reader: every stage folder listed, every page it names exists.
        stage_pages = []
        reader = self.html / "reader.html"
        if not reader.exists():
            self.fail("reader.html was not generated (docs/gen_pages.py reader, after Doxygen)")
        else:
            t = reader.read_text(encoding="utf-8")
            m = re.search(r"const STAGES = (\[.*?\]);\n", t, flags=re.S)
            if not m:
                self.fail("reader.html: no stage data")
            else:
                data = json.loads(m.group(1))
                ids = {s["id"] for s in data}
                for d in stage_dirs:
                    if d.name not in ids:
                        self.fail(f"reader.html: stage {d.name} missing")
                for s in data:
                    for href in [s["notes"]] + [f["href"] for f in s["files"]]:
                        if not href:
                            continue
                        if not (self.html / href).exists():
                            self.fail(f"reader.html: {s['id']} names {href}, which is not in "
                                      f"the site")
                        else:
                            stage_pages.append(self.html / href)
                    if not s["files"]:
                        self.fail(f"reader.html: {s['id']} has no source file")

        # Every other page (the source listings, the folder pages): its links lead somewhere.
        for f in sorted(self.html.glob("*.html")):
            if f.name not in self._link_checked and f.name != "reader.html":
                self.check_links(f, LinksOnly(links(f)))

        # No empty reference page: a "File Reference" (Doxygen writes one for a file it
        # documents, a generated note's among them) with neither a description nor a member.
        for f in sorted(self.html.glob("*.html")):
            raw = f.read_text(encoding="utf-8", errors="replace")
            title = TITLE_RE.search(raw)
            if title and "Reference" in title.group(1):
                body = raw[raw.find('<div class="contents">'):raw.find("<!-- contents -->")]
                if not re.search(r"memitem|memItemLeft", body) and not re.search(r'class="textblock"><p', body):
                    self.fail(f"{f.name}: an empty page, '{htmllib.unescape(title.group(1).strip())}' "
                              f"(a reference page with neither a description nor a member)")

        # No lab marker in a stage's notes or annotated source, or in a concept page: the
        # docs show the solution, as a plain program.
        stage_pages += sorted(self.html.glob("concept_*.html"))
        for f in stage_pages:
            text = htmllib.unescape(re.sub(r"<[^>]*>", "", f.read_text(encoding="utf-8", errors="replace")))
            if "LAB " not in text:
                continue  # no marker on the page: its lines need no look (most pages)
            for line in text.splitlines():
                code = re.sub(r"^\s*\d+\s?", "", line).strip()
                if re.match(r"//\s*LAB (BEGIN:|END$)", code):
                    self.fail(f"{f.name}: shows the lab marker '{code[:40]}' (the docs "
                              f"filter should blank it)")
        print(f"check_docs: {self.checked_pages} note/concept pages, {len(stage_dirs)} stage "
              f"folders checked")

    # ------------------------------------------------------------------ rendering
    def render(self, chromium: str, browsers: int | None = None):
        """Every page with formulas or figures, in headless Chromium (tests/docs_render.py):
        the notes, concept, notebook and other pages at the width of a pane of the
        side-by-side reader, the results page at a window's; formulas typeset, none
        clipped, figures loaded, inside the text column, readable and painted."""
        pages = [(self.html / "results.html", docs_render.PAGE_WIDTH)]
        for pattern in ("index.html", "stage_[0-9][0-9].html", "concept_*.html", "notebook_*.html",
                        "design.html", "lab_guide.html"):
            pages += [(p, docs_render.READER_WIDTH) for p in sorted(self.html.glob(pattern))]
        # and the side-by-side reader, on the first stage whose notes quote code
        stage = next((d.name for d in sorted((self.repo / "stages").glob("[0-9][0-9]_*"))
                      if (self.html / f"stage_{d.name[:2]}.html").exists()
                      and 'class="snippetfile"><a ' in (self.html / f"stage_{d.name[:2]}.html").read_text(
                          encoding="utf-8", errors="replace")), None)
        def open_reader(b):
            return docs_render.check_reader(b, self.html / "reader.html", stage), []
        reader = open_reader if stage and self.have_reader else None
        results = docs_render.render_each(chromium, [(p, w) for p, w in pages if p.exists()], then=reader,
                                          workers=browsers)
        for failures, notes_ in results:
            for n in notes_:
                if "formulas typeset" in n or "results.html" in n:
                    print(f"check_docs: chromium: {n}")
            for f in failures:
                self.fail(f)
        print(f"check_docs: chromium rendered {len(pages)} pages")
        if reader:
            print(f"check_docs: chromium: the reader at #{stage}: the notes pane without Doxygen's "
                  f"header and tree, a code quote's file label opening the source pane"
                  + (" (failed)" if results[-1][0] else ""))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--html", required=True, type=Path)
    ap.add_argument("--repo", required=True, type=Path)
    ap.add_argument("--chromium", choices=("auto", "yes", "no"), default="auto")
    ap.add_argument("--browsers", type=int, default=None,
                    help="Chromium processes that share the pages (default: one per core, at most 2)")
    args = ap.parse_args(argv)
    c = Checker(args.html.resolve(), args.repo.resolve())
    c.run()
    browser = docs_render.find_chromium()
    if args.chromium == "yes" and not browser:
        c.fail("--chromium yes, but no chromium on PATH")
    elif args.chromium != "no" and browser and not c.failures:
        c.render(browser, args.browsers)
    elif args.chromium == "auto" and not browser:
        print("check_docs: no chromium on PATH; rendering not checked (the HTML was)")
    for f in c.failures:
        print("FAIL: " + f)
    print("check_docs: " + ("PASS" if not c.failures else f"{len(c.failures)} failure(s)"))
    return 0 if not c.failures else 1


if __name__ == "__main__":
    sys.exit(main())
