"""The PyTorch API: attention() over the native operator torch.ops.fa_attention (C++,
python/csrc/fa_torch.cpp, built as libfa_torch.so with the project when torch is installed).

    from fa_attention.torch_ops import attention
    out = attention(q, k, v, causal=True, stage="11")  # q [b, h, Nq, d]; k, v [b, hkv, Nk, d]
    out.sum().backward()                               # stage 11's backward (10's forward)
    out = attention(q, k, v, causal=True, window=(255, 0), cu_seqlens_q=cu, cu_seqlens_k=cu)  # stage 13

CUDA tensors (float32, float16 or bfloat16, as the stage supports) run on a GPU stage on
torch's current stream of their device, with outputs and scratch from torch's caching
allocator: the op can be captured in a CUDA graph. CPU tensors (float32) run through the host
entry points, on any stage. hkv must divide h (GQA: query head i reads kv head i // (h / hkv));
causal is bottom-right (key j is visible to query i when j <= i + Nk - Nq); scale None means
1/sqrt(d). Strided inputs are copied to contiguous ones first. The forward saves O and L (the
rows' log-sum-exp, float32 [b, h, Nq]) for the backward, which is the stage's own: a
forward-only stage (08, 10) refuses gradients, so train with 09 or 11 (08's and 10's forward
with their backward). What the op or a stage refuses (a dtype, a head dim, a CPU stage for
CUDA tensors, a stage without backward) raises ValueError with the stage's message; a failure
while running raises RuntimeError.

The two ops are torch.ops.fa_attention.forward(q, k, v, causal, scale, stage) -> (O, L) and
torch.ops.fa_attention.backward(q, k, v, O, L, dO, causal, scale, stage) -> (dQ, dK, dV);
scale 0.0 there means 1/sqrt(d), as in fa_problem. With modifiers (window, alibi_slopes, softcap,
sinks, cu_seqlens_q/_k) attention() runs stage 13 through torch.ops.fa_attention.masked_forward
and masked_backward (python/csrc/fa_torch_masked.cpp). Stage 14 (decoding) adds decode() and
append_kv() over torch.ops.fa_attention.decode and torch.ops.fa_attention.append_kv (a KV
cache, one length per sequence, contiguous or paged). The library is found through the
environment variable FA_TORCH_LIB, else next to this package (an installed wheel), else in
python/ of the build folder that holds libfa_c.so (torch_library_candidates()).
"""
import os
import pathlib

import torch

from fa_attention import core


def torch_library_candidates():
    """Where the native op is looked for, in order: $FA_TORCH_LIB alone when it is set; else
    this package's folder; else <build>/python/ for every <build>/stages/libfa_c.so that
    core.library_candidates() lists (with $FA_LIB set: the build folder of that library)."""
    if os.environ.get("FA_TORCH_LIB"):
        return [pathlib.Path(os.environ["FA_TORCH_LIB"])]
    found = [pathlib.Path(__file__).resolve().parent / "libfa_torch.so"]
    for c_lib in core.library_candidates():
        path = c_lib.parent.parent / "python" / "libfa_torch.so"  # <build>/stages/ -> <build>/python/
        if path not in found:
            found.append(path)
    return found


def _load():
    for path in torch_library_candidates():
        if path.is_file():
            torch.ops.load_library(str(path))
            return
    looked = "\n  ".join(map(str, torch_library_candidates()))
    raise ImportError("libfa_torch.so (the native op) not found: configure the project where python3 can "
                      "import torch and build the fa_torch target (cmake --build build --target fa_torch), "
                      f"or set FA_TORCH_LIB to its path. Looked at:\n  {looked}")


_load()
_forward = torch.ops.fa_attention.forward.default
_backward = torch.ops.fa_attention.backward.default
_masked_forward = torch.ops.fa_attention.masked_forward.default
_decode = torch.ops.fa_attention.decode.default
_append_kv = torch.ops.fa_attention.append_kv.default


# Stage 13 takes the modifiers; without them, stage 08 is the default (forward only on the GPU).
_DEFAULT_STAGE = "08"
_MASKED_STAGES = ("13", "13_masks")


def _window(window):
    """window=(left, right) as the op's two optional ints."""
    if window is None:
        return None, None
    if not isinstance(window, (tuple, list)) or len(window) != 2 or \
            not all(w is None or (isinstance(w, int) and not isinstance(w, bool)) for w in window):
        raise ValueError(f"attention: window = {window!r} is not allowed: give (left, right), the keys before "
                         "and after each row's diagonal, each an int >= 0 or None for no bound "
                         "(e.g. (255, 0) with causal=True for a 256-token sliding window)")
    return window[0], window[1]


