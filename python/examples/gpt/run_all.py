"""The capstone in one command: a small GPT and a long-context recall model, trained once per
attention backend, within a time budget; CSVs, a summary and a figure of the loss curves.

    python3 python/examples/gpt/run_all.py --out OUT --budget-s 420            # on the GPU
    python3 python/examples/gpt/run_all.py --out OUT --device cpu --tiny        # a CPU try-out
    python3 python/examples/gpt/run_all.py --out OUT --tasks text --documents   # document masking

Backends: "sdpa" (torch's scaled_dot_product_attention, its own choice of kernel), "08+09"
(stage 08's forward, 09's backward), "10+11" (stages 10 and 11, Hopper only); on the CPU "sdpa"
and "06". The control "sdpa-cudnn" (SDPA held to its cuDNN kernel; "sdpa-flash" to its
FlashAttention-2 kernel) is another exact attention with its own rounding: how far its curve
lies from sdpa's is how far rounding alone moves a run. A backend that
cannot run here (no library, a stage not built, a GPU it does not support) is skipped with
the reason. The library is found as the package finds it ($FA_LIB, else build/ or build-gpu/).

With --documents the text task masks documents: each file of the repository is a document and
every token attends only within its own (data.py, model.py); the backends are then "sdpa" (a
dense mask) and "13" (stage 13 with cu_seqlens: its Hopper kernels on a GPU, its CPU step on
the CPU).

The tasks (data.py): "text", next-byte prediction on the repository's notes and sources with a
6-layer GPT (d_model 384, 6 heads of 64, context 1024); "recall", key–value recall at N = 4096
with a 2-layer model (4 heads of 64). How the budget becomes step counts: each backend trains
a throwaway model for a few steps per task (the calibration), which gives its seconds per step
and per evaluation batch; what is left of the budget after that (less a reserve for writing
the files) is shared 55/45 between the tasks, and each task gets the number of steps that all
its backends fit into its share, at most --max-steps-*. Every backend of a task trains the same
number of steps on the same batches. A run past the budget stops (and says so) rather than
overrun it.
"""
import argparse
import datetime
import os
import pathlib
import subprocess
import sys
import time

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parents[1]))  # python/: fa_attention

import numpy as np  # noqa: E402

import report  # noqa: E402  (no torch)

RESERVE_S = 20.0          # writing the CSVs and the figure, and leaving the process
TASK_SHARE = {"text": 0.55, "recall": 0.45}


def task_settings(tiny):
    """Model, data and schedule of each task; `tiny` is the CPU try-out (and the smoke test)."""
    from model import GPTConfig
    if tiny:
        return {
            "text": dict(cfg=GPTConfig(context=128, n_layer=2, n_head=2, head_dim=64), batch=4,
                         lr=2e-3, max_steps=40, eval_every=10, eval_batches=2),
            "recall": dict(cfg=GPTConfig(context=256, n_layer=2, n_head=2, head_dim=64,
                                         previous_token=True),
                           batch=4, pairs=8, lr=2e-3, max_steps=40, eval_every=10, eval_batches=1),
        }
    return {
        "text": dict(cfg=GPTConfig(context=1024, n_layer=6, n_head=6, head_dim=64), batch=16,
                     lr=1e-3, max_steps=1200, eval_every=50, eval_batches=4),
        "recall": dict(cfg=GPTConfig(context=4096, n_layer=2, n_head=4, head_dim=64,
                                     previous_token=True),
                       batch=8, pairs=16, lr=1e-3, max_steps=1500, eval_every=50, eval_batches=2),
    }


def make_data(task, s, seed, steps=None, documents=False):
    """The task's data; for recall with a step count, the curriculum: the first 30% of the steps
    at 64 tokens, the next 20% at 512 (where shorter than N), then N. `documents`: the text
    task's files as documents (document masking)."""
    from data import RecallData, TextData
    if task == "text":
        return TextData(context=s["cfg"].context, batch=s["batch"], seed=seed, documents=documents)
    N = s["cfg"].context
    phases = ()
    if steps:
        phases = tuple((n, int(steps * until)) for n, until in ((64, 0.3), (512, 0.5)) if n < N)
    return RecallData(seq=N, pairs=s["pairs"], batch=s["batch"], seed=seed, phases=phases)


