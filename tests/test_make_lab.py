#!/usr/bin/env python3
"""Unit tests of the lab generator (scripts/lab/make_lab.py).

    python3 tests/test_make_lab.py        (exit 0 when every test passes)

Bad markers must be refused with file:line; a generated tree must carry the stubs, the
include and the device guards; pasting the solutions back must restore them exactly.
"""
from __future__ import annotations

import contextlib
import io
import os
import subprocess
import sys
import tempfile
import textwrap
import time
import unittest
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts" / "lab"))
import make_lab  # noqa: E402
from make_lab import LabError, parse_regions  # noqa: E402

F = "stages/05_x/x.cpp"


def src(text: str) -> str:
    return textwrap.dedent(text).lstrip("\n")


GOOD = src("""
    #include "x.h"

    namespace fa::stage05 {
    void forward(int n, float* out) {
      float m = 0.0f;
      for (int j = 0; j < n; ++j) {
        const float s = float(j);
        // LAB BEGIN: online update — hint: m = max(m, s)
        const float m_new = s > m ? s : m;
        m = m_new;
        // LAB END
      }
      out[0] = m;
    }
    }  // namespace fa::stage05
""")


def sub(text: str, old: str, new: str) -> str:
    assert old in text, f"test bug: {old!r} is not in the source"
    return text.replace(old, new)


def raises(text: str, path: str = F) -> str:
    try:
        parse_regions(path, text)
        make_lab.check_outliving_names(path, text, parse_regions(path, text))
    except LabError as e:
        return str(e)
    raise AssertionError("no LabError raised")


