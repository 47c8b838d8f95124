#!/usr/bin/env python3
"""Unit tests of docs/notes.py, the notes' plain-Markdown format (CTest: notes_format).

On a small repository made in a temporary folder: the conversion for Doxygen (math, anchors,
links, snippets, emphasis, headings, line numbers kept), the checks (a stale snippet, Doxygen
syntax left in a plain note, a link to nothing, a lone $), the rendering fixes of notes still
in Doxygen Markdown, and the migration of such a note into the plain format. Then the real
repository: every note passes `notes.py check`.
"""
import subprocess
import sys
import tempfile
import unittest
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "docs"))
import notes  # noqa: E402

SOURCE = """int f(int x) {
  //! [the step]
  int y = x + 1;  // y = x + 1
  // LAB BEGIN: step — hint: add one
  y = y * 2;
  // LAB END
  //! [the step]
  return y;
}
"""

NOTE = """# Stage 01: the first <a id="stage_01"></a>

## The idea <a id="stage_01_idea"></a>

A **bold $x$** word, *its $y$*, `code $z$` and $a_i = b$, and \\$5.
$$ O = PV $$
$$
S = QK^\\top
$$
See [the idea](#stage_01_idea), [stage 02](../02_y/README.md), [its part](../02_y/README.md#stage_02_part),
[f.cpp](f.cpp), [the data](../../docs/data.csv), [`docs/data.csv`](../../docs/data.csv) and
[a site](https://example.org).

<!-- snippet: f.cpp the step -->
```cpp
int y = x + 1;  // y = x + 1
y = y * 2;
```

<!-- lab-hint: 01 step
Add one, then double. -->
Naming file:line and `file:line`.
### With `--option` in it
"""

NOTE2 = """# Stage 02: the second <a id="stage_02"></a>

## A part <a id="stage_02_part"></a>

Text.
"""

LEGACY = """# Stage 02: the second {#stage_02}

## A part {#stage_02_part}

**Why \\f$D\\f$.** Text with \\f$a =
b\\f$, more, and \\ref stage_01 "the first" and \\ref stage_01_idea.

\\snippet f.cpp the step

## Variants (`--variant`)
"""


class Repo:
    def __init__(self):
        self.tmp = tempfile.TemporaryDirectory(prefix="fa_notes_")
        self.root = Path(self.tmp.name)
        for sub in ("stages/01_x", "stages/02_y", "common", "docs/concepts"):
            (self.root / sub).mkdir(parents=True)
        (self.root / "stages/01_x/f.cpp").write_text(SOURCE)
        (self.root / "stages/01_x/README.md").write_text(NOTE)
        (self.root / "stages/02_y/README.md").write_text(NOTE2)
        (self.root / "docs/data.csv").write_text("a,b\n")

    def close(self):
        self.tmp.cleanup()

    def tree(self):
        return notes.Tree(self.root)

    def note(self, rel):
        t = self.tree()
        return t, t.notes[rel]


