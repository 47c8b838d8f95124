"""The notebooks as pages of the docs site: each notebooks/NN_name.ipynb, with the outputs it
was committed with, becomes a note in the plain-Markdown format (docs/notes.py), which the
notes' converter turns into Doxygen Markdown like any other note. Markdown cells stay as
they are (but for formulas in headings, which lose their dollars), code cells become fenced Python, text outputs fenced text, Markdown outputs
Markdown, and figures PNG files beside the site's other images.

Python standard library only (the notebooks are JSON).
"""
from __future__ import annotations

import base64
import json
import re
from pathlib import Path

from notes_tree import Note, Tree, notebook_label, split_fences


def notebook_files(repo: Path) -> list[Path]:
    return sorted((repo / "notebooks").glob("[0-9][0-9]_*.ipynb"))


def page_label(path: Path) -> str:
    """The page's name on the site (notes_tree.notebook_label)."""
    return notebook_label(f"notebooks/{path.name}")


def _fenced(text: str, language: str) -> list[str]:
    """A fence longer than any run of backticks inside the text."""
    longest = max((len(m) for m in re.findall(r"`+", text)), default=0)
    fence = "`" * max(3, longest + 1)
    return [fence + language] + text.rstrip("\n").split("\n") + [fence, ""]


def _text(value) -> str:
    return "".join(value) if isinstance(value, list) else str(value)


def notebook_markdown(path: Path, images: Path) -> tuple[str, list[str]]:
    """The notebook as one plain-Markdown note, and the names of its figures, which are
    written into `images`."""
    nb = json.loads(path.read_text(encoding="utf-8"))
    rel = f"notebooks/{path.name}"
    lines: list[str] = []
    figures: list[str] = []
    for cell in nb.get("cells", []):
        source = _text(cell.get("source", ""))
        if cell.get("cell_type") == "markdown":
            # Doxygen 1.9 renders no formula in a heading: there, $N = 4096$ becomes N = 4096
            # (a heading whose formula needs more than plain text is reported, not mangled).
            cell_lines = source.rstrip("\n").split("\n")
            fenced = {i for i, _, f in split_fences(cell_lines) if f}
            for i, line in enumerate(cell_lines):
                if i not in fenced and re.match(r"#{1,6} ", line) and "$" in line:
                    line = re.sub(r"(?<!\\)\$([^$\\]+)\$", r"\1", line)
                    if "$" in line:
                        raise ValueError(f"a heading with a formula that is not plain text: {line!r}")
                lines.append(line)
            lines.append("")
            continue
        if cell.get("cell_type") != "code" or not source.strip():
            continue
        lines += _fenced(source, "python")
        for out in cell.get("outputs", []):
            kind = out.get("output_type")
            if kind == "stream":
                lines += _fenced(_text(out.get("text", "")), "")
            elif kind == "error":
                lines += _fenced(f"{out.get('ename', '')}: {out.get('evalue', '')}", "")
            elif kind in ("display_data", "execute_result"):
                data = out.get("data", {})
                if "image/png" in data:
                    name = f"{page_label(path)}_{len(figures) + 1}.png"
                    figures.append(name)
                    png = base64.b64decode(_text(data["image/png"]))
                    if not (images / name).exists() or (images / name).read_bytes() != png:
                        (images / name).write_bytes(png)
                    lines += [f'\\image html {name} ""', ""]
                elif any(k.startswith("image/") for k in data):
                    raise ValueError(f"a figure in {sorted(data)}: only image/png is shown on the site")
                elif "text/markdown" in data:
                    lines += _text(data["text/markdown"]).rstrip("\n").split("\n") + [""]
                elif "text/plain" in data:
                    lines += _fenced(_text(data["text/plain"]), "")
    # The title: the first line, a level-1 heading, gets the page's anchor and a line under it
    # saying where the page comes from.
    if not lines or not lines[0].startswith("# "):
        raise ValueError("the first cell must begin with a '# ' title")
    lines[0] = f'{lines[0]} <a id="{page_label(path)}"></a>'
    lines[1:1] = ["", f"*This page is `{rel}` with the outputs it was committed with; "
                      f"`scripts/dev/run_notebooks.sh` runs it (a Jupyter kernel can too).*", ""]
    return "\n".join(lines).rstrip("\n") + "\n", figures


def write_notebook_pages(repo: Path, out: Path) -> list[str]:
    """Every notebook as a page under OUT/notebooks/ (figures in OUT/images/); the errors of
    the conversion, as file: message lines."""
    from notes_doxygen import Converter
    tree, errors = Tree(repo), []
    (out / "notebooks").mkdir(parents=True, exist_ok=True)
    written, kept = set(), set()
    for path in notebook_files(repo):
        try:
            text, figures = notebook_markdown(path, out / "images")
            kept.update(figures)
        except (ValueError, json.JSONDecodeError) as e:
            errors.append(f"notebooks/{path.name}: {e}")
            continue
        title = re.sub(r"^# ", "", text.split("\n", 1)[0]).split(" <a id=")[0]
        note = Note(path.resolve(), f"notebooks/{path.name}", text, page_label(path), title, False)
        converter = Converter(tree, note)
        page = converter.convert()
        errors += converter.errors
        # (the converter's line numbers are those of the generated page, OUT/notebooks/NAME.md)
        target = out / "notebooks" / f"{path.stem}.md"
        if not target.exists() or target.read_text(encoding="utf-8") != page:
            target.write_text(page, encoding="utf-8")
        written.add(target.name)
    for old in (out / "notebooks").glob("*.md"):  # a notebook that was removed or renamed
        if old.name not in written:
            old.unlink()
    for old in (out / "images").glob("notebook_*.png"):  # and the figures no page shows now
        if old.name not in kept:
            old.unlink()
    return errors
