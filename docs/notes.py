#!/usr/bin/env python3
"""The course notes: plain Markdown in the repository, Doxygen Markdown on the site.

A note (a stage's README.md, docs/*.md, docs/concepts/*.md) is written so that it reads as
it is, on GitHub, in an editor or any Markdown viewer, math and code included; the docs build
converts a copy of it, line for line, into what Doxygen reads. The format:

    # Stage 05: one fused pass <a id="stage_05"></a>      title; the anchor is the page name
    ## How the tests catch a mistake <a id="stage_05_tests"></a>   a section with a stable anchor
    $m' = \\max(m, s)$   inline math      $$ O = PV $$   display math (may span lines)
    <!-- snippet: one_pass_fused.cpp fused pass -->      code quoted from a source file: the
    ```cpp                                               fenced block under the marker holds the
    ...                                                  snippet's current text (`notes.py sync`
    ```                                                  writes it; the docs test fails if stale)
    [stage 04](../04_two_pass_online/README.md)          a link to a note (or note.md#anchor)
    [naive.cpp](naive.cpp)                               a link to a source file (its annotated
                                                         page on the site)
    [Concepts](concepts/index.md "subpage")              a sub-page in the site's page tree
    <!-- toc -->                                         the site's table of contents
    <!-- include: stage_table.md -->                     a generated table (site only)
    ![caption](../results/figures/roofline.svg)          a figure (an image line of its own)
    <!-- lab-hint: 05 online update                      prose that a lab tree shows where
    What the region must do, in words. -->               stage 05's region "online update" is
                                                         stubbed (hidden elsewhere)

A literal dollar sign is written `\\$`. Links to other files of the repository (CSV,
notebooks, scripts) become their path in code type on the site.

    notes.py doxygen --repo ROOT --out DIR   every note converted for Doxygen into DIR, under
                                             its path in the repository (line numbers kept)
    notes.py sync [--check] [--repo ROOT] [FILES]
                                             refresh the code under every snippet marker from
                                             the sources (--check: exit 1 and list stale ones)
    notes.py check [--repo ROOT] [--strict]  every note: snippets current, no Doxygen-only
                                             syntax in a note of this format (--strict: and no
                                             note left in the old Doxygen format)
    notes.py migrate FILES                   rewrite notes written in Doxygen Markdown (\\f$,
                                             \\snippet, \\ref, {#label}) into this format

Python standard library only.
"""
from __future__ import annotations

import argparse
import re
import sys
from dataclasses import dataclass
from pathlib import Path

SOURCE_EXTS = (".h", ".hpp", ".cpp", ".cu", ".cuh")
IMAGE_DIRS = ("docs/results/figures", "docs/figures")
# Pages the docs build generates (docs/gen_pages.py); a note links to them by these files,
# which read well in plain Markdown too.
GENERATED_PAGES = {"docs/results/README.md": "results", "stages/README.md": "stages"}

ANCHOR = r'<a\s+(?:id|name)="([A-Za-z0-9_]+)"\s*>\s*</a>'
HEADING_RE = re.compile(r"^(#{1,6})[ \t]+(.*?)[ \t]*(?:" + ANCHOR + r")?[ \t]*$")
OLD_HEADING_RE = re.compile(r"^(#{1,6})[ \t]+(.*?)[ \t]*\{#([A-Za-z0-9_]+)\}[ \t]*$")
ANCHOR_LINE_RE = re.compile(r"^[ \t]*" + ANCHOR + r"[ \t]*$")
SNIPPET_RE = re.compile(r"^([ \t]*)<!--[ \t]*snippet:[ \t]*(\S+)[ \t]+(.*?)[ \t]*-->[ \t]*$")
FENCE_RE = re.compile(r"^([ \t]*)(```+|~~~+)(.*)$")
LINK_RE = re.compile(r"(!?)\[((?:[^\[\]]|\[[^\]]*\])*)\]\(([^()\s]+)(?:[ \t]+\"([^\"]*)\")?\)")
DOXYGEN_ONLY_RE = re.compile(r"\\f[$\[\]]|^[ \t]*[\\@](?:snippet|subpage|image|includedoc|ref)\b"
                             r"|[\\@]ref\b|\{#[A-Za-z0-9_]+\}[ \t]*$|^\[TOC\]", re.M)


class NoteError(Exception):
    """A problem in a note; the message starts with file:line."""