class Markers(unittest.TestCase):
    def test_a_good_region(self):
        [r] = parse_regions(F, GOOD)
        self.assertEqual((r.stage, r.name, r.hint), ("05", "online update", "m = max(m, s)"))
        self.assertEqual((r.begin, r.end), (8, 11))
        self.assertEqual(r.body, ["    const float m_new = s > m ? s : m;\n", "    m = m_new;\n"])
        self.assertEqual(r.function, "forward")
        self.assertFalse(r.device)

    def test_ascii_dash_is_accepted(self):
        [r] = parse_regions(F, sub(GOOD, " — hint:", " - hint:"))
        self.assertEqual(r.name, "online update")

    def test_a_name_with_a_dash(self):
        [r] = parse_regions(F, sub(GOOD, "online update —", "dS - the gradient —"))
        self.assertEqual(r.name, "dS - the gradient")

    def test_unclosed_marker_names_file_and_line(self):
        e = raises(sub(GOOD, "    // LAB END\n", ""))
        self.assertIn(f"{F}:8:", e)
        self.assertIn("never closed", e)

    def test_nested_markers(self):
        text = sub(GOOD, "    m = m_new;\n", "    // LAB BEGIN: inner — hint: h\n    m = m_new;\n    // LAB END\n")
        e = raises(text)
        self.assertIn(f"{F}:10:", e)
        self.assertIn("nested", e)
        self.assertIn("line 8", e)

    def test_end_without_begin(self):
        e = raises(sub(GOOD, "    // LAB BEGIN: online update — hint: m = max(m, s)\n", ""))
        self.assertIn(f"{F}:10:", e)
        self.assertIn("without a LAB BEGIN", e)

    def test_marker_outside_a_function(self):
        text = src("""
            namespace fa::stage05 {
            // LAB BEGIN: constants — hint: none
            constexpr int kN = 4;
            // LAB END
            void forward() {}
            }
        """)
        e = raises(text)
        self.assertIn(f"{F}:2:", e)
        self.assertIn("outside a function", e)

    def test_marker_in_a_class_body_is_outside_a_function(self):
        text = src("""
            struct Tiles {
              // LAB BEGIN: fields — hint: B_r and B_c
              int B_r = 0;
              // LAB END
            };
        """)
        self.assertIn(f"{F}:2:", raises(text))

    def test_member_function_body_is_a_function(self):
        text = src("""
            struct A {
              __device__ void update(float (&S)[4]) {
                // LAB BEGIN: update — hint: scale
                for (int k = 0; k < 4; ++k) S[k] *= 2.0f;
                // LAB END
              }
            };
        """)
        [r] = parse_regions("stages/08_y/y.cuh", text)
        self.assertTrue(r.device)
        self.assertEqual(r.function, "update")

    def test_malformed_begin(self):
        e = raises(sub(GOOD, " — hint: m = max(m, s)", ""))
        self.assertIn(f"{F}:8:", e)
        self.assertIn("malformed", e)
        e = raises(sub(GOOD, "// LAB END", "// LAB END of it"))
        self.assertIn(f"{F}:11:", e)

    def test_region_must_be_whole_statements(self):
        text = sub(GOOD, "  out[0] = m;\n", "  out[0] =\n  // LAB BEGIN: tail — hint: h\n  m;\n  // LAB END\n")
        e = raises(text)
        self.assertIn(f"{F}:14:", e)
        self.assertIn("inside a statement", e)
        # LAB END one block further out than LAB BEGIN
        text = sub(GOOD, "    // LAB END\n  }\n", "  }\n    // LAB END\n")
        e = raises(text)
        self.assertIn("does not end in the block it began in", e)

    def test_braces_in_strings_and_comments_do_not_count(self):
        text = sub(GOOD, "float m = 0.0f;", 'float m = 0.0f; const char* t = "}}{"; /* { */ // }\n  int big = 1\'000;')
        [r] = parse_regions(F, text)
        self.assertEqual(r.name, "online update")

    def test_lambda_argument_keeps_the_statement_open(self):
        text = src("""
            void forward(int n) {
              run(n, [&](int t) {
                work(t);
              });
              // LAB BEGIN: after — hint: h
              done(n);
              // LAB END
            }
        """)
        [r] = parse_regions(F, text)
        self.assertEqual(r.name, "after")

    def test_a_declared_name_used_after_the_region_is_refused(self):
        text = sub(GOOD, "    m = m_new;\n    // LAB END\n", "    // LAB END\n    m = m_new;\n")
        e = raises(text)
        self.assertIn(f"{F}:9:", e)
        self.assertIn("'m_new'", e)
        self.assertIn("would not compile", e)

    def test_a_name_declared_afresh_after_the_region_is_fine(self):
        text = sub(GOOD, "    // LAB END\n  }\n", "    // LAB END\n    const float m_new = 1.0f;\n    m += m_new;\n  }\n")
        parse_regions(F, text)
        make_lab.check_outliving_names(F, text, parse_regions(F, text))

    def test_comma_declarations_are_seen(self):
        text = sub(GOOD, "const float m_new = s > m ? s : m;", "float a = 0, m_new = s > m ? s : m;")
        text = sub(text, "    // LAB END\n  }\n", "    // LAB END\n    m += a;\n  }\n")
        self.assertIn("'a'", raises(text))

    def test_markers_outside_a_stage_folder(self):
        self.assertIn("common/x.cpp:8:", raises(GOOD, "common/x.cpp"))

    def test_quotes_in_a_region_name(self):
        self.assertIn("quotes", raises(sub(GOOD, "online update", 'online "update"')))


CUDA = src("""
    #include <cstdio>

    #include "y.h"

    namespace fa::stage07 {
    template <int N>
    __device__ void scores(float (&S)[N]) {
      // LAB BEGIN: scores — hint: S = Q K^T
      for (int k = 0; k < N; ++k) S[k] = 1.0f;
      // LAB END
    }

    __global__ void kernel(float* out) {
      float S[4];
      scores(S);
      out[0] = S[0];
    }

    void forward(float* out, int n) {
      if (n == 0) return;
      kernel<<<1, 1>>>(out);
    }
    }  // namespace fa::stage07
""")


