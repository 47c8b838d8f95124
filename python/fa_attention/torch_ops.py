"""The PyTorch API: attention() as a torch.library custom op with a fake implementation and
autograd, over the C ABI of libfa_c.so (common/fa_c.h).

    from fa_attention.torch_ops import attention
    out = attention(q, k, v, causal=True, stage="08")  # q [b, h, Nq, d]; k, v [b, hkv, Nk, d]
    out = attention(q, k, v, causal=True, stage="09")  # the same forward (08's), with a backward
    out.sum().backward()                               # stage 09's backward

CUDA tensors (float32, float16 or bfloat16, as the stage supports) run on a GPU stage through
fa_forward_device / fa_backward_device, on torch's current stream of their device. CPU
tensors (float32) run through the host entry points fa_forward / fa_backward, on any stage.
hkv must divide h (GQA: query head i reads kv head i // (h / hkv)); causal is bottom-right
(key j is visible to query i when j <= i + Nk - Nq); scale None means 1/sqrt(d). Inputs are
made contiguous. The forward saves O and L (the rows' log-sum-exp, float32 [b, h, Nq]) for
the backward, which is the stage's own: a forward-only stage (08, 10) refuses gradients, so
train with 09 or 11 (08's and 10's forward with their backward). What a stage refuses (a
dtype, a head dim, a CPU stage for CUDA tensors, a stage without backward) raises
fa_attention.FaError with the stage's message.

The two ops are torch.ops.fa_attention.forward(q, k, v, causal, scale, stage) -> (O, L) and
torch.ops.fa_attention.backward(q, k, v, O, L, dO, causal, scale, stage) -> (dQ, dK, dV);
scale 0.0 there means 1/sqrt(d), as in fa_problem.
"""
import ctypes

import torch

from fa_attention import core

_DTYPE_CODES = {torch.float32: 0, torch.float16: 1, torch.bfloat16: 2}  # enum fa_dtype
_F32P = ctypes.POINTER(ctypes.c_float)


def _check_inputs(q, k, v):
    """What the C ABI cannot see through pointers: ranks, shapes, devices and dtypes that agree
    (q [b, h, Nq, d], k and v [b, hkv, Nk, d]). The rest (heads, head dims, dtypes a stage
    supports) the stage checks."""
    if q.dim() != 4 or k.dim() != 4 or v.dim() != 4:
        raise ValueError(f"attention: q, k, v must be [batch, heads, seq, head_dim]; got shapes "
                         f"{tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}")
    b, h, nq, d = q.shape
    if k.shape != v.shape or k.shape[0] != b or k.shape[3] != d:
        raise ValueError(f"attention: k {tuple(k.shape)} and v {tuple(v.shape)} must be "
                         f"[{b}, kv_heads, seq_k, {d}] for q {tuple(q.shape)}")
    if not (q.device == k.device == v.device):
        raise ValueError(f"attention: q, k, v on different devices ({q.device}, {k.device}, {v.device})")
    if not (q.dtype == k.dtype == v.dtype):
        raise ValueError(f"attention: q, k, v of different dtypes ({q.dtype}, {k.dtype}, {v.dtype})")
    if q.device.type == "cuda" and q.dtype not in _DTYPE_CODES:
        raise ValueError(f"attention: dtype {q.dtype} is not supported on CUDA tensors "
                         "(float32, float16, bfloat16)")
    if q.device.type == "cpu" and q.dtype != torch.float32:
        raise ValueError(f"attention: dtype {q.dtype} is not supported on CPU tensors (float32: "
                         "the host entry points take fp32)")
    if q.device.type not in ("cpu", "cuda"):
        raise ValueError(f"attention: device {q.device} is not supported (cpu, cuda)")


def _problem(q, k, v, causal, scale):
    _check_inputs(q, k, v)
    b, h, nq, d = q.shape
    return core.Problem(b, h, k.shape[1], nq, k.shape[2], d, int(bool(causal)), float(scale))


def _ptr(t):
    """A tensor's address for the C ABI; None for a tensor with no elements (allowed NULL)."""
    return t.data_ptr() if t.numel() > 0 else None


def _f32(t):
    return ctypes.cast(_ptr(t), _F32P)


