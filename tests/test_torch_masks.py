"""The PyTorch op with stage 13's modifiers (python/csrc/fa_torch_masked.cpp, through
fa_attention.torch_ops.attention): window, ALiBi, soft-cap, sinks and documents (cu_seqlens).

Forward and gradients (q, k, v and sinks) against a float64 torch reference written plainly
here, its mask built densely element by element from the definitions of common/modifiers.h,
held to the FlashAttention tests' rule: at most twice the error of the same reference computed
in the inputs' own dtype (plus a few ulps). Also gradcheck, opcheck, torch.compile, and every
refusal. On the CPU the op runs stage 13's CPU step (float32); on a 9.x GPU its Hopper kernels
(float16, bfloat16). Runs as a script (exit 77 = skipped without torch), with the op's other
test files in one process (CTest python_torch: tests/torch_checks.py) or under pytest. Keep the CPU cases small: CI has two cores.
"""
import math
import pathlib
import sys
import warnings

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent / "python"))
from torch_checks import refused, run_tests, skip  # noqa: E402 (tests/, beside this file)

try:
    import torch
except ImportError:
    torch = None

if torch is None and "pytest" in sys.modules:
    import pytest
    pytest.skip("torch is not installed", allow_module_level=True)

if torch is not None:
    from fa_attention.torch_ops import attention, attention_with_lse

    HAS_HOPPER = torch.cuda.is_available() and torch.cuda.get_device_capability()[0] == 9


def _skip_unless_hopper():
    if not HAS_HOPPER:
        skip("no GPU of compute capability 9.x")


def dense_mask(nq, nk, causal, window, cu_q, cu_k):
    """keep [nq, nk] and dist = j - diag [nq, nk], decided element by element."""
    keep = torch.zeros(nq, nk, dtype=torch.bool)
    dist = torch.zeros(nq, nk, dtype=torch.float64)
    cu_q = list(cu_q) if cu_q is not None else [0, nq]
    cu_k = list(cu_k) if cu_k is not None else [0, nk]
    left, right = window if window is not None else (None, None)
    for doc in range(len(cu_q) - 1):
        n_q, n_k = cu_q[doc + 1] - cu_q[doc], cu_k[doc + 1] - cu_k[doc]
        for i in range(n_q):
            diag = i + n_k - n_q
            for j in range(n_k):
                seen = (not causal or j <= diag) and (left is None or j >= diag - left) and \
                       (right is None or j <= diag + right)
                keep[cu_q[doc] + i, cu_k[doc] + j] = seen
                dist[cu_q[doc] + i, cu_k[doc] + j] = j - diag
    return keep, dist