# ----------------------------------------------------------------------------- the tree
@dataclass
class Note:
    path: Path      # absolute
    rel: str        # relative to the repository, with '/'
    text: str
    label: str | None
    title: str
    legacy: bool    # still written in Doxygen Markdown


def note_files(repo: Path) -> list[Path]:
    """Every note: the stages' README.md, docs/*.md, docs/concepts/*.md."""
    files = sorted(p for p in (repo / "stages").glob("[0-9][0-9]_*/README.md"))
    files += sorted(p for p in (repo / "docs").glob("*.md"))
    files += sorted((repo / "docs" / "concepts").glob("*.md"))
    return files


def is_legacy(text: str) -> bool:
    """True for a note still in Doxygen Markdown (a {#label} title or \\f$ math)."""
    first = text.splitlines()[0] if text else ""
    return bool(OLD_HEADING_RE.match(first)) or "\\f$" in strip_code(text) or "\\f[" in strip_code(text)


def read_note(path: Path, repo: Path) -> Note:
    text = path.read_text(encoding="utf-8")
    rel = path.resolve().relative_to(repo.resolve()).as_posix()
    first = text.splitlines()[0] if text.strip() else ""
    label, title = None, first.lstrip("# ").strip()
    m = OLD_HEADING_RE.match(first)
    if m:
        label, title = m.group(3), m.group(2)
    else:
        m = HEADING_RE.match(first)
        if m and m.group(1) == "#":
            label, title = m.group(3), m.group(2)
    return Note(path.resolve(), rel, text, label, title, is_legacy(text))


class Tree:
    """What a conversion needs to know about the repository."""

    def __init__(self, repo: Path):
        self.repo = repo.resolve()
        self.notes = {n.rel: n for n in (read_note(p, self.repo) for p in note_files(self.repo))}
        self.labels = {n.label: n for n in self.notes.values() if n.label}
        self.anchor_file = {}   # section anchor → note (for migration)
        for n in self.notes.values():
            for line in n.text.splitlines():
                m = OLD_HEADING_RE.match(line) or HEADING_RE.match(line)
                if m and m.group(3):
                    self.anchor_file[m.group(3)] = n
                m = ANCHOR_LINE_RE.match(line)
                if m:
                    self.anchor_file[m.group(1)] = n
        self._names = None

    def source_names(self) -> dict[str, list[Path]]:
        """File name → the Doxygen inputs (common/, stages/) with that name."""
        if self._names is None:
            self._names = {}
            for top in (self.repo / "common", self.repo / "stages"):
                for p in sorted(top.rglob("*")):
                    if p.is_file() and p.suffix in SOURCE_EXTS:
                        self._names.setdefault(p.name, []).append(p)
        return self._names

    def source_page(self, path: Path) -> str | None:
        """The Doxygen page of a source file's annotated listing (FULL_PATH_NAMES = YES,
        SHORT_NAMES = NO): naive.cpp → naive_8cpp_source.html; a name that several inputs
        share takes its folder too (01_naive/main.cpp → 01__naive_2main_8cpp_source.html)."""
        same = self.source_names().get(path.name, [])
        if path not in same:
            return None
        name = path.name if len(same) == 1 else f"{path.parent.name}/{path.name}"
        if not re.fullmatch(r"[A-Za-z0-9_./\-]+", name):
            return None
        return name.replace("_", "__").replace("/", "_2").replace(".", "_8") + "_source.html"

    def example_file(self, name: str, note_dir: Path) -> Path | None:
        """Where Doxygen finds `\\snippet name`: the note's own folder first, then the
        docs' EXAMPLE_PATH (every stage folder, stages/, common/, the repository root)."""
        dirs = [note_dir] + sorted(d for d in (self.repo / "stages").glob("[0-9][0-9]_*") if d.is_dir())
        dirs += [self.repo / "stages", self.repo / "common", self.repo]
        for d in dirs:
            p = d / name
            if p.is_file():
                return p.resolve()
        return None


# ----------------------------------------------------------------------------- spans
CODE_SPAN_RE = re.compile(r"(`+)(.+?)(?<!`)\1(?!`)")
DISPLAY_INLINE_RE = re.compile(r"(?<!\\)\$\$(.+?)(?<!\\)\$\$")
INLINE_MATH_RE = re.compile(r"(?<![\\$\w])\$(?![\s$])((?:[^$\\\n]|\\.)+?)(?<![\s\\])\$(?![$\w])")


