#!/usr/bin/env python3
"""Side-by-side GPU benchmark: the project's GPU stages and PyTorch, in one process.

The stages run through the C ABI (libfa_c.so, fa_forward_device / fa_backward_device) on
torch tensors' device pointers, on torch's current stream, so both sides are timed the
same way: CUDA events around each launch, a warm-up first, the median of --repeats
launches, rotating several input sets so that together they exceed the L2 cache (no launch
finds its inputs there). Every timed stage output is checked against a PyTorch reference
(max abs error printed; NaN or a large error fails the run).

The bar and the stage it is held to are timed in alternation: at each point, the first stage
of the list (without a variant) and SDPA's cuDNN backend are timed in --rounds rounds, stage
then cuDNN, forward then backward, each round a median of --repeats launches, and each row
holds the median of its rounds. A GPU's clocks follow its recent power draw, so a kernel timed
right after a heavy one runs slower than one timed after a light one; timed once each, in a
fixed order (the stage after the previous point's cuDNN, cuDNN after FlashAttention-2's
slower kernels), the ratio of the two carried that order (on an H200, 0.88 where alternating
rounds gave 0.94–1.02). The other rows (steps, variants, FlashAttention-2) are timed once.

What is measured (FLOPs by the FlashAttention papers' convention: forward 4·b·h·N²·d,
halved when causal; backward 2.5× forward):
  * ceilings: an 8192³ fp32 GEMM through cuBLAS with TF32 off (the CUDA-core ceiling for
    fp32 stages) and an 8192³ bf16 GEMM (the tensor-core ceiling);
  * stage 07 (fp32): N = 4096, d ∈ {64, 128}, causal and not, batch 4, heads 2048/d, against
    SDPA's math backend in fp32 (also the reference); with each step (option `step`), each
    shared-memory layout and B_c = 32;
  * stages 08/09 (fp16, bf16): the FlashAttention papers' sweep, batch·N = 16384 tokens,
    heads·d = 2048, N ∈ {1024 … 16384}, d ∈ {64, 128}, causal and not (40 points), against
    SDPA's flash (FlashAttention-2) and cuDNN backends; reference: fp32 SDPA on upcast inputs.

Why batch 4 and heads 2048/d for stage 07: it keeps b·N = 16384 tokens and h·d = 2048 like
the sweep and the anchors (docs/results/h200_anchors.csv), and it fills the GPU: stage 07
runs one 128-thread block per 64 query rows, so the grid is 4·h·4096/64 = 4096 (d = 128) or
8192 (d = 64) blocks, 10–20 waves of the 396 blocks an H200 holds at once (132 SMs × 3), so
the last, partial wave costs a few percent at most.

Usage (on the GPU machine, after building build-gpu):
  python3 scripts/bench/bench_gpu.py --out gpu_out/bench.csv [--stages 07,08,09] [--quick]
Writes one CSV row per measurement (device, commit, date in each row) and prints a summary.
Exit code 1 if a check failed or a stage call returned an error.
"""
import argparse
import ctypes
import csv
import datetime
import math
import os
import signal
import statistics
import subprocess
import sys
import traceback

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

FA_DTYPES = {"f32": (0, torch.float32), "f16": (1, torch.float16), "bf16": (2, torch.bfloat16)}
# Largest acceptable max|out − ref| / max|ref| per dtype (a sanity bound, far above the
# rounding each type gives; the C++ tests hold the principled tolerance).
REL_BOUND = {"f32": 1e-4, "f16": 1e-2, "bf16": 3e-2}
L_BOUND = {"f32": 1e-3, "f16": 2e-2, "bf16": 5e-2}  # max |L − ref| (natural log)


class FaProblem(ctypes.Structure):
    _fields_ = [(n, ctypes.c_int32) for n in
                ("batch", "heads", "kv_heads", "seq_q", "seq_k", "head_dim", "causal")] + \
               [("scale", ctypes.c_float)]


