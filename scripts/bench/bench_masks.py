#!/usr/bin/env python3
"""Stage 13's Hopper forward beside PyTorch's two ways of running a masked attention:
flex_attention (compiled, with its BlockMask: skipped blocks are never computed) and
scaled_dot_product_attention on cuDNN with a dense mask (every block computed, the mask read
as a tensor).

    bench_masks.py --bench13 build/stages/13_masks/bench13_hopper --out h100_stage13_masks.csv

Shapes: bf16, d = 128, 16 heads, batch 1, N in {4096, 16384}; masks: a causal sliding window
of 1024 and of 4096 keys, and causal documents of 256–8192 tokens (lengths drawn with a fixed
seed, the last one cut to fill N). Time: CUDA events around 10 calls in a row, per call,
median of 10 such runs after warm-up (the stage's program times itself the same way). Work: 4·d·(visible query-key pairs)·heads
floating-point operations per call, the same count for every implementation, so TFLOP/s
compares useful work.

With --backward: a forward and a backward per call (the stage's forward_hopper then
backward_hopper; flex_attention's compiled forward then its backward through
torch.autograd.grad), work 3.5 times the forward's (the backward's five products against the
forward's two); the stage's backward alone goes into its note. SDPA is not timed then.

Columns: device,commit,date,impl,seq,heads,head_dim,mask,ms,tflops,note
"""
import argparse
import csv
import datetime
import os
import random
import subprocess

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.nn.attention.flex_attention import create_block_mask, flex_attention

HEADS, HEAD_DIM = 16, 128


def document_lengths(n, seed=13):
    rng, lengths = random.Random(seed), []
    while sum(lengths) < n:
        lengths.append(min(rng.randint(256, 8192), n - sum(lengths)))
    return lengths


def masks(n):
    """(name, window or None, document lengths or None) for a sequence of n tokens."""
    return [(f"window {w}", w, None) for w in (1024, 4096)] + [("documents 256-8192", None, document_lengths(n))]


def visible_pairs(n, window, lengths):
    if lengths:
        return sum(m * (m + 1) // 2 for m in lengths)
    return sum(min(i, window) + 1 for i in range(n))


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


def mask_mod_for(n, window, lengths):
    if lengths:
        doc = torch.repeat_interleave(torch.arange(len(lengths), device="cuda"), torch.tensor(lengths, device="cuda"))
        return lambda b, h, q, k: (doc[q] == doc[k]) & (k <= q)
    return lambda b, h, q, k: (k <= q) & (q - k <= window)


def dense_mask(n, mask_mod):
    q = torch.arange(n, device="cuda")[:, None]
    k = torch.arange(n, device="cuda")[None, :]
    return mask_mod(0, 0, q, k)


def run_stage13(binary, n, window, lengths, backward=False):
    args = [binary, "--seq", str(n), "--heads", str(HEADS), "--head-dim", str(HEAD_DIM), "--causal"]
    if backward:
        args += ["--backward"]
    if window is not None:
        args += ["--window-left", str(window)]
    if lengths:
        args += ["--seqlens", ",".join(map(str, lengths))]
    out = subprocess.run(args, check=True, capture_output=True, text=True).stdout
    fields = dict(f.split("=") for f in out.split())
    note = f"tiles skip {fields['tiles_skip']} full {fields['tiles_full']} partial {fields['tiles_partial']}"
    if backward:
        note += f"; backward alone {fields['bwd_ms']} ms"
    return float(fields["ms"]), note


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bench13", required=True, help="the stage's timing program (bench13_hopper)")
    ap.add_argument("--out", required=True)
    ap.add_argument("--seqs", type=int, nargs="+", default=[4096, 16384])
    ap.add_argument("--backward", action="store_true", help="time forward + backward")
    args = ap.parse_args()
    device = torch.cuda.get_device_name()
    commit = os.environ.get("FA_COMMIT", "unknown")
    date = datetime.date.today().isoformat()
    flex = torch.compile(flex_attention)
    out = open(args.out, "w", newline="")  # row by row: a run cut short keeps what it measured
    w = csv.writer(out)
    w.writerow(["device", "commit", "date", "impl", "seq", "heads", "head_dim", "mask", "ms", "tflops", "note"])
    for n in args.seqs:
        q, k, v = (torch.randn(1, HEADS, n, HEAD_DIM, device="cuda", dtype=torch.bfloat16) for _ in range(3))
        for name, window, lengths in masks(n):
            flops = 4.0 * HEAD_DIM * visible_pairs(n, window, lengths) * HEADS * (3.5 if args.backward else 1.0)
            results = []
            ms, note = run_stage13(args.bench13, n, window, lengths, args.backward)
            results.append(("stage13_hopper", ms, note))
            mask_mod = mask_mod_for(n, window, lengths)
            block_mask = create_block_mask(mask_mod, None, None, n, n, device="cuda")
            if args.backward:
                qg, kg, vg = (x.detach().requires_grad_() for x in (q, k, v))
                do = torch.randn_like(q)

                def forward_backward():
                    out = flex(qg, kg, vg, block_mask=block_mask)
                    torch.autograd.grad(out, (qg, kg, vg), do)

                results.append(("flex_attention", time_ms(forward_backward),
                                f"forward + backward; block mask sparsity {block_mask.sparsity():.1f}%"))
                for impl, ms, note in results:
                    row = [device, commit, date, impl, n, HEADS, HEAD_DIM, name, f"{ms:.4f}",
                           f"{flops / (ms * 1e-3) / 1e12:.1f}", note]
                    w.writerow(row)
                    out.flush()
                    print(",".join(map(str, row)), flush=True)
                continue
            results.append(("flex_attention", time_ms(lambda: flex(q, k, v, block_mask=block_mask)),
                            f"block mask sparsity {block_mask.sparsity():.1f}%"))
            dense = dense_mask(n, mask_mod)
            try:
                with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                    results.append(("sdpa_cudnn_dense_mask",
                                    time_ms(lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=dense)), "bool mask"))
            except RuntimeError as e:
                results.append(("sdpa_cudnn_dense_mask", float("nan"), "refused: " + str(e).splitlines()[0][:120]))
            del dense
            for impl, ms, note in results:
                row = [device, commit, date, impl, n, HEADS, HEAD_DIM, name, f"{ms:.4f}",
                       f"{flops / (ms * 1e-3) / 1e12:.1f}", note]
                w.writerow(row)
                out.flush()
                print(",".join(map(str, row)), flush=True)
    out.close()


if __name__ == "__main__":
    main()