def strip_code(md: str) -> str:
    """Markdown without fenced code blocks and code spans."""
    md = re.sub(r"^( {0,3})(```|~~~).*?^\1\2[^\n]*$", "", md, flags=re.S | re.M)
    return re.sub(r"`[^`\n]*`", "", md)


class Protect:
    """Replaces spans by placeholders (\\x00N\\x00) and puts them back."""

    def __init__(self):
        self.spans: list[str] = []

    def put(self, s: str) -> str:
        self.spans.append(s)
        return f"\x00{len(self.spans) - 1}\x00"

    def restore(self, s: str) -> str:
        while "\x00" in s:
            s = re.sub(r"\x00(\d+)\x00", lambda m: self.spans[int(m.group(1))], s)
        return s


def split_fences(lines: list[str]):
    """Yields (index, line, in_fence) with the fence lines themselves counted as in_fence."""
    fence = None
    for i, line in enumerate(lines):
        m = FENCE_RE.match(line)
        if fence is None and m and len(m.group(1)) <= 3:
            fence = m.group(2)[0] * 3
            yield i, line, True
        elif fence is not None:
            yield i, line, True
            if line.strip().startswith(fence) and line.strip().strip(fence[0]) == "":
                fence = None
        else:
            yield i, line, False


# ----------------------------------------------------------------------------- snippets
MARKER_LINE_RE = re.compile(r"^\s*//!\s*\[[^\]]+\]\s*$")
LAB_LINE_RE = re.compile(r"^\s*//\s*LAB (BEGIN:.*|END\s*)$")


def snippet_text(source: Path, name: str, keep_lab_markers: bool = False) -> str | None:
    """The code between the two lines that hold `[name]` in `source` (Doxygen's \\snippet),
    without snippet marker lines and (unless kept) lab marker lines, dedented."""
    lines = source.read_text(encoding="utf-8", errors="replace").splitlines()
    tag = f"[{name}]"
    at = [i for i, line in enumerate(lines) if tag in line]
    if len(at) < 2:
        return None
    body = [line.rstrip() for line in lines[at[0] + 1:at[1]]
            if not MARKER_LINE_RE.match(line) and (keep_lab_markers or not LAB_LINE_RE.match(line))]
    while body and not body[0].strip():
        body.pop(0)
    while body and not body[-1].strip():
        body.pop()
    indent = min((len(line) - len(line.lstrip()) for line in body if line.strip()), default=0)
    return "\n".join(line[indent:] for line in body)


def fence_language(path: Path) -> str:
    return {".cu": "cuda", ".cuh": "cuda", ".py": "python", ".sh": "sh"}.get(path.suffix, "cpp")


def snippet_blocks(lines: list[str], where: str):
    """(marker index, end index exclusive, indent, file, name) of every snippet block."""
    blocks = []
    i = 0
    while i < len(lines):
        m = SNIPPET_RE.match(lines[i])
        if not m:
            i += 1
            continue
        indent, file, name = m.group(1), m.group(2), m.group(3)
        end = i + 1
        if end < len(lines) and FENCE_RE.match(lines[end]):
            fence = FENCE_RE.match(lines[end]).group(2)
            end += 1
            while end < len(lines) and lines[end].strip() != fence:
                end += 1
            if end == len(lines):
                raise NoteError(f"{where}:{i + 2}: the code block of snippet '{name}' is never closed")
            end += 1
        blocks.append((i, end, indent, file, name))
        i = end
    return blocks


def sync_text(text: str, note_path: Path, tree: Tree, keep_lab_markers: bool = False) -> str:
    """`text` with the fenced block under every snippet marker replaced by the snippet's
    current text (a marker without a block gets one)."""
    lines = text.split("\n")
    where = note_path.relative_to(tree.repo).as_posix() if note_path.is_relative_to(tree.repo) else str(note_path)
    out, last = [], 0
    for start, end, indent, file, name in snippet_blocks(lines, where):
        src = tree.example_file(file, note_path.parent)
        if src is None:
            raise NoteError(f"{where}:{start + 1}: snippet file '{file}' not found (looked in the "
                            f"note's folder, every stage folder, stages/, common/, the repository)")
        code = snippet_text(src, name, keep_lab_markers)
        if code is None:
            raise NoteError(f"{where}:{start + 1}: '{src.relative_to(tree.repo)}' has no snippet "
                            f"'{name}' (two lines '//! [{name}]')")
        out += lines[last:start + 1]
        out.append(f"{indent}```{fence_language(src)}")
        out += [(indent + c) if c else "" for c in code.split("\n")]
        out.append(f"{indent}```")
        last = end
    out += lines[last:]
    return "\n".join(out)