def _call(q, k, v, causal, scale, stage, window, alibi_slopes, softcap, sinks, cu_seqlens_q, cu_seqlens_k,
          max_seqlen_q, max_seqlen_k):
    scale = 0.0 if scale is None else float(scale)
    mods = dict(window=window, alibi_slopes=alibi_slopes, softcap=softcap, sinks=sinks, cu_seqlens_q=cu_seqlens_q,
                cu_seqlens_k=cu_seqlens_k, max_seqlen_q=max_seqlen_q, max_seqlen_k=max_seqlen_k)
    given = [name for name, value in mods.items() if value is not None]
    if given and stage is not None and stage not in _MASKED_STAGES:
        raise ValueError(f"attention: stage {stage!r} takes no modifiers ({', '.join(given)}); stage 13 does "
                         "(leave stage out, or pass stage='13')")
    if not given and stage not in _MASKED_STAGES:
        return _forward(q, k, v, bool(causal), scale, stage or _DEFAULT_STAGE)
    left, right = _window(window)
    return _masked_forward(q, k, v, bool(causal), scale, left, right, float(softcap or 0.0), alibi_slopes, sinks,
                           cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k)


def attention(q, k, v, causal=False, scale=None, stage=None, *, window=None, alibi_slopes=None, softcap=None,
              sinks=None, cu_seqlens_q=None, cu_seqlens_k=None, max_seqlen_q=None, max_seqlen_k=None):
    """softmax(scale · q kᵀ [+ mask and modifiers]) v; differentiable in q, k, v (and sinks).
    q [b, h, Nq, d], k and v [b, hkv, Nk, d] -> [b, h, Nq, d].

    Without modifiers it runs stage `stage` (default "08"). With any of the keywords it runs
    stage 13 (stage left out, or "13"), whose definitions are common/modifiers.h's:
      window=(left, right)   row i sees keys diag - left .. diag + right (diag = i + Nk - Nq, the
                             causal alignment, per document); None on a side: unbounded
      softcap=cap            s <- cap · tanh(s / cap) (cap > 0)
      alibi_slopes           [h] float: s <- s + slope_h · (j - diag)
      sinks                  [h] float on q's device: a logit per head in every row's softmax
                             denominator; learnable (its gradient flows)
      cu_seqlens_q/_k        int32 or int64 [documents + 1]: documents packed into one row
                             (b = 1), each row attending only within its document; on the CPU or
                             q's device (read on the host either way: from the GPU that is a copy
                             which waits for the stream)
      max_seqlen_q/_k        optional: at least the longest document, checked
    CUDA: float16 or bfloat16, d = 64 or 128, a GPU of compute capability 9.x (stage 13's Hopper
    kernels). CPU: float32 (stage 13's CPU step)."""
    return _call(q, k, v, causal, scale, stage, window, alibi_slopes, softcap, sinks, cu_seqlens_q, cu_seqlens_k,
                 max_seqlen_q, max_seqlen_k)[0]


def attention_with_lse(q, k, v, causal=False, scale=None, stage=None, **modifiers):
    """As attention(), and also L (float32 [b, h, Nq], detached: not differentiable); with
    sinks, a row's L counts its sink (a row that sees no key has L = sink)."""
    names = ("window", "alibi_slopes", "softcap", "sinks", "cu_seqlens_q", "cu_seqlens_k", "max_seqlen_q",
             "max_seqlen_k")
    unknown = sorted(set(modifiers) - set(names))
    if unknown:
        raise TypeError(f"attention_with_lse: unexpected keyword(s) {unknown} (modifiers: {', '.join(names)})")
    o, lse = _call(q, k, v, causal, scale, stage, *(modifiers.get(n) for n in names))
    return o, lse.detach()


def decode(q, k_cache, v_cache, cache_seqlens, block_table=None, causal=True, scale=None):
    """Stage 14's decode step: each sequence's q_len new tokens (1 to 16) against its KV cache.
    q [b, h, q_len, d] -> O [b, h, q_len, d]. The caches are contiguous [b, hkv, capacity, d],
    or paged [num_blocks, hkv, block_size, d] with block_table int32 [b, blocks_per_seq]
    (token j of sequence s lies in block block_table[s, j // block_size], row j % block_size).
    cache_seqlens int32 [b] counts each sequence's tokens, the new ones included (append_kv
    them first): with causal, new token i of sequence s sees keys j <= cache_seqlens[s] - q_len
    + i; without, every key j < cache_seqlens[s]. hkv divides h (GQA). CUDA: float16 or
    bfloat16, head dims 64 and 128, lengths and table on the GPU (never read back: the call
    can be captured in a CUDA graph). CPU: float32, any head dim."""
    return _decode(q, k_cache, v_cache, cache_seqlens, block_table, bool(causal),
                   0.0 if scale is None else float(scale))[0]


def decode_with_lse(q, k_cache, v_cache, cache_seqlens, block_table=None, causal=True, scale=None):
    """As decode(), and also L (float32 [b, h, q_len], each row's natural-log log-sum-exp;
    -inf for a row that sees no key, whose output is 0)."""
    return _decode(q, k_cache, v_cache, cache_seqlens, block_table, bool(causal),
                   0.0 if scale is None else float(scale))


def append_kv(k_new, v_new, k_cache, v_cache, cache_seqlens, block_table=None):
    """Writes the new tokens' keys and values (k_new, v_new [b, hkv, q_len, d]) into the
    caches in place, token i of sequence s at position cache_seqlens[s] - q_len + i (the
    lengths already count the new tokens, as decode() takes them: every length >= q_len).
    Caches and table as in decode(); the caches must be contiguous. Returns None."""
    _append_kv(k_new, v_new, k_cache, v_cache, cache_seqlens, block_table)
