"""The docs site as a reader sees it, in headless Chromium (used by tests/check_docs.py and
tests/test_check_docs.py).

A Chromium process (tests/headless_chromium.py) renders the pages asked for, one after
another; one such process per core shares them. Each page is laid out at a given window
width, its formulas typeset, and a probe run in the page reports what the checks need. A
page passes when

  - MathJax typeset its formulas (some where the page has any) and reported no error;
  - no display formula is clipped: each fits the page's text column, or scrolls inside its
    own box (a formula wider than the column otherwise runs past the pane's edge, where a
    reader of the side-by-side reader cannot see it);
  - every figure (img or object in the text) loaded, fits the text column (an image shown
    at its natural size is cut off at the pane's edge), and is readable: its body text (the
    smallest font an SVG uses for labels, ticks and legend, exponents aside) comes out at
    least MIN_FONT_PX CSS pixels high at the size it is shown;
  - every SVG figure (drawn by the project's scripts) is painted: a screenshot of its box
    is not blank.
The side-by-side reader passes (check_reader) when its notes pane shows no Doxygen header or
navigation tree and a click on a code quote's file label opens the source pane at its line.

The PNG screenshots are decoded with zlib.
"""
from __future__ import annotations

import json
import os
import re
import struct
import time
import zlib
from pathlib import Path

from headless_chromium import Browser, find_chromium  # noqa: F401  (find_chromium: the callers')

MIN_FONT_PX = 8.0
# The width of a page in the side-by-side reader (each pane at a 1920 px screen) and of a
# page opened alone.
READER_WIDTH = 960
PAGE_WIDTH = 1280

# Runs in the page after it loaded and MathJax finished: what the checks read.
PROBE = r"""(() => {
  const contents = document.querySelector('div.contents') || document.body;
  const cr = contents.getBoundingClientRect();
  const limit = Math.min(cr.right, document.documentElement.clientWidth) + 1;
  const scrolls = (el) => {   // a box between el and the text column that scrolls sideways
    for (let a = el.parentElement; a && a !== contents; a = a.parentElement) {
      const o = getComputedStyle(a).overflowX;
      if (o === 'auto' || o === 'scroll') return true;
    }
    return false;
  };
  const clipped = [];
  document.querySelectorAll('div.MathJax_Display').forEach(d => {
    const m = d.querySelector('span.MathJax') || d;
    const r = m.getBoundingClientRect();
    if (r.right > limit && !scrolls(m)) {
      let s = d.nextElementSibling;
      while (s && !(s.tagName === 'SCRIPT' && /math\/tex/.test(s.type))) s = s.nextElementSibling;
      clipped.push({w: Math.round(r.width), column: Math.round(limit - cr.left),
                    tex: s ? s.textContent.trim().slice(0, 60) : ''});
    }
  });
  const figs = [];
  contents.querySelectorAll('img, object').forEach(im => {
    const r = im.getBoundingClientRect();
    figs.push({src: im.getAttribute('src') || im.getAttribute('data'), nw: im.naturalWidth || 0,
               x: r.left, y: r.top, w: r.width, h: r.height,
               overflows: r.right > limit && !scrolls(im)});
  });
  return JSON.stringify({
    typeset: document.querySelectorAll('span.MathJax, div.MathJax_Display').length,
    errors: document.querySelectorAll('.MathJax_Error, merror, span.merror').length,
    clipped: clipped, figures: figs});
})()"""

def svg_width(svg_text: str) -> float | None:
    """The width an SVG asks for, in CSS px."""
    m = re.search(r'<svg[^>]*\bwidth="([0-9.]+)(pt|px)?"', svg_text)
    return float(m.group(1)) * (4 / 3 if m.group(2) == "pt" else 1.0) if m else None