# ----------------------------------------------------------------------------- to Doxygen
def heading_text(text: str) -> str:
    """A heading as Doxygen 1.9 shows it without literal tags: code spans become plain
    text (their hyphens non-breaking, so `--variant` keeps its two dashes), emphasis marks
    are dropped."""
    text = CODE_SPAN_RE.sub(lambda m: m.group(2).strip().replace("-", "\u2011"), text)
    return re.sub(r"\*\*(.+?)\*\*|(?<![\w*])\*(?=\S)(.+?)(?<=\S)\*(?![\w*])",
                  lambda m: m.group(1) or m.group(2), text)


def emphasis(line: str) -> str:
    """**x** and *x* as HTML: Doxygen 1.9 leaves the marks literal next to a formula."""
    line = re.sub(r"\*\*(?=\S)(.+?)(?<=\S)\*\*", r"<b>\1</b>", line)
    return re.sub(r"(?<![\w*\\])\*(?=[^\s*])(.+?)(?<=[^\s*\\])\*(?![\w*])", r"<em>\1</em>", line)


def no_autolink(text: str) -> str:
    """Doxygen links any 'file:…' (even in code) to the scheme file:, which leads nowhere;
    an invisible word joiner after 'file' stops it."""
    return re.sub(r"\bfile:(?!//)", "file\u2060:", text)