@torch.library.custom_op("fa_attention::forward", mutates_args=())
def _forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool, scale: float,
             stage: str) -> tuple[torch.Tensor, torch.Tensor]:
    q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
    p = _problem(q, k, v, causal, scale)
    o = q.new_empty(q.shape)                                     # [b, h, Nq, d]
    lse = q.new_empty(q.shape[:3], dtype=torch.float32)          # [b, h, Nq]
    lib, name = core.library(), stage.encode()
    if q.device.type == "cuda":
        with torch.cuda.device(q.device):
            stream = torch.cuda.current_stream(q.device).cuda_stream
            rc = lib.fa_forward_device(name, ctypes.byref(p), _DTYPE_CODES[q.dtype], _ptr(q),
                                       _ptr(k), _ptr(v), _ptr(o), _ptr(lse), stream or None)
    else:
        rc = lib.fa_forward(name, ctypes.byref(p), _f32(q), _f32(k), _f32(v), _f32(o), _f32(lse))
    core._check(rc)
    return o, lse


@_forward.register_fake
def _forward_fake(q, k, v, causal, scale, stage):
    _check_inputs(q, k, v)
    return q.new_empty(q.shape), q.new_empty(q.shape[:3], dtype=torch.float32)


@torch.library.custom_op("fa_attention::backward", mutates_args=())
def _backward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, o: torch.Tensor,
              lse: torch.Tensor, do: torch.Tensor, causal: bool, scale: float,
              stage: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    q, k, v, o, lse, do = (t.contiguous() for t in (q, k, v, o, lse, do))
    p = _problem(q, k, v, causal, scale)
    if o.shape != q.shape or do.shape != q.shape or lse.shape != q.shape[:3]:
        raise ValueError(f"attention backward: O {tuple(o.shape)} and dO {tuple(do.shape)} must be "
                         f"{tuple(q.shape)}, L {tuple(lse.shape)} {tuple(q.shape[:3])}")
    if o.dtype != q.dtype or do.dtype != q.dtype or lse.dtype != torch.float32:
        raise ValueError(f"attention backward: O {o.dtype} and dO {do.dtype} must be {q.dtype}, "
                         f"L {lse.dtype} float32")
    dq, dk, dv = q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape)
    lib, name = core.library(), stage.encode()
    if q.device.type == "cuda":
        with torch.cuda.device(q.device):
            stream = torch.cuda.current_stream(q.device).cuda_stream
            rc = lib.fa_backward_device(name, ctypes.byref(p), _DTYPE_CODES[q.dtype], _ptr(q),
                                        _ptr(k), _ptr(v), _ptr(o), _ptr(lse), _ptr(do), _ptr(dq),
                                        _ptr(dk), _ptr(dv), stream or None)
    else:
        rc = lib.fa_backward(name, ctypes.byref(p), *(_f32(t) for t in (q, k, v, o, lse, do, dq, dk, dv)))
    core._check(rc)
    return dq, dk, dv


@_backward.register_fake
def _backward_fake(q, k, v, o, lse, do, causal, scale, stage):
    _check_inputs(q, k, v)
    return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape)


def _setup_context(ctx, inputs, output):
    q, k, v, causal, scale, stage = inputs
    o, lse = output
    ctx.save_for_backward(q, k, v, o, lse)
    ctx.causal, ctx.scale, ctx.stage = causal, scale, stage


def _backward_rule(ctx, grad_o, grad_lse):
    # grad_lse is ignored: the stages' backward takes dO only, and attention_with_lse() hands
    # out L detached, so no gradient reaches it through the public API.
    q, k, v, o, lse = ctx.saved_tensors
    dq, dk, dv = _backward(q, k, v, o, lse, grad_o, ctx.causal, ctx.scale, ctx.stage)
    return dq, dk, dv, None, None, None


_forward.register_autograd(_backward_rule, setup_context=_setup_context)


def attention(q, k, v, causal=False, scale=None, stage="08"):
    """softmax(scale · q kᵀ [+ causal mask]) v with stage `stage`; differentiable in q, k, v.
    q [b, h, Nq, d], k and v [b, hkv, Nk, d] -> [b, h, Nq, d]."""
    o, _ = _forward(q.contiguous(), k.contiguous(), v.contiguous(), bool(causal),
                    0.0 if scale is None else float(scale), stage)
    return o


def attention_with_lse(q, k, v, causal=False, scale=None, stage="08"):
    """As attention(), and also L (float32 [b, h, Nq], detached: not differentiable)."""
    o, lse = _forward(q.contiguous(), k.contiguous(), v.contiguous(), bool(causal),
                      0.0 if scale is None else float(scale), stage)
    return o, lse.detach()