class Tree(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.repo = Path(self.tmp.name) / "repo"
        self.out = Path(self.tmp.name) / "lab"
        files = {
            "stages/05_x/x.cpp": GOOD,
            "stages/05_x/CMakeLists.txt": "fa_add_stage(x.cpp)\n",
            "stages/04_w/w.cpp": sub(GOOD, "stage05", "stage04").replace("online update", "normaliser"),
            "stages/04_w/CMakeLists.txt": "fa_add_stage(w.cpp)\n",
            "stages/07_y/y.cu": CUDA,
            "stages/07_y/y.h": "#pragma once\n",
            "stages/07_y/CMakeLists.txt": "fa_add_stage(y.cu)\n",
            "scripts/test.sh": "#!/usr/bin/env bash\nroot=x\ncd build\nctest --output-on-failure \"$@\"\n",
            "README.md": "readme\n",
            "build/junk.o": "not copied: ignored by git\n",
            ".gitignore": "/build/\n",
        }
        for name, text in files.items():
            (self.repo / name).parent.mkdir(parents=True, exist_ok=True)
            (self.repo / name).write_text(text, encoding="utf-8")
        os.chmod(self.repo / "scripts/test.sh", 0o755)
        subprocess.run(["git", "init", "-q", str(self.repo)], check=True)

    def tearDown(self):
        self.tmp.cleanup()

    def generate(self, stages: str) -> dict:
        with contextlib.redirect_stdout(io.StringIO()):
            return make_lab.generate(self.repo, self.out, stages)

    def test_stubs_include_guard_and_stripped_markers(self):
        manifest = self.generate("05,07")
        self.assertEqual(manifest["stubbed_stages"], ["05", "07"])
        x = (self.out / "stages/05_x/x.cpp").read_text()
        self.assertIn('FA_LAB_TODO("05", "online update");', x)
        self.assertIn("// LAB BEGIN: online update — hint: m = max(m, s)", x)
        self.assertIn('#include "lab.h"', x)
        self.assertLess(x.index('#include "x.h"'), x.index('#include "lab.h"'))
        self.assertNotIn("m_new", x)
        w = (self.out / "stages/04_w/w.cpp").read_text()  # not stubbed: solution, no markers
        self.assertNotIn("LAB", w)
        self.assertIn("m = m_new;", w)
        self.assertNotIn("lab.h", w)
        y = (self.out / "stages/07_y/y.cu").read_text()
        self.assertIn('#define FA_LAB_PENDING_07_1 "scores"', y)
        self.assertNotIn("S[k] = 1.0f", y)
        guard = y.index("#if defined(FA_LAB_PENDING_07_1)")
        self.assertLess(y.index('#define FA_LAB_PENDING_07_1'), guard)
        self.assertLess(y.index("void forward(float* out, int n) {"), guard)
        self.assertLess(guard, y.index("if (n == 0) return;"))
        self.assertIn('FA_LAB_TODO("07", FA_LAB_PENDING_07_1);', y)
        self.assertIn('#include "lab.h"', y)
        self.assertFalse((self.out / "build/junk.o").exists())
        t = (self.out / "scripts/test.sh")
        self.assertIn('python3 "$root/scripts/lab/grade.py" --build-dir . -- --output-on-failure "$@"', t.read_text())
        self.assertTrue(os.access(t, os.X_OK))

    def test_regenerating_writes_only_what_changed(self):
        self.generate("05")
        x = self.out / "stages/05_x/x.cpp"
        readme = self.out / "README.md"
        old = time.time() - 1000
        os.utime(x, (old, old))
        os.utime(readme, (old, old))
        self.generate("05")
        self.assertEqual(x.stat().st_mtime, old)
        self.generate("none")
        self.assertNotEqual(x.stat().st_mtime, old)  # the stub became the solution
        self.assertEqual(readme.stat().st_mtime, old)

    def test_paste_back_restores_the_solutions(self):
        self.generate("all")
        with contextlib.redirect_stdout(io.StringIO()):
            pasted = make_lab.paste_back(self.repo, self.out, "all")
        self.assertEqual(sorted(r.stage for r in pasted), ["04", "05", "07"])
        x = (self.out / "stages/05_x/x.cpp").read_text()
        self.assertNotIn('FA_LAB_TODO("', x)
        self.assertIn("const float m_new = s > m ? s : m;\n    m = m_new;\n    // LAB END", x)
        y = (self.out / "stages/07_y/y.cu").read_text()
        self.assertNotIn("#define FA_LAB_PENDING", y)
        self.assertIn("S[k] = 1.0f", y)
        # the regions of the pasted tree are exactly the solution's
        for f in ("stages/05_x/x.cpp", "stages/07_y/y.cu"):
            mine = parse_regions(f, (self.out / f).read_text())
            theirs = parse_regions(f, (self.repo / f).read_text())
            self.assertEqual([r.body for r in mine], [r.body for r in theirs])

    def test_unknown_or_unmarked_stages_are_refused(self):
        with self.assertRaises(LabError) as e:
            self.generate("09")
        self.assertIn("no stage 09", str(e.exception))
        (self.repo / "stages/03_z").mkdir()
        (self.repo / "stages/03_z/z.cpp").write_text("void f() {}\n")
        with self.assertRaises(LabError) as e:
            self.generate("03")
        self.assertIn("no LAB regions", str(e.exception))

    def test_stage_numbers_and_a_foreign_output_folder(self):
        self.assertEqual(self.generate("5")["stubbed_stages"], ["05"])
        other = Path(self.tmp.name) / "someone-elses"
        other.mkdir()
        (other / "notes.txt").write_text("keep me\n")
        with self.assertRaises(LabError) as e:
            with contextlib.redirect_stdout(io.StringIO()):
                make_lab.generate(self.repo, other, "05")
        self.assertIn("not empty", str(e.exception))

    def test_duplicate_region_names_in_a_stage(self):
        (self.repo / "stages/05_x/x2.cpp").write_text(GOOD)
        with self.assertRaises(LabError) as e:
            self.generate("05")
        self.assertIn("used twice", str(e.exception))

    def test_a_device_region_without_a_launcher(self):
        (self.repo / "stages/07_y/y.cu").write_text(sub(CUDA, "void forward(", "void launch("))
        with self.assertRaises(LabError) as e:
            self.generate("07")
        self.assertIn("stages/07_y/y.cu:8:", str(e.exception))
        self.assertIn("HOST_ENTRY_POINTS", str(e.exception))

    def test_a_device_region_in_an_included_header(self):
        header = src("""
            #pragma once
            template <int N>
            __device__ void scores(float (&S)[N]) {
              // LAB BEGIN: scores — hint: S = Q K^T
              for (int k = 0; k < N; ++k) S[k] = 1.0f;
              // LAB END
            }
        """)
        (self.repo / "stages/07_y/scores.cuh").write_text(header)
        cu = CUDA.split("namespace fa::stage07 {")[1].split("__global__")[1]
        (self.repo / "stages/07_y/y.cu").write_text(
            '#include "scores.cuh"\n\nnamespace fa::stage07 {\n__global__' + cu)
        self.generate("07")
        y = (self.out / "stages/07_y/y.cu").read_text()
        self.assertIn("#if defined(FA_LAB_PENDING_07_1)", y)
        self.assertIn("#define FA_LAB_PENDING_07_1", (self.out / "stages/07_y/scores.cuh").read_text())

    def test_a_launcher_that_never_reaches_the_region_is_not_guarded(self):
        # Stage 11's step_11d includes add_dq's header but never calls it: a stub of that
        # region must not stop 11d, while every launcher that reaches it (directly or
        # through another function of the header) refuses to run.
        header = src("""
            #pragma once
            template <int N>
            __device__ void scores(float (&S)[N]) {
              // LAB BEGIN: scores — hint: S = Q K^T
              for (int k = 0; k < N; ++k) S[k] = 1.0f;
              // LAB END
            }
            template <int N>
            __device__ void tile(float (&S)[N]) { scores(S); }
            __device__ inline void other(float* x) { x[0] = 0.f; }
        """)
        (self.repo / "stages/07_y/scores.cuh").write_text(header)
        cu = CUDA.split("namespace fa::stage07 {")[1].split("__global__")[1]
        (self.repo / "stages/07_y/y.cu").write_text(
            '#include "scores.cuh"\n\nnamespace fa::stage07 {\n__global__' + cu.replace("scores(S);", "tile(S);"))
        (self.repo / "stages/07_y/z.cu").write_text(src("""
            #include "scores.cuh"

            namespace fa::stage07 {
            __global__ void kernel_b(float* out) { other(out); }

            void backward(float* out) {
              kernel_b<<<1, 1>>>(out);
            }
            }  // namespace fa::stage07
        """))
        make_lab.HOST_ENTRY_POINTS["07"] = ("forward", "backward")  # launchers beside their kernels
        try:
            self.generate("07")
        finally:
            del make_lab.HOST_ENTRY_POINTS["07"]
        self.assertIn("#if defined(FA_LAB_PENDING_07_1)", (self.out / "stages/07_y/y.cu").read_text())
        self.assertNotIn("FA_LAB_PENDING", (self.out / "stages/07_y/z.cu").read_text())

    def test_the_command_line_reports_file_and_line(self):
        (self.repo / "stages/05_x/x.cpp").write_text(sub(GOOD, "    // LAB END\n", ""))
        r = subprocess.run([sys.executable, str(ROOT / "scripts/lab/make_lab.py"), "--repo", str(self.repo),
                            "--out", str(self.out)], capture_output=True, text=True)
        self.assertNotEqual(r.returncode, 0)
        self.assertIn("stages/05_x/x.cpp:8:", r.stderr)
        self.assertIn("never closed", r.stderr)
        self.assertFalse(self.out.exists())

    def test_out_inside_the_repository_must_be_ignored(self):
        with self.assertRaises(LabError):
            with contextlib.redirect_stdout(io.StringIO()):
                make_lab.generate(self.repo, self.repo / "lab", "05")
        with contextlib.redirect_stdout(io.StringIO()):
            make_lab.generate(self.repo, self.repo / "build" / "lab", "05")  # ignored: allowed


@unittest.skipIf((ROOT / ".lab.json").exists() or not (ROOT / ".git").exists(),
                 "not the solution repository (a generated lab tree, or no git checkout)")
class ThisRepository(unittest.TestCase):
    def test_every_marker_of_the_stages_is_valid(self):
        tree = make_lab.load_tree(ROOT)
        make_lab.plan_guards(tree, set(tree.regions))
        for regions in tree.regions.values():
            for r in regions:
                self.assertTrue(r.hint, r.where)
                self.assertTrue(r.body, f"{r.where}: region \"{r.name}\" is empty")


    def test_the_notes_know_the_layers(self):
        sys.path.insert(0, str(ROOT / "docs"))
        import notes  # docs/notes.py checks lab-hint names against the same layers
        self.assertEqual({k.rstrip("/"): v for k, v in make_lab.LAYER_STAGES.items()}, notes.LAYER_STAGES)

    def test_every_hopper_step_is_guarded_on_what_it_runs(self):
        tree = make_lab.load_tree(ROOT)
        guards = {g.function: {r.name for r in g.regions} for g in make_lab.plan_guards(tree, {"10", "11"})}
        for step in ("10a", "10b", "10c", "10d", "10e", "10f", "11a", "11b", "11c", "11d"):
            self.assertIn(f"step_{step}", guards, f"step {step} would launch a stubbed kernel")
        self.assertNotIn("the dQ reduction", guards["step_11d"])  # 11d reduces dQ by bulk copies
        self.assertIn("the dQ reduction", guards["step_11c"])
        self.assertIn("the producer's loop", guards["step_10e"])
        self.assertIn("the producer's loop", guards["step_10f"])
        for region in ("the ping-pong turn", "wait for S only", "release Q"):  # the persistent kernel's
            self.assertEqual(sorted(f for f, names in guards.items() if region in names), ["step_10e", "step_10f"],
                             region)
        self.assertEqual([f for f, names in guards.items() if "the dQ handover" in names], ["step_11d"])


if __name__ == "__main__":
    unittest.main(verbosity=1)