class Converter:
    """One note, plain Markdown → Doxygen Markdown, line for line."""

    def __init__(self, tree: Tree, note: Note, site_extras: bool = True):
        self.tree, self.note, self.site_extras = tree, note, site_extras
        self.dir = note.path.parent
        self.errors: list[str] = []

    def where(self, i: int) -> str:
        return f"{self.note.rel}:{i + 1}"

    # --- links
    def resolve(self, target: str):
        """(kind, value) for a link target: ('url', t), ('ref', label), ('anchor', a),
        ('source', page), ('file', repo-relative path) or ('missing', path)."""
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):
            return "url", target
        if target.startswith("#"):
            return "anchor", target[1:]
        path, _, anchor = target.partition("#")
        full = (self.dir / path).resolve()
        try:
            rel = full.relative_to(self.tree.repo).as_posix()
        except ValueError:
            return "missing", target
        if rel in GENERATED_PAGES:
            return "ref", anchor or GENERATED_PAGES[rel]
        if rel in self.tree.notes:
            note = self.tree.notes[rel]
            return "ref", anchor or note.label or rel
        if not full.exists():
            return "missing", rel
        if full.is_file() and full.suffix in SOURCE_EXTS:
            page = self.tree.source_page(full)
            if page:
                return "source", page
        return "file", rel

    def link(self, m: re.Match, i: int, protect: Protect) -> str:
        bang, text, target, title = m.group(1), m.group(2), m.group(3), m.group(4)
        kind, value = self.resolve(target)
        if bang:
            return m.group(0)  # images are handled per line
        if kind == "missing":
            self.errors.append(f"{self.where(i)}: link to {target}, which does not exist")
            return m.group(0)
        if title == "subpage":
            if kind != "ref":
                self.errors.append(f"{self.where(i)}: a \"subpage\" link must point at a note")
                return m.group(0)
            return protect.put(f'\\subpage {value} "{text}"')
        if kind == "url":
            return m.group(0)
        if kind in ("ref", "anchor"):
            return f"[{text}](@ref {value})" if kind == "ref" else f"[{text}](#{value})"
        if kind == "source":
            return f"[{text}]({value})"
        # Another file of the repository: not part of the site; its path, in code type.
        if CODE_SPAN_RE.fullmatch(protect.restore(text).strip()):
            return text
        return f"{text} (`{value}`)"

    # --- one line of prose
    def inline(self, line: str, i: int) -> str:
        protect = Protect()
        line = CODE_SPAN_RE.sub(lambda m: protect.put(no_autolink(m.group(0))), line)
        line = re.sub(r"<!--.*?-->", lambda m: protect.put(m.group(0)), line)
        line = no_autolink(line)
        line = DISPLAY_INLINE_RE.sub(lambda m: protect.put(f"\\f[{m.group(1)}\\f]"), line)
        line = INLINE_MATH_RE.sub(lambda m: protect.put(f"\\f${m.group(1)}\\f$"), line)
        line = line.replace("\\$", protect.put("\\$"))
        if "$" in line:
            self.errors.append(f"{self.where(i)}: a '$' that opens no formula on this line (inline "
                               f"math opens and closes on one line; a literal dollar is \\$)")
        line = LINK_RE.sub(lambda m: protect.put(self.link(m, i, protect)), line)
        return protect.restore(emphasis(line))

    @staticmethod
    def open_display(line: str) -> int | None:
        """Where a $$ opens a display formula that closes on a later line, or None."""
        masked = CODE_SPAN_RE.sub(lambda m: " " * len(m.group(0)), line)
        masked = DISPLAY_INLINE_RE.sub(lambda m: " " * len(m.group(0)), masked)
        k = masked.find("$$")
        return k if k >= 0 and masked[k - 1:k] != "\\" else None

    def image(self, line: str, i: int) -> str | None:
        m = re.match(r"^([ \t]*)!\[([^\]]*)\]\(([^()\s]+)\)[ \t]*$", line)
        if not m:
            return None
        full = (self.dir / m.group(3)).resolve()
        try:
            rel = full.relative_to(self.tree.repo).as_posix()
        except ValueError:
            rel = m.group(3)
        if not full.is_file() or not any(rel.startswith(d + "/") for d in IMAGE_DIRS):
            self.errors.append(f"{self.where(i)}: image {m.group(3)} is not a file under "
                               f"{' or '.join(IMAGE_DIRS)}")
            return line
        caption = m.group(2).replace('"', "'")
        return f'{m.group(1)}\\image html {full.name} "{caption}"'

    def snippet_caption(self, file: str) -> str:
        src = self.tree.example_file(file, self.dir)
        page = self.tree.source_page(src) if src else None
        name = src.name if src else file
        link = f'<a href="{page}">{name}</a>' if page else name
        return f'<div class="snippetfile">{link}</div>'

    def legacy(self) -> str:
        """A note still in Doxygen Markdown, passed through with the fixes of rendering
        faults Doxygen 1.9 makes: emphasis next to a formula, code in a heading, file:line."""
        lines = self.note.text.split("\n")
        fenced = {i for i, _, f in split_fences(lines) if f}
        for i, line in enumerate(lines):
            if i in fenced or re.match(r"^[ \t]*[\\@]", line):
                continue
            m = OLD_HEADING_RE.match(line) or re.match(r"^(#{1,6})[ \t]+(.*?)[ \t]*()$", line)
            if m:
                lines[i] = f"{m.group(1)} {heading_text(m.group(2))}" + (f" {{#{m.group(3)}}}" if m.group(3) else "")
                continue
            protect = Protect()
            line = CODE_SPAN_RE.sub(lambda mm: protect.put(no_autolink(mm.group(0))), line)
            line = re.sub(r"\\f\$.*?\\f\$|\\f\[.*?\\f\]", lambda mm: protect.put(mm.group(0)), line)
            lines[i] = protect.restore(emphasis(no_autolink(line)))
        return "\n".join(lines)

    def convert(self) -> str:
        if self.note.legacy:
            return self.legacy()
        lines = self.note.text.split("\n")
        out = list(lines)
        # Snippet blocks: the caption and \snippet on the marker's two lines, blanks after.
        skip = set()
        for start, end, indent, file, name in snippet_blocks(lines, self.note.rel):
            out[start] = indent + self.snippet_caption(file)
            block = [indent + f"\\snippet {file} {name}"] + [""] * (end - start - 2)
            out[start + 1:end] = block
            skip.update(range(start, end))
        in_math = False
        in_comment = False
        fenced = {i for i, _, f in split_fences(lines) if f}
        for i, line in enumerate(lines):
            if i in skip or i in fenced:
                continue
            if in_comment:
                if "-->" in line:
                    in_comment = False
                out[i] = ""
                continue
            if re.match(r"^[ \t]*<!--[ \t]*lab-hint:", line) and "-->" not in line:
                in_comment = True
                out[i] = ""
                continue
            stripped = line.strip()
            if in_math:
                k = line.find("$$")
                if k < 0:
                    continue  # a line inside a display formula
                out[i] = line[:k] + "\\f]" + self.inline(line[k + 2:], i)
                in_math = False
                continue
            opened = self.open_display(line)
            if opened is not None:
                out[i] = self.inline(line[:opened], i) + "\\f[" + line[opened + 2:]
                in_math = True
                continue
            if stripped == "<!-- toc -->":
                out[i] = "[TOC]"
                continue
            m = re.match(r"^([ \t]*)<!--[ \t]*include:[ \t]*(\S+)[ \t]*-->[ \t]*$", line)
            if m:
                out[i] = f"{m.group(1)}\\includedoc {m.group(2)}"
                continue
            m = ANCHOR_LINE_RE.match(line)
            if m:
                out[i] = f"\\anchor {m.group(1)}"
                continue
            img = self.image(line, i)
            if img is not None:
                out[i] = img
                continue
            m = HEADING_RE.match(line)
            if m:
                hashes, text, label = m.group(1), m.group(2), m.group(3)
                if i == 0 and self.site_extras and not label:
                    self.errors.append(f"{self.where(i)}: the title has no <a id=\"...\"></a> "
                                       f"anchor (the page's name on the site)")
                out[i] = f"{hashes} {self.inline(heading_text(text), i)}" + (f" {{#{label}}}" if label else "")
                continue
            out[i] = self.inline(line, i)
        if in_math:
            self.errors.append(f"{self.note.rel}: a $$ display formula is never closed")
        return "\n".join(out)


