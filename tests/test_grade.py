#!/usr/bin/env python3
"""Unit tests of scripts/lab/grade.py's summary (CTest: grade_summary), on JUnit reports written
here: a failing stage shows its case and every comparison line; a stage whose forward is
graded alone gets a line per part; a test the build has but the run did not select reads
"not selected", one the build lacks "not built here"; --expect-not-implemented counts the
forward part like its stage; a GPU stage's CPU test (stage12_cpu) is graded as the stage."""
import sys
import tempfile
import unittest
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts" / "lab"))
import grade  # noqa: E402

FAILING_05 = """[doctest] ...
TEST CASE:  stage 05: shape matrix
  logged: 05_one_pass_fused f32 batch=2 heads=2 kv_heads=2 seq_q=2 seq_k=2 d=64 non-causal scale=0.125 seed=101 dist=normal
          O: max_abs=6.924e-01 (tol 2.475e-06) max_rel=1.249e+01 rel_fro=1.182e-01 worst (b,h,row,col)=(0,0,0,56) got 1.478e-01 ref 8.402e-01 FAIL
L: max_abs=3.067e-01 (tol 1.707e-06) max_rel=7.051e-01 rel_fro=1.067e-01 worst (b,h,row,col)=(0,0,0,0) got 7.418e-01 ref 4.350e-01 FAIL
"""
STUB_06 = 'not implemented: stage 06, region "recompute P and dS"\n'


def junit(cases):
    body = []
    for name, status, out in cases:
        inner = {"passed": "", "failed": '<failure message="Failed"/>',
                 "skipped": '<skipped message="SKIP_RETURN_CODE=77"/>'}[status]
        body.append(f'<testcase name="{name}" status="{"fail" if status == "failed" else "run"}">{inner}'
                    f"<system-out><![CDATA[{out}]]></system-out></testcase>")
    return '<?xml version="1.0"?><testsuite>' + "".join(body) + "</testsuite>"


FOLDERS = {"04": "04_two_pass_online", "05": "05_one_pass_fused", "06": "06_tiled_cpu", "07": "07_smem_cuda"}


class Summary(unittest.TestCase):
    def summary(self, cases, known=None):
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / "r.xml"
            path.write_text(junit(cases))
            results = grade.read_junit(path)
        return grade.summarise(results, FOLDERS, {}, known)

    def test_every_comparison_line(self):
        lines, v = self.summary([("harness", "passed", ""), ("stage05", "failed", FAILING_05)])
        k = lines.index("stage 05_one_pass_fused: failed, on the case and comparison below:")
        self.assertIn("seed=101", lines[k + 1])
        self.assertTrue(lines[k + 2].strip().startswith("O: max_abs=6.924e-01"))
        self.assertTrue(lines[k + 3].strip().startswith("L: max_abs=3.067e-01"))
        self.assertEqual(v["stages"]["05"]["state"], "failed")

    def test_forward_graded_alone(self):
        lines, v = self.summary([("harness", "passed", ""), ("stage06_forward", "passed", ""),
                                 ("stage06", "failed", STUB_06)])
        self.assertIn("stage 06_tiled_cpu, forward alone: passed", lines)
        self.assertIn('stage 06_tiled_cpu, all its tests: not implemented (region "recompute P and dS")', lines)
        self.assertEqual(v["stages"]["06_forward"]["state"], "passed")
        self.assertEqual(grade.check_expectation(v, {"06"}, FOLDERS),
                         ["stage 06_forward: passed (expected not implemented)"])

    def test_not_selected_and_not_built(self):
        known = {"harness", "stage04", "stage05", "stage06", "stage06_forward", "tour"}
        lines, v = self.summary([("stage05", "passed", "")], known)
        self.assertIn("harness: not selected (not among the tests this run was asked for)", lines)
        self.assertIn("stage 04_two_pass_online: not selected (not among the tests this run was asked for)", lines)
        self.assertIn("stage 06_tiled_cpu, forward alone: not selected (not among the tests this run was asked for)", lines)
        self.assertIn("stage 07_smem_cuda: not built here (no test program: GPU stages need a CUDA build)", lines)
        self.assertIn("other tests: 0 passed; 1 not selected", lines)

    def test_cpu_part_of_a_gpu_stage(self):
        folders = dict(FOLDERS, **{"12": "12_ring_attention"})
        stub = 'not implemented: stage 12, region "merge a partial result"\n'
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / "r.xml"
            path.write_text(junit([("harness", "passed", ""), ("stage12_cpu", "failed", stub),
                                   ("cli_stage12", "failed", stub)]))
            lines, v = grade.summarise(grade.read_junit(path), folders, {})
        self.assertIn('stage 12_ring_attention, CPU part: not implemented (region "merge a partial result")', lines)
        self.assertEqual(v["stages"]["12_cpu"]["state"], "not implemented")
        self.assertNotIn("stage12_cpu", v["others"])
        self.assertEqual(grade.check_expectation(v, {"12"}, folders), [])
        self.assertNotEqual(grade.check_expectation(v, set(), folders), [])

    def test_stage_that_waits_before_its_own_stub(self):
        """Stage 12 stubbed and run on a stubbed stage 06: it stops at 06's stub first. That
        meets "12 and 06 not implemented", and not "only 12" (06 should then pass)."""
        folders = dict(FOLDERS, **{"12": "12_ring_attention"})
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / "r.xml"
            path.write_text(junit([("harness", "passed", ""), ("stage12_cpu", "failed", STUB_06)]))
            lines, v = grade.summarise(grade.read_junit(path), folders, {})
        self.assertEqual(v["stages"]["12_cpu"]["state"], "waiting")
        self.assertEqual(grade.check_expectation(v, {"06", "12"}, folders), [])
        self.assertNotEqual(grade.check_expectation(v, {"12"}, folders), [])

    def test_stage_without_regions_that_runs_a_stubbed_one(self):
        """Stage 14's CPU step runs stage 05's loop and has no region of its own: with 05
        stubbed it waits on 05, which meets "only 05 not implemented" and not "none"."""
        folders = dict(FOLDERS, **{"14": "14_decode"})
        stub_05 = 'not implemented: stage 05, region "online update"\n'
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / "r.xml"
            path.write_text(junit([("harness", "passed", ""), ("stage14_cpu", "failed", stub_05)]))
            lines, v = grade.summarise(grade.read_junit(path), folders, {})
        self.assertEqual(v["stages"]["14_cpu"]["state"], "waiting")
        self.assertEqual(grade.check_expectation(v, {"05"}, folders), [])
        self.assertNotEqual(grade.check_expectation(v, set(), folders), [])


if __name__ == "__main__":
    unittest.main(verbosity=1)
