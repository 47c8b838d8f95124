#!/usr/bin/env python3
"""Unit tests of the notes' computed numbers (docs/notes_calc.py; CTest: notes_calc).

The cards' table (docs/hardware.csv) agrees with itself: each card's dense bf16 peak is its
SMs × clock × 2 × multiply-adds per clock, to 0.1%. A note with a calc marker: the right value
passes, a planted wrong value is caught by `notes.py check` and `sync --check` and put right
by `sync`, a bad expression or an unknown figure is reported, and a marker in a code block is
left alone. The site's copy shows the value without the marker. Then the real repository:
every calc value in the notes agrees with the table, and planting a wrong number in a real
note (stage 10's) is caught.
"""
import shutil
import subprocess
import sys
import tempfile
import unittest
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "docs"))
import notes  # noqa: E402
import notes_calc  # noqa: E402

NOTE = """# Stage 01: the first <a id="stage_01"></a>

An m16n8k16 is <!-- calc: 16*8*16 -->2048 multiply-adds, <!-- calc: 16*8*16 / H100.mac_bf16 * 4 -->4 clocks
of one SM sub-partition; the exponentials cost <!-- calc: (128*128/H100.ex2_per_clk) / (2*128*128*128/H100.mac_bf16) as frac -->1/2
of the products, and 384 threads get <!-- calc: floor(H100.regs_per_sm / 12 / H100.reg_unit_per_warp) * H100.reg_unit_per_warp / 32 -->168.
A big one: <!-- calc: 64*64*16 -->65,536.

```
<!-- calc: 1+1 -->3 in a code block is not a marker
```
"""


class Repo:
    def __init__(self, note: str):
        self.tmp = tempfile.TemporaryDirectory(prefix="fa_calc_")
        self.root = Path(self.tmp.name)
        (self.root / "stages/01_x").mkdir(parents=True)
        (self.root / "docs").mkdir()
        (self.root / "common").mkdir()
        shutil.copy(ROOT / "docs/hardware.csv", self.root / "docs/hardware.csv")
        self.note = self.root / "stages/01_x/README.md"
        self.note.write_text(note, encoding="utf-8")

    def notes(self, *args):
        return subprocess.run([sys.executable, str(ROOT / "docs/notes.py"), *args, "--repo", str(self.root)],
                              capture_output=True, text=True)


class Table(unittest.TestCase):
    def test_peaks_agree_with_the_rates(self):
        cards = notes_calc.load_cards(ROOT / "docs/hardware.csv")
        self.assertEqual(set(cards), {"A100", "H100", "H200"})
        for name, c in cards.items():
            peak = c["sms"] * c["boost_mhz"] * 1e6 * 2 * c["mac_bf16"] / 1e12
            self.assertAlmostEqual(peak / c["bf16_tflops"], 1.0, delta=1e-3, msg=name)
            self.assertEqual(c["mac_tf32"] * 2, c["mac_bf16"], name)
            self.assertEqual(c["reg_unit_per_warp"] % 32, 0, name)

    def test_the_issue_arithmetic(self):
        cards = notes_calc.load_cards(ROOT / "docs/hardware.csv")
        calc = lambda e: notes_calc.compute(e, cards)  # noqa: E731
        self.assertEqual(calc("16*8*16"), "2048")                      # m16n8k16
        self.assertEqual(calc("H100.mac_bf16"), "2048")                # not the A100's 1024
        self.assertEqual(calc("A100.mac_bf16"), "1024")
        self.assertEqual(calc("64*64*16"), "65,536")                   # m64n64k16
        self.assertEqual(calc("H100.bf16_tflops*1e12/(H100.sms*H100.boost_mhz*1e6) as .0f"), "4096")


class Marker(unittest.TestCase):
    def test_right_values_pass(self):
        repo = Repo(NOTE)
        r = repo.notes("check")
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        self.assertEqual(repo.notes("sync", "--check").returncode, 0)

    def test_planted_wrong_number_is_caught_and_synced(self):
        wrong = NOTE.replace("-->2048 multiply-adds", "-->4096 multiply-adds")
        repo = Repo(wrong)
        r = repo.notes("check")
        self.assertEqual(r.returncode, 1)
        self.assertIn("stages/01_x/README.md:3:", r.stdout)
        self.assertIn("is 4096, the table gives 2048", r.stdout)
        self.assertEqual(repo.notes("sync", "--check").returncode, 1)
        self.assertEqual(repo.notes("sync").returncode, 0)
        self.assertEqual(repo.note.read_text(encoding="utf-8"), NOTE)

    def test_wrong_fraction_and_grouping(self):
        for old, new in (("-->1/2\n", "-->1/4\n"), ("-->65,536.", "-->65536."), ("-->168.", "-->170.")):
            _, problems = notes_calc.calc_text(NOTE.replace(old, new),
                                               notes_calc.load_cards(ROOT / "docs/hardware.csv"), "n")
            self.assertEqual(len(problems), 1, (old, new, problems))

    def test_missing_value_is_written(self):
        text, problems = notes_calc.calc_text("x <!-- calc: 2*3 --> y", {}, "n")
        self.assertEqual(text, "x <!-- calc: 2*3 -->6 y")
        self.assertIn("missing", problems[0])

    def test_bad_expressions(self):
        cards = notes_calc.load_cards(ROOT / "docs/hardware.csv")
        for expr, words in (("H100.nope", "no number for H100.nope"), ("B200.sms", "no card 'B200'"),
                            ("__import__('os')", "not allowed"), ("1/3", "not an integer"),
                            ("A100.mac_fp8", "no number for A100.mac_fp8"), ("1 +", "not an expression")):
            with self.assertRaises(notes_calc.CalcError) as e:
                notes_calc.compute(expr, cards)
            self.assertIn(words, str(e.exception), expr)

    def test_marker_must_not_open_a_line(self):
        for text in ("<!-- calc: 2*3 -->6 at the start", "  <!-- calc: 2*3 -->6", "- <!-- calc: 2*3 -->6"):
            problems = notes_calc.calc_text(text, {}, "n")[1]
            self.assertEqual(len(problems), 1, text)
            self.assertIn("starts the line", problems[0])

    def test_code_span_is_quoted_text(self):
        text = "write `<!-- calc: 2*3 -->7` in a note"
        self.assertEqual(notes_calc.calc_text(text, {}, "n"), (text, []))

    def test_site_shows_the_value(self):
        self.assertEqual(notes_calc.strip_markers("is <!-- calc: 16*8*16 -->2048 MACs"), "is 2048 MACs")


class RealRepository(unittest.TestCase):
    def test_every_note_agrees_with_the_table(self):
        tree = notes.Tree(ROOT)
        cards = notes.cards_of(ROOT)
        problems, markers = [], 0
        for note in tree.notes.values():
            markers += note.text.count("<!-- calc:")
            problems += notes_calc.calc_text(note.text, cards, note.rel)[1]
        self.assertEqual(problems, [])
        self.assertGreater(markers, 0, "no calc marker in the notes")

    def test_planted_wrong_number_in_stage_10_is_caught(self):
        text = (ROOT / "stages/10_hopper_fwd/README.md").read_text(encoding="utf-8")
        i = text.find("<!-- calc:")
        self.assertGreaterEqual(i, 0)
        m = notes_calc.CALC_RE.search(text, i)
        planted = text[:m.start("value")] + "1" + m.group("value") + text[m.end("value"):]
        _, problems = notes_calc.calc_text(planted, notes.cards_of(ROOT), "stages/10_hopper_fwd/README.md")
        self.assertEqual(len(problems), 1, problems)


if __name__ == "__main__":
    unittest.main(verbosity=1)