def to_doxygen(tree: Tree, note: Note) -> tuple[str, list[str]]:
    c = Converter(tree, note)
    text = c.convert()
    return text, c.errors


# ----------------------------------------------------------------------------- migration
def migrate_text(text: str, note_path: Path, tree: Tree) -> str:
    """A note in Doxygen Markdown rewritten into the plain format (then `sync` fills the
    snippets' code). Headings' {#label} become anchors, \\f$ \\f[ become $ $$, \\ref and
    \\subpage become links to the note's file, \\snippet becomes a marker and its code."""
    here = note_path.parent

    def rel_to(n: Note) -> str:
        return Path(_relpath(n.path, here)).as_posix()

    def ref(label: str, text: str | None) -> str:
        if label in tree.labels:
            n = tree.labels[label]
            return f"[{text or n.title}]({rel_to(n) if n.path != note_path else ''})"
        for rel, lab in GENERATED_PAGES.items():
            if lab == label:
                return f"[{text or label}]({_relpath(tree.repo / rel, here)})"
        if label in tree.anchor_file:
            n = tree.anchor_file[label]
            target = "" if n.path == note_path else rel_to(n)
            return f"[{text or label}]({target}#{label})"
        raise NoteError(f"{note_path}: \\ref {label}: no note or section has that label")

    out = []
    lines = text.split("\n")
    fenced = {i for i, _, f in split_fences(lines) if f}
    # An inline formula that wraps onto the next line is joined onto one line (the plain
    # format keeps each inline formula on one line).
    i = 0
    while i < len(lines) - 1:
        if i not in fenced and len(re.findall(r"\\f\$", CODE_SPAN_RE.sub("", lines[i]))) % 2 == 1:
            nxt = lines[i + 1]
            k = nxt.find("\\f$")
            if k >= 0:  # the formula's closing \f$ and what sticks to it (punctuation)
                k += 3
                while k < len(nxt) and not nxt[k].isspace():
                    k += 1
            take = nxt if k < 0 else nxt[:k]
            lines[i] = lines[i].rstrip() + " " + take.strip()
            rest = "" if k < 0 else nxt[k:].lstrip()
            if rest:
                lines[i + 1] = rest
            else:
                del lines[i + 1]
                fenced = {j - 1 if j > i else j for j in fenced}
            continue
        i += 1
    for i, line in enumerate(lines):
        if i in fenced:
            out.append(line)
            continue
        m = OLD_HEADING_RE.match(line)
        if m:
            line = f"{m.group(1)} {m.group(2)} <a id=\"{m.group(3)}\"></a>"
        if line.strip() == "[TOC]":
            out.append("<!-- toc -->")
            continue
        m = re.match(r"^([ \t]*)[\\@]snippet(?:\{[^}]*\})?[ \t]+(\S+)[ \t]+(.*?)[ \t]*$", line)
        if m:
            out.append(f"{m.group(1)}<!-- snippet: {m.group(2)} {m.group(3)} -->")
            continue
        m = re.match(r"^([ \t]*)[\\@]image[ \t]+html[ \t]+(\S+)(?:[ \t]+\"([^\"]*)\")?.*$", line)
        if m:
            found = [tree.repo / d / m.group(2) for d in IMAGE_DIRS if (tree.repo / d / m.group(2)).is_file()]
            target = _relpath(found[0], here) if found else m.group(2)
            out.append(f"{m.group(1)}![{m.group(3) or ''}]({target})")
            continue
        m = re.match(r"^([ \t]*)[\\@]includedoc[ \t]+(\S+)[ \t]*$", line)
        if m:
            out.append(f"{m.group(1)}<!-- include: {m.group(2)} -->")
            continue
        protect = Protect()
        line = CODE_SPAN_RE.sub(lambda mm: protect.put(mm.group(0)), line)
        line = re.sub(r"\\f\$(.*?)\\f\$", lambda mm: protect.put(f"${mm.group(1).strip()}$"), line)
        line = line.replace("\\f[", "$$").replace("\\f]", "$$")
        line = re.sub(r'[\\@]subpage[ \t]+([A-Za-z0-9_]+)(?:[ \t]+"([^"]*)")?',
                      lambda mm: protect.put(_subpage(ref(mm.group(1), mm.group(2)))), line)
        line = re.sub(r'[\\@]ref[ \t]+([A-Za-z0-9_]+)(?:[ \t]+"([^"]*)")?',
                      lambda mm: protect.put(ref(mm.group(1), mm.group(2))), line)
        line = re.sub(r"\]\(#([A-Za-z0-9_]+)\)",
                      lambda mm: protect.put("](" + ref(mm.group(1), "x").split("](", 1)[1]), line)
        line = re.sub(r"(?<![\\$])\$(?!\$)", r"\\$", line)  # a literal $ left in the prose
        out.append(protect.restore(line))
    return sync_text("\n".join(out), note_path, tree)


