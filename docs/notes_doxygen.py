"""The notes' plain-Markdown format, the writing side (docs/notes.py has the format and the
commands): a note converted for Doxygen line for line (`to_doxygen`), with the fixes of the
rendering faults Doxygen 1.9 makes, and a note in Doxygen Markdown migrated into the plain
format (`migrate_text`).

Python standard library only.
"""
from __future__ import annotations

import re
from pathlib import Path

from notes_calc import strip_markers as strip_calc_markers
from notes_tree import (ANCHOR_LINE_RE, CODE_SPAN_RE, DISPLAY_INLINE_RE, GENERATED_PAGES,
                        HEADING_RE, IMAGE_DIRS, INLINE_MATH_RE, LINK_RE, OLD_HEADING_RE, SOURCE_EXTS,
                        Note, NoteError, Protect, Tree, notebook_label, snippet_blocks, snippet_line,
                        split_fences, sync_text)


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
        if notebook_label(rel) and full.is_file():
            return "ref", anchor or notebook_label(rel)
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
        line = strip_calc_markers(line)  # the site shows a computed number, not its formula
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

    def snippet_caption(self, file: str, snippet: str) -> str:
        """The quote's file, linked to its listing at the quote's first line (in the
        side-by-side reader, the source pane opens there)."""
        src = self.tree.example_file(file, self.dir)
        page = self.tree.source_page(src) if src else None
        name = src.name if src else file
        line = snippet_line(src, snippet) if page else None
        if line:
            page += f"#l{line:05d}"
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
            out[start] = indent + self.snippet_caption(file, name)
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
