"""The PyTorch API: attention() over the native operator torch.ops.fa_attention (C++,
python/csrc/fa_torch.cpp, built as libfa_torch.so with the project when torch is installed).

    from fa_attention.torch_ops import attention
    out = attention(q, k, v, causal=True, stage="11")  # q [b, h, Nq, d]; k, v [b, hkv, Nk, d]
    out.sum().backward()                               # stage 11's backward (10's forward)

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
scale 0.0 there means 1/sqrt(d), as in fa_problem. The library is found through the
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


def attention(q, k, v, causal=False, scale=None, stage="08"):
    """softmax(scale · q kᵀ [+ causal mask]) v with stage `stage`; differentiable in q, k, v.
    q [b, h, Nq, d], k and v [b, hkv, Nk, d] -> [b, h, Nq, d]."""
    return _forward(q, k, v, bool(causal), 0.0 if scale is None else float(scale), stage)[0]


def attention_with_lse(q, k, v, causal=False, scale=None, stage="08"):
    """As attention(), and also L (float32 [b, h, Nq], detached: not differentiable)."""
    o, lse = _forward(q, k, v, bool(causal), 0.0 if scale is None else float(scale), stage)
    return o, lse.detach()