def _subpage(link: str) -> str:
    return link[:-1] + ' "subpage")'


def _relpath(target: Path, start: Path) -> str:
    import os
    return os.path.relpath(target, start).replace(os.sep, "/")


# ----------------------------------------------------------------------------- labs
LAB_HINT_RE = re.compile(r"^[ \t]*<!--[ \t]*lab-hint:[ \t]*(\d\d)[ \t]+(.+?)[ \t]*$", re.M)
LAB_BEGIN_RE = re.compile(r"^\s*//\s*LAB BEGIN:\s*(.+?)\s+(?:—|-)\s+hint:", re.M)


def lab_regions(repo: Path) -> dict[str, set[str]]:
    """Stage number → the names of its lab regions (the LAB BEGIN lines of its sources)."""
    found: dict[str, set[str]] = {}
    for folder in sorted((repo / "stages").glob("[0-9][0-9]_*")):
        for p in folder.rglob("*"):
            if p.is_file() and p.suffix in SOURCE_EXTS:
                for m in LAB_BEGIN_RE.finditer(p.read_text(encoding="utf-8", errors="replace")):
                    found.setdefault(folder.name[:2], set()).add(m.group(1))
    return found


def show_lab_hints(text: str, stubbed: set[tuple[str, str]]) -> str:
    """For a lab tree: each lab-hint comment of a stubbed (stage, region) becomes a quoted
    paragraph the student sees; the others stay hidden comments."""
    lines, out, k = text.split("\n"), [], 0
    fenced = {i for i, _, f in split_fences(lines) if f}
    while k < len(lines):
        m = LAB_HINT_RE.match(lines[k])
        if not m or k in fenced or (m.group(1), m.group(2)) not in stubbed:
            out.append(lines[k])
            k += 1
            continue
        end = k
        while "-->" not in lines[end]:
            end += 1
        body = [ln.strip() for ln in lines[k + 1:end + 1]]
        body[-1] = body[-1].replace("-->", "").rstrip()
        out.append(f'> **Lab: you write this.** Stage {m.group(1)}\'s region "{m.group(2)}" is '
                   f"stubbed in this tree: the code above shows its `LAB BEGIN` line with a hint.")
        out += [("> " + ln) if ln else ">" for ln in body]
        k = end + 1
    return "\n".join(out)