def available_backends(names, device):
    """[(backend, None)] for the usable ones, [(backend, reason)] for the others."""
    import torch
    from model import BACKENDS
    out = []
    for name in names:
        if name not in BACKENDS:
            out.append((name, f"unknown backend (backends: {', '.join(BACKENDS)})"))
            continue
        stage = BACKENDS[name]
        if name == "sdpa":
            out.append((name, None))
            continue
        try:
            dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
            if stage is None:  # SDPA held to one kernel: a causal forward and backward show if it runs here
                from model import attention_backend
                q, k, v = (torch.randn(1, 2, 128, 64, device=device, dtype=dtype, requires_grad=True)
                           for _ in range(3))
                attention_backend(name)(q, k, v).sum().backward()
                out.append((name, None))
                continue
            from fa_attention import core
            from fa_attention.torch_ops import attention
            if stage == "13":  # not in the stage list (its own entries): a try shows whether it runs here
                from data import cu_seqlens_of
                from model import Documents, attention_backend
                q, k, v = (torch.randn(2, 2, 64, 64, device=device, dtype=dtype, requires_grad=True)
                           for _ in range(3))
                ids = np.repeat(np.arange(4), 32).reshape(2, 64)
                attention_backend(name)(q, k, v, Documents.of(ids, device)).sum().backward()
                out.append((name, None))
                continue
            built = [s for s in core.stages() if s.startswith(stage)]
            if not built:
                raise RuntimeError(f"stage {stage} is not in {core.library()._name} "
                                   f"(it has: {', '.join(core.stages())})")
            if core.is_gpu(stage) != (device.type == "cuda"):
                where = "a GPU" if core.is_gpu(stage) else "the CPU"
                raise RuntimeError(f"stage {stage} runs on {where}, this run on {device}")
            # A causal forward and backward on a small problem: refusals show here (a stage not
            # built into this library, a GPU architecture it does not support).
            q, k, v = (torch.randn(1, 2, 128, 64, device=device, dtype=dtype, requires_grad=True)
                       for _ in range(3))
            attention(q, k, v, causal=True, stage=stage).sum().backward()
            if device.type == "cuda":
                torch.cuda.synchronize()
            out.append((name, None))
        except Exception as e:  # the library's FaError, a missing library, a CUDA error
            out.append((name, f"{type(e).__name__}: {e}"))
    return out


def git_commit():
    if os.environ.get("FA_COMMIT"):
        return os.environ["FA_COMMIT"]
    try:
        return subprocess.run(["git", "-C", str(HERE), "rev-parse", "--short=12", "HEAD"],
                              capture_output=True, text=True, check=True).stdout.strip()
    except Exception:
        return "unknown"