def reference(q, k, v, sinks, causal, scale, dtype, window=None, softcap=None, alibi_slopes=None, cu_seqlens_q=None,
              cu_seqlens_k=None):
    """Plain attention under the modifiers in `dtype`, differentiable by torch's autograd:
    (O, L, leaves). A row that sees nothing has O = 0 and L = its sink (or -inf)."""
    leaves = [t.detach().to(dtype).requires_grad_() for t in (q, k, v)]
    s_leaf = sinks.detach().to(q.device, dtype).requires_grad_() if sinks is not None else None
    q, k, v = leaves
    h, nq, nk = q.shape[1], q.shape[2], k.shape[2]
    kk, vv = (t.repeat_interleave(h // k.shape[1], dim=1) for t in (k, v))
    keep, dist = dense_mask(nq, nk, causal, window, cu_seqlens_q, cu_seqlens_k)
    keep, dist = keep.to(q.device), dist.to(q.device, dtype)
    s = scale * q @ kk.transpose(-1, -2)
    if softcap:
        s = softcap * torch.tanh(s / softcap)
    if alibi_slopes is not None:
        s = s + alibi_slopes.to(q.device, dtype)[None, :, None, None] * dist
    s = s.masked_fill(~keep, -math.inf)
    sink = (s_leaf[None, :, None, None] if s_leaf is not None else torch.full((1, h, 1, 1), -math.inf, device=q.device,
                                                                               dtype=dtype))
    both = torch.cat([sink.expand(q.shape[0], h, nq, 1), s], dim=-1)
    lse = torch.logsumexp(both, dim=-1)  # -inf for a row with neither sink nor key
    p = torch.exp(s - lse.masked_fill(torch.isinf(lse), 0.0)[..., None]).masked_fill(~keep, 0.0)
    o = p @ vv
    return o, lse, leaves + ([s_leaf] if s_leaf is not None else [])


def same_precision_ok(ours, base, exact, what):
    """|ours − exact| <= 2 |base − exact| + 4 ulp(max|exact|) in ours' dtype, finite entries alike."""
    finite = torch.isfinite(exact)
    assert torch.equal(torch.isfinite(ours), finite.to(ours.device)), f"{what}: infinities differ"
    err = (ours.double() - exact).abs()[finite].max().item() if finite.any() else 0.0
    base_err = (base.double() - exact).abs()[finite].max().item() if finite.any() else 0.0
    floor = 4 * torch.finfo(ours.dtype).eps * max(1.0, exact[finite].abs().max().item() if finite.any() else 0.0)
    ok = err <= 2 * base_err + floor
    print(f"{'ok  ' if ok else 'FAIL'} {what}: err {err:.2e}, same-precision reference {base_err:.2e}")
    assert ok, f"{what}: err {err:.2e} > 2 x {base_err:.2e} + {floor:.1e}"


def slopes(h):
    return torch.tensor([2.0 ** (-8 * (i + 1) / h) for i in range(h)])


def cases(h, d, plain_shape):
    """(name, causal, modifiers, shape) of every modifier alone and in combination; documents
    are packed into one row (batch 1), two rows past the last document in the first."""
    g = torch.Generator().manual_seed(1)
    return [
        ("window", True, dict(window=(9, 0)), plain_shape),
        ("two-sided window", False, dict(window=(4, 6)), plain_shape),
        ("softcap", False, dict(softcap=1.5), plain_shape),
        ("alibi", True, dict(alibi_slopes=slopes(h)), plain_shape),
        ("sinks", False, dict(sinks=torch.randn(h, generator=g)), plain_shape),
        ("documents", True, dict(cu_seqlens_q=[0, 9, 9, 10, 30], cu_seqlens_k=[0, 12, 13, 13, 34],
                                 max_seqlen_q=20, max_seqlen_k=21), (1, h, 2, 32, 34, d)),
        ("all", True, dict(window=(5, None), softcap=2.0, alibi_slopes=slopes(h), sinks=torch.randn(h, generator=g),
                           cu_seqlens_q=[0, 17, 18, 36], cu_seqlens_k=[0, 20, 21, 36]), (1, h, 2, 36, 36, d)),
    ]


def check_case(device, dtype, name, causal, mods, shape):
    b, h, hkv, nq, nk, d = shape
    g = torch.Generator().manual_seed(7)
    q, do = (torch.randn(b, h, nq, d, generator=g) for _ in range(2))
    k, v = (torch.randn(b, hkv, nk, d, generator=g) for _ in range(2))
    scale = 0.9 / math.sqrt(d)
    op_mods = dict(mods)
    for key in ("cu_seqlens_q", "cu_seqlens_k"):
        if key in op_mods:
            op_mods[key] = torch.tensor(op_mods[key], dtype=torch.int32, device=device)
    ref_mods = {key: value for key, value in mods.items() if not key.startswith("max_seqlen") and key != "sinks"}
    sinks = mods.get("sinks")
    if sinks is not None:
        op_mods["sinks"] = sinks.to(device).requires_grad_()
    qq, kk, vv = (t.to(device, dtype).requires_grad_() for t in (q, k, v))
    o, lse = attention_with_lse(qq, kk, vv, causal=causal, scale=scale, **op_mods)
    inputs = [t.to(device, dtype) for t in (q, k, v)]
    exact, exact_lse, leaves64 = reference(*inputs, sinks, causal, scale, torch.float64, **ref_mods)
    base, _, leaves = reference(*inputs, sinks, causal, scale, torch.float32 if dtype == torch.float32 else dtype,
                                **ref_mods)
    what = f"{device} {dtype} {name} {shape}"
    same_precision_ok(o, base, exact, f"{what}: O")
    finite = torch.isfinite(exact_lse)
    assert torch.equal(torch.isfinite(lse), finite) and \
        (lse.double() - exact_lse)[finite].abs().max().item() < (1e-4 if dtype == torch.float32 else 2e-2), \
        f"{what}: L differs"
    do = do.to(device, dtype)
    o.backward(do)
    exact.backward(do.double())
    base.backward(do.to(base.dtype))
    ours = [qq, kk, vv] + ([op_mods["sinks"]] if sinks is not None else [])
    for grad_name, a, bl, e in zip(("dQ", "dK", "dV", "dsinks"), ours, leaves, leaves64):
        same_precision_ok(a.grad, bl.grad, e.grad, f"{what}: {grad_name}")


def test_cpu():
    for name, causal, mods, shape in cases(4, 16, (2, 4, 2, 19, 23, 16)):
        check_case("cpu", torch.float32, name, causal, mods, shape)


def test_gpu():
    _skip_unless_hopper()
    for dtype in (torch.bfloat16, torch.float16):
        for d in (64, 128):
            for name, causal, mods, shape in cases(4, d, (2, 4, 2, 77, 93, d)):
                check_case("cuda", dtype, name, causal, mods, shape)


def test_gradcheck_cpu():
    """gradcheck in q, k, v and sinks, under documents, a window, soft-cap and ALiBi. The CPU
    step takes fp32, so the step and tolerances are those of test_torch_ops.py's gradcheck."""
    g = torch.Generator().manual_seed(11)
    q, k, v = (torch.randn(1, 2, 9, 8, generator=g, requires_grad=True) for _ in range(3))
    sinks = torch.randn(2, generator=g, requires_grad=True)
    cu = torch.tensor([0, 4, 9], dtype=torch.int32)

    def f(q, k, v, sinks):
        return attention(q, k, v, causal=True, window=(2, None), softcap=3.0, alibi_slopes=slopes(2), sinks=sinks,
                         cu_seqlens_q=cu, cu_seqlens_k=cu)

    with warnings.catch_warnings():  # "not double precision": known, hence the tolerances
        warnings.simplefilter("ignore", UserWarning)
        assert torch.autograd.gradcheck(f, (q, k, v, sinks), eps=3e-3, atol=1e-3, rtol=1e-3, nondet_tol=0.0)
    print("ok   gradcheck in q, k, v, sinks (stage 13's CPU step, fp32)")


def test_opcheck_cpu():
    """The registrations (schema, autograd, Meta, AOT dispatch) of masked_forward and masked_backward."""
    g = torch.Generator().manual_seed(5)
    q, k, v = (torch.randn(1, 2, 13, 16, generator=g, requires_grad=True) for _ in range(3))
    sinks = torch.randn(2, generator=g, requires_grad=True)
    cu = torch.tensor([0, 6, 13], dtype=torch.int32)
    args = (q, k, v, True, 0.0, 3, None, 2.0, slopes(2), sinks, cu, cu, None, None)
    torch.library.opcheck(torch.ops.fa_attention.masked_forward.default, args)
    o, lse = torch.ops.fa_attention.masked_forward(*(a.detach() if isinstance(a, torch.Tensor) else a for a in args))
    torch.library.opcheck(torch.ops.fa_attention.masked_backward.default,
                          (q.detach(), k.detach(), v.detach(), o, lse, torch.randn_like(o), True, 0.0, 3, None, 2.0,
                           slopes(2), sinks.detach(), cu, cu))
    print("ok   opcheck of masked_forward and masked_backward on CPU")


def test_compile_cpu():
    """torch.compile(fullgraph=True) around the op with documents: equal to eager."""
    g = torch.Generator().manual_seed(13)
    q = torch.randn(1, 2, 20, 16, generator=g, requires_grad=True)
    cu = torch.tensor([0, 7, 20], dtype=torch.int32)

    def f(q):
        return (attention(q * 2, q, q, causal=True, window=(4, 0), cu_seqlens_q=cu, cu_seqlens_k=cu) + 1).sum()

    eager = f(q)
    eager.backward()
    grad = q.grad.clone()
    q.grad = None
    compiled = torch.compile(f, fullgraph=True)(q)
    compiled.backward()
    assert torch.allclose(eager, compiled, rtol=1e-5) and torch.allclose(grad, q.grad, rtol=1e-4, atol=1e-5)
    print("ok   torch.compile(fullgraph=True) on CPU with documents")


def test_refusals_cpu():
    x = torch.zeros(1, 2, 8, 16)
    cu = torch.tensor([0, 4, 8], dtype=torch.int32)
    refusals = [
        (dict(cu_seqlens_q=torch.tensor([1, 8]), cu_seqlens_k=torch.tensor([0, 8])), "cu_seqlens_q starts at 1"),
        (dict(cu_seqlens_q=torch.tensor([0, 5, 3]), cu_seqlens_k=cu), "cu_seqlens_q decreases at entry 2"),
        (dict(cu_seqlens_q=cu, cu_seqlens_k=torch.tensor([0, 4, 9])), "cu_seqlens_k ends at 9, past the tensor"),
        (dict(cu_seqlens_q=cu), "cu_seqlens_q is given without cu_seqlens_k"),
        (dict(cu_seqlens_q=cu, cu_seqlens_k=torch.tensor([0, 8])), "cu_seqlens_q has 3 entries and cu_seqlens_k 2"),
        (dict(cu_seqlens_q=cu.float(), cu_seqlens_k=cu), "torch.int32 or torch.int64"),
        (dict(cu_seqlens_q=cu, cu_seqlens_k=cu, max_seqlen_q=3), "max_seqlen_q = 3 is less than the longest document (4)"),
        (dict(max_seqlen_k=7), "max_seqlen_k = 7 is less than the longest sequence (8)"),
        (dict(window=(-1, 0)), "window_left = -1"),
        (dict(window=(None, -2)), "window_right = -2"),
        (dict(window=4), "window = 4 is not allowed"),
        (dict(softcap=-1.0), "softcap = -1"),
        (dict(alibi_slopes=torch.ones(3)), "alibi_slopes has 3 entries"),
        (dict(alibi_slopes=torch.ones(1, 2)), "alibi_slopes must be 1-D"),
        (dict(sinks=torch.zeros(5)), "sinks has 5 entries"),
        (dict(sinks=torch.zeros(2, dtype=torch.int32)), "sinks must be a floating tensor"),
    ]
    for mods, says in refusals:
        refused(lambda: attention(x, x, x, causal=True, **mods), says, f"modifiers {sorted(mods)} ({says})")
    xb = torch.zeros(2, 2, 8, 16)
    refused(lambda: attention(xb, xb, xb, cu_seqlens_q=cu, cu_seqlens_k=cu), "batch = 2 with cu_seqlens",
             "documents with batch 2")
    refused(lambda: attention(x, x, x, stage="06", window=(1, 1)), "stage '06' takes no modifiers",
             "modifiers on another stage")
    refused(lambda: attention(x.double(), x.double(), x.double(), window=(1, 1)), "float64", "CPU float64")


def test_refusals_gpu():
    _skip_unless_hopper()
    x = torch.zeros(1, 2, 8, 64, device="cuda", dtype=torch.bfloat16)
    refused(lambda: attention(x.float(), x.float(), x.float(), window=(1, 1)), "float32", "CUDA float32")
    refused(lambda: attention(x, x, x, sinks=torch.zeros(2)), "sinks is on cpu", "sinks on the CPU")
    bad = torch.tensor([0, 9], dtype=torch.int32, device="cuda")
    refused(lambda: attention(x, x, x, cu_seqlens_q=bad, cu_seqlens_k=bad), "ends at 9, past the tensor",
             "a device cu_seqlens past the tensor")
    y = torch.zeros(1, 2, 8, 32, device="cuda", dtype=torch.bfloat16)
    refused(lambda: attention(y, y, y, window=(1, 1)), "head_dim = 32", "head_dim 32")


def main():
    return run_tests(globals(), torch is not None, "skipped: torch is not installed")


if __name__ == "__main__":
    sys.exit(main())
