"""The PyTorch API (the native op, python/csrc/fa_torch.cpp, through
python/fa_attention/torch_ops.py) against torch's scaled_dot_product_attention.

Forward and gradients on odd shapes (GQA, Nq != Nk, causal bottom-right), held to the rule of
the FlashAttention tests: the error against a float64 reference is at most twice the error of
torch's attention computed in the inputs' own dtype (plus a few ulps of the largest value).
Also torch.library.opcheck, torch.autograd.gradcheck, torch.compile(fullgraph=True) (on the CPU
and the GPU), strided inputs, a side stream, a CUDA graph that captures forward and backward
and replays them on new inputs, and every refusal.

Runs as a script (exit 77 = skipped when torch is not installed), with the op's other test
files in one process (CTest python_torch: tests/torch_checks.py) or under pytest (skipped
likewise). Without a CUDA device the CPU cases run and the GPU cases are
reported skipped. On a GPU machine, after building the gpu preset:
FA_LIB=build-gpu/stages/libfa_c.so python3 tests/test_torch_ops.py
"""
import math
import pathlib
import sys
import warnings

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent / "python"))
from torch_checks import refused, run_tests, skip  # noqa: E402 (tests/, beside this file)
import fa_attention as fa  # noqa: E402

try:
    import torch
except ImportError:
    torch = None

if torch is None and "pytest" in sys.modules:
    import pytest
    pytest.skip("torch is not installed", allow_module_level=True)

if torch is not None:
    import torch.nn.functional as F

    from fa_attention.torch_ops import attention, attention_with_lse

    HAS_GPU = torch.cuda.is_available()


def _skip_gpu():
    if not HAS_GPU:
        skip("no CUDA device")


def reference(q, k, v, causal, scale, dtype):
    """torch's attention in `dtype` on the inputs (bottom-right causal, GQA by repeating kv
    heads); returns O and the leaves, whose .grad the caller fills."""
    q, k, v = (t.detach().to(dtype).requires_grad_() for t in (q, k, v))
    groups = q.shape[1] // k.shape[1]
    kk, vv = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
    mask = None
    if causal:
        nq, nk = q.shape[2], k.shape[2]
        mask = torch.arange(nk, device=q.device)[None, :] <= torch.arange(nq, device=q.device)[:, None] + nk - nq
    o = F.scaled_dot_product_attention(q, kk, vv, attn_mask=mask, scale=scale)
    return o, (q, k, v)


def same_precision_ok(ours, base, exact, what):
    """|ours − exact| <= 2 |base − exact| + 4 ulp(max|exact|) in ours' dtype."""
    err = (ours.double() - exact).abs().max().item()
    base_err = (base.double() - exact).abs().max().item()
    floor = 4 * torch.finfo(ours.dtype).eps * max(1.0, exact.abs().max().item())
    ok = err <= 2 * base_err + floor
    print(f"{'ok  ' if ok else 'FAIL'} {what}: err {err:.2e}, same-precision torch {base_err:.2e}")
    assert ok, f"{what}: err {err:.2e} > 2 x {base_err:.2e} + {floor:.1e}"


def check_stage(stage, device, dtype, causal, shape=(2, 4, 2, 77, 93, 64)):
    b, h, hkv, nq, nk, d = shape
    g = torch.Generator(device="cpu").manual_seed(7)
    q = torch.randn(b, h, nq, d, generator=g).to(device, dtype)
    k = torch.randn(b, hkv, nk, d, generator=g).to(device, dtype)
    v = torch.randn(b, hkv, nk, d, generator=g).to(device, dtype)
    do = torch.randn(b, h, nq, d, generator=g).to(device, dtype)
    scale = 0.9 / math.sqrt(d)
    qq, kk, vv = (t.clone().requires_grad_() for t in (q, k, v))
    o = attention(qq, kk, vv, causal=causal, scale=scale, stage=stage)
    exact, leaves64 = reference(q, k, v, causal, scale, torch.float64)
    base, leaves = reference(q, k, v, causal, scale, dtype)
    what = f"stage {stage} {device} {dtype} causal={causal} {shape}"
    same_precision_ok(o, base, exact, f"{what}: O")
    if not fa.has_backward(stage):
        return
    o.backward(do)
    exact.backward(do.double())
    base.backward(do)
    for name, ours, b_, e in zip(("dQ", "dK", "dV"), (qq, kk, vv), leaves, leaves64):
        same_precision_ok(ours.grad, b_.grad, e.grad, f"{what}: {name}")


