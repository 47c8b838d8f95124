#!/usr/bin/env python3
"""Stage 13's Hopper forward beside PyTorch's two ways of running a masked attention:
flex_attention (compiled, with its BlockMask: skipped blocks are never computed) and
scaled_dot_product_attention on cuDNN with a dense mask (every block computed, the mask read
as a tensor).

    bench_masks.py --bench13 build/stages/13_masks/bench13_hopper --fa-lib build/stages/libfa_c.so \
        --out h100_stage13_masks.csv

Shapes: bf16, d = 128, 16 heads, batch 1, N in {4096, 16384}; masks: a causal sliding window
of 1024 and of 4096 keys, and causal documents of 256–8192 tokens (lengths drawn with a fixed
seed, the last one cut to fill N); score modifiers, each with the causal mask: ALiBi with the
geometric slopes 2^(−8(h+1)/H) (flex_attention's score_mod adds slope_h·(kv − q); cuDNN reads
the same bias as a dense bf16 tensor, −inf above the diagonal) and the logit soft-cap
50·tanh(s/50) (Gemma 2's attention cap; cuDNN has no way to say it: its row is n/a).
--cases picks the masks, the modifiers or all.

Before any timing, stage 13 (through the C ABI, libfa_c.so) and flex_attention run each timed
case's mask and modifier on N = 1024, forward and backward, against a float64 reference:
each must stay within twice the error of the same attention computed plainly in bf16, plus
4 ulp (the rule of tests/test_torch_masks.py); the script stops otherwise.

Time: CUDA events around 10 calls in a row, per call, median of 10 such runs after warm-up
(the stage's program times itself the same way). Work: 4·d·(visible query-key pairs)·heads
floating-point operations per call, the same count for every implementation (a modifier adds
none), so TFLOP/s compares useful work.

With --backward: a forward and a backward per call (the stage's forward_hopper then
backward_hopper; flex_attention's compiled forward then its backward through
torch.autograd.grad), work 3.5 times the forward's (the backward's five products against the
forward's two), and the backward alone (rows *_bwd, work 2.5 times the forward's): the stage's
program times its backward_hopper by itself; flex_attention's runs forward-backward pairs with
the events around torch.autograd.grad only (its compiled backward donates buffers, so one graph
cannot be run backward twice). flex_attention's forward + backward is timed in pairs as well,
the events around the pair: both kinds of pair start after a GPU sleep, so that the host has
queued the pair before the GPU reaches it. (Timed as ten pairs in a row, flex's forward +
backward at N = 4096, window 1024, took 0.58 ms in session 15 and 0.72 ms in session 16, while
its backward alone took 0.28 ms on the GPU and its forward 0.13 ms: most likely the host's
time.) SDPA is not timed then.

Rounds (--rounds, default 3): every implementation of a case is timed once per round, in turn,
the order reversed every other round, so that none is always timed right after the same other.
Each row reports its median round (the upper middle for an even count), picked per row: a
stage's forward + backward and its backward alone may come from different rounds.

Columns: device,commit,date,impl,seq,heads,head_dim,mask,ms,tflops,note
"""
import argparse
import csv
import ctypes
import datetime
import itertools
import math
import os
import pathlib
import random
import subprocess
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.nn.attention.flex_attention import create_block_mask, flex_attention

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "python"))
from fa_attention import core  # noqa: E402 (the C ABI, for the check)

HEADS, HEAD_DIM = 16, 128
SOFTCAP = 50.0  # Gemma 2's attention logit cap
SLOPES = torch.tensor([2.0 ** (-8 * (h + 1) / HEADS) for h in range(HEADS)], device="cuda")  # ALiBi's slopes_h


def document_lengths(n, seed=13):
    rng, lengths = random.Random(seed), []
    while sum(lengths) < n:
        lengths.append(min(rng.randint(256, 8192), n - sum(lengths)))
    return lengths


