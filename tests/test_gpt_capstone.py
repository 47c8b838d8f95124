"""The GPT capstone (python/examples/gpt) on the CPU: run_all.py --tiny with stage 06 and sdpa.

Both tasks train a tiny model for a few steps with each backend, then: every step's loss of
stage 06 agrees with sdpa's (both fp32, same weights and batches, so only rounding differs),
the loss decreases, and the CSVs, the summary and the figure are written.

Runs as a script (CTest python_gpt; exit 77 = skipped when torch is not installed, as in CI)
or under pytest (skipped likewise).
"""
import pathlib
import sys
import tempfile

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "python" / "examples" / "gpt"))

try:
    import torch
except ImportError:
    torch = None

if torch is None and "pytest" in sys.modules:
    import pytest
    pytest.skip("torch is not installed", allow_module_level=True)

STEPS = 30


def check_task(rows, task):
    by_backend = {}
    for r in rows:
        by_backend.setdefault(r["backend"], []).append(r)
    ours, base = by_backend["06"], by_backend["sdpa"]
    assert len(ours) == len(base) == STEPS, f"{task}: {len(ours)} and {len(base)} steps, expected {STEPS}"
    worst = max(abs(a["loss"] - b["loss"]) / b["loss"] for a, b in zip(ours, base))
    print(f"{'ok  ' if worst < 1e-4 else 'FAIL'} {task}: stage 06 against sdpa, largest relative "
          f"loss difference over {STEPS} steps {worst:.1e}")
    assert worst < 1e-4, f"{task}: losses of 06 and sdpa differ by {worst:.1e} (relative)"
    first, last = base[0]["loss"], sum(r["loss"] for r in base[-5:]) / 5
    print(f"{'ok  ' if last < first - 0.5 else 'FAIL'} {task}: loss {first:.3f} at step 0, "
          f"{last:.3f} over the last 5 steps")
    assert last < first - 0.5, f"{task}: the loss did not decrease ({first:.3f} -> {last:.3f})"


def test_tiny_run():
    import report
    import run_all
    torch.set_num_threads(min(2, torch.get_num_threads()))
    with tempfile.TemporaryDirectory() as out:
        rc = run_all.main(["--out", out, "--device", "cpu", "--tiny", "--backends", "sdpa,06",
                           "--steps", str(STEPS), "--prefix", "test_gpt_capstone"])
        assert rc == 0, f"run_all returned {rc}"
        files = sorted(p.name for p in pathlib.Path(out).iterdir())
        for name in ("test_gpt_capstone_text.csv", "test_gpt_capstone_recall.csv",
                     "test_gpt_capstone_summary.csv", "test_gpt_capstone_summary.md",
                     "test_gpt_capstone.png"):
            assert name in files, f"{name} was not written (files: {files})"
        for task in ("text", "recall"):
            check_task(report.read_csv(pathlib.Path(out) / f"test_gpt_capstone_{task}.csv"), task)
        summary = report.read_csv(pathlib.Path(out) / "test_gpt_capstone_summary.csv")
        assert {(r["task"], r["backend"]) for r in summary} == {
            (t, b) for t in ("text", "recall") for b in ("sdpa", "06")}, summary


def main():
    if torch is None:
        print("skip: torch is not installed")
        return 77
    test_tiny_run()
    print("all passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
