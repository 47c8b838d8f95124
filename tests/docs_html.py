"""What tests/check_docs.py reads of a page of the docs site: its code blocks, scripts and
links (Page), the text a reader sees (Visible), the anchors it defines and, for a page checked
for nothing else, its links, each kept per file and modification time (tests/test_check_docs.py
checks copies of the site whose unchanged pages are links to the same files, 16 times over).
Python standard library only.
"""
from __future__ import annotations

import html as htmllib
import re
from html.parser import HTMLParser
from pathlib import Path


class Page(HTMLParser):
    """Collects what the checks need from one Doxygen page."""

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.fragments = []        # text of each <div class="fragment">, one string per line
        self.scripts = []          # (src, inline text)
        self.hrefs = []
        self._stack = []           # open <div> kinds: "fragment", "line", or ""
        self._in_script = None

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "div":
            cls = (a.get("class") or "").split()
            kind = "fragment" if "fragment" in cls else ("line" if "line" in cls else "")
            if kind == "fragment":
                self.fragments.append([])
            elif kind == "line" and self._inside("fragment"):
                self.fragments[-1].append("")
            self._stack.append(kind)
        elif tag == "script":
            self._in_script = [a.get("src"), ""]
        elif tag == "a" and a.get("href"):
            self.hrefs.append(a["href"])
        elif tag in ("iframe", "img") and a.get("src"):
            self.hrefs.append(a["src"])
        elif tag == "object" and a.get("data"):
            self.hrefs.append(a["data"])

    def handle_endtag(self, tag):
        if tag == "div" and self._stack:
            self._stack.pop()
        elif tag == "script" and self._in_script is not None:
            self.scripts.append(tuple(self._in_script))
            self._in_script = None

    def handle_data(self, data):
        if self._in_script is not None:
            self._in_script[1] += data
        if self._inside("line") and self._inside("fragment") and self.fragments:
            if self.fragments[-1]:
                self.fragments[-1][-1] += data

    def _inside(self, kind):
        return kind in self._stack


class Visible(HTMLParser):
    """The text a reader sees on a page, without code (fragments, <code>, <pre>), scripts and
    styles: where a Markdown mark or a tag shown literally would be a rendering fault."""

    SKIP = {"script", "style", "pre", "code", "tt", "kbd"}
    VOID = {"br", "img", "hr", "input", "meta", "link", "area", "base", "col", "wbr"}

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.chunks = []
        self._stack = []  # (tag, skipping)

    def _skipping(self):
        return any(skip for _, skip in self._stack)

    def handle_starttag(self, tag, attrs):
        if tag in self.VOID:
            return
        cls = (dict(attrs).get("class") or "").split()
        self._stack.append((tag, tag in self.SKIP or (tag == "div" and "fragment" in cls)))

    def handle_endtag(self, tag):
        for k in range(len(self._stack) - 1, -1, -1):
            if self._stack[k][0] == tag:
                del self._stack[k:]
                break

    def handle_data(self, data):
        if not self._skipping():
            self.chunks.append(data)

    def text(self):
        return "".join(self.chunks)


class LinksOnly:
    """A page's links found by a regular expression (pages checked for nothing else: links())."""

    def __init__(self, hrefs):
        self.hrefs = [htmllib.unescape(h) for h in hrefs]


_PARSED, _VISIBLE, _ANCHORS, _LINKS = {}, {}, {}, {}


def _key(path: Path):
    st = path.stat()
    return (str(path.resolve()), st.st_mtime_ns, st.st_size)


def visible_text(path: Path) -> str:
    """The text a reader sees on the page (Visible; kept as parse() keeps pages)."""
    key = _key(path)
    if key not in _VISIBLE:
        v = Visible()
        v.feed(path.read_text(encoding="utf-8", errors="replace"))
        _VISIBLE[key] = v.text()
    return _VISIBLE[key]


def parse(path: Path) -> Page:
    """The page parsed (kept by file and modification time: tests/test_check_docs.py checks
    copies of the site whose unchanged pages are links to the same files)."""
    key = _key(path)
    if key not in _PARSED:
        p = Page()
        p.feed(path.read_text(encoding="utf-8", errors="replace"))
        _PARSED[key] = p
    return _PARSED[key]


def anchors(path: Path) -> set:
    """The ids and names the page defines, the targets of page.html#anchor (kept as parse()
    keeps pages)."""
    key = _key(path)
    if key not in _ANCHORS:
        raw = path.read_text(encoding="utf-8", errors="replace")
        _ANCHORS[key] = set(re.findall(r'\b(?:id|name)="([^"]+)"', raw))
    return _ANCHORS[key]


def links(path: Path) -> list:
    """The targets of the page's a, img and iframe tags, found by a regular expression (kept as
    parse() keeps pages)."""
    key = _key(path)
    if key not in _LINKS:
        raw = path.read_text(encoding="utf-8", errors="replace")
        _LINKS[key] = re.findall(r'<(?:a|img|iframe)\s[^>]*?\b(?:href|src)="([^"]*)"', raw)
    return _LINKS[key]