def cases(n, which):
    """(name, window or None, document lengths or None, modifier or None) for a sequence of n
    tokens; every case is causal."""
    masks = [(f"window {w}", w, None, None) for w in (1024, 4096)] + [
        ("documents 256-8192", None, document_lengths(n), None)]
    modifiers = [("causal + ALiBi", None, None, "alibi"), (f"causal + soft-cap {SOFTCAP:g}", None, None, "softcap")]
    return {"masks": masks, "modifiers": modifiers, "all": masks + modifiers}[which]


def visible_pairs(n, window, lengths):
    if lengths:
        return sum(m * (m + 1) // 2 for m in lengths)
    return sum((i if window is None else min(i, window)) + 1 for i in range(n))


def time_ms(fn, repeats=10, calls=10):
    for _ in range(3):
        fn()
    times = []
    for _ in range(repeats):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        for _ in range(calls):
            fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) / calls)
    return sorted(times)[len(times) // 2]


def time_after_ms(first, timed, repeats=10, calls=10):
    """As time_ms, for the second half of a pair: each call runs first() untimed, then
    timed(its result) between two events (a forward, then its backward; or nothing, then a
    forward + backward); the mean over `calls`, median of `repeats`.
    A GPU sleep of about two milliseconds is queued before each pair, so that the host has queued
    the timed half before the GPU reaches the first event (else a host slower than the GPU
    puts its own time between the events)."""
    for _ in range(3):
        timed(first())
    times = []
    for _ in range(repeats):
        events = []
        for _ in range(calls):
            torch.cuda._sleep(4_000_000)  # clock cycles: about 2 ms at the H100's and H200's clocks
            out = first()
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            timed(out)
            b.record()
            events.append((a, b))
        torch.cuda.synchronize()
        times.append(sum(a.elapsed_time(b) for a, b in events) / calls)
    return sorted(times)[len(times) // 2]


def causal(b, h, q, k):
    return k <= q


def mask_mod_for(n, window, lengths):
    if lengths:
        doc = torch.repeat_interleave(torch.arange(len(lengths), device="cuda"), torch.tensor(lengths, device="cuda"))
        return lambda b, h, q, k: (doc[q] == doc[k]) & (k <= q)
    if window is None:
        return causal
    return lambda b, h, q, k: (k <= q) & (q - k <= window)


def alibi(score, b, h, q, kv):  # s + slope_h·(j − i): the diagonal is i (one square document)
    return score + SLOPES[h] * (kv - q)


def softcap(score, b, h, q, kv):  # cap·tanh(s/cap) on the scaled score
    return SOFTCAP * torch.tanh(score / SOFTCAP)


SCORE_MODS = {None: None, "alibi": alibi, "softcap": softcap}


def dense_mask(n, mask_mod):
    q = torch.arange(n, device="cuda")[:, None]
    k = torch.arange(n, device="cuda")[None, :]
    return mask_mod(0, 0, q, k)


def dense_alibi_bias(n):
    """[1, heads, n, n] bf16: slope_h·(j − i) where j ≤ i, −inf above the diagonal."""
    i = torch.arange(n, device="cuda")
    dist = (i[None, :] - i[:, None]).float()  # [n, n] j − i
    bias = torch.empty(1, HEADS, n, n, device="cuda", dtype=torch.bfloat16)
    for h in range(HEADS):
        bias[0, h] = (SLOPES[h] * dist).masked_fill(dist > 0, -math.inf)
    return bias


def stage13_modifiers(window, lengths, modifier):
    """The fa_modifiers of a case (and the arrays it points into)."""
    return core.modifiers(window=None if window is None else (window, None),
                          alibi_slopes=SLOPES.cpu().numpy() if modifier == "alibi" else None,
                          softcap=SOFTCAP if modifier == "softcap" else 0.0,
                          cu_seqlens_q=None if not lengths else [0] + list(itertools.accumulate(lengths)),
                          cu_seqlens_k=None if not lengths else [0] + list(itertools.accumulate(lengths)))


def stage13_forward_backward(q, k, v, do, window, lengths, modifier):
    """O, dQ, dK, dV of stage 13's Hopper kernels on torch tensors [1, heads, n, d] (bf16)."""
    lib = core.library()
    p = core.Problem(1, HEADS, HEADS, q.shape[2], k.shape[2], HEAD_DIM, 1, 0.0)
    m, _keep = stage13_modifiers(window, lengths, modifier)
    o, dq, dk, dv = (torch.empty_like(x) for x in (q, q, k, v))
    lse = torch.empty(1, HEADS, q.shape[2], device="cuda", dtype=torch.float32)
    bf16 = 2  # enum fa_dtype's FA_BF16
    core._check(lib.fa_forward_masked_device(ctypes.byref(p), ctypes.byref(m), bf16, q.data_ptr(), k.data_ptr(),
                                             v.data_ptr(), o.data_ptr(), lse.data_ptr(), None))
    core._check(lib.fa_backward_masked_device(ctypes.byref(p), ctypes.byref(m), bf16, q.data_ptr(), k.data_ptr(),
                                              v.data_ptr(), o.data_ptr(), lse.data_ptr(), do.data_ptr(),
                                              dq.data_ptr(), dk.data_ptr(), dv.data_ptr(), None, None))
    torch.cuda.synchronize()
    return o, dq, dk, dv


def plain_forward_backward(q, k, v, do, keep, score_mod, dtype):
    """O, dQ, dK, dV of attention written plainly in `dtype` (the dense mask `keep` [n, n])."""
    q, k, v = (x.detach().to(dtype).requires_grad_() for x in (q, k, v))
    n = q.shape[2]
    s = q @ k.transpose(-1, -2) / math.sqrt(HEAD_DIM)
    if score_mod is not None:
        i = torch.arange(n, device="cuda")
        h = torch.arange(HEADS, device="cuda")[None, :, None, None]
        s = score_mod(s, 0, h, i[:, None], i[None, :]).to(dtype)  # ALiBi's slopes are fp32
    o = torch.softmax(s.masked_fill(~keep, -math.inf), dim=-1) @ v
    return (o,) + torch.autograd.grad(o, (q, k, v), do.to(dtype))


def within_rule(ours, base, exact, what):
    """|ours − exact| <= 2 |base − exact| + 4 ulp(max |exact|) in ours' dtype."""
    err = (ours.double() - exact).abs().max().item()
    base_err = (base.double() - exact).abs().max().item()
    floor = 4 * torch.finfo(ours.dtype).eps * max(1.0, exact.abs().max().item())
    ok = err <= 2 * base_err + floor
    print(f"check {'ok  ' if ok else 'FAIL'} {what}: err {err:.2e}, plain bf16 {base_err:.2e}", flush=True)
    return ok


def check(flex, which, n=1024):
    """Stage 13 and flex_attention against float64 on every case of the run at N = n."""
    g = torch.Generator(device="cuda").manual_seed(7)
    q, k, v, do = (torch.randn(1, HEADS, n, HEAD_DIM, device="cuda", generator=g).bfloat16() for _ in range(4))
    ok = True
    for name, window, lengths, modifier in cases(n, which):
        mask_mod, score_mod = mask_mod_for(n, window, lengths), SCORE_MODS[modifier]
        block_mask = create_block_mask(mask_mod, None, None, n, n, device="cuda")
        qg, kg, vg = (x.detach().requires_grad_() for x in (q, k, v))
        o = flex(qg, kg, vg, score_mod=score_mod, block_mask=block_mask)
        ours = {"stage13": stage13_forward_backward(q, k, v, do, window, lengths, modifier),
                "flex_attention": (o,) + torch.autograd.grad(o, (qg, kg, vg), do)}
        keep = dense_mask(n, mask_mod)
        exact = plain_forward_backward(q, k, v, do, keep, score_mod, torch.float64)
        base = plain_forward_backward(q, k, v, do, keep, score_mod, torch.bfloat16)
        for impl, outputs in ours.items():
            for label, x, b, e in zip(("O", "dQ", "dK", "dV"), outputs, base, exact):
                ok &= within_rule(x, b, e, f"{impl} {name} N={n} {label}")
        apart = [(x.float() - y.float()).abs().max().item() for x, y in zip(*ours.values())]
        print(f"check      stage13 against flex_attention, {name}: max |difference| of O, dQ, dK, dV "
              + ", ".join(f"{d:.2e}" for d in apart), flush=True)
    return ok


def run_stage13(binary, n, window, lengths, modifier, backward=False):
    args = [binary, "--seq", str(n), "--heads", str(HEADS), "--head-dim", str(HEAD_DIM), "--causal"]
    if backward:
        args += ["--backward"]
    if window is not None:
        args += ["--window-left", str(window)]
    if lengths:
        args += ["--seqlens", ",".join(map(str, lengths))]
    if modifier == "alibi":
        args += ["--alibi"]
    if modifier == "softcap":
        args += ["--softcap", f"{SOFTCAP:g}"]
    out = subprocess.run(args, check=True, capture_output=True, text=True).stdout
    fields = dict(f.split("=") for f in out.split())
    note = f"tiles skip {fields['tiles_skip']} full {fields['tiles_full']} partial {fields['tiles_partial']}"
    return float(fields["ms"]), note, float(fields["bwd_ms"]) if backward else float("nan")


def sdpa_dense(q, k, v, n, mask_mod, modifier):
    """(ms, note) of SDPA's cuDNN backend with the case as a dense mask or bias (n/a where none says it)."""
    if modifier == "softcap":
        return float("nan"), "n/a: cap·tanh(s/cap) is no additive mask"
    dense, kind = (dense_alibi_bias(n), "bf16 ALiBi bias") if modifier == "alibi" else (dense_mask(n, mask_mod), "bool mask")
    try:
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            return time_ms(lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=dense)), kind
    except RuntimeError as e:
        return float("nan"), "refused: " + str(e).splitlines()[0][:120]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bench13", required=True, help="the stage's timing program (bench13_hopper)")
    ap.add_argument("--fa-lib", required=True, help="libfa_c.so, for the check before timing")
    ap.add_argument("--cases", choices=("masks", "modifiers", "all"), default="all")
    ap.add_argument("--out", required=True)
    ap.add_argument("--seqs", type=int, nargs="+", default=[4096, 16384])
    ap.add_argument("--backward", action="store_true", help="time forward + backward, and the backward alone")
    ap.add_argument("--rounds", type=int, default=3, help="rounds of every implementation in turn (median reported)")
    args = ap.parse_args()
    device = torch.cuda.get_device_name()
    commit = os.environ.get("FA_COMMIT", "unknown")
    date = datetime.date.today().isoformat()
    # Every case compiles flex_attention anew (its mask and score closures differ, and N): allow
    # them all, keep each compiled for its own N (static shapes, as a model of one length gets),
    # and stop rather than fall back to the eager path, which materializes S (that fallback, at
    # the default limit of 8, made a run's last case at each N 16–30 times slower).
    torch._dynamo.config.recompile_limit = 64
    torch._dynamo.config.automatic_dynamic_shapes = False
    torch._dynamo.config.fail_on_recompile_limit_hit = True
    flex = torch.compile(flex_attention)
    core.library(args.fa_lib)
    if not check(flex, args.cases):
        sys.exit("bench_masks.py: stage 13 or flex_attention is outside the check's bound (above); nothing timed")
    out = open(args.out, "w", newline="")  # row by row: a run cut short keeps what it measured
    w = csv.writer(out)
    w.writerow(["device", "commit", "date", "impl", "seq", "heads", "head_dim", "mask", "ms", "tflops", "note"])
    for n in args.seqs:
        q, k, v = (torch.randn(1, HEADS, n, HEAD_DIM, device="cuda", dtype=torch.bfloat16) for _ in range(3))
        do = torch.randn_like(q)
        for name, window, lengths, modifier in cases(n, args.cases):
            fwd_flops = 4.0 * HEAD_DIM * visible_pairs(n, window, lengths) * HEADS
            mask_mod, score_mod = mask_mod_for(n, window, lengths), SCORE_MODS[modifier]
            block_mask = create_block_mask(mask_mod, None, None, n, n, device="cuda")
            # Each timer returns {impl: (ms, note)}; work[impl] is the FLOP count of that row.
            if args.backward:
                qg, kg, vg = (x.detach().requires_grad_() for x in (q, k, v))

                def stage13():  # one run of the program times both
                    ms, note, bwd_ms = run_stage13(args.bench13, n, window, lengths, modifier, backward=True)
                    return {"stage13_hopper": (ms, note),
                            "stage13_hopper_bwd": (bwd_ms, "backward alone (the program's own timing)")}

                def flex_forward_backward():
                    out = flex(qg, kg, vg, score_mod=score_mod, block_mask=block_mask)
                    torch.autograd.grad(out, (qg, kg, vg), do)

                def flex_timings():
                    sparsity = f"block mask sparsity {block_mask.sparsity():.1f}%"
                    alone = time_after_ms(lambda: flex(qg, kg, vg, score_mod=score_mod, block_mask=block_mask),
                                             lambda out: torch.autograd.grad(out, (qg, kg, vg), do))
                    # Forward + backward timed as pairs too, each after a GPU sleep: at N = 4096 the
                    # host takes longer to queue one than the GPU to run it (session 16).
                    pair = time_after_ms(lambda: None, lambda _: flex_forward_backward())
                    return {"flex_attention": (pair, "forward + backward (events around each, after a GPU sleep); " + sparsity),
                            "flex_attention_bwd": (alone, "backward alone (events around autograd.grad of each pair)")}

                timers = [stage13, flex_timings]
                work = {"stage13_hopper": 3.5 * fwd_flops, "flex_attention": 3.5 * fwd_flops,
                        "stage13_hopper_bwd": 2.5 * fwd_flops, "flex_attention_bwd": 2.5 * fwd_flops}
            else:
                def stage13():
                    return {"stage13_hopper": run_stage13(args.bench13, n, window, lengths, modifier)[:2]}

                def flex_timings():
                    return {"flex_attention": (time_ms(lambda: flex(q, k, v, score_mod=score_mod, block_mask=block_mask)),
                                               f"block mask sparsity {block_mask.sparsity():.1f}%")}

                timers = [stage13, flex_timings, lambda: {"sdpa_cudnn_dense_mask": sdpa_dense(q, k, v, n, mask_mod, modifier)}]
                work = {impl: fwd_flops for impl in ("stage13_hopper", "flex_attention", "sdpa_cudnn_dense_mask")}
            # Rounds: every timer once per round, in turn, the order reversed every other round,
            # so that no implementation is always timed right after the same other; the median
            # round per implementation is reported.
            runs = {}
            for r in range(args.rounds):
                for timer in (timers if r % 2 == 0 else timers[::-1]):
                    for impl, result in timer().items():
                        runs.setdefault(impl, []).append(result)
            for impl, results in runs.items():
                ms, note = sorted(results, key=lambda r: (math.isnan(r[0]), r[0]))[len(results) // 2]
                if args.rounds > 1 and not math.isnan(ms):
                    note += f"; median of {args.rounds} rounds"
                row = [device, commit, date, impl, n, HEADS, HEAD_DIM, name, f"{ms:.4f}",
                       f"{work[impl] / (ms * 1e-3) / 1e12:.1f}", note]
                w.writerow(row)
                out.flush()
                print(",".join(map(str, row)), flush=True)
    out.close()


if __name__ == "__main__":
    main()