def test_cpu_stages():
    for stage in [s for s in fa.stages() if not fa.is_gpu(s)]:
        for causal in (False, True):
            check_stage(stage, "cpu", torch.float32, causal, shape=(1, 4, 2, 19, 23, 32))


def test_gpu_stages():
    _skip_gpu()
    ran = []
    for stage in [s for s in fa.stages() if fa.is_gpu(s)]:
        for dtype in (torch.float32, torch.float16, torch.bfloat16):
            try:
                attention(*(torch.zeros(1, 1, 1, 64, device="cuda", dtype=dtype),) * 3, stage=stage)
            except ValueError as e:  # this stage does not run this dtype (or this GPU)
                print(f"skip stage {stage} {dtype}: {e}")
                continue
            for causal in (False, True):
                check_stage(stage, "cuda", dtype, causal)
            ran.append((stage, dtype))
    assert any(s.startswith("08") for s, _ in ran), f"stage 08 ran in no dtype: {ran}"


def test_lse():
    _skip_gpu()
    q = torch.randn(1, 2, 33, 64, device="cuda", dtype=torch.float16)
    o, lse = attention_with_lse(q, q, q, stage="08")
    exact = torch.logsumexp(q.double() @ q.double().transpose(-1, -2) / 8.0, dim=-1)
    err = (lse.double() - exact).abs().max().item()
    assert lse.dtype == torch.float32 and lse.shape == (1, 2, 33) and err < 2e-2, err


def test_opcheck():
    _skip_gpu()
    q = torch.randn(1, 4, 37, 64, device="cuda", dtype=torch.float16, requires_grad=True)
    k = torch.randn(1, 2, 41, 64, device="cuda", dtype=torch.float16, requires_grad=True)
    v = torch.randn(1, 2, 41, 64, device="cuda", dtype=torch.float16, requires_grad=True)
    torch.library.opcheck(torch.ops.fa_attention.forward.default, (q, k, v, True, 0.0, "09"))
    print("ok   opcheck fa_attention::forward")


def compiled_equals_eager(q, k, stage, out_tol, grad_tol):
    """torch.compile(fullgraph=True) of a small function around the op: its output and the
    gradients of q and k equal eager's within the tolerances (rtol, atol)."""
    def f(q, k):
        return (attention(q * 2, k, k, causal=True, stage=stage) + 1).sum()

    eager = f(q, k)
    eager.backward()
    grads = q.grad.clone(), k.grad.clone()
    q.grad = k.grad = None
    compiled = torch.compile(f, fullgraph=True)(q, k)
    compiled.backward()
    assert torch.allclose(eager, compiled, rtol=out_tol[0], atol=out_tol[1]), \
        f"stage {stage}: torch.compile(fullgraph=True) forward differs from eager"
    assert all(torch.allclose(a, b, rtol=grad_tol[0], atol=grad_tol[1]) for a, b in zip(grads, (q.grad, k.grad))), \
        f"stage {stage}: torch.compile(fullgraph=True) gradients differ from eager"
    print(f"ok   torch.compile(fullgraph=True) on {q.device.type}, stage {stage}: forward and backward equal eager")


