#!/usr/bin/env python3
"""The PyTorch op against torch's own attention, side by side in one process (issue #28).

Times fa_attention.torch_ops.attention (the native op; stage "11" on Hopper: stage 10's
forward and stage 11's backward, "09" elsewhere) against F.scaled_dot_product_attention with
torch's default backend choice, and held to its cuDNN and its flash (FlashAttention-2)
backends, bf16, causal and not, forward and forward + backward, through one timer: the
implementations take turns call by call (CUDA events around each call, the L2 flushed before
it), so the GPU clock's drift under load reaches all of them alike; the median of each. The
GPU time of a call hides its host work when the GPU is busy (the flush), so at the per-call
shape the host's time per call is measured too (host_us: calls issued back to back without
waiting): that is the per-call cost. A call's time includes its host work, so at small
shapes the per-call cost shows.

Shapes (B, H, N, d): (1, 1, 64, 64) for the per-call cost, the GPT layers (16, 6, 1024, 64)
and (8, 12, 2048, 64), (4, 16, 4096, 128), (1, 16, 16384, 128), and (2, 8, 8192, 256) forward
only (stage 11 has no backward at d = 256). Also the op on [b, n, h, d] inputs transposed to
[b, h, n, d] (what a model passes): the copy to contiguous that the op makes is timed in.

Every op output is checked against the default backend's (max abs error, relative to the
output's largest value); a failure exits 1.

  python3 scripts/bench/bench_torch_op.py --out docs/results/h100_torch_op.csv [--stage 11] [--quick]
  python3 scripts/bench/bench_torch_op.py --profile 4,16,4096,128 [--causal]

--profile runs forward + backward of the op and of the default backend under torch.profiler
at one shape and prints, for each, the GPU time of every kernel and the wall time per step:
where a gap at a large shape lies, in the kernels or in the host work around them.
"""
import argparse
import csv
import datetime
import math
import os
import statistics
import subprocess
import sys
import time

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python"))
from fa_attention.torch_ops import attention  # noqa: E402

SHAPES = [(1, 1, 64, 64), (16, 6, 1024, 64), (8, 12, 2048, 64), (4, 16, 4096, 128), (1, 16, 16384, 128),
          (2, 8, 8192, 256)]
BACKENDS = {"default": None, "cudnn": SDPBackend.CUDNN_ATTENTION, "flash": SDPBackend.FLASH_ATTENTION}


def interleaved(calls, budget_s=0.6):
    """Median GPU time (µs) of each call, timed in turns: call A, call B, ..., then A again,
    each between two CUDA events with the L2 flushed before it, so that the GPU's clock,
    which drifts by up to 10% under sustained load, drifts under all of them alike. The number
    of turns fills about budget_s (5 to 100)."""
    flush = torch.empty(64 * 1024 * 1024, dtype=torch.int32, device="cuda")  # 256 MB, more than L2
    names = list(calls)
    for name in names:  # warm-up, and one timed call each to size the turns
        calls[name]()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for name in names:
        calls[name]()
    torch.cuda.synchronize()
    turns = max(5, min(100, int(budget_s / max(time.perf_counter() - start, 1e-6))))
    events = {name: [] for name in names}
    for i in range(turns):
        for name in names[i % len(names):] + names[:i % len(names)]:
            flush.zero_()
            begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            begin.record()
            calls[name]()
            end.record()
            events[name].append((begin, end))
    torch.cuda.synchronize()
    return {name: statistics.median(b.elapsed_time(e) * 1e3 for b, e in events[name]) for name in names}


def host_time(call, calls=300):
    """Microseconds of host work per call: the median of five runs of `calls` calls issued
    without waiting for the GPU (whose work per call is shorter than the host's here)."""
    for _ in range(20):
        call()
    torch.cuda.synchronize()
    runs = []
    for _ in range(5):
        start = time.perf_counter()
        for _ in range(calls):
            call()
        runs.append((time.perf_counter() - start) / calls * 1e6)
        torch.cuda.synchronize()
    return sorted(runs)[2]