class Conversion(unittest.TestCase):
    def setUp(self):
        self.repo = Repo()
        self.addCleanup(self.repo.close)
        self.tree, self.note = self.repo.note("stages/01_x/README.md")
        self.out, self.errors = notes.to_doxygen(self.tree, self.note)
        self.lines = self.out.split("\n")

    def test_line_for_line(self):
        self.assertEqual(len(self.lines), len(NOTE.split("\n")))
        self.assertEqual(self.errors, [])

    def test_title_and_anchors(self):
        self.assertEqual(self.lines[0], "# Stage 01: the first {#stage_01}")
        self.assertEqual(self.lines[2], "## The idea {#stage_01_idea}")

    def test_math(self):
        line = self.lines[4]
        self.assertIn("\\f$x\\f$", line)
        self.assertIn("\\f$a_i = b\\f$", line)
        self.assertIn("`code $z$`", line)       # code is left alone
        self.assertIn("\\$5", line)               # a literal dollar
        self.assertEqual(self.lines[5], "\\f[ O = PV \\f]")
        self.assertEqual(self.lines[6:9], ["\\f[", "S = QK^\\top", "\\f]"])

    def test_emphasis_as_html(self):
        self.assertIn("<b>bold \\f$x\\f$</b>", self.lines[4])
        self.assertIn("<em>its \\f$y\\f$</em>", self.lines[4])

    def test_links(self):
        text = "\n".join(self.lines[9:12])
        self.assertIn("[the idea](#stage_01_idea)", text)
        self.assertIn("[stage 02](@ref stage_02)", text)
        self.assertIn("[its part](@ref stage_02_part)", text)
        self.assertIn("[f.cpp](f_8cpp_source.html)", text)
        self.assertIn("the data (`docs/data.csv`)", text)
        self.assertIn("`docs/data.csv` and", text)
        self.assertIn("[a site](https://example.org)", text)

    def test_snippet(self):
        k = self.lines.index("\\snippet f.cpp the step")
        # the label opens the listing at the quote's first line (line 3 of f.cpp)
        self.assertIn('<a href="f_8cpp_source.html#l00003">f.cpp</a>', self.lines[k - 1])
        self.assertEqual(self.lines[k + 1:k + 4], ["", "", ""])

    def test_lab_hint_hidden_and_autolink_and_heading(self):
        self.assertFalse(any("Add one" in line for line in self.lines))
        self.assertIn("file\u2060:line", self.lines[-3])
        self.assertNotIn("file:line", self.lines[-3])
        self.assertEqual(self.lines[-2], "### With \u2011\u2011option in it")


class Checks(unittest.TestCase):
    def setUp(self):
        self.repo = Repo()
        self.addCleanup(self.repo.close)

    def problems(self, text):
        (self.repo.root / "stages/01_x/README.md").write_text(text)
        tree, note = self.repo.note("stages/01_x/README.md")
        return notes.check_note(tree, note)

    def test_clean(self):
        self.assertEqual(self.problems(NOTE), [])

    def test_stale_snippet(self):
        p = self.problems(NOTE.replace("y = y * 2;\n```", "y = y * 3;\n```"))
        self.assertTrue(any("differs from the source" in x for x in p), p)

    def test_doxygen_syntax_in_plain_note(self):
        p = self.problems(NOTE.replace("Text", "x") + "\nSee \\ref stage_02.\n")
        self.assertTrue(any("Doxygen-only syntax" in x for x in p), p)

    def test_missing_link(self):
        p = self.problems(NOTE + "\n[gone](../09_z/README.md)\n")
        self.assertTrue(any("does not exist" in x for x in p), p)

    def test_lone_dollar(self):
        p = self.problems(NOTE + "\nit costs $5 and more\n")
        self.assertTrue(any("opens no formula" in x for x in p), p)

    def test_lab_hint_of_no_region(self):
        p = self.problems(NOTE.replace("lab-hint: 01 step", "lab-hint: 01 no such region"))
        self.assertTrue(any("which no LAB BEGIN line of stage 01 names" in x for x in p), p)

    def test_lab_tree_shows_the_hint(self):
        text = notes.show_lab_hints(NOTE, {("01", "step")})
        self.assertIn("> **Lab: you write this.** Stage 01's region \"step\"", text)
        self.assertIn("> Add one, then double.", text)
        self.assertNotIn("lab-hint", text)
        self.assertEqual(notes.show_lab_hints(NOTE, {("01", "other")}), NOTE)

    def test_missing_snippet(self):
        p = self.problems(NOTE.replace("<!-- snippet: f.cpp the step -->", "<!-- snippet: f.cpp no such -->"))
        self.assertTrue(any("has no snippet 'no such'" in x for x in p), p)

    def test_sync_fills_the_block(self):
        text = NOTE.replace("int y = x + 1;  // y = x + 1\ny = y * 2;\n", "old\n")
        (self.repo.root / "stages/01_x/README.md").write_text(text)
        tree = self.repo.tree()
        fresh = notes.sync_text(text, self.repo.root / "stages/01_x/README.md", tree)
        self.assertEqual(fresh, NOTE)
        kept = notes.sync_text(text, self.repo.root / "stages/01_x/README.md", tree, keep_lab_markers=True)
        self.assertIn("// LAB BEGIN: step — hint: add one", kept)