def test_compile():
    _skip_gpu()
    q = torch.randn(2, 4, 50, 64, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    k = torch.randn(2, 4, 50, 64, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    # Stage 09 at d = 64 sums dQ with fp32 atomics: equal up to the order of those sums.
    compiled_equals_eager(q, k, "09", out_tol=(1e-2, 0.0), grad_tol=(2e-2, 2e-2))


def test_side_stream():
    _skip_gpu()
    q = torch.randn(2, 8, 512, 64, device="cuda", dtype=torch.float16)
    want = attention(q, q, q)
    torch.cuda.synchronize()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        x = q * 1  # written on the side stream: a kernel on another stream would race it
        got = attention(x, x, x)
    torch.cuda.current_stream().wait_stream(side)
    assert torch.equal(got, want), "attention on a side stream differs"
    print("ok   side stream")


def test_refusals_cpu():
    x = torch.zeros(1, 2, 4, 16)
    refused(lambda: attention(x.double(), x.double(), x.double(), stage="05"), "float64", "CPU float64")
    refused(lambda: attention(x, x.half(), x, stage="05"), "different dtypes", "mixed dtypes")
    refused(lambda: attention(x[0], x[0], x[0], stage="05"), "[batch, heads, seq, head_dim]", "rank 3")
    refused(lambda: attention(x, x[:, :1], x, stage="05"), "kv_heads", "k and v of different shapes")
    refused(lambda: attention(x, x[..., :8], x[..., :8], stage="05"), "kv_heads", "k of another head dim")
    refused(lambda: attention(x[:, :1].expand(1, 3, 4, 16), x, x, stage="05"), "heads = 3",
             "heads=3 over kv_heads=2")
    refused(lambda: attention(x, x, x, stage="99"), "is not a stage", "unknown stage")
    o, lse = torch.ops.fa_attention.forward(x, x, x, False, 0.0, "05")
    refused(lambda: torch.ops.fa_attention.backward(x, x, x, o, lse[..., :2], x, False, 0.0, "06"), "L",
             "backward with L of the wrong shape")
    refused(lambda: torch.ops.fa_attention.backward(x, x, x, o, lse.half(), x, False, 0.0, "06"), "float32",
             "backward with L not float32")


def test_strided_inputs():
    """The usual layout of a model, [b, n, h, d] viewed as [b, h, n, d], gives what the
    contiguous tensors give (the op copies them; nothing reads past a stride)."""
    g = torch.Generator().manual_seed(3)
    devices = ["cpu"] + (["cuda"] if HAS_GPU else [])
    for device in devices:
        stage, dtype = ("06", torch.float32) if device == "cpu" else ("09", torch.float16)
        bnhd = torch.randn(2, 33, 4, 64, generator=g).to(device, dtype)
        q = bnhd.transpose(1, 2)
        assert not q.is_contiguous()
        got = attention(q, q, q, causal=True, stage=stage)
        want = attention(q.contiguous(), q.contiguous(), q.contiguous(), causal=True, stage=stage)
        assert torch.equal(got, want), f"{device}: a transposed input differs from its contiguous copy"
    print("ok   strided inputs")


def test_opcheck_cpu():
    """The op's registrations (schema, autograd, Meta kernels, AOT dispatch with dynamic
    shapes) on CPU tensors, forward and backward."""
    g = torch.Generator().manual_seed(5)
    q = torch.randn(1, 4, 13, 32, generator=g, requires_grad=True)
    k = torch.randn(1, 2, 17, 32, generator=g, requires_grad=True)
    v = torch.randn(1, 2, 17, 32, generator=g, requires_grad=True)
    torch.library.opcheck(torch.ops.fa_attention.forward.default, (q, k, v, True, 0.0, "06"))
    o, lse = torch.ops.fa_attention.forward(q.detach(), k.detach(), v.detach(), True, 0.0, "06")
    torch.library.opcheck(torch.ops.fa_attention.backward.default,
                          (q.detach(), k.detach(), v.detach(), o, lse, torch.randn_like(o), True, 0.0, "06"))
    print("ok   opcheck on CPU (forward and backward)")


def test_gradcheck_cpu():
    """torch.autograd.gradcheck on stage 06. The host stages take fp32, not float64, so the
    central differences use a step of 3e-3 (rounding of the fp32 outputs over 2·eps stays near
    1e-4) against a tolerance of 1e-3 + 1e-3·|J|; dK scaled by 1.01 in the op's backward fails
    it (checked by hand), as does any larger fault."""
    g = torch.Generator().manual_seed(11)
    q, k, v = (torch.randn(1, 2, n, 8, generator=g, requires_grad=True) for n in (5, 7, 7))
    for causal in (False, True):
        with warnings.catch_warnings():  # "not double precision": known, hence the tolerances above
            warnings.simplefilter("ignore", UserWarning)
            ok = torch.autograd.gradcheck(lambda q, k, v: attention(q, k, v, causal=causal, stage="06"), (q, k, v),
                                          eps=3e-3, atol=1e-3, rtol=1e-3, nondet_tol=0.0)
        assert ok
    print("ok   gradcheck (stage 06, fp32)")


def test_compile_cpu():
    """torch.compile(fullgraph=True) over the op on CPU tensors (stage 06: the same sums in the
    same order in both runs)."""
    g = torch.Generator().manual_seed(13)
    q = torch.randn(2, 4, 20, 16, generator=g, requires_grad=True)
    k = torch.randn(2, 2, 24, 16, generator=g, requires_grad=True)
    compiled_equals_eager(q, k, "06", out_tol=(1e-5, 0.0), grad_tol=(1e-4, 1e-5))


def test_cuda_graph():
    """Forward and backward captured in one CUDA graph, replayed on new inputs copied into the
    captured ones: the same O as eager, and gradients equal up to the order of the stage's fp32
    atomic sums."""
    _skip_gpu()
    stage = "11" if torch.cuda.get_device_capability()[0] == 9 else "09"
    g = torch.Generator().manual_seed(17)

    def inputs():
        return [torch.randn(2, 4, 300, 64, generator=g).to("cuda", torch.float16) for _ in range(4)]

    q, k, v, do = (t.requires_grad_(i < 3) for i, t in enumerate(inputs()))
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up outside the capture, as torch's graph docs do
        for _ in range(2):
            attention(q, k, v, causal=True, stage=stage).backward(do)
    torch.cuda.current_stream().wait_stream(side)
    q.grad = k.grad = v.grad = None
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        o = attention(q, k, v, causal=True, stage=stage)
        o.backward(do)
    for _ in range(2):
        new = inputs()
        with torch.no_grad():
            for static, fresh in zip((q, k, v, do), new):
                static.copy_(fresh)
        graph.replay()
        qq, kk, vv = (t.clone().requires_grad_() for t in new[:3])
        want = attention(qq, kk, vv, causal=True, stage=stage)
        want.backward(new[3])
        torch.cuda.synchronize()
        assert torch.equal(o, want), f"stage {stage}: the replayed forward differs from eager"
        for name, a, b in (("dQ", q.grad, qq.grad), ("dK", k.grad, kk.grad), ("dV", v.grad, vv.grad)):
            assert torch.allclose(a, b, rtol=1e-2, atol=1e-2), f"stage {stage}: replayed {name} differs from eager"
    print(f"ok   CUDA graph of stage {stage}'s forward and backward, replayed on new inputs")


def test_other_gpu():
    """Tensors on a GPU other than the current one run there (the op switches device)."""
    _skip_gpu()
    if torch.cuda.device_count() < 2:
        skip("one GPU")
    x = torch.randn(1, 2, 40, 64, device="cuda:1", dtype=torch.float16)
    with torch.cuda.device(0):
        got = attention(x, x, x, stage="09")
    with torch.cuda.device(1):
        want = attention(x, x, x, stage="09")
    assert got.device == x.device and torch.equal(got, want)
    print("ok   tensors on cuda:1 with cuda:0 current")


def test_head_dim_256_gpu():
    """Models with d = 256 heads train through the op on Hopper: stage 11's backward (and
    stage 12's ring, which runs 10 and 11 on its ranks) against torch in float64."""
    _skip_gpu()
    if torch.cuda.get_device_capability()[0] != 9:
        skip("d = 256 has a backward on Hopper only (stages 11 and 12's Hopper set)")
    for stage in ("11", "12_ring_attention_gpu"):
        for causal in (False, True):
            check_stage(stage, "cuda", torch.bfloat16, causal, shape=(1, 4, 2, 130, 200, 256))


def test_refusals_gpu():
    _skip_gpu()
    x = torch.zeros(1, 2, 4, 64, device="cuda", dtype=torch.float16)
    refused(lambda: attention(x.double(), x.double(), x.double()), "float64", "CUDA float64")
    refused(lambda: attention(x, x.bfloat16(), x), "different dtypes", "CUDA mixed dtypes")
    refused(lambda: attention(x[:, :1].expand(1, 3, 4, 64).contiguous(), x, x, stage="09"), "heads = 3",
             "CUDA heads=3 over kv_heads=2")
    xf = x.float()
    refused(lambda: attention(xf, xf, xf, stage="05"), "not a GPU stage", "CUDA tensors on a CPU stage")
    y = torch.zeros(1, 2, 4, 65, device="cuda", dtype=torch.float16)
    refused(lambda: attention(y, y, y), "65", "head_dim 65 on stage 08")
    refused(lambda: attention(x, x.cpu(), x), "different devices", "mixed devices")
    q = x.clone().requires_grad_()
    refused(lambda: attention(q, x, x, stage="08").sum().backward(), "has no GPU backward",
             "gradients through stage 08 (forward only; stage 09 is its forward with a backward)")


def main():
    return run_tests(globals(), torch is not None,
                     "skipped: torch is not installed (the GPU script runs these tests where it is)")


if __name__ == "__main__":
    sys.exit(main())