# ----------------------------------------------------------------------------- checks
def check_note(tree: Tree, note: Note) -> list[str]:
    """Problems of one note: stale snippets, Doxygen-only syntax in a plain note, and what
    the conversion refuses (missing link targets, images, snippet files)."""
    if note.legacy:
        return []
    problems = []
    for m in DOXYGEN_ONLY_RE.finditer(strip_code(note.text)):
        line = note.text[:note.text.find(m.group(0))].count("\n") + 1
        problems.append(f"{note.rel}:{line}: Doxygen-only syntax '{m.group(0).strip()}' in a "
                        f"plain-Markdown note (see docs/notes.py for the format)")
    regions = lab_regions(tree.repo)
    lines = note.text.split("\n")
    fenced = {i for i, _, f in split_fences(lines) if f}
    for k, line in enumerate(lines):
        m = LAB_HINT_RE.match(line)
        if m and k not in fenced and m.group(2) not in regions.get(m.group(1), set()):
            problems.append(f"{note.rel}:{k + 1}: lab-hint for stage {m.group(1)} region '{m.group(2)}', "
                            f"which no LAB BEGIN line of stage {m.group(1)} names")
    try:
        # A lab tree's notes quote the stubs it was made with, not the student's code.
        lab_tree = (tree.repo / ".lab.json").is_file()
        fresh = note.text if lab_tree else sync_text(note.text, note.path, tree)
        # A lab tree quotes its stubs with their marker lines (scripts/make_lab.py).
        if fresh != note.text and sync_text(note.text, note.path, tree, keep_lab_markers=True) == note.text:
            fresh = note.text
        if fresh != note.text:
            old, new = note.text.split("\n"), fresh.split("\n")
            k = next((k for k in range(min(len(old), len(new))) if old[k] != new[k]), min(len(old), len(new)))
            problems.append(f"{note.rel}:{k + 1}: the code under a snippet marker differs from the "
                            f"source: run `python3 docs/notes.py sync {note.rel}` and commit")
        _, errors = to_doxygen(tree, note)
        problems += errors
    except NoteError as e:
        problems.append(str(e))
    return problems


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    d = sub.add_parser("doxygen")
    d.add_argument("--repo", type=Path, default=Path(__file__).resolve().parent.parent)
    d.add_argument("--out", type=Path, required=True)
    s = sub.add_parser("sync")
    s.add_argument("--repo", type=Path, default=Path(__file__).resolve().parent.parent)
    s.add_argument("--check", action="store_true")
    s.add_argument("files", nargs="*", type=Path)
    c = sub.add_parser("check")
    c.add_argument("--repo", type=Path, default=Path(__file__).resolve().parent.parent)
    c.add_argument("--strict", action="store_true")
    m = sub.add_parser("migrate")
    m.add_argument("--repo", type=Path, default=Path(__file__).resolve().parent.parent)
    m.add_argument("files", nargs="+", type=Path)
    a = ap.parse_args(argv)
    tree = Tree(a.repo)

    if a.cmd == "doxygen":
        failed = []
        for note in tree.notes.values():
            text, errors = to_doxygen(tree, note)
            failed += errors
            target = a.out / note.rel
            target.parent.mkdir(parents=True, exist_ok=True)
            if not target.exists() or target.read_text(encoding="utf-8") != text:
                target.write_text(text, encoding="utf-8")
        for e in failed:
            print(f"notes: {e}", file=sys.stderr)
        return 1 if failed else 0

    if a.cmd == "sync":
        paths = [p.resolve() for p in a.files] or [n.path for n in tree.notes.values()]
        stale = []
        for p in paths:
            note = tree.notes.get(p.relative_to(tree.repo).as_posix()) or read_note(p, tree.repo)
            if note.legacy:
                continue
            fresh = sync_text(note.text, note.path, tree)
            if fresh != note.text:
                stale.append(note.rel)
                if not a.check:
                    note.path.write_text(fresh, encoding="utf-8")
        verb = "stale" if a.check else "refreshed"
        for r in stale:
            print(f"notes: {verb}: {r}")
        return 1 if (a.check and stale) else 0

    if a.cmd == "check":
        problems, legacy = [], []
        for note in tree.notes.values():
            problems += check_note(tree, note)
            if note.legacy:
                legacy.append(note.rel)
        if legacy:
            msg = (f"still in Doxygen Markdown ({len(legacy)}): {', '.join(legacy)}; convert with "
                   f"`python3 docs/notes.py migrate FILE`")
            (problems.append if a.strict else print)(f"notes: {msg}")
        for p in problems:
            print(f"notes: FAIL: {p}")
        print(f"notes: {len(tree.notes)} notes, {len(problems)} problem(s)")
        return 1 if problems else 0

    for p in a.files:
        p = p.resolve()
        note = read_note(p, tree.repo)
        if not note.legacy:
            print(f"notes: {note.rel} is already plain Markdown")
            continue
        p.write_text(migrate_text(note.text, p, tree), encoding="utf-8")
        print(f"notes: migrated {note.rel}")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except NoteError as e:
        print(f"notes: {e}", file=sys.stderr)
        sys.exit(1)