class Fa:
    """The C ABI of libfa_c.so, device-pointer entry points only."""

    def __init__(self, path):
        lib = ctypes.CDLL(path)
        vp, pp = ctypes.c_void_p, ctypes.POINTER(FaProblem)
        lib.fa_stage_count.restype = ctypes.c_int
        lib.fa_stage_name.restype = ctypes.c_char_p
        lib.fa_stage_name.argtypes = [ctypes.c_int]
        lib.fa_last_error.restype = ctypes.c_char_p
        lib.fa_stage_has_backward.argtypes = [ctypes.c_char_p]
        lib.fa_stage_is_gpu.argtypes = [ctypes.c_char_p]
        lib.fa_forward_device.argtypes = [ctypes.c_char_p, pp, ctypes.c_int] + [vp] * 6
        lib.fa_backward_device.argtypes = [ctypes.c_char_p, pp, ctypes.c_int] + [vp] * 10
        lib.fa_set_option.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_int64]
        if hasattr(lib, "fa_stage_options"):  # a library older than the option tables lacks it
            lib.fa_stage_options.restype = ctypes.c_char_p
            lib.fa_stage_options.argtypes = [ctypes.c_char_p]
        self.lib = lib

    def stages(self):
        names = [self.lib.fa_stage_name(i).decode() for i in range(self.lib.fa_stage_count())]
        return [n for n in names if self.lib.fa_stage_is_gpu(n.encode()) == 1]

    def has_backward(self, stage):
        return self.lib.fa_stage_has_backward(stage.encode()) == 1

    def _check(self, rc, what):
        if rc != 0:
            raise RuntimeError(f"{what}: {self.lib.fa_last_error().decode()}")

    def options(self, stage):
        """The stage's option table as lines "name (allowed; default d)", [] without one."""
        if not hasattr(self.lib, "fa_stage_options"):
            return []
        text = self.lib.fa_stage_options(stage.encode()) or b""
        rows = [line.split("\t") for line in text.decode().splitlines()]
        return [f"{name} ({allowed}; default {default})" for name, default, allowed, _ in rows]

    def set_option(self, stage, name, value):
        """True when the stage has the option (0 restores its default)."""
        return self.lib.fa_set_option(stage.encode(), name.encode(), value) == 0

    def forward(self, stage, prob, dtype, q, k, v, o, lse):
        stream = torch.cuda.current_stream().cuda_stream
        self._check(self.lib.fa_forward_device(stage.encode(), ctypes.byref(prob), dtype,
                                               q.data_ptr(), k.data_ptr(), v.data_ptr(),
                                               o.data_ptr(), lse.data_ptr(), stream),
                    f"{stage} forward")

    def backward(self, stage, prob, dtype, q, k, v, o, lse, do, dq, dk, dv):
        stream = torch.cuda.current_stream().cuda_stream
        self._check(self.lib.fa_backward_device(stage.encode(), ctypes.byref(prob), dtype,
                                                q.data_ptr(), k.data_ptr(), v.data_ptr(),
                                                o.data_ptr(), lse.data_ptr(), do.data_ptr(),
                                                dq.data_ptr(), dk.data_ptr(), dv.data_ptr(),
                                                stream),
                    f"{stage} backward")


# ---------------------------------------------------------------------------------------
# Timing and FLOPs
# ---------------------------------------------------------------------------------------
def median_ms(fn, n_sets, repeats, warmup=3):
    """Median milliseconds of fn(i) over `repeats` launches, input set i rotating."""
    for i in range(max(warmup, n_sets)):
        fn(i % n_sets)
    torch.cuda.synchronize()
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(repeats)]
    stops = [torch.cuda.Event(enable_timing=True) for _ in range(repeats)]
    for r in range(repeats):
        starts[r].record()
        fn(r % n_sets)
        stops[r].record()
    torch.cuda.synchronize()
    return statistics.median(s.elapsed_time(e) for s, e in zip(starts, stops))


def alternating_ms(fns, n_sets, repeats, rounds):
    """{name: fn}: each timed as median_ms does, in `rounds` rounds of all of them in turn;
    returns {name: median over the rounds}."""
    times = {name: [] for name in fns}
    for _ in range(rounds):
        for name, fn in fns.items():
            times[name].append(median_ms(fn, n_sets, repeats))
    return {name: statistics.median(t) for name, t in times.items()}


def attn_flops(b, h, n, d, causal):
    f = 4.0 * b * h * n * n * d
    return f / 2 if causal else f


def tflops(flops, ms):
    return flops / (ms * 1e-3) / 1e12 if ms and ms > 0 else float("nan")


# ---------------------------------------------------------------------------------------
# Inputs and references
# ---------------------------------------------------------------------------------------
def l2_bytes():
    try:
        return int(torch.cuda.get_device_properties(0).L2_cache_size)
    except Exception:  # older torch: the H200's 60 MB
        return 60 << 20


def make_sets(b, h, n, d, dtype, backward):
    """Input sets [b, h, n, d]; enough of them that together they exceed 3× the L2 cache."""
    elem = torch.tensor([], dtype=dtype).element_size()
    per_set = b * h * n * d * elem * (8 if backward else 4) + b * h * n * 4
    count = max(2, min(8, math.ceil(3 * l2_bytes() / per_set)))
    g = torch.Generator(device="cuda").manual_seed(1234)
    sets = []
    for _ in range(count):
        s = {x: torch.randn(b, h, n, d, device="cuda", dtype=dtype, generator=g) for x in "qkv"}
        s["o"] = torch.empty_like(s["q"])
        s["lse"] = torch.empty(b, h, n, device="cuda", dtype=torch.float32)
        if backward:
            s["do"] = torch.randn(b, h, n, d, device="cuda", dtype=dtype, generator=g)
            for x in ("dq", "dk", "dv"):
                s[x] = torch.empty_like(s["q"])
        sets.append(s)
    return sets


def ref_lse(q, k, causal):
    """Log-sum-exp of scale·q kᵀ per row, fp32, one (batch, head) block of S at a time."""
    b, h, n, d = q.shape
    scale = 1.0 / math.sqrt(d)
    out = torch.empty(b, h, n, device=q.device, dtype=torch.float32)
    mask = torch.ones(n, n, device=q.device, dtype=torch.bool).tril() if causal else None
    for i in range(b):
        for j in range(h):
            s = (q[i, j].float() @ k[i, j].float().t()) * scale
            if mask is not None:
                s = s.masked_fill(~mask, float("-inf"))
            out[i, j] = torch.logsumexp(s, dim=-1)
    return out


def rel_err(x, ref):
    x, ref = x.float(), ref.float()
    if torch.isnan(x).any():
        return float("nan")
    return ((x - ref).abs().max() / ref.abs().max().clamp_min(1e-30)).item()


def abs_err(x, ref):
    x, ref = x.float(), ref.float()
    if torch.isnan(x).any():
        return float("nan")
    return (x - ref).abs().max().item()


def first_line(e):
    text = str(e).strip()
    return text.splitlines()[0][:200] if text else type(e).__name__


