#!/usr/bin/env python3
"""Ring and Ulysses attention on several GPUs (fa_attention.distributed, NCCL) against the op
on one GPU: first a check of each against a float64 reference, then their times, into a CSV.

    NCCL_NVLS_ENABLE=0 FA_LIB=build-gpu/stages/libfa_c.so \\
        torchrun --nproc-per-node 2 scripts/bench/bench_distributed.py --out docs/results/h100x2_distributed.csv

Every rank makes the same whole q, k, v, dO (one seed) and takes its shard. The check, on a
small problem (batch 2, GQA h = 4P, hkv = 2P, N = 2P·(1024 // P), d = 128, the dtype below),
gathers O, dQ, dK, dV of each strategy and holds them to the rule of tests/test_torch_ops.py: the
error against float64 is at most twice that of the op on one GPU in the same dtype, plus 4 ulps.
The timing (batch 1, 16 heads, d = 128, N = 16k, 32k, 64k, causal and not, bf16) times, for
each strategy, the forward and the forward + backward: CUDA events around each call on every
rank, the ranks started together by a barrier, the call's time the slowest rank's (an all_reduce
of the times), the median of --reps. "one-gpu" is the op on the whole sequence on one GPU (every
rank runs it at once; rank 0's time). Its O also checks each strategy's at every timed shape
(max_abs_diff_vs_one_gpu, O only).

Strategies: ring-zigzag and ring-plain (ring_attention with each split), ulysses (zigzag
shards). The stage is the op's: "11" on Hopper (10's forward, 11's backward), else "09".

No hang: the process group has a timeout (--timeout-s; NCCL's watchdog then stops the job
with the collective that waited), the ranks agree on every refusal before going on (a
strategy or shape that is refused is a row "refused: ..." on every rank), and every failure
names its rank. Exit code: 0 when every check passed, 1 when one failed, 2 for a bad setup.
Writes --out (the times) and the same name with _check before .csv (the checks).
"""
import argparse
import csv
import datetime
import os
import statistics
import subprocess
import sys
import time
from datetime import timedelta

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python"))

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


def fail_setup(message):
    print(f"bench_distributed: {message}", file=sys.stderr, flush=True)
    sys.exit(2)


def setup(timeout_s, cpu):
    """(rank, P, device) after checking what torchrun and the machine give."""
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        if name not in os.environ:
            fail_setup(f"${name} is not set: start with torchrun --nproc-per-node <GPUs> {sys.argv[0]} ...")
    local_rank, P = int(os.environ["LOCAL_RANK"]), int(os.environ["WORLD_SIZE"])
    if cpu:  # the script's own try-out: gloo, CPU tensors
        torch.set_num_threads(1)
        dist.init_process_group("gloo", timeout=timedelta(seconds=timeout_s))
        return dist.get_rank(), P, torch.device("cpu")
    if not torch.cuda.is_available():
        fail_setup("no CUDA device (this script runs the NCCL side; tests/test_distributed.py the CPU side)")
    if local_rank >= torch.cuda.device_count():
        fail_setup(f"local rank {local_rank} but only {torch.cuda.device_count()} GPUs visible: "
                   "--nproc-per-node must not exceed the GPU count")
    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")  # NVLink multicast stays off (docs/design.md)
    device = torch.device("cuda", local_rank)
    torch.cuda.set_device(device)
    dist.init_process_group("nccl", timeout=timedelta(seconds=timeout_s), device_id=device)
    return dist.get_rank(), P, device


def everyone_ok(ok, device):
    """True when `ok` holds on every rank, so that all ranks take the same branch."""
    flag = torch.tensor([1 if ok else 0], device=device)
    dist.all_reduce(flag, op=dist.ReduceOp.MIN)
    return bool(flag.item())


def reference(q, k, v, causal):
    """float64 attention, bottom-right causal, GQA by repeating kv heads (small shapes only)."""
    groups = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(groups, 1), v.repeat_interleave(groups, 1)
    s = q @ k.transpose(-1, -2) / q.shape[-1] ** 0.5
    if causal:
        nq, nk = q.shape[2], k.shape[2]
        visible = torch.arange(nk, device=q.device)[None, :] <= torch.arange(nq, device=q.device)[:, None] + nk - nq
        s = s.masked_fill(~visible, float("-inf"))
    return torch.softmax(s, -1) @ v


def with_grads(fn, q, k, v, d_o):
    q, k, v = (t.detach().clone().requires_grad_() for t in (q, k, v))
    o = fn(q, k, v)
    o.backward(d_o)
    return o.detach(), q.grad, k.grad, v.grad


