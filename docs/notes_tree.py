"""The notes' plain-Markdown format, the reading side (docs/notes.py has the format and the
commands): which files are notes, their titles and anchors, the spans that are code or math,
and the snippets a note quotes, kept equal to the sources (`sync_text`).

Python standard library only.
"""
from __future__ import annotations

import re
import sys
from dataclasses import dataclass
from pathlib import Path

SOURCE_EXTS = (".h", ".hpp", ".cpp", ".cu", ".cuh")
IMAGE_DIRS = ("docs/results/figures", "docs/figures")
# Pages the docs build generates (docs/gen_pages.py); a note links to them by these files,
# which read well in plain Markdown too.
GENERATED_PAGES = {"docs/results/README.md": "results", "stages/README.md": "stages"}


def notebook_label(rel: str) -> str | None:
    """The site's page of a notebook (docs/notebook_pages.py makes it), by the notebook's
    path in the repository: notebooks/05_gpt_capstone.ipynb → notebook_05_gpt_capstone."""
    m = re.fullmatch(r"notebooks/([0-9][0-9]_[^/]*)\.ipynb", rel)
    return "notebook_" + re.sub(r"[^A-Za-z0-9_]", "_", m.group(1)) if m else None


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
            fence = m.group(2)  # closed by a run of the same character, at least as long
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


def snippet_line(source: Path, name: str) -> int | None:
    """The line (1-based) of `source` where the quote of snippet `name` begins: its first
    line that is neither blank nor a marker; the anchor of that line in the source's
    listing is `l` and the number in five digits (l00042)."""
    lines = source.read_text(encoding="utf-8", errors="replace").splitlines()
    tag = f"[{name}]"
    at = [i for i, line in enumerate(lines) if tag in line]
    if len(at) < 2:
        return None
    for i in range(at[0] + 1, at[1]):
        if lines[i].strip() and not MARKER_LINE_RE.match(lines[i]) and not LAB_LINE_RE.match(lines[i]):
            return i + 1
    return at[0] + 1


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