def sdpa(q, k, v, causal, backend):
    with sdpa_kernel(backend):
        return F.scaled_dot_product_attention(q, k, v, is_causal=causal)


# ---------------------------------------------------------------------------------------
# The benchmark
# ---------------------------------------------------------------------------------------
class Bench:
    def __init__(self, args, fa):
        self.args, self.fa = args, fa
        self.rows, self.failures, self.summary = [], [], []
        self.device = torch.cuda.get_device_name(0)
        self.date = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
        self.gemm = {}

    # `what` names the implementation (a stage, an SDPA backend, or a ceiling as in
    # h200_anchors.csv), `pass` is fwd or bwd: the columns docs/gen_pages.py reads.
    COLUMNS = ["device", "commit", "date", "what", "pass", "dtype", "batch", "heads", "seq_q",
               "seq_k", "head_dim", "causal", "ms", "tflops", "err_O", "err_L", "check", "note"]

    def open_csv(self, path):
        """Rows are written as they are measured, so a run cut short keeps what it measured."""
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        self.csv_file = open(path, "w", newline="")
        self.csv = csv.DictWriter(self.csv_file, fieldnames=self.COLUMNS, extrasaction="ignore")
        self.csv.writeheader()
        self.csv_file.flush()

    def row(self, direction="", **kw):
        base = dict(device=self.device, commit=self.args.commit, date=self.date)
        base["pass"] = direction
        base.update(kw)
        self.rows.append(base)
        self.csv.writerow({c: base.get(c, "") for c in self.COLUMNS})
        self.csv_file.flush()
        return base

    def fail(self, what):
        print(f"  FAILED: {what}", flush=True)
        self.failures.append(what)

    # -- ceilings ------------------------------------------------------------------------
    def gemms(self):
        n = 8192
        for name, dtype, short in (("ceiling_fp32_gemm_noTF32", torch.float32, "f32"),
                                   ("ceiling_bf16_gemm", torch.bfloat16, "bf16")):
            g = torch.Generator(device="cuda").manual_seed(7)
            a = torch.randn(n, n, device="cuda", dtype=dtype, generator=g)
            b = torch.randn(n, n, device="cuda", dtype=dtype, generator=g)
            c = torch.empty(n, n, device="cuda", dtype=dtype)
            ms = median_ms(lambda i: torch.matmul(a, b, out=c), 1, max(10, self.args.repeats // 2))
            t = tflops(2.0 * n ** 3, ms)
            self.gemm[dtype] = t
            self.row(what=name, dtype=short, batch=1, heads=1, seq_q=n, seq_k=n, head_dim=n,
                     causal=0, ms=f"{ms:.4f}", tflops=f"{t:.2f}", check="-",
                     note=f"cuBLAS {n}^3 matrix product (torch.matmul), 2n^3 FLOPs")
            print(f"{name:28s} {n}^3: {ms:8.3f} ms  {t:7.1f} TFLOP/s", flush=True)
            del a, b, c
        torch.cuda.empty_cache()

    # -- the bar, side by side ------------------------------------------------------------
    def alternate(self, stage, prob, fa_dtype, sets, causal, backend, want_bwd):
        """{(what, pass): ms} of `stage` and SDPA's cuDNN backend, forward (and backward),
        timed in alternating rounds; what fails here (a refused shape, a backend that does
        not take it) is left to the single timing that follows, which reports it."""
        n, reps, rounds = len(sets), self.args.repeats, self.args.rounds
        times = {}
        fwd = lambda i: self.fa.forward(stage, prob, fa_dtype, *(sets[i][x] for x in ("q", "k", "v", "o", "lse")))
        cudnn_fwd = lambda i: sdpa(sets[i]["q"], sets[i]["k"], sets[i]["v"], causal, backend)
        try:
            got = alternating_ms({"stage": fwd, "cudnn": cudnn_fwd}, n, reps, rounds)
        except Exception:  # noqa: BLE001 — reported by the single timing
            return times
        times[(stage, "fwd")], times[("sdpa_cudnn", "fwd")] = got["stage"], got["cudnn"]
        if not (want_bwd and self.fa.has_backward(stage)):
            return times
        try:
            for i in range(n):  # O and L of every set, for the stage's backward
                fwd(i)
            bwd = lambda i: self.fa.backward(stage, prob, fa_dtype, *(sets[i][x] for x in (
                "q", "k", "v", "o", "lse", "do", "dq", "dk", "dv")))
            leaves = [{x: sets[i][x].detach().requires_grad_(True) for x in "qkv"} for i in range(n)]
            outs = [sdpa(l["q"], l["k"], l["v"], causal, backend) for l in leaves]
            cudnn_bwd = lambda i: torch.autograd.grad(outs[i], (leaves[i]["q"], leaves[i]["k"], leaves[i]["v"]),
                                                      sets[i]["do"], retain_graph=True)
            got = alternating_ms({"stage": bwd, "cudnn": cudnn_bwd}, n, reps, rounds)
            times[(stage, "bwd")], times[("sdpa_cudnn", "bwd")] = got["stage"], got["cudnn"]
            del leaves, outs
        except Exception:  # noqa: BLE001 — reported by the single timing
            pass
        return times

    # -- one attention point -------------------------------------------------------------
    def point(self, stages, dtype_name, b, h, n, d, causal, baselines, variants=()):
        """Times `stages` (and each (option, value) variant) and the SDPA `baselines`."""
        fa_dtype, dtype = FA_DTYPES[dtype_name]
        want_bwd = any(self.fa.has_backward(s) for s in stages)
        sets = make_sets(b, h, n, d, dtype, want_bwd)
        fl = attn_flops(b, h, n, d, causal)
        prob = FaProblem(b, h, h, n, n, d, int(causal), 0.0)
        shape = dict(dtype=dtype_name, batch=b, heads=h, seq_q=n, seq_k=n, head_dim=d,
                     causal=int(causal))
        tag = f"{dtype_name} b={b} h={h} N={n} d={d} {'causal' if causal else 'full'}"
        print(f"-- {tag} ({len(sets)} input sets)", flush=True)
        result = {"fwd": {}, "bwd": {}}
        reps = self.args.repeats

        # References from set 0: O (and dQ, dK, dV) by SDPA in fp32, L by log-sum-exp.
        s0 = sets[0]
        q32, k32, v32 = (s0[x].detach().to(torch.float32, copy=True).requires_grad_(want_bwd)
                         for x in "qkv")
        # fp32 SDPA: the math backend for fp32 stages (it is also what they are timed against);
        # for 16-bit stages the memory-efficient one, which needs no N×N buffer (math if not).
        try:
            ref_backend = SDPBackend.MATH if dtype == torch.float32 else SDPBackend.EFFICIENT_ATTENTION
            o_ref = sdpa(q32, k32, v32, causal, ref_backend)
        except RuntimeError:
            o_ref = sdpa(q32, k32, v32, causal, SDPBackend.MATH)
        grads_ref = None
        if want_bwd:
            grads_ref = torch.autograd.grad(o_ref, (q32, k32, v32), s0["do"].float())
        o_ref = o_ref.detach()
        lse_ref = ref_lse(s0["q"], s0["k"], causal)
        del q32, k32, v32

        # The first stage and cuDNN, timed in alternating rounds (the module's docstring).
        cudnn = dict(baselines).get("sdpa_cudnn")
        paired = {}
        if cudnn is not None and stages and self.args.rounds > 1:
            paired = self.alternate(stages[0], prob, fa_dtype, sets, causal, cudnn, want_bwd)
        paired_note = f"median of {self.args.rounds} rounds alternating {stages[0] if stages else ''} and sdpa_cudnn"

        # The project's stages (and variants), through the C ABI.
        runs = [(s, None) for s in stages] + [(s, v) for s in stages for v in variants]
        for stage, variant in runs:
            impl = stage if variant is None else f"{stage}[{variant[0]}={variant[1]}]"
            if variant is not None and not self.fa.set_option(stage, *variant):
                continue
            try:
                fwd = lambda i, s=stage: self.fa.forward(s, prob, fa_dtype, sets[i]["q"], sets[i]["k"],
                                                         sets[i]["v"], sets[i]["o"], sets[i]["lse"])
                fwd(0)
                torch.cuda.synchronize()
                a_o, r_o = abs_err(s0["o"], o_ref), rel_err(s0["o"], o_ref)
                e_l = abs_err(s0["lse"], lse_ref)
                ok = r_o <= REL_BOUND[dtype_name] and e_l <= L_BOUND[dtype_name]  # False on NaN
                ms = paired.get((impl, "fwd")) or median_ms(fwd, len(sets), reps)
                t = tflops(fl, ms)
                result["fwd"][impl] = (ms, t)
                self.row(direction="fwd", what=impl, **shape, ms=f"{ms:.4f}", tflops=f"{t:.2f}",
                         err_O=f"{a_o:.3e}", err_L=f"{e_l:.3e}", check="ok" if ok else "FAIL",
                         note=paired_note if (impl, "fwd") in paired else "")
                print(f"  {impl:34s} fwd {ms:9.3f} ms {t:7.2f} TFLOP/s   "
                      f"max|ΔO| {a_o:.2e} (rel {r_o:.1e})  max|ΔL| {e_l:.2e}  "
                      f"{'ok' if ok else 'CHECK FAILED'}",
                      flush=True)
                if not ok:
                    self.fail(f"{impl} fwd {tag}: max abs err O {a_o:.3e} (rel {r_o:.3e}), "
                              f"max abs err L {e_l:.3e}")
                if self.fa.has_backward(stage):
                    for i in range(len(sets)):
                        fwd(i)
                    bwd = lambda i, s=stage: self.fa.backward(
                        s, prob, fa_dtype, sets[i]["q"], sets[i]["k"], sets[i]["v"], sets[i]["o"],
                        sets[i]["lse"], sets[i]["do"], sets[i]["dq"], sets[i]["dk"], sets[i]["dv"])
                    bwd(0)
                    torch.cuda.synchronize()
                    pairs = list(zip(("dq", "dk", "dv"), grads_ref))
                    errs = [abs_err(s0[x], r) for x, r in pairs]
                    rels = [rel_err(s0[x], r) for x, r in pairs]
                    ok = all(e <= REL_BOUND[dtype_name] for e in rels)
                    ms = paired.get((impl, "bwd")) or median_ms(bwd, len(sets), reps)
                    t = tflops(2.5 * fl, ms)
                    result["bwd"][impl] = (ms, t)
                    self.row(direction="bwd", what=impl, **shape, ms=f"{ms:.4f}", tflops=f"{t:.2f}",
                             err_O=f"{max(errs):.3e}", check="ok" if ok else "FAIL",
                             note="err_O: the largest max abs error of dQ, dK, dV" +
                                  (f"; {paired_note}" if (impl, "bwd") in paired else ""))
                    print(f"  {impl:34s} bwd {ms:9.3f} ms {t:7.2f} TFLOP/s   "
                          f"max|ΔdQ|,|ΔdK|,|ΔdV| {errs[0]:.2e}, {errs[1]:.2e}, {errs[2]:.2e}  "
                          f"{'ok' if ok else 'CHECK FAILED'}", flush=True)
                    if not ok:
                        self.fail(f"{impl} bwd {tag}: max abs errs {errs}, relative {rels}")
            except Exception as e:  # a refused shape or a CUDA error: record, go on
                self.fail(f"{impl} {tag}: {e}")
                self.row(direction="fwd", what=impl, **shape, check="ERROR", note=first_line(e))
            finally:
                if variant is not None:
                    self.fa.set_option(stage, variant[0], 0)

        # PyTorch's scaled_dot_product_attention, same inputs, same timing.
        for name, backend in baselines:
            try:
                fwd = lambda i, be=backend: sdpa(sets[i]["q"], sets[i]["k"], sets[i]["v"], causal, be)
                out = fwd(0)
                a_o = abs_err(out, o_ref)
                ms = paired.get((name, "fwd")) or median_ms(fwd, len(sets), reps)
                t = tflops(fl, ms)
                result["fwd"][name] = (ms, t)
                self.row(direction="fwd", what=name, **shape, ms=f"{ms:.4f}", tflops=f"{t:.2f}",
                         err_O=f"{a_o:.3e}", check="-", note=paired_note if (name, "fwd") in paired else "")
                print(f"  {name:34s} fwd {ms:9.3f} ms {t:7.2f} TFLOP/s   max|ΔO| {a_o:.2e}",
                      flush=True)
                del out
                if want_bwd:
                    leaves = [{x: sets[i][x].detach().requires_grad_(True) for x in "qkv"}
                              for i in range(len(sets))]
                    outs = [sdpa(l["q"], l["k"], l["v"], causal, backend) for l in leaves]
                    bwd = lambda i: torch.autograd.grad(outs[i], (leaves[i]["q"], leaves[i]["k"],
                                                                  leaves[i]["v"]), sets[i]["do"],
                                                        retain_graph=True)
                    ms = paired.get((name, "bwd")) or median_ms(bwd, len(sets), reps)
                    t = tflops(2.5 * fl, ms)
                    result["bwd"][name] = (ms, t)
                    self.row(direction="bwd", what=name, **shape, ms=f"{ms:.4f}", tflops=f"{t:.2f}",
                             check="-", note=paired_note if (name, "bwd") in paired else "")
                    print(f"  {name:34s} bwd {ms:9.3f} ms {t:7.2f} TFLOP/s", flush=True)
                    del leaves, outs
            except Exception as e:  # a backend that does not take this shape or dtype
                print(f"  {name:34s} not available: {first_line(e)}", flush=True)
                self.row(direction="fwd", what=name, **shape, check="n/a", note=first_line(e))
        del sets, o_ref, grads_ref, lse_ref
        torch.cuda.empty_cache()
        return result

    def safe_point(self, *args, **kw):
        """point(), but a failure (out of memory, a backend error) costs one point, not the run."""
        try:
            return self.point(*args, **kw)
        except Exception as e:
            self.fail(f"point {args[1:7]}: {first_line(e)}")
            torch.cuda.empty_cache()
            return {"fwd": {}, "bwd": {}}

    # -- sweeps --------------------------------------------------------------------------
    def stage07(self, stages):
        print("\n== fp32 stages against SDPA math (fp32, TF32 off)", flush=True)
        dims = (64, 128)
        results = {}
        for d in dims:
            for causal in (False, True):
                h = 2048 // d
                results[(d, causal)] = self.safe_point(stages, "f32", 4, h, 4096, d, causal,
                                                       [("sdpa_math", SDPBackend.MATH)],
                                                       variants=[("step", 1), ("step", 2),
                                                                 ("smem_layout", 1), ("smem_layout", 2),
                                                                 ("block_k", 32)])
        gemm = self.gemm.get(torch.float32, float("nan"))
        lines = [f"fp32 forward, N = 4096, batch 4, heads 2048/d (TFLOP/s; fp32 GEMM {gemm:.1f})",
                 f"{'impl':34s} {'d':>4s} {'causal':>6s} {'TFLOP/s':>8s} {'ms':>8s} "
                 f"{'/math':>6s} {'/GEMM':>6s} {'causal speed-up':>15s}"]
        for stage in stages:
            impls = sorted({k for r in results.values() for k in r["fwd"] if k.startswith(stage)})
            for impl in impls:
                for d in dims:
                    for causal in (False, True):
                        r = results[(d, causal)]["fwd"]
                        if impl not in r:
                            continue
                        ms, t = r[impl]
                        m = r.get("sdpa_math", (float("nan"), float("nan")))[1]
                        speed = ""
                        if causal and impl in results[(d, False)]["fwd"]:
                            speed = f"{results[(d, False)]['fwd'][impl][0] / ms:.2f}x"
                        lines.append(f"{impl:34s} {d:4d} {str(causal):>6s} {t:8.2f} {ms:8.3f} "
                                     f"{t / m:6.2f} {t / gemm:6.2f} {speed:>15s}")
            # The issue's targets, for the stage's default configuration.
            for d in dims:
                full, caus = results[(d, False)]["fwd"], results[(d, True)]["fwd"]
                if stage not in full:
                    continue
                t = full[stage][1]
                m = full.get("sdpa_math", (0, float("nan")))[1]
                speed = full[stage][0] / caus[stage][0] if stage in caus else float("nan")
                checks = [("≥ 25 TFLOP/s", t >= 25), ("≥ 0.5× fp32 GEMM", t >= 0.5 * gemm),
                          ("≥ 1.3× SDPA math", t >= 1.3 * m), ("causal ≥ 1.7× faster", speed >= 1.7)]
                lines.append(f"targets {stage} d={d}: " + ", ".join(
                    f"{name} {'met' if ok else 'NOT met'}" for name, ok in checks))
        for m in ("sdpa_math",):
            for d in dims:
                for causal in (False, True):
                    r = results[(d, causal)]["fwd"]
                    if m in r:
                        lines.append(f"{m:34s} {d:4d} {str(causal):>6s} {r[m][1]:8.2f} {r[m][0]:8.3f}")
        self.summary += lines

    def stages_16bit(self, stages):
        print("\n== fp16/bf16 stages against SDPA flash and cuDNN", flush=True)
        ns = (1024, 4096, 16384) if self.args.quick else (1024, 2048, 4096, 8192, 16384)
        dims = (128,) if self.args.quick else (64, 128)
        dtypes = ("bf16",) if self.args.quick else ("f16", "bf16")
        base = [("sdpa_flash", SDPBackend.FLASH_ATTENTION), ("sdpa_cudnn", SDPBackend.CUDNN_ATTENTION)]
        names = stages + ["sdpa_flash", "sdpa_cudnn"]
        lines = [f"fp16/bf16 sweep, batch·N = 16384, heads·d = 2048: TFLOP/s, and for the stages "
                 f"the ratio to sdpa_flash (bf16 GEMM {self.gemm.get(torch.bfloat16, float('nan')):.0f})",
                 f"{'dtype':5s} {'d':>4s} {'N':>6s} {'causal':>6s} " +
                 " ".join(f"{n[:12] + ' ' + w:>16s}" for n in names for w in ("fwd", "bwd"))]
        for dt in dtypes:
            for d in dims:
                for n in ns:
                    for causal in (False, True):
                        r = self.safe_point(stages, dt, 16384 // n, 2048 // d, n, d, causal, base)
                        cells = []
                        for name in names:
                            for w in ("fwd", "bwd"):
                                if name not in r[w]:
                                    cells.append(f"{'-':>16s}")
                                    continue
                                t = r[w][name][1]
                                flash = r[w].get("sdpa_flash", (0, float("nan")))[1]
                                ratio = f" ({t / flash:.2f}x)" if name in stages else ""
                                cells.append(f"{f'{t:.1f}{ratio}':>16s}")
                        lines.append(f"{dt:5s} {d:4d} {n:6d} {str(causal):>6s} " + " ".join(cells))
        self.summary += lines


def hopper_sweep(bench, stages, quick=False, dims=(64, 128, 256)):
    """--hopper: stage 10 (every step: the default is 10f; steps 10a-10e as variants) on the
    40 points of stages 08/09 plus d = 256 at N = 2048 and 8192, against SDPA's FlashAttention-2
    and cuDNN backends measured in the same run; ratios to both and % of the bf16 GEMM rate."""
    print("\n== stage 10 (Hopper) against SDPA flash and cuDNN", flush=True)
    base = [("sdpa_flash", SDPBackend.FLASH_ATTENTION), ("sdpa_cudnn", SDPBackend.CUDNN_ATTENTION)]
    steps = [("step", 1), ("step", 2), ("step", 3), ("step", 4), ("step", 5)]
    gemm = bench.gemm.get(torch.bfloat16, float("nan"))
    points = []
    for dt in (("bf16",) if quick else ("f16", "bf16")):
        for d in dims:
            ns = (2048, 8192) if d == 256 else ((1024, 4096, 16384) if quick else (1024, 2048, 4096, 8192, 16384))
            points += [(dt, d, n, causal) for n in ns for causal in (False, True)]
    lines = [f"stage 10, batch·N = 16384, heads·d = 2048: TFLOP/s of each step; for 10f (the default) the ratio "
             f"to sdpa_flash (FA2) and sdpa_cudnn and the share of the bf16 GEMM rate ({gemm:.0f} TFLOP/s)",
             f"{'dtype':5s} {'d':>4s} {'N':>6s} {'causal':>6s} {'10a':>7s} {'10b':>7s} {'10c':>7s} {'10d':>7s} "
             f"{'10e':>7s} {'10f':>7s} {'flash':>7s} {'cudnn':>7s} {'/flash':>7s} {'/cudnn':>7s} {'%gemm':>6s}"]
    for dt, d, n, causal in points:
        st = stages[0]
        r = bench.safe_point(stages, dt, 16384 // n, 2048 // d, n, d, causal, base, variants=steps)["fwd"]
        get = lambda k: r.get(k, (0, float("nan")))[1]
        t10 = [get(f"{st}[step={i}]") for i in (1, 2, 3, 4, 5)] + [get(st)]
        fl, cu = get("sdpa_flash"), get("sdpa_cudnn")
        lines.append(f"{dt:5s} {d:4d} {n:6d} {str(causal):>6s} " + " ".join(f"{t:7.1f}" for t in t10) +
                     f" {fl:7.1f} {cu:7.1f} {t10[5] / fl:7.2f} {t10[5] / cu:7.2f} {100 * t10[5] / gemm:5.1f}%")
    bench.summary += lines


def hopper_bwd_sweep(bench, stages, quick=False, dims=(64, 128, 256)):
    """--hopper with stage 11: the backward's steps (11d, the default; 11a-11c and the deterministic
    mode as variants) on the 40 points of stage 09, and 11d with its deterministic mode at d = 256
    (the steps before it have no kernel there) on the same lengths, against the backward of
    SDPA's FlashAttention-2 and cuDNN backends measured in the same run; ratios to both."""
    print("\n== stage 11 (Hopper backward) against SDPA flash and cuDNN", flush=True)
    base = [("sdpa_flash", SDPBackend.FLASH_ATTENTION), ("sdpa_cudnn", SDPBackend.CUDNN_ATTENTION)]
    steps = [("step", 1), ("step", 2), ("step", 3), ("deterministic", 1)]
    points = [(dt, d, n, causal) for dt in (("bf16",) if quick else ("f16", "bf16")) for d in dims
              for n in ((1024, 4096, 16384) if quick else (1024, 2048, 4096, 8192, 16384)) for causal in (False, True)]
    lines = [f"stage 11 backward, batch·N = 16384, heads·d = 2048: TFLOP/s (2.5 forwards) of each step; for 11d "
             f"(the default) the ratio to sdpa_flash (FA2) and sdpa_cudnn",
             f"{'dtype':5s} {'d':>4s} {'N':>6s} {'causal':>6s} {'11a':>7s} {'11b':>7s} {'11c':>7s} {'11d':>7s} {'determ':>7s} "
             f"{'flash':>7s} {'cudnn':>7s} "
             f"{'/flash':>7s} {'/cudnn':>7s}"]
    for dt, d, n, causal in points:
        st = stages[0]
        r = bench.safe_point(stages, dt, 16384 // n, 2048 // d, n, d, causal, base,
                             variants=steps if d < 256 else [("deterministic", 1)])["bwd"]
        get = lambda k: r.get(k, (0, float("nan")))[1]
        t11 = [get(f"{st}[step=1]"), get(f"{st}[step=2]"), get(f"{st}[step=3]"), get(st),
               get(f"{st}[deterministic=1]")]
        fl, cu = get("sdpa_flash"), get("sdpa_cudnn")
        lines.append(f"{dt:5s} {d:4d} {n:6d} {str(causal):>6s} " + " ".join(f"{t:7.1f}" for t in t11) +
                     f" {fl:7.1f} {cu:7.1f} {t11[3] / fl:7.2f} {t11[3] / cu:7.2f}")
    bench.summary += lines


def tune_sweep(bench, stages):
    """--tune: the stages' variants side by side (tile shapes, steps, ablations), bf16,
    against sdpa_flash only, to choose defaults and fill the ablation tables."""
    print("\n== tuning sweep (bf16): variants and ablations against sdpa_flash", flush=True)
    base = [("sdpa_flash", SDPBackend.FLASH_ATTENTION)]
    lines = ["tuning sweep, bf16, batch·N = 16384, heads·d = 2048 (TFLOP/s, ratio to sdpa_flash)"]

    def table(r, n, d, causal):
        for w in ("fwd", "bwd"):
            flash = r[w].get("sdpa_flash", (0, float("nan")))[1]
            for impl, (ms, t) in sorted(r[w].items()):
                lines.append(f"{w} d={d:3d} N={n:5d} {'causal' if causal else 'full  '} "
                             f"{impl:34s} {t:7.1f}  ({t / flash:.2f}x)")

    for d in (64, 128):
        for n in (1024, 4096, 16384):
            for causal in (False, True):
                variants = []
                if any(s.startswith("08") for s in stages) and d == 128:
                    variants += [("tile_d128", 1), ("tile_d128", 3)]
                r = bench.safe_point([s for s in stages if s.startswith("08")], "bf16", 16384 // n,
                                     2048 // d, n, d, causal, base, variants=variants)
                table(r, n, d, causal)
                r = bench.safe_point([s for s in stages if s.startswith("09")], "bf16", 16384 // n,
                                     2048 // d, n, d, causal, [],
                                     variants=[("step", 1), ("step", 2), ("step", 3)])
                table(r, n, d, causal)
    for d in (64, 128):
        for causal in (False, True):
            r = bench.safe_point([s for s in stages if s.startswith("08")], "bf16", 4, 2048 // d, 4096,
                                 d, causal, base, variants=[("ablation", k) for k in (2, 3, 4)])
            table(r, 4096, d, causal)
    bench.summary += lines


def steps_sweep(bench, stages):
    """--steps: the steps of stages 08 and 09 (option `step`) side by side, bf16, with
    sdpa_flash: the data of the notes' steps tables."""
    print("\n== steps of 08 and 09 (bf16) against sdpa_flash", flush=True)
    lines = ["steps of stages 08 and 09, bf16, batch·N = 16384, heads·d = 2048 "
             "(TFLOP/s, ratio to sdpa_flash; [step=k] is step k, the stage name alone is auto)"]
    steps = {"08": [("step", 1), ("step", 2)], "09": [("step", 1), ("step", 2), ("step", 3)]}
    for d in (64, 128):
        for n in (1024, 4096, 16384):
            for causal in (False, True):
                for prefix, variants in steps.items():
                    chosen = [s for s in stages if s.startswith(prefix)]
                    if not chosen:
                        continue
                    r = bench.safe_point(chosen, "bf16", 16384 // n, 2048 // d, n, d, causal,
                                         [("sdpa_flash", SDPBackend.FLASH_ATTENTION)], variants=variants)
                    for w in ("fwd", "bwd") if prefix == "09" else ("fwd",):
                        flash = r[w].get("sdpa_flash", (0, float("nan")))[1]
                        for impl, (ms, t) in sorted(r[w].items()):
                            lines.append(f"{w} d={d:3d} N={n:5d} {'causal' if causal else 'full  '} "
                                         f"{impl:34s} {t:7.1f}  ({t / flash:.2f}x)")
    bench.summary += lines


def git_commit():
    try:
        return subprocess.run(["git", "rev-parse", "--short=12", "HEAD"], capture_output=True,
                              text=True, check=True).stdout.strip()
    except Exception:
        return "unknown"


def main():
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--lib", default=os.path.join(root, "build-gpu", "stages", "libfa_c.so"),
                    help="libfa_c.so to load (default: build-gpu/stages/libfa_c.so)")
    ap.add_argument("--stages", default="07,08,09", help="stage prefixes to time (GPU stages only)")
    ap.add_argument("--out", default="bench_gpu.csv", help="CSV file to write")
    ap.add_argument("--commit", default=os.environ.get("FA_COMMIT") or git_commit(),
                    help="commit recorded in every row (default: $FA_COMMIT or git rev-parse)")
    ap.add_argument("--repeats", type=int, default=20, help="timed launches per measurement (median)")
    ap.add_argument("--rounds", type=int, default=3,
                    help="rounds of the first stage and cuDNN timed in turn (median of the rounds); 1: once each")
    ap.add_argument("--quick", action="store_true", help="a smaller fp16/bf16 sweep (bf16, d=128, 3 lengths)")
    ap.add_argument("--steps", action="store_true",
                    help="only the steps of stages 08 and 09 (option step), bf16, against sdpa_flash")
    ap.add_argument("--hopper", action="store_true",
                    help="stage 10's steps on the 08/09 points plus d = 256, and stage 11's on the 09 points plus d = 256, "
                         "against sdpa_flash and sdpa_cudnn")
    ap.add_argument("--head-dims", default="64,128,256",
                    help="with --hopper: the head dims of the sweeps (default 64,128,256)")
    ap.add_argument("--tune", action="store_true",
                    help="only the variants and ablations of 08 and 09 (bf16), against sdpa_flash")
    args = ap.parse_args()
    args.repeats = max(20, args.repeats)

    if not torch.cuda.is_available():
        print("bench_gpu: no CUDA device", file=sys.stderr)
        return 2
    torch.backends.cuda.matmul.allow_tf32 = False  # fp32 GEMMs and SDPA math stay fp32
    torch.backends.cudnn.allow_tf32 = False
    torch.set_float32_matmul_precision("highest")

    fa = Fa(args.lib)
    wanted = [p.strip() for p in args.stages.split(",") if p.strip()]
    gpu_stages = fa.stages()
    chosen = [s for s in gpu_stages if any(s.startswith(p) for p in wanted)]
    print(f"device: {torch.cuda.get_device_name(0)}; torch {torch.__version__}; commit {args.commit}")
    print(f"GPU stages in {args.lib}: {', '.join(gpu_stages) or 'none'}; timing: {', '.join(chosen) or 'none'}")
    for stage in chosen:  # what each variant "[name=value]" below means
        for line in fa.options(stage):
            print(f"  {stage} option {line}")

    def stop(signum, frame):  # a time limit (SIGTERM): keep the rows so far, print the summary
        raise KeyboardInterrupt(f"signal {signum}")
    signal.signal(signal.SIGTERM, stop)

    bench = Bench(args, fa)
    bench.open_csv(args.out)
    try:
        bench.gemms()
        if args.steps:
            steps_sweep(bench, [s for s in chosen if s.startswith(("08", "09"))])
            chosen = []
        if args.hopper:
            fwd10 = [s for s in chosen if s.startswith("10")]
            bwd11 = [s for s in chosen if s.startswith("11")]
            dims = tuple(int(x) for x in args.head_dims.split(","))
            if fwd10:
                hopper_sweep(bench, fwd10, args.quick, dims)
            if bwd11:
                hopper_bwd_sweep(bench, bwd11, args.quick, dims)
            chosen = []
        if args.tune:
            tune_sweep(bench, [s for s in chosen if s.startswith(("08", "09"))])
            chosen = [s for s in chosen if s.startswith("07")]
        fp32 = [s for s in chosen if s.startswith("07")]
        half = [s for s in chosen if s.startswith(("08", "09"))]
        if fp32:
            bench.stage07(fp32)
        if half:
            bench.stages_16bit(half)
        hopper = [s for s in chosen if s.startswith("10")]
        if hopper:
            hopper_sweep(bench, hopper, args.quick)
    except KeyboardInterrupt as e:
        bench.failures.append(f"benchmark interrupted ({e}): the CSV holds the rows measured so far")
    except Exception:
        traceback.print_exc()
        bench.failures.append("benchmark aborted: " + traceback.format_exc().splitlines()[-1])
    finally:
        bench.csv_file.close()

    print("\n==== bench_gpu summary ====")
    print(f"device {bench.device}, commit {args.commit}, {bench.date}; CSV: {args.out}")
    for line in bench.summary:
        print(line)
    if bench.failures:
        print(f"{len(bench.failures)} FAILURE(S):")
        for f in bench.failures:
            print("  " + f)
        return 1
    print("all checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