def flops(b, h, n, d, causal, backward):
    fwd = 4 * b * h * n * n * d * (0.5 if causal else 1.0)
    return fwd * (3.5 if backward else 1.0)


def sdpa(backend):
    def run(q, k, v, causal):
        if backend is None:
            return F.scaled_dot_product_attention(q, k, v, is_causal=causal)
        with sdpa_kernel([backend]):
            return F.scaled_dot_product_attention(q, k, v, is_causal=causal)
    return run


def profile(shape, causal, stage):
    """Kernels and their GPU time per forward + backward step, the op beside the default backend."""
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile
    b, h, n, d = shape
    q, k, v, do = (torch.randn(b, h, n, d, device="cuda", dtype=torch.bfloat16) for _ in range(4))
    steps = 10
    for name, fn in (("op", lambda *a: attention(*a, causal=causal, stage=stage)),
                     ("sdpa-default", lambda *a: F.scaled_dot_product_attention(*a, is_causal=causal))):
        leaves = [t.clone().requires_grad_() for t in (q, k, v)]
        for _ in range(3):
            fn(*leaves).backward(do)
        torch.cuda.synchronize()
        with torch_profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            for _ in range(steps):
                fn(*leaves).backward(do)
            torch.cuda.synchronize()
        kernels = {}
        for e in prof.events():
            if e.device_type == torch.autograd.DeviceType.CUDA:
                kernels[e.name] = kernels.get(e.name, 0.0) + e.device_time / steps
        total = sum(kernels.values())
        print(f"\n{name}: {b}x{h}x{n}x{d} causal={int(causal)}, GPU time per fwd+bwd step {total:.1f} us")
        for kname, us in sorted(kernels.items(), key=lambda kv: -kv[1]):
            print(f"  {us:9.1f} us  {kname[:110]}")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", help="CSV to write")
    ap.add_argument("--profile", help="B,H,N,d: profile forward + backward at this shape instead")
    ap.add_argument("--causal", action="store_true", help="with --profile: the causal mask")
    ap.add_argument("--stage", default=None, help="the op's stage (default: 11 on Hopper, else 09)")
    ap.add_argument("--quick", action="store_true", help="the first three shapes only")
    args = ap.parse_args()
    major = torch.cuda.get_device_capability()[0]
    stage = args.stage or ("11" if major == 9 else "09")
    if args.profile:
        profile(tuple(int(x) for x in args.profile.split(",")), args.causal, stage)
        return 0
    if not args.out:
        ap.error("--out is needed (or --profile)")
    timer_name = "interleaved CUDA events, L2 flushed"
    device = torch.cuda.get_device_name()
    commit = os.environ.get("FA_COMMIT") or subprocess.run(
        ["git", "rev-parse", "--short=12", "HEAD"], capture_output=True, text=True).stdout.strip() or "unknown"
    date = datetime.date.today().isoformat()
    rows, failed = [], False
    for b, h, n, d in SHAPES[:3] if args.quick else SHAPES:
        for causal in (False, True):
            g = torch.Generator(device="cuda").manual_seed(n + d)
            q, k, v, do = (torch.randn(b, h, n, d, device="cuda", dtype=torch.bfloat16, generator=g)
                           for _ in range(4))
            bnhd = [t.transpose(1, 2).contiguous().transpose(1, 2) for t in (q, k, v)]  # [b,n,h,d] memory
            with_backward = (False,) if d == 256 else (False, True)
            runs = {f"sdpa-{name}": sdpa(be) for name, be in BACKENDS.items()}
            # Stage 11 has no backward at d = 256, so it refuses that head dim; its forward is 10's.
            op_stage = "10" if d == 256 and stage == "11" else stage
            runs["op"] = lambda q, k, v, causal, s=op_stage: attention(q, k, v, causal=causal, stage=s)
            want = runs["sdpa-default"](q, k, v, causal)
            for name, fn in [("op", runs["op"])]:
                got = fn(q, k, v, causal)
                err = (got.float() - want.float()).abs().max().item() / max(want.float().abs().max().item(), 1e-6)
                ok = math.isfinite(err) and err < 3e-2
                failed |= not ok
                print(f"{'ok  ' if ok else 'FAIL'} check op {b}x{h}x{n}x{d} causal={causal}: rel err {err:.1e}")
            for backward in with_backward:
                calls = {}
                for name, fn in list(runs.items()) + [("op-bnhd", runs["op"])]:
                    args3 = bnhd if name == "op-bnhd" else (q, k, v)
                    if backward:
                        leaves = [t.detach().requires_grad_() for t in args3]
                        if name == "op-bnhd":  # the same [b,n,h,d] memory, viewed as [b,h,n,d]
                            leaves = [t.detach().transpose(1, 2).contiguous().transpose(1, 2).requires_grad_()
                                      for t in args3]

                        def call(fn=fn, leaves=leaves):
                            fn(*leaves, causal).backward(do)
                    else:
                        def call(fn=fn, args3=args3):
                            with torch.no_grad():
                                fn(*args3, causal)
                    try:
                        call()
                        calls[name] = call
                    except Exception as e:  # a backend that does not take this shape
                        print(f"skip {name} {b}x{h}x{n}x{d} causal={causal} bwd={backward}: {type(e).__name__}: "
                              f"{str(e).splitlines()[0][:120]}")
                names = list(calls)
                medians = interleaved(calls)
                # Host time per call: calls issued back to back with no wait, while the GPU keeps
                # up (only at the per-call shape, where a call's GPU work is a few microseconds).
                host = {}
                if (b, h, n, d) == SHAPES[0]:
                    for name in names:
                        host[name] = host_time(calls[name])
                for name in names:
                    us = medians[name]
                    tflops = flops(b, h, n, d, causal, backward) / (us * 1e-6) / 1e12
                    rows.append(dict(device=device, torch=torch.__version__, commit=commit, date=date,
                                     timer=timer_name, stage=op_stage, batch=b, heads=h, seq=n, head_dim=d,
                                     causal=int(causal), dtype="bf16", pass_="fwd+bwd" if backward else "fwd",
                                     impl=name, time_us=round(us, 2), tflops=round(tflops, 1),
                                     host_us=round(host[name], 2) if name in host else ""))
                    print(f"{name:>14} {b}x{h}x{n}x{d} causal={int(causal)} {'fwd+bwd' if backward else 'fwd':7} "
                          f"{us:9.1f} us {tflops:7.1f} TFLOP/s")
    # Each row's speed against the default backend at the same point (time_default / time).
    base = {(r["batch"], r["heads"], r["seq"], r["head_dim"], r["causal"], r["pass_"]): r["time_us"]
            for r in rows if r["impl"] == "sdpa-default"}
    for r in rows:
        t = base.get((r["batch"], r["heads"], r["seq"], r["head_dim"], r["causal"], r["pass_"]))
        r["x_default"] = round(t / r["time_us"], 3) if t else ""
    fields = ["device", "torch", "commit", "date", "timer", "stage", "batch", "heads", "seq", "head_dim", "causal",
              "dtype", "pass", "impl", "time_us", "tflops", "x_default", "host_us"]
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=fields)
        w.writeheader()
        for r in rows:
            r["pass"] = r.pop("pass_")
            w.writerow(r)
    print("\nop ÷ default (speed), bf16:")
    for r in rows:
        if r["impl"] in ("op", "op-bnhd"):
            print(f"  {r['impl']:8} {r['batch']}x{r['heads']}x{r['seq']}x{r['head_dim']} causal={r['causal']} "
                  f"{r['pass']:7} {r['x_default']}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
