#!/usr/bin/env python3
"""PyTorch's scaled_dot_product_attention on stage 14's decode shapes, per backend: the side
of the comparison that issue 33's benchmark asks for (scripts/gpu/stage14.sh calls it).

    bench_decode_sdpa.py --out stage14_sdpa.csv [--batches 1 8 64] [--caches 1024 ...] [--q-lens 1 4]

Shapes: bf16, d = 128, 32 query heads over 8 KV heads, every sequence's cache full (the
contiguous cache: SDPA has no paged one). K and V are [batch, 8, cache, 128]; the query
heads share them through enable_gqa (backends that refuse it get K and V expanded to 32
heads, which is counted as they read it: 'expanded' in the CSV). q_len > 1 uses the
bottom-right causal mask (the new tokens are the cache's last positions). Time: CUDA events
around a CUDA graph of 10 calls (a decode takes microseconds, as long as the host takes to
launch it), median of 10 graph launches. As stage 14's own benchmark does, the calls rotate over
copies of K and V that together hold at least twice the L2, so that no call finds its keys
there. Metric: bytes of K and V read (8 KV heads) per second.

Columns: device,commit,date,backend,batch,heads,kv_heads,head_dim,q_len,cache,ms,kv_gbs,note
"""
import argparse
import csv
import math

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

BACKENDS = [("cudnn", SDPBackend.CUDNN_ATTENTION), ("flash", SDPBackend.FLASH_ATTENTION),
            ("efficient", SDPBackend.EFFICIENT_ATTENTION)]


def mask_for(q_len, cache):
    if q_len == 1:
        return None
    try:
        from torch.nn.attention.bias import causal_lower_right
        return causal_lower_right(q_len, cache)
    except ImportError:
        return None


def time_events(run, per_run, launches):
    """Median milliseconds per call of `run` (which makes `per_run` calls), timed with events."""
    times = []
    for _ in range(launches):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        run()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) / per_run)
    return sorted(times)[len(times) // 2]


def time_graph(fn, calls=10, launches=10):
    """A CUDA graph of `calls` calls fn(0) … fn(calls − 1), timed over `launches` replays; where
    the backend cannot be captured, the calls are timed as they are launched (the host's part
    then counts too)."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for c in range(3):
            fn(c)
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    try:
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            for c in range(calls):
                fn(c)
        g.replay()
        torch.cuda.synchronize()
        return time_events(g.replay, calls, launches)
    except Exception as e:  # noqa: BLE001 — any capture failure falls back to plain launches
        print(f"  (not captured: {type(e).__name__}; timed launch by launch)")
        torch.cuda.synchronize()
        return time_events(lambda: [fn(c) for c in range(calls)], calls, launches)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 8, 64])
    ap.add_argument("--caches", type=int, nargs="+", default=[1024, 8192, 32768, 131072])
    ap.add_argument("--q-lens", type=int, nargs="+", default=[1, 4])
    ap.add_argument("--commit", default="unknown")
    ap.add_argument("--date", default="")
    args = ap.parse_args()
    heads, kv_heads, d = 32, 8, 128
    device = torch.cuda.get_device_name()
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    with open(args.out, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["device", "commit", "date", "backend", "batch", "heads", "kv_heads", "head_dim", "q_len", "cache", "ms", "kv_gbs",
                    "note"])
        for batch in args.batches:
            for cache in args.caches:
                kv_bytes = 2 * batch * kv_heads * cache * d * 2
                sets = max(1, min(64, math.ceil(2 * l2 / kv_bytes)))  # copies of K, V: ≥ twice the L2
                ks = [torch.randn(batch, kv_heads, cache, d, device="cuda", dtype=torch.bfloat16) for _ in range(sets)]
                vs = [torch.randn_like(k) for k in ks]
                for q_len in args.q_lens:
                    q = torch.randn(batch, heads, q_len, d, device="cuda", dtype=torch.bfloat16)
                    mask = mask_for(q_len, cache)
                    for name, backend in BACKENDS:
                        note = ""
                        try:
                            with sdpa_kernel([backend]):
                                def fn(c):
                                    return F.scaled_dot_product_attention(q, ks[c % sets], vs[c % sets], attn_mask=mask,
                                                                          enable_gqa=True)
                                fn(0)
                                ms = time_graph(fn)
                        except Exception as e:  # a backend that refuses the shape, GQA or the mask
                            try:
                                ke = [k.repeat_interleave(heads // kv_heads, dim=1) for k in ks]
                                ve = [v.repeat_interleave(heads // kv_heads, dim=1) for v in vs]
                                with sdpa_kernel([backend]):
                                    def fn(c):
                                        return F.scaled_dot_product_attention(q, ke[c % sets], ve[c % sets], attn_mask=mask)
                                    fn(0)
                                    ms = time_graph(fn)
                                note = "expanded"
                                ke = ve = None
                            except Exception as e2:
                                print(f"{name} batch={batch} cache={cache} q_len={q_len}: {type(e2).__name__}: "
                                      f"{str(e2).splitlines()[0] if str(e2) else ''} (with GQA: {type(e).__name__})")
                                continue
                        gbs = kv_bytes / (ms * 1e6)
                        print(f"{name:9s} batch={batch} cache={cache} q_len={q_len}: {ms:.4f} ms {gbs:.0f} GB/s {note}")
                        w.writerow([device, args.commit, args.date, name, batch, heads, kv_heads, d, q_len, cache, f"{ms:.5f}", f"{gbs:.1f}", note])
                        f.flush()
                ks = vs = None  # freed before the next shape's copies
                torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
