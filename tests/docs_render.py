"""The figures of the docs site, as a reader sees them (used by tests/check_docs.py).

Headless Chromium opens a copy of a page (results.html) with a small script added that
records, after layout, where each figure landed and at what size, and then takes a
screenshot of the whole page. A figure passes when

  - it loaded (the image decoded, it has a size);
  - it is readable: its body text (the smallest font the SVG uses for labels, ticks and
    legend, exponents aside) comes out at least MIN_FONT_PX CSS pixels high at the size it
    is shown;
  - it is painted: in the screenshot, the figure's box is not blank.

Python standard library only (the PNG is decoded with zlib).
"""
from __future__ import annotations

import json
import os
import re
import shutil
import struct
import subprocess
import tempfile
import zlib
from pathlib import Path

MIN_FONT_PX = 8.0
WINDOW_WIDTH = 1280

PROBE = """<script>
window.addEventListener('load', function () { setTimeout(function () {
  var figs = [];
  document.querySelectorAll('div.contents img, div.contents object').forEach(function (im) {
    var r = im.getBoundingClientRect();
    figs.push({src: im.getAttribute('src') || im.getAttribute('data'),
               nw: im.naturalWidth || 0, x: r.left, y: r.top, w: r.width, h: r.height});
  });
  var pre = document.createElement('pre');
  pre.id = 'fa-figure-probe';
  pre.textContent = JSON.stringify(figs);
  document.body.appendChild(pre);
}, 300); });
</script>"""


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


def read_png(path: Path):
    """(width, height, rows) of an 8-bit RGB or RGBA PNG, rows as bytes (filters undone)."""
    data = path.read_bytes()
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


def check_figures(chromium: str, html: Path, page: str = "results.html", shot: Path | None = None):
    """(failures, notes) for the figures of `page` rendered by `chromium`."""
    failures, notes = [], []
    src = html / page
    if not src.exists():
        return [f"{page} is not in the site"], notes
    with tempfile.TemporaryDirectory(prefix="fa_figures_") as tmp:
        tmp = Path(tmp)
        for entry in html.iterdir():  # the site, by links; only the probed page is a copy
            if entry.name != page:
                os.symlink(entry.resolve(), tmp / entry.name)
        text = src.read_text(encoding="utf-8", errors="replace")
        (tmp / page).write_text(text.replace("</body>", PROBE + "</body>"), encoding="utf-8")
        base = [chromium, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                "--virtual-time-budget=15000"]
        dom = subprocess.run(base + [f"--window-size={WINDOW_WIDTH},900", "--dump-dom",
                                     (tmp / page).as_uri()], capture_output=True, text=True, timeout=120).stdout
        m = re.search(r'<pre id="fa-figure-probe">(.*?)</pre>', dom, flags=re.S)
        if not m:
            return [f"{page}: the figure probe did not run in headless Chromium"], notes
        import html as htmllib
        figs = json.loads(htmllib.unescape(m.group(1)))
        if not figs:
            return [f"{page}: no figure on the page"], notes
        # The page scrolls inside Doxygen's content pane: a window as tall as the content
        # shows every figure at once.
        height = int(max(f["y"] + f["h"] for f in figs)) + 40
        png_path = tmp / "page.png"
        subprocess.run(base + [f"--window-size={WINDOW_WIDTH},{height}", f"--screenshot={png_path}",
                               (tmp / page).as_uri()], capture_output=True, timeout=120)
        if shot is not None and png_path.exists():
            shutil.copyfile(png_path, shot)
        png = read_png(png_path) if png_path.exists() else None
        for f in figs:
            name = f["src"]
            svg = html / name
            svg_text = svg.read_text(encoding="utf-8") if svg.suffix == ".svg" and svg.exists() else ""
            natural = f["nw"] or (svg_width(svg_text) if svg_text else 0)
            if not natural or not f["w"]:
                failures.append(f"{page}: figure {name} did not load")
                continue
            scale = f["w"] / natural
            font = svg_body_font(svg_text) if svg_text else None
            shown = font * scale if font else None
            notes.append(f"{name}: shown {f['w']:.0f} px wide of {natural:.0f} ({scale:.2f}×)"
                         + (f", body text {shown:.1f} px" if shown else ""))
            if shown is not None and shown < MIN_FONT_PX:
                failures.append(f"{page}: figure {name} is shown at {scale:.2f}× its size: its text is "
                                f"{shown:.1f} px high, under {MIN_FONT_PX} px (unreadable)")
            if png is None:
                failures.append(f"{page}: Chromium took no screenshot")
            elif inked(png, (f["x"], f["y"], f["w"], f["h"])) < 0.01:
                failures.append(f"{page}: figure {name} is blank in the screenshot")
    return failures, notes