def strategies(stage):
    """name -> (function of this rank's shards, the split its shards are cut by)."""
    from fa_attention.distributed import ring_attention, ulysses_attention

    def ring(split):
        return lambda q, k, v, causal, check=True: ring_attention(q, k, v, causal=causal, split=split, stage=stage,
                                                                  check=check)
    return {"ring-zigzag": (ring("zigzag"), "zigzag"), "ring-plain": (ring("plain"), "plain"),
            "ulysses": (lambda q, k, v, causal, check=True: ulysses_attention(q, k, v, causal=causal, stage=stage,
                                                                            check=check), "zigzag")}


def run_checks(P, dtype, stage, rank, device, chunk, d):
    """Each strategy, causal and not, against float64; returns the rows and whether all passed."""
    from fa_attention.distributed import gather, shard
    from fa_attention.torch_ops import attention
    b, h, hkv, n = 2, 4 * P, 2 * P, 2 * P * chunk  # heads divisible by P, for Ulysses
    rows, all_ok = [], True
    for causal in (False, True):
        g = torch.Generator(device=device).manual_seed(11 + causal)
        q = torch.randn(b, h, n, d, device=device, generator=g)
        k, v = (torch.randn(b, hkv, n, d, device=device, generator=g) for _ in range(2))
        d_o = torch.randn(b, h, n, d, device=device, generator=g)
        exact = with_grads(lambda q, k, v: reference(q, k, v, causal), *(t.double() for t in (q, k, v, d_o)))
        q, k, v, d_o = (t.to(dtype) for t in (q, k, v, d_o))
        one = with_grads(lambda q, k, v: attention(q, k, v, causal=causal, stage=stage), q, k, v, d_o)
        for name, (fn, split) in strategies(stage).items():
            error = None
            try:
                mine = with_grads(lambda q, k, v: fn(q, k, v, causal), *(shard(t, split=split) for t in (q, k, v)),
                                  shard(d_o, split=split))
            except Exception as e:  # noqa: BLE001 (every rank must hear of it: see everyone_ok)
                error = f"rank {rank}: {type(e).__name__}: {e}"
            if not everyone_ok(error is None, device):
                if rank == 0:
                    print(f"FAIL check {name} causal={causal}: {error or 'refused on another rank'}", flush=True)
                rows.append(dict(strategy=name, causal=causal, tensor="all", ok=False, note=error or "another rank"))
                all_ok = False
                continue
            for tensor, ours, base, ex in zip(("O", "dQ", "dK", "dV"), mine, one, exact):
                ours = gather(ours, split=split)
                err = (ours.double() - ex).abs().max().item()
                base_err = (base.double() - ex).abs().max().item()
                floor = 4 * torch.finfo(dtype).eps * max(1.0, ex.abs().max().item())
                ok = err <= 2 * base_err + floor
                all_ok &= ok
                if rank == 0:
                    print(f"{'ok  ' if ok else 'FAIL'} check {name} causal={causal} {tensor}: err {err:.2e}, "
                          f"one GPU {base_err:.2e}", flush=True)
                rows.append(dict(strategy=name, causal=causal, tensor=tensor, ok=ok, err=f"{err:.3e}",
                                 one_gpu_err=f"{base_err:.3e}", note=""))
        for r in rows:
            r.update(batch=b, heads=h, kv_heads=hkv, seq=n, head_dim=d)
    return rows, all_ok


def time_ms(call, reps, warmup, device):
    """Median over reps of the slowest rank's GPU time of call() (ms); on the CPU, wall time."""
    for _ in range(warmup):
        call()
    times = []
    for _ in range(reps):
        dist.barrier()  # the ranks start together; the events follow the barrier on the stream
        if device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            call()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
        else:
            t0 = time.perf_counter()
            call()
            times.append(1e3 * (time.perf_counter() - t0))
    slowest = torch.tensor(times, device=device)
    dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
    return statistics.median(slowest.tolist())