class Legacy(unittest.TestCase):
    def setUp(self):
        self.repo = Repo()
        self.addCleanup(self.repo.close)
        (self.repo.root / "stages/02_y/README.md").write_text(LEGACY)

    def test_rendering_fixes(self):
        tree, note = self.repo.note("stages/02_y/README.md")
        self.assertTrue(note.legacy)
        out, errors = notes.to_doxygen(tree, note)
        self.assertEqual(errors, [])
        self.assertIn("<b>Why \\f$D\\f$.</b>", out)
        self.assertIn("## Variants (\u2011\u2011variant)", out)
        self.assertIn("\\snippet f.cpp the step", out)

    def test_migration(self):
        tree, note = self.repo.note("stages/02_y/README.md")
        text = notes.migrate_text(note.text, note.path, tree)
        self.assertTrue(text.startswith('# Stage 02: the second <a id="stage_02"></a>\n'))
        self.assertIn("**Why $D$.** Text with $a = b$,\nmore,", text)
        self.assertIn("[the first](../01_x/README.md)", text)
        self.assertIn("[stage_01_idea](../01_x/README.md#stage_01_idea)", text)
        self.assertIn("<!-- snippet: f.cpp the step -->\n```cpp\nint y = x + 1;", text)
        (self.repo.root / "stages/02_y/README.md").write_text(text)
        tree, note = self.repo.note("stages/02_y/README.md")
        self.assertFalse(note.legacy)
        self.assertEqual(notes.check_note(tree, note), [])


class TheRepository(unittest.TestCase):
    def test_every_note_reads_as_plain_markdown(self):
        """Each plain note, rendered by a CommonMark renderer with $…$ math (markdown-it-py
        with dollarmath, as GitHub and Jupyter read it): as many formulas as the site gets,
        a code block under every snippet marker, and no '$' left in the text."""
        try:
            from markdown_it import MarkdownIt
            from mdit_py_plugins.dollarmath import dollarmath_plugin
        except ImportError:
            self.skipTest("markdown-it-py / mdit-py-plugins not installed (notebooks/requirements.txt)")
        import re
        md = MarkdownIt("commonmark").enable("table").use(dollarmath_plugin, allow_space=True, double_inline=True)
        tree = notes.Tree(ROOT)
        for note in tree.notes.values():
            if note.legacy:
                continue
            with self.subTest(note=note.rel):
                html = md.render(note.text)
                formulas = html.count('class="math inline"') + html.count('class="math block"')
                site, _ = notes.to_doxygen(tree, note)
                expected = len(re.findall(r"\\f\$", notes.strip_code(site))) // 2 + site.count("\\f[")
                self.assertEqual(formulas, expected, "formulas in plain Markdown vs on the site")
                markers = len(re.findall(r"<!--\s*snippet:", notes.strip_code(note.text)))
                self.assertGreaterEqual(html.count("<pre><code"), markers)
                text = re.sub(r"<(pre|code)[^>]*>.*?</(pre|code)>", "", html, flags=re.S)
                text = re.sub(r'<(eq|eqn|section|span|div)[^>]*class="math[^"]*"[^>]*>.*?</\1>', "", text, flags=re.S)
                self.assertNotIn("$", re.sub(r"<[^>]+>", "", text), "a '$' outside any formula")

    def test_every_note_passes(self):
        r = subprocess.run([sys.executable, str(ROOT / "docs" / "notes.py"), "check", "--strict", "--repo", str(ROOT)],
                           capture_output=True, text=True)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)


if __name__ == "__main__":
    unittest.main(verbosity=1)
