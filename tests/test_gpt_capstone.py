"""The GPT capstone (python/examples/gpt) on the CPU: run_all.py --tiny with stage 06 and sdpa.

Two checks:
- the gradients: one forward and backward of the tiny text model from the same weights on the
  same batch, with stage 06 and with sdpa (both fp32): the losses agree to 1e-6 and every
  parameter's gradient to 1e-5 (relative, in norm). A wrong forward or backward of the stage
  breaks this; only rounding separates the two.
- the runs: both tasks train a tiny model for 30 steps with each backend; stage 06's loss at
  step 0 agrees with sdpa's to 1e-6, every later step's to 1e-3, the loss decreases, and the
  CSVs, the summary and the figure are written. The later steps get a wider bound than the
  gradients because AdamW magnifies rounding: a weight whose gradient is near zero moves by
  about lr·sign(gradient), so two exact attentions part by ~1e-4 after 30 steps on some CPUs
  (2.1e-4 seen on the GPU machine's), while a wrong gradient parts them by far more.

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
    first = abs(ours[0]["loss"] - base[0]["loss"]) / base[0]["loss"]
    worst = max(abs(a["loss"] - b["loss"]) / b["loss"] for a, b in zip(ours, base))
    ok = first < 1e-6 and worst < 1e-3
    print(f"{'ok  ' if ok else 'FAIL'} {task}: stage 06 against sdpa, relative loss difference "
          f"{first:.1e} at step 0, at most {worst:.1e} over {STEPS} steps")
    assert first < 1e-6, f"{task}: losses of 06 and sdpa differ by {first:.1e} (relative) at step 0"
    assert worst < 1e-3, f"{task}: losses of 06 and sdpa differ by {worst:.1e} (relative)"
    first, last = base[0]["loss"], sum(r["loss"] for r in base[-5:]) / 5
    print(f"{'ok  ' if last < first - 0.5 else 'FAIL'} {task}: loss {first:.3f} at step 0, "
          f"{last:.3f} over the last 5 steps")
    assert last < first - 0.5, f"{task}: the loss did not decrease ({first:.3f} -> {last:.3f})"


def test_gradients():
    """One forward and backward of the tiny text model: stage 06 against sdpa, same weights, same batch."""
    import run_all
    from data import TextData
    from model import GPT, attention_backend
    torch.set_num_threads(min(2, torch.get_num_threads()))
    s = run_all.task_settings(tiny=True)["text"]
    inputs, targets = (torch.from_numpy(x) for x in
                       TextData(context=s["cfg"].context, batch=s["batch"], seed=0).train_batch(0))
    results = {}
    for backend in ("sdpa", "06"):
        torch.manual_seed(0)
        model = GPT(s["cfg"], attention_backend(backend))
        _, loss = model(inputs, targets)
        loss.backward()
        results[backend] = (loss.item(), {n: p.grad.clone() for n, p in model.named_parameters()})
    (loss_ref, grads_ref), (loss_06, grads_06) = results["sdpa"], results["06"]
    d_loss = abs(loss_06 - loss_ref) / loss_ref
    d_grad = {n: ((grads_06[n] - g).norm() / g.norm()).item() for n, g in grads_ref.items() if g.norm() > 0}
    name, worst = max(d_grad.items(), key=lambda kv: kv[1])
    ok = d_loss < 1e-6 and worst < 1e-5
    print(f"{'ok  ' if ok else 'FAIL'} gradients: stage 06 against sdpa, loss {d_loss:.1e}, "
          f"largest gradient difference {worst:.1e} ({name}), {len(d_grad)} parameters")
    assert d_loss < 1e-6, f"loss of 06 and sdpa differ by {d_loss:.1e} (relative)"
    assert worst < 1e-5, f"gradient of {name}: 06 and sdpa differ by {worst:.1e} (relative, in norm)"


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
    test_gradients()
    test_tiny_run()
    print("all passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