def run_timing(args, P, dtype, stage, rank, device):
    from fa_attention.distributed import gather, shard
    from fa_attention.torch_ops import attention
    b, h, d = args.batch, args.heads, args.head_dim
    rows = []
    for n in args.seqs:
        for causal in (False, True):
            g = torch.Generator(device=device).manual_seed(n + causal)
            q, k, v, d_o = (torch.randn(b, h, n, d, device=device, generator=g).to(dtype) for _ in range(4))
            one_o = attention(q, k, v, causal=causal, stage=stage)
            runs = {"one-gpu": (lambda q, k, v, causal, check=True: attention(q, k, v, causal=causal, stage=stage),
                                None)}
            runs.update(strategies(stage))
            for name, (fn, split) in runs.items():
                row = dict(strategy=name, batch=b, heads=h, kv_heads=h, seq=n, head_dim=d, causal=causal)
                error = None
                try:
                    args3 = [t if split is None else shard(t, split=split) for t in (q, k, v)]
                    grad = d_o if split is None else shard(d_o, split=split)
                    o = fn(*args3, causal)  # also the check across ranks, once
                    diff = (gather(o, split=split) if split else o).float().sub(one_o.float()).abs().max().item()
                    leaves = [t.detach().requires_grad_() for t in args3]

                    def forward(fn=fn, args3=args3):
                        with torch.no_grad():
                            fn(*args3, causal, check=False)

                    def forward_backward(fn=fn, leaves=leaves, grad=grad):
                        for t in leaves:
                            t.grad = None
                        fn(*leaves, causal, check=False).backward(grad)
                    fwd = time_ms(forward, args.reps, args.warmup, device)
                    fwd_bwd = time_ms(forward_backward, args.reps, args.warmup, device)
                except Exception as e:  # noqa: BLE001 (every rank must hear of it: see everyone_ok)
                    error = f"rank {rank}: {type(e).__name__}: {e}"
                if not everyone_ok(error is None, device):
                    note = f"refused: {error or 'on another rank'}"
                    if rank == 0:
                        print(f"{name} N={n} causal={causal}: {note}", flush=True)
                    rows.append(dict(row, note=note))
                    continue
                if rank == 0:
                    print(f"{name:12s} N={n:6d} causal={causal!s:5s}  fwd {fwd:9.2f} ms  fwd+bwd {fwd_bwd:9.2f} ms  "
                          f"|O - one GPU| {diff:.1e}", flush=True)
                rows.append(dict(row, fwd_ms=f"{fwd:.3f}", fwd_bwd_ms=f"{fwd_bwd:.3f}",
                                 max_abs_diff_vs_one_gpu=f"{diff:.3e}", note=""))
            del q, k, v, d_o, one_o
            if device.type == "cuda":
                torch.cuda.empty_cache()
    return rows


def write(path, rows, fields, common):
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(common) + fields, extrasaction="ignore")
        w.writeheader()
        for r in rows:
            w.writerow({**common, **r})
    print(f"wrote {path}", flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, help="CSV of the times (the checks go to NAME_check.csv)")
    ap.add_argument("--seqs", default="16384,32768,65536", help="whole sequence lengths N, comma-separated")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--dtype", choices=sorted(DTYPES), default="bf16")
    ap.add_argument("--stage", default=None, help="the op's stage (default: 11 on Hopper, else 09)")
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--timeout-s", type=int, default=180, help="the process group's timeout (s): a rank left "
                    "waiting longer is stopped by NCCL's watchdog")
    ap.add_argument("--check-only", action="store_true", help="the checks, no timing")
    ap.add_argument("--cpu", action="store_true", help="try the script itself on the CPU: gloo, float32, stage 06, "
                    "a small check (N = 2P·16, d = 32); give small --seqs, --heads, --head-dim")
    args = ap.parse_args()
    args.seqs = [int(x) for x in args.seqs.split(",")]
    rank, P, device = setup(args.timeout_s, args.cpu)
    try:
        if args.cpu:
            dtype, stage, chunk, check_d, args.dtype = torch.float32, args.stage or "06", 16, 32, "fp32"
            name = "CPU"
        else:
            dtype, chunk, check_d = DTYPES[args.dtype], max(16, 1024 // P), 128  # N = 2P·chunk, about 2048
            stage = args.stage or ("11" if torch.cuda.get_device_capability(device)[0] == 9 else "09")
            name = torch.cuda.get_device_name(device)
        names = [None] * P
        dist.all_gather_object(names, name)
        common = dict(device=" + ".join(sorted(set(names))), gpus=P, torch=torch.__version__,
                      commit=os.environ.get("FA_COMMIT") or subprocess.run(
                          ["git", "rev-parse", "--short=12", "HEAD"], capture_output=True, text=True).stdout.strip(),
                      date=datetime.date.today().isoformat(), dtype=args.dtype, stage=stage)
        if rank == 0:
            print(f"{common['device']} x {P}, torch {torch.__version__}, stage {stage}, {args.dtype}", flush=True)
        check_rows, checks_ok = run_checks(P, dtype, stage, rank, device, chunk, check_d)
        base, ext = os.path.splitext(args.out)
        shape = ["batch", "heads", "kv_heads", "seq", "head_dim"]
        if rank == 0:
            write(f"{base}_check{ext or '.csv'}", check_rows,
                  ["strategy"] + shape + ["causal", "tensor", "ok", "err", "one_gpu_err", "note"], common)
        if not args.check_only:
            rows = run_timing(args, P, dtype, stage, rank, device)
            if rank == 0:
                write(args.out, rows, ["strategy"] + shape + ["causal", "fwd_ms", "fwd_bwd_ms",
                                                             "max_abs_diff_vs_one_gpu", "note"], common)
        if rank == 0:
            print("checks: " + ("all passed" if checks_ok else "FAILED (see above)"), flush=True)
        return 0 if checks_ok else 1
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    sys.exit(main())