def device_prefix(device_name):
    for chip in ("H100", "H200", "A100"):
        if chip in device_name:
            return chip.lower()
    return "cpu" if device_name.startswith("cpu") else "gpu"


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True, help="folder for the CSVs, the summary and the figure")
    ap.add_argument("--budget-s", type=float, default=420.0, help="seconds for everything (default 420)")
    ap.add_argument("--device", default=None, help="cuda or cpu (default: cuda when there is one)")
    ap.add_argument("--backends", default=None,
                    help="comma-separated (default: sdpa,sdpa-cudnn,08+09,10+11 on a GPU; sdpa,06 on the CPU)")
    ap.add_argument("--tasks", default=None,
                    help="comma-separated: text, recall (default: both; text alone with --documents)")
    ap.add_argument("--steps", type=int, default=None,
                    help="train exactly this many steps per task (no calibration; --budget-s still stops runs)")
    ap.add_argument("--tiny", action="store_true", help="small models and data (a CPU try-out)")
    ap.add_argument("--documents", action="store_true",
                    help="document masking on the text task: each file a document (backends sdpa and 13)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--prefix", default=None,
                    help="file name prefix (default: <chip>_gpt_capstone, e.g. h100_gpt_capstone)")
    args = ap.parse_args(argv)
    t0 = time.monotonic()
    deadline = t0 + args.budget_s - RESERVE_S

    import torch
    from train import Trainer, measure, run
    if args.device is None:
        args.device = "cuda" if torch.cuda.is_available() else "cpu"
    device = torch.device(args.device)
    device_name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    default_backends = "sdpa,sdpa-cudnn,08+09,10+11" if device.type == "cuda" else "sdpa,06"
    if args.documents:
        default_backends = "sdpa,13"
    commit, date = git_commit(), datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    prefix = args.prefix or f"{device_prefix(device_name)}_gpt_capstone" + ("_documents" if args.documents else "")
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    print(f"run_all: {device_name}, torch {torch.__version__}, commit {commit}, budget {args.budget_s:.0f} s")

    backends = []
    for name, reason in available_backends((args.backends or default_backends).split(","), device):
        print(f"  backend {name:10}: " + ("ok" if reason is None else f"skipped ({reason})"))
        if reason is None:
            backends.append(name)
    if not backends:
        print("run_all: no backend can run here")
        return 1
    settings = task_settings(args.tiny)
    args.tasks = args.tasks or ("text" if args.documents else "text,recall")
    tasks = [t for t in args.tasks.split(",") if t]
    for t in tasks:
        if t not in settings:
            ap.error(f"--tasks: unknown task '{t}' (tasks: {', '.join(settings)})")
    if args.documents and tasks != ["text"]:
        ap.error(f"--documents masks the text task's files: give --tasks text (got --tasks {args.tasks})")

    # Calibration: seconds per step and per evaluation batch of each backend on each task.
    steps = {}
    if args.steps is not None:
        steps = {t: args.steps for t in tasks}
    else:
        cost = {}
        for t in tasks:
            s = settings[t]
            data = make_data(t, s, args.seed, documents=args.documents)
            val = data.val_batches(1)
            cost[t] = 0.0
            for b in backends:
                trainer = Trainer(data, s["cfg"], b, device, s["lr"], total_steps=100, seed=args.seed,
                                  documents=args.documents)
                step_s, eval_s = measure(trainer, steps=5, warmup=3, val=val)
                cost[t] += step_s + eval_s * s["eval_batches"] / s["eval_every"]
                print(f"  calibration {t:6} {b:10}: {1e3 * step_s:7.1f} ms/step, {1e3 * eval_s:6.1f} ms/eval batch")
                del trainer
            if device.type == "cuda":
                torch.cuda.empty_cache()
        left = deadline - time.monotonic()
        share = sum(TASK_SHARE[t] for t in tasks)
        for t in tasks:
            fit = int(0.9 * left * TASK_SHARE[t] / share / cost[t])
            steps[t] = max(1, min(settings[t]["max_steps"], fit))
            print(f"  plan {t}: {steps[t]} steps per backend (the budget fits {fit}, at most "
                  f"{settings[t]['max_steps']}), about {steps[t] * cost[t]:.0f} s for {len(backends)} backends")

    # The runs: every backend of a task on the same batches.
    summary = []
    for t in tasks:
        s = settings[t]
        data = make_data(t, s, args.seed, steps[t], documents=args.documents)
        val = data.val_batches(s["eval_batches"])
        print(f"{data.describe()}; {steps[t]} steps of {data.batch} x {s['cfg'].context} tokens")
        runs, step_rows = {}, []
        for b in backends:
            trainer = Trainer(data, s["cfg"], b, device, s["lr"], total_steps=steps[t], seed=args.seed,
                              documents=args.documents)
            if b == backends[0]:
                print(f"  model: {s['cfg']}, {trainer.model.num_params() / 1e6:.2f} M parameters")
            start = time.monotonic()
            rows, stopped = run(trainer, steps[t], s["eval_every"], val, deadline=deadline)
            print(f"  {b}: {len(rows)} steps in {time.monotonic() - start:.1f} s")
            runs[b] = (rows, stopped)
            step_rows += [dict(task=t, backend=b, device=device_name, commit=commit, date=date, **r)
                          for r in rows]
            del trainer
            if device.type == "cuda":
                torch.cuda.empty_cache()
        report.write_csv(out / f"{prefix}_{t}.csv", report.STEP_COLUMNS, step_rows)
        summary += [dict(r, device=device_name, commit=commit, date=date) for r in report.summarize(t, runs)]

    report.write_csv(out / f"{prefix}_summary.csv", report.SUMMARY_COLUMNS, summary)
    header = [f"# GPT capstone: {device_name}",
              "",
              f"Written by `python/examples/gpt/run_all.py` (budget {args.budget_s:.0f} s) at commit "
              f"`{commit}`, {date}, torch {torch.__version__}. Final loss: the mean training loss of the "
              "last 10% of the steps (the same batches for every backend); val loss and accuracy: at "
              "the last step; tokens/s: over the timed steps at the task's full sequence length."]
    md = report.summary_markdown(summary, header)
    (out / f"{prefix}_summary.md").write_text(md, encoding="utf-8")
    print(md)
    try:
        step_rows = [r for t in tasks for r in report.read_csv(out / f"{prefix}_{t}.csv")]
        report.plot(step_rows, out / f"{prefix}.png", title=f"GPT capstone, {device_name}")
        print(f"run_all: figure {out / f'{prefix}.png'}")
    except ImportError as e:
        print(f"run_all: no figure ({e}); the CSVs are written")
    print(f"run_all: files in {out}; {time.monotonic() - t0:.0f} s in all")
    return 0


if __name__ == "__main__":
    sys.exit(main())
