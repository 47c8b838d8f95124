#!/usr/bin/env python3
"""Unit tests of docs/notebook_pages.py, the notebooks as pages of the docs site (CTest:
notebook_pages).

On a notebook made in a temporary folder: the page's title gets its anchor, a formula in a
heading becomes plain text and one that cannot is reported, a code cell and its text output
become fences long enough for the backticks inside them, a figure becomes a PNG file and an
image line, Markdown outputs stay Markdown, a notebook without a title is reported, and a
figure that is no longer shown is removed. Then the real repository: every notebook converts
without an error.
"""
import base64
import json
import sys
import tempfile
import unittest
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "docs"))
import notebook_pages  # noqa: E402

# A 1×1 PNG.
PNG = base64.b64decode("iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR4nGNgYGD4DwABBAEAwS2OUAAAAABJRU5ErkJggg==")


def markdown(text):
    return {"cell_type": "markdown", "metadata": {}, "source": text.splitlines(keepends=True)}


def code(text, *outputs):
    return {"cell_type": "code", "metadata": {}, "execution_count": 1, "outputs": list(outputs),
            "source": text.splitlines(keepends=True)}


def stream(text):
    return {"output_type": "stream", "name": "stdout", "text": text.splitlines(keepends=True)}


def display(data):
    return {"output_type": "display_data", "metadata": {}, "data": data}


def write_notebook(repo: Path, name: str, cells):
    (repo / "notebooks").mkdir(parents=True, exist_ok=True)
    nb = {"cells": cells, "metadata": {}, "nbformat": 4, "nbformat_minor": 5}
    (repo / "notebooks" / name).write_text(json.dumps(nb), encoding="utf-8")


class Conversion(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.repo = Path(self.tmp.name) / "repo"
        self.out = Path(self.tmp.name) / "gen"
        (self.out / "images").mkdir(parents=True)

    def tearDown(self):
        self.tmp.cleanup()

    def convert(self):
        errors = notebook_pages.write_notebook_pages(self.repo, self.out)
        pages = {p.name: p.read_text(encoding="utf-8") for p in (self.out / "notebooks").glob("*.md")}
        return errors, pages

    def test_a_notebook_becomes_a_page(self):
        write_notebook(self.repo, "07_demo.ipynb", [
            markdown("# 7 · A demo\n\nSoftmax of $x$, and\n\n## At $N = 4096$\n"),
            code("print('```')", stream("```\nnot the end: $x$ and **bold**\n")),
            code("plot()", display({"image/png": base64.b64encode(PNG).decode(), "text/plain": "<Figure>"})),
            code("table()", display({"text/markdown": "| a | b |\n|:--|:--|\n| 1 | 2 |", "text/plain": "x"})),
        ])
        errors, pages = self.convert()
        self.assertEqual(errors, [])
        page = pages["07_demo.md"]
        lines = page.split("\n")
        self.assertEqual(lines[0], "# 7 · A demo {#notebook_07_demo}")
        self.assertIn("## At N = 4096", lines)  # a heading renders no formula: plain text
        self.assertIn("Softmax of \\f$x\\f$, and", lines)  # prose keeps its math
        # the output holds a line of three backticks: its fence is longer, and closes it
        k = lines.index("not the end: $x$ and **bold**")  # untouched: still inside the fence
        self.assertEqual((lines[k - 2], lines[k + 1]), ("````", "````"))
        self.assertIn('\\image html notebook_07_demo_1.png ""', lines)
        self.assertEqual((self.out / "images" / "notebook_07_demo_1.png").read_bytes(), PNG)
        self.assertIn("| 1 | 2 |", lines)  # a Markdown output stays Markdown
        self.assertNotIn("<Figure>", page)  # a figure's text form is not shown beside it

        # The figure goes when the notebook no longer has it, and so does a removed notebook's page.
        write_notebook(self.repo, "07_demo.ipynb", [markdown("# 7 · A demo\n")])
        errors, pages = self.convert()
        self.assertEqual(errors, [])
        self.assertFalse((self.out / "images" / "notebook_07_demo_1.png").exists())
        (self.repo / "notebooks" / "07_demo.ipynb").unlink()
        errors, pages = self.convert()
        self.assertEqual((errors, pages), ([], {}))

    def test_what_cannot_be_shown_is_reported(self):
        write_notebook(self.repo, "08_untitled.ipynb", [markdown("Some text first.\n")])
        write_notebook(self.repo, "09_formula.ipynb", [markdown("# 9 · Ok\n\n## Scaled by $\\sqrt{d}$\n")])
        write_notebook(self.repo, "10_svg.ipynb", [markdown("# 10 · Svg\n"), code("f()", display({"image/svg+xml": "<svg/>"}))])
        errors, pages = self.convert()
        self.assertEqual(pages, {})
        self.assertEqual(len(errors), 3, errors)
        self.assertIn("notebooks/08_untitled.ipynb: the first cell must begin with a '# ' title", errors)
        self.assertTrue(any(e.startswith("notebooks/09_formula.ipynb: a heading with a formula") for e in errors))
        self.assertTrue(any(e.startswith("notebooks/10_svg.ipynb: a figure in") for e in errors))


class TheRepository(unittest.TestCase):
    def test_every_notebook_converts(self):
        with tempfile.TemporaryDirectory() as tmp:
            out = Path(tmp)
            (out / "images").mkdir()
            errors = notebook_pages.write_notebook_pages(ROOT, out)
            self.assertEqual(errors, [])
            names = sorted(p.stem for p in (out / "notebooks").glob("*.md"))
            self.assertEqual(names, sorted(p.stem for p in notebook_pages.notebook_files(ROOT)))
            self.assertTrue(names)


if __name__ == "__main__":
    unittest.main(verbosity=1)