def svg_body_font(svg_text: str) -> float | None:
    """The smallest font size (in the SVG's own units, converted to CSS px at its natural
    size) of its body text: every font size used, without the ones below 0.75 × the median
    (exponents and other raised text)."""
    sizes = [float(v) for v in re.findall(r"font(?:-size)?:\s*([0-9.]+)px", svg_text)]
    sizes += [float(v) for v in re.findall(r'font-size="([0-9.]+)(?:px)?"', svg_text)]
    if not sizes:
        return None
    median = sorted(sizes)[len(sizes) // 2]
    body = min(s for s in sizes if s >= 0.75 * median)
    m = re.search(r'<svg[^>]*\bwidth="([0-9.]+)(pt|px)?"[^>]*viewBox="[0-9.\-]+ [0-9.\-]+ ([0-9.]+)', svg_text)
    if not m:
        return body
    width = float(m.group(1)) * (4 / 3 if m.group(2) == "pt" else 1.0)
    return body * width / float(m.group(3))


def read_png_bytes(data: bytes):
    """(width, height, bytes per pixel, rows) of an 8-bit RGB or RGBA PNG, rows as bytes
    (filters undone)."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    pos, idat, width = 8, b"", 0
    while pos < len(data):
        length, kind = struct.unpack(">I4s", data[pos:pos + 8])
        chunk = data[pos + 8:pos + 8 + length]
        if kind == b"IHDR":
            width, height, depth, color = struct.unpack(">IIBB", chunk[:10])
            if depth != 8 or color not in (2, 6):
                raise ValueError(f"PNG with depth {depth}, color type {color}: not RGB(A)")
            bpp = 3 if color == 2 else 4
        elif kind == b"IDAT":
            idat += chunk
        pos += 12 + length
    raw = zlib.decompress(idat)
    stride = width * bpp
    rows, prev = [], bytearray(stride)
    for y in range(height):
        f, line = raw[y * (stride + 1)], bytearray(raw[y * (stride + 1) + 1:(y + 1) * (stride + 1)])
        for x in range(stride):
            a = line[x - bpp] if x >= bpp else 0
            b, c = prev[x], prev[x - bpp] if x >= bpp else 0
            if f == 1:
                line[x] = (line[x] + a) & 255
            elif f == 2:
                line[x] = (line[x] + b) & 255
            elif f == 3:
                line[x] = (line[x] + (a + b) // 2) & 255
            elif f == 4:
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                line[x] = (line[x] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
        rows.append(bytes(line))
        prev = line
    return width, height, bpp, rows


def inked(png, box) -> float:
    """The share of pixels in box (x, y, w, h) that are not near-white."""
    width, height, bpp, rows = png
    x0, y0 = max(0, int(box[0])), max(0, int(box[1]))
    x1, y1 = min(width, int(box[0] + box[2])), min(height, int(box[1] + box[3]))
    total = dark = 0
    for y in range(y0, y1, 2):
        row = rows[y]
        for x in range(x0, x1, 2):
            total += 1
            r, g, b = row[x * bpp], row[x * bpp + 1], row[x * bpp + 2]
            dark += (r + g + b) < 3 * 235
    return dark / total if total else 0.0


def check_page(browser: Browser, page: Path, width: int, blank: bool = True):
    """(failures, notes) for one page of the site as `browser` renders it `width` px wide:
    formulas typeset and not clipped, figures loaded, inside the text column, readable and
    (with blank) the SVG ones painted."""
    failures, notes = [], []
    name = page.name
    try:
        browser.open(page, width)
        probe = json.loads(browser.evaluate(PROBE))
    except (RuntimeError, TimeoutError, EOFError, OSError, ValueError) as e:
        return [f"{name}: headless Chromium could not render it: {e}"], notes
    raw = page.read_text(encoding="utf-8", errors="replace")
    expected = raw.count("\\(") + raw.count("\\[")
    if expected:
        notes.append(f"{name}: {probe['typeset']} formulas typeset ({expected} in the page), "
                     f"{probe['errors']} errors")
        if probe["typeset"] == 0:
            failures.append(f"{name}: MathJax typeset nothing in headless Chromium")
    if probe["errors"]:
        failures.append(f"{name}: MathJax reported {probe['errors']} errors in headless Chromium")
    for c in probe["clipped"]:
        failures.append(f"{name}: a display formula {c['w']} px wide is clipped: the text column is "
                        f"{c['column']} px at a {width} px window, and nothing scrolls it ({c['tex']!r})")
    figs = probe["figures"]
    for f in figs:
        src = f["src"] or "?"
        svg = page.parent / src
        svg_text = svg.read_text(encoding="utf-8") if svg.suffix == ".svg" and svg.exists() else ""
        natural = f["nw"] or (svg_width(svg_text) if svg_text else 0)
        if not natural or not f["w"]:
            failures.append(f"{name}: figure {src} did not load")
            continue
        if f["overflows"]:
            failures.append(f"{name}: figure {src} is wider than the text column at a {width} px window "
                            f"({f['w']:.0f} px shown, from x = {f['x']:.0f}): it is cut off at the pane's "
                            f"edge (not scaled to the page)")
        scale = f["w"] / natural
        font = svg_body_font(svg_text) if svg_text else None
        shown = font * scale if font else None
        notes.append(f"{name}: {src}: shown {f['w']:.0f} px wide of {natural:.0f} ({scale:.2f}×)"
                     + (f", body text {shown:.1f} px" if shown else ""))
        if shown is not None and shown < MIN_FONT_PX:
            failures.append(f"{name}: figure {src} is shown at {scale:.2f}× its size: its text is "
                            f"{shown:.1f} px high, under {MIN_FONT_PX} px (unreadable)")
    if blank:
        for k, f in enumerate(figs):
            if not f["w"] or not f["h"] or not (f["src"] or "").endswith(".svg"):
                continue  # (a PNG is a notebook's own output: loaded and in the column is enough)
            ink = 0.0
            for _ in range(2):  # a second look where the first found a blank box: painted late?
                try:  # the figure scrolled into view and painted (two frames later), then its box
                    box = json.loads(browser.evaluate(
                        "new Promise(done => { const im = document.querySelectorAll("
                        "'div.contents img, div.contents object')[%d]; im.scrollIntoView({block: 'start'});"
                        " requestAnimationFrame(() => requestAnimationFrame(() => {"
                        " const r = im.getBoundingClientRect(); done(JSON.stringify("
                        "[r.left, r.top, r.width, Math.min(r.height, innerHeight - r.top)])); })); })" % k,
                        wait=True))
                    png = read_png_bytes(browser.screenshot(box))
                except (RuntimeError, TimeoutError, EOFError, OSError, ValueError, AssertionError) as e:
                    failures.append(f"{name}: Chromium took no screenshot of figure {f['src']}: {e}")
                    break
                ink = inked(png, (0, 0, png[0], png[1]))
                if ink >= 0.01:
                    break
            else:
                failures.append(f"{name}: figure {f['src']} is blank in the screenshot")
    return failures, notes


# Runs in the reader before the click on a code quote's file label: window.faClickWatch
# resolves to true once the pane's message (docs/pane.js) has been handled and the handler
# changed the hash or the source pane (the reader's listener runs before this one, in the same
# dispatch), to false when the message changed neither or the notes pane loaded another page
# (no message: the link was followed), and to null after 5 s without either.
CLICK_WATCH = r"""(() => {
  const source = document.getElementById('source'), notes = document.getElementById('notes');
  const state = () => location.hash + ' ' + source.getAttribute('src');
  const before = state();
  window.faClickWatch = new Promise(done => {
    window.addEventListener('message', () => done(state() !== before), {once: true});
    notes.addEventListener('load', () => done(false), {once: true});
    setTimeout(() => done(null), 5000);
  });
  return 0;
})()"""


def check_reader(browser: Browser, reader: Path, stage: str, width: int = 1920, height: int = 1000):
    """Failures of the side-by-side reader (reader.html#<stage>) at a full-screen window:
    its notes pane must show the page without Doxygen's header and navigation tree
    (docs/pane.js), and a click on the file label of the notes' first code quote must open
    that listing in the source pane at the quote's line, the notes staying where they are."""
    name = reader.name
    try:
        browser.call("Emulation.setDeviceMetricsOverride", {"width": width, "height": height,
                                                             "deviceScaleFactor": 1, "mobile": False},
                     session=True)
        browser.navigate(reader.resolve().as_uri() + "#" + stage)
        notes_url = browser.evaluate("document.getElementById('notes').src")
        frames = browser.call("Page.getFrameTree", session=True)["frameTree"].get("childFrames", [])
        frame = next((f["frame"]["id"] for f in frames if f["frame"]["url"] == notes_url), None)
        contexts = [m["params"]["context"] for m in browser._events
                    if m.get("method") == "Runtime.executionContextCreated"
                    and m["params"]["context"].get("auxData", {}).get("frameId") == frame]
        if not frame or not contexts:
            return [f"{name}#{stage}: the notes pane ({notes_url}) did not load"]

        def in_notes(expression):
            r = browser.call("Runtime.evaluate", {"expression": expression, "returnByValue": True,
                                                  "contextId": contexts[-1]["id"]}, session=True)
            return r.get("result", {}).get("value")

        failures = []
        shown = in_notes("['top', 'side-nav'].filter(id => { const e = document.getElementById(id);"
                         " return e && getComputedStyle(e).display !== 'none'; }).join(', ')")
        if shown:
            failures.append(f"{name}#{stage}: the notes pane shows Doxygen's #{shown} (the page does not "
                            f"load pane.js, or style.css does not hide it in a pane)")
        browser.evaluate(CLICK_WATCH)
        href = in_notes("(() => { const a = document.querySelector('div.snippetfile a');"
                        " if (!a) return null; a.click(); return a.getAttribute('href'); })()")
        if not href:
            return failures + [f"{name}#{stage}: the notes have no code quote with a file label"]
        # The source pane may follow a moment later (the reader sets the hash, and its
        # hashchange sets the pane): waited for while the reader acted on the click's message;
        # where it did not (no handler, no message), nothing will change it.
        acted = browser.evaluate("window.faClickWatch", wait=True)
        deadline = time.monotonic() + 5
        source = browser.evaluate("document.getElementById('source').getAttribute('src')")
        while acted and source != href and time.monotonic() < deadline:
            time.sleep(0.05)
            source = browser.evaluate("document.getElementById('source').getAttribute('src')")
        if source != href:
            failures.append(f"{name}#{stage}: a click on the code quote's file label ({href}) did not open "
                            f"the source pane there (it shows {source})")
        now = browser.evaluate("document.getElementById('notes').contentWindow ? "
                               "document.getElementById('notes').src : ''")
        if now != notes_url:
            failures.append(f"{name}#{stage}: the click replaced the notes pane ({now})")
        return failures
    except (RuntimeError, TimeoutError, EOFError, OSError, ValueError, KeyError) as e:
        return [f"{name}#{stage}: headless Chromium could not run the reader: {e}"]


def render_each(chromium: str, pages, blank=lambda page: True, workers: int | None = None,
                then=None):
    """[(failures, notes)] for [(page path, window width)], in order: the pages shared among
    `workers` Chromium processes (one per core, at most 2), each rendering its share in turn.
    `then` (a function of a Browser), if given, runs in the last worker's browser after its
    pages; its result is the list's last element."""
    import threading
    pages = list(pages)
    workers = max(1, min(workers or min(2, os.cpu_count() or 1), len(pages)))
    results = [None] * len(pages) + ([None] if then else [])

    def work(k):
        try:
            with Browser(chromium) as b:
                for i in range(k, len(pages), workers):
                    page, width = pages[i]
                    results[i] = check_page(b, page, width, blank(page))
                if then and k == workers - 1:
                    results[-1] = then(b)
        except (OSError, EOFError, RuntimeError, TimeoutError) as e:
            for i in range(k, len(pages), workers):
                if results[i] is None:
                    results[i] = ([f"{pages[i][0].name}: headless Chromium failed: {e}"], [])
            if then and k == workers - 1 and results[-1] is None:
                results[-1] = ([f"headless Chromium failed: {e}"], [])

    threads = [threading.Thread(target=work, args=(k,)) for k in range(workers)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    return results


def check_pages(chromium: str, pages, blank=lambda page: True, workers: int | None = None):
    """(failures, notes) of every page of [(page path, window width)] (render_each)."""
    failures, notes = [], []
    for f, n in render_each(chromium, pages, blank, workers):
        failures += f
        notes += n
    return failures, notes
