"""Stage 14's PyTorch ops, fa_attention.decode and fa_attention.append_kv (the native ops
torch.ops.fa_attention.decode / append_kv, python/csrc/fa_torch_decode.cpp).

CPU (float32, stage 14's CPU step): decode against a float64 reference computed here from the
formula (new token i of sequence b sees keys j <= len_b - q_len + i), on a contiguous and a
paged cache (a shuffled block table), mixed lengths including 0 and lengths below q_len,
q_len 1 and 4, GQA and not, causal and not; append_kv writes exactly the new rows and nothing
else and bumps the caches' version counters; torch.library.opcheck of both ops; torch.compile(fullgraph=True) of append + decode; every
refusal, with nothing written. GPU (skipped without CUDA): the same problems in bfloat16 and
float16 against the CPU path on the same rounded inputs, append_kv bit for bit, opcheck,
torch.compile, a CUDA graph that captures append_kv + decode and replays them with new tokens,
and the GPU's refusals (float32, a table or lengths on the CPU).

Runs as a script (exit 77 = skipped when torch is not installed), with the op's other test
files in one process (CTest python_torch: tests/torch_checks.py) or under pytest. On a GPU machine, after building the gpu preset:
FA_LIB=build-gpu/stages/libfa_c.so python3 tests/test_torch_decode.py
"""
import math
import pathlib
import sys

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
    from fa_attention import torch_ops  # noqa: F401  (loads the native op: torch.ops.fa_attention)

    HAS_GPU = torch.cuda.is_available()


def _skip_gpu():
    if not HAS_GPU:
        skip("no CUDA device")


# ---- problems and the reference ----

def make_problem(lens, heads, kv_heads, q_len, d, block_size=None, capacity=None, seed=0):
    """Random q, caches (filled everywhere, past every length too) and the new tokens' K/V, fp32
    on the CPU. Contiguous (block_size None): caches [b, hkv, capacity, d]. Paged: a pool of
    more blocks than the sequences need, each sequence's blocks shuffled over it, table
    entries past a sequence's blocks -1 (never read)."""
    g = torch.Generator().manual_seed(seed)
    b = len(lens)
    lens_t = torch.tensor(lens, dtype=torch.int32)
    q = torch.randn(b, heads, q_len, d, generator=g)
    k_new = torch.randn(b, kv_heads, q_len, d, generator=g)
    v_new = torch.randn(b, kv_heads, q_len, d, generator=g)
    if block_size is None:
        capacity = capacity or max(max(lens), 1)
        k = torch.randn(b, kv_heads, capacity, d, generator=g)
        v = torch.randn(b, kv_heads, capacity, d, generator=g)
        return dict(q=q, k=k, v=v, lens=lens_t, table=None, k_new=k_new, v_new=v_new)
    per_seq = max(1, max(math.ceil(n / block_size) for n in lens))
    num_blocks = b * per_seq + 3
    order = torch.randperm(num_blocks, generator=g)
    table = torch.full((b, per_seq), -1, dtype=torch.int32)
    used = 0
    for s, n in enumerate(lens):
        for j in range(math.ceil(n / block_size)):
            table[s, j] = order[used]
            used += 1
    k = torch.randn(num_blocks, kv_heads, block_size, d, generator=g)
    v = torch.randn(num_blocks, kv_heads, block_size, d, generator=g)
    return dict(q=q, k=k, v=v, lens=lens_t, table=table, k_new=k_new, v_new=v_new)


def gather(cache, table, s, n):
    """Sequence s's first n tokens out of a cache: [hkv, n, d]."""
    if table is None:
        return cache[s, :, :n]
    bs = cache.shape[2]
    rows = [cache[int(table[s, j // bs]), :, j % bs] for j in range(n)]
    return torch.stack(rows, dim=1) if rows else cache.new_zeros(cache.shape[1], 0, cache.shape[3])


def reference(q, k, v, lens, table, causal=True, scale=None):
    """O and L in float64 from the formula: row i of sequence s, head h, reads kv head
    h // (h_q / h_kv) and keys j < len_s - q_len + i + 1 (causal) or j < len_s; a row with no
    key has O = 0 and L = -inf."""
    b, h, q_len, d = q.shape
    group = h // k.shape[1]
    scale = 1 / math.sqrt(d) if scale is None else scale
    o = torch.zeros(q.shape, dtype=torch.float64)
    lse = torch.full((b, h, q_len), -math.inf, dtype=torch.float64)
    for s in range(b):
        n = int(lens[s])
        ks, vs = gather(k, table, s, n).double(), gather(v, table, s, n).double()
        for hh in range(h):
            for i in range(q_len):
                seen = max(0, n - q_len + i + 1) if causal else n
                if seen == 0:
                    continue
                scores = scale * (ks[hh // group, :seen] @ q[s, hh, i].double())
                lse[s, hh, i] = torch.logsumexp(scores, 0)
                o[s, hh, i] = torch.softmax(scores, 0) @ vs[hh // group, :seen]
    return o, lse


def check_close(got, want, atol, what):
    err = (got.double() - want).abs().max().item() if got.numel() else 0.0
    assert err <= atol, f"{what}: max error {err:.3g} > {atol:.3g}"
    return err


def check_lse(got, want, atol, what):
    finite = torch.isfinite(want)
    assert torch.equal(torch.isfinite(got.cpu()), finite), f"{what}: L is finite where the reference's is not"
    assert (got.cpu()[~finite] == -math.inf).all(), f"{what}: a row with no key has L != -inf"
    check_close(got.cpu()[finite], want[finite], atol, f"{what} L")


# The CPU grid: mixed lengths (0, below q_len, 1, 2^k +- 1), q_len 1 and 4, GQA and not.
CASES = [
    dict(lens=[0, 1, 17, 64, 33], heads=8, kv_heads=2, q_len=1, d=32),
    dict(lens=[3, 0, 63, 2, 40], heads=8, kv_heads=2, q_len=4, d=32),
    dict(lens=[65, 9], heads=4, kv_heads=4, q_len=4, d=24),
    dict(lens=[1, 129, 31], heads=6, kv_heads=1, q_len=1, d=16),
]


def test_decode_cpu():
    for case in CASES:
        for block_size in (None, 16):
            for causal in (True, False):
                t = make_problem(**case, block_size=block_size, seed=len(case["lens"]))
                o, lse = fa.decode_with_lse(t["q"], t["k"], t["v"], t["lens"], t["table"], causal=causal)
                want_o, want_l = reference(t["q"], t["k"], t["v"], t["lens"], t["table"], causal)
                what = f"cpu {'paged' if block_size else 'contiguous'} causal={causal} {case}"
                check_close(o, want_o, 2e-5, what + " O")
                check_lse(lse, want_l, 2e-5, what)
    # A scale other than 1/sqrt(d).
    t = make_problem(**CASES[1], seed=1)
    o = fa.decode(t["q"], t["k"], t["v"], t["lens"], scale=0.3)
    check_close(o, reference(t["q"], t["k"], t["v"], t["lens"], None, True, 0.3)[0], 2e-5, "cpu scale=0.3")
    print("ok   decode on the CPU against the float64 reference (contiguous, paged, causal or not)")


def appended(t, lens):
    """What append_kv must leave: the caches with the new rows written at len - q_len + i."""
    k, v = t["k"].clone(), t["v"].clone()
    q_len = t["k_new"].shape[2]
    bs = k.shape[2]
    for s, n in enumerate(lens.tolist()):
        for i in range(q_len):
            j = n - q_len + i
            if t["table"] is None:
                k[s, :, j], v[s, :, j] = t["k_new"][s, :, i], t["v_new"][s, :, i]
            else:
                blk = int(t["table"][s, j // bs])
                k[blk, :, j % bs], v[blk, :, j % bs] = t["k_new"][s, :, i], t["v_new"][s, :, i]
    return k, v


def test_append_kv_cpu():
    for block_size in (None, 16):
        for q_len, lens in ((1, [1, 17, 64]), (4, [4, 33, 5])):
            t = make_problem(lens, 4, 2, q_len, 32, block_size=block_size, capacity=64, seed=q_len)
            want_k, want_v = appended(t, t["lens"])
            k, v = t["k"].clone(), t["v"].clone()
            versions = k._version, v._version
            assert fa.append_kv(t["k_new"], t["v_new"], k, v, t["lens"], t["table"]) is None
            assert (k._version, v._version) == (versions[0] + 1, versions[1] + 1), \
                "append_kv did not bump the caches' version counters (autograd would miss the write)"
            layout = "paged" if block_size else "contiguous"
            assert torch.equal(k, want_k) and torch.equal(v, want_v), \
                f"append_kv ({layout}, q_len {q_len}) wrote other rows than the new ones"
            changed = int((k != t["k"]).any(-1).sum())
            assert changed == len(lens) * 2 * q_len, f"append_kv changed {changed} rows of K"
            # Then decode sees the new tokens: equal to the reference on the written caches.
            o = fa.decode(t["q"], k, v, t["lens"], t["table"])
            check_close(o, reference(t["q"], want_k, want_v, t["lens"], t["table"])[0], 2e-5, "decode after append")
    print("ok   append_kv on the CPU writes exactly the new rows (contiguous and paged)")


def opcheck_args(t):
    return ((t["q"], t["k"], t["v"], t["lens"], t["table"], True, 0.0),
            (t["k_new"], t["v_new"], t["k"].clone(), t["v"].clone(), t["lens"], t["table"]))


def test_opcheck_cpu():
    """Schema (append_kv mutates exactly k_cache and v_cache), Meta kernels, AOT dispatch with
    dynamic shapes, for both ops and both cache layouts."""
    for block_size in (None, 16):
        t = make_problem([5, 20, 1], 4, 2, 1, 16, block_size=block_size, capacity=24)
        dec, app = opcheck_args(t)
        torch.library.opcheck(torch.ops.fa_attention.decode.default, dec)
        torch.library.opcheck(torch.ops.fa_attention.append_kv.default, app)
    print("ok   opcheck on CPU (decode and append_kv, contiguous and paged)")


def compiled_step(t, device):
    """torch.compile(fullgraph=True) of append + decode equals eager (and both write the caches)."""
    def step(q, k_new, v_new, k, v, lens, table):
        fa.append_kv(k_new, v_new, k, v, lens, table)
        return fa.decode(q * 2, k, v, lens, table) + 1

    args = [t[n] for n in ("q", "k_new", "v_new")]
    k1, v1, k2, v2 = t["k"].clone(), t["v"].clone(), t["k"].clone(), t["v"].clone()
    eager = step(*args, k1, v1, t["lens"], t["table"])
    compiled = torch.compile(step, fullgraph=True)(*args, k2, v2, t["lens"], t["table"])
    assert torch.equal(k1, k2) and torch.equal(v1, v2), f"{device}: compiled append_kv wrote other caches than eager"
    assert torch.allclose(eager.float(), compiled.float(), rtol=1e-5, atol=1e-5), \
        f"{device}: compiled decode differs from eager"


def test_compile_cpu():
    compiled_step(make_problem([5, 20], 4, 2, 2, 16, block_size=16), "cpu")
    print("ok   torch.compile(fullgraph=True) of append_kv + decode on CPU equals eager")


def refusals(device, dtype):
    t = make_problem([5, 20], 4, 2, 1, 64, block_size=16)
    q, k, v, lens, table, kn, vn = (None if x is None else x.to(device, dtype if x.is_floating_point() else x.dtype)
                                    for x in (t[n] for n in ("q", "k", "v", "lens", "table", "k_new", "v_new")))
    c = make_problem([5, 20], 4, 2, 1, 64, capacity=32)
    cq, ck, cv, clens = (x.to(device, dtype if x.is_floating_point() else x.dtype)
                         for x in (c[n] for n in ("q", "k", "v", "lens")))
    dec = fa.decode
    refused(lambda: dec(q[0], k, v, lens, table), "4 dimensions", "q of rank 3")
    refused(lambda: dec(q, k, v[:, :1], lens, table), "same shape", "k_cache and v_cache of different shapes")
    refused(lambda: dec(q[..., :32], k, v, lens, table), "head_dim", "q of another head dim")
    refused(lambda: dec(q, k, v.half() if dtype != torch.float16 else v.float(), lens, table), "different dtypes",
             "mixed dtypes")
    refused(lambda: dec(q, k, v, lens.long(), table), "torch.int32", "int64 cache_seqlens")
    refused(lambda: dec(q, k, v, lens[:1], table), "one length per sequence", "one length for two sequences")
    refused(lambda: dec(q, k, v, lens, table.long()), "block_table must be torch.int32", "int64 block table")
    refused(lambda: dec(q, k, v, lens), "contiguous k_cache", "a pool without a block table")
    refused(lambda: dec(cq[:1], ck, cv, clens[:1]), "[1, kv_heads, capacity", "a contiguous cache of another batch")
    refused(lambda: dec(q[:, :3], k, v, lens, table), "heads = 3", "heads 3 over kv_heads 2")
    big = torch.zeros(2, 4, 17, 64, device=device, dtype=dtype)
    refused(lambda: dec(big, k, v, torch.tensor([20, 20], dtype=torch.int32, device=device), table), "q_len = 17",
             "q_len 17")
    kk = k.transpose(2, 3).contiguous().transpose(2, 3)
    refused(lambda: dec(q, kk, v, lens, table), "contiguous", "a strided cache")
    refused(lambda: dec(q, k, v, lens, table.to("meta")), "block_table is on meta", "a block table on another device")
    refused(lambda: dec(q, k, v, lens.to("meta"), table), "cache_seqlens is on meta", "lengths on another device")
    # Appends that are refused write nothing.
    k0, v0, ck0, cv0 = k.clone(), v.clone(), ck.clone(), cv.clone()
    keep = ((k, k0), (v, v0), (ck, ck0), (cv, cv0))
    app = fa.append_kv
    refused(lambda: app(kn, vn[:, :1], k, v, lens, table), "must match k_new", "v_new of another shape", keep)
    refused(lambda: app(kn[:, :1], vn[:, :1], k, v, lens, table), "kv_heads", "k_new of other kv_heads", keep)
    refused(lambda: app(kn, vn, k, v, lens.long(), table), "torch.int32", "append with int64 lengths", keep)
    refused(lambda: app(kn, vn, k, v, lens, table.to("meta")), "block_table is on meta",
             "append with a block table on another device", keep)
    return dict(q=q, k=k, v=v, lens=lens, table=table, kn=kn, vn=vn, keep=keep, c=(cq, ck, cv, clens))


def test_refusals_cpu():
    r = refusals("cpu", torch.float32)
    q, k, v, lens, table, kn, vn, keep = (r[n] for n in ("q", "k", "v", "lens", "table", "kn", "vn", "keep"))
    cq, ck, cv, clens = r["c"]
    # What stage 14 itself refuses (on the host: the CPU path reads lengths and table).
    refused(lambda: fa.decode(q.double(), k.double(), v.double(), lens, table), "float64", "CPU float64")
    refused(lambda: fa.decode(cq, ck, cv, torch.tensor([5, 33], dtype=torch.int32)), "cache_seqlens[1] = 33",
             "a length past the capacity")
    bad = table.clone()
    bad[1, 1] = 1000
    refused(lambda: fa.decode(q, k, v, lens, bad), "block_table[1][1] = 1000", "a block table entry out of the pool")
    refused(lambda: fa.append_kv(kn, vn, k, v, lens, bad), "block_table[1][1] = 1000",
             "append with a block table entry out of the pool", keep)
    refused(lambda: fa.append_kv(kn, vn, k, v, torch.tensor([5, 0], dtype=torch.int32), table),
             "cache_seqlens[1] = 0", "append to a sequence whose length does not count the new token", keep)
    refused(lambda: fa.append_kv(kn, vn, ck, cv, torch.tensor([5, 40], dtype=torch.int32)),
             "cache_seqlens[1] = 40", "append past the capacity", keep)
    pool8 = torch.zeros(20, 2, 8, 64)
    refused(lambda: fa.decode(q, pool8, pool8, lens, torch.zeros(2, 3, dtype=torch.int32)), "block_size = 8",
             "block size 8")


# ---- GPU: the same against the CPU path ----

GPU_CASES = [
    dict(lens=[0, 1, 17, 300, 1025], heads=8, kv_heads=2, q_len=1, d=128),
    dict(lens=[3, 0, 511, 2, 64], heads=8, kv_heads=2, q_len=4, d=64),
    dict(lens=[4000, 9], heads=32, kv_heads=8, q_len=4, d=128),
    dict(lens=[129, 31, 700], heads=4, kv_heads=4, q_len=1, d=64),
]


def test_decode_gpu():
    """bfloat16 and float16 on the GPU against the CPU path on the same rounded inputs. The
    GPU rounds P to the dtype for P·V (each p_j off by at most u·p_j, u the unit roundoff:
    2^-9 bf16, 2^-11 f16) and O once at the end (u·|O|), so |O - O_cpu| <= u·(|O| + max|V|);
    the test allows twice that."""
    _skip_gpu()
    for dtype, u in ((torch.bfloat16, 2 ** -9), (torch.float16, 2 ** -11)):
        for case in GPU_CASES:
            for block_size in (None, 16, 256):
                t = make_problem(**case, block_size=block_size, seed=7)
                q, k, v = (t[n].to(dtype) for n in ("q", "k", "v"))  # rounded once, both paths read these
                want_o, want_l = fa.decode_with_lse(q.float(), k.float(), v.float(), t["lens"], t["table"])
                table = None if t["table"] is None else t["table"].cuda()
                o, lse = fa.decode_with_lse(q.cuda(), k.cuda(), v.cuda(), t["lens"].cuda(), table)
                what = f"gpu {dtype} {'paged ' + str(block_size) if block_size else 'contiguous'} {case}"
                bound = 2 * u * (want_o.abs().double() + v.float().abs().max().item())
                err = (o.cpu().double() - want_o.double()).abs()
                assert (err <= bound).all(), \
                    f"{what}: O off by {err.max().item():.3g} (bound {bound.min().item():.3g} or more)"
                check_lse(lse, torch.where(torch.isfinite(want_l), want_l, -math.inf).double(), 1e-3, what)
    print("ok   decode on the GPU (bf16, f16; contiguous, paged 16 and 256) against the CPU path")


def test_append_kv_gpu():
    """The GPU append writes what the CPU append writes, bit for bit (the new rows are copied)."""
    _skip_gpu()
    for block_size in (None, 16):
        t = make_problem([1, 17, 64], 8, 2, 4, 128, block_size=block_size, capacity=64, seed=3)
        t["lens"] = torch.tensor([4, 17, 64], dtype=torch.int32)
        k, v, kn, vn = (t[n].to(torch.bfloat16) for n in ("k", "v", "k_new", "v_new"))
        k_cpu, v_cpu = k.float(), v.float()
        fa.append_kv(kn.float(), vn.float(), k_cpu, v_cpu, t["lens"], t["table"])
        k_gpu, v_gpu = k.cuda(), v.cuda()
        table = None if t["table"] is None else t["table"].cuda()
        fa.append_kv(kn.cuda(), vn.cuda(), k_gpu, v_gpu, t["lens"].cuda(), table)
        assert torch.equal(k_gpu.cpu().float(), k_cpu) and torch.equal(v_gpu.cpu().float(), v_cpu), \
            f"GPU append_kv ({'paged' if block_size else 'contiguous'}) differs from the CPU's"
    print("ok   append_kv on the GPU equals the CPU's, bit for bit")


def test_opcheck_compile_gpu():
    _skip_gpu()
    for block_size in (None, 16):
        t = make_problem([5, 200, 1], 8, 2, 2, 64, block_size=block_size, capacity=256)
        g = {n: (None if x is None else x.cuda().to(torch.bfloat16) if x.is_floating_point() else x.cuda())
             for n, x in t.items()}
        dec, app = opcheck_args(g)
        torch.library.opcheck(torch.ops.fa_attention.decode.default, dec)
        torch.library.opcheck(torch.ops.fa_attention.append_kv.default, app)
        compiled_step(g, "cuda")
    print("ok   opcheck and torch.compile(fullgraph=True) on CUDA (decode and append_kv)")


def test_cuda_graph():
    """append_kv + decode captured in one CUDA graph (lengths and table on the GPU, nothing
    read back), replayed token after token with the lengths advanced on the GPU: the same
    caches and outputs as eager calls."""
    _skip_gpu()
    for block_size in (None, 64):
        t = make_problem([10, 100, 1], 8, 2, 1, 128, block_size=block_size, capacity=256, seed=5)
        if block_size:  # room for the tokens the replays append: every sequence gets 4 blocks
            pool = torch.randperm(3 * 4, generator=torch.Generator().manual_seed(1)).int().view(3, 4)
            t["table"] = pool
            t["k"] = torch.randn(12, 2, 64, 128)
            t["v"] = torch.randn(12, 2, 64, 128)
        cuda = {n: (None if x is None else x.cuda().to(torch.bfloat16) if x.is_floating_point() else x.cuda())
                for n, x in t.items()}
        q, kn, vn, lens, table = (cuda[n] for n in ("q", "k_new", "v_new", "lens", "table"))
        k, v = cuda["k"].clone(), cuda["v"].clone()
        k_eager, v_eager = cuda["k"].clone(), cuda["v"].clone()
        lens_eager = lens.clone()

        def step(k, v, lens):
            fa.append_kv(kn, vn, k, v, lens, table)
            return fa.decode(q, k, v, lens, table)

        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):  # warm-up outside the capture, on scratch copies
            step(k.clone(), v.clone(), lens)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = step(k, v, lens)
        g = torch.Generator(device="cuda").manual_seed(2)
        for _ in range(3):
            lens += 1  # the next token of every sequence, written on the GPU
            lens_eager += 1
            for x in (q, kn, vn):
                x.copy_(torch.randn(x.shape, generator=g, device="cuda"))
            graph.replay()
            want = step(k_eager, v_eager, lens_eager)
            torch.cuda.synchronize()
            assert torch.equal(k, k_eager) and torch.equal(v, v_eager), "replayed append_kv differs from eager"
            assert torch.equal(out, want), "replayed decode differs from eager"
    print("ok   CUDA graph of append_kv + decode (contiguous and paged), replayed token by token")


def test_refusals_gpu():
    _skip_gpu()
    r = refusals("cuda", torch.bfloat16)
    q, k, v, lens, table, kn, vn, keep = (r[n] for n in ("q", "k", "v", "lens", "table", "kn", "vn", "keep"))
    refused(lambda: fa.decode(q.float(), k.float(), v.float(), lens, table), "float32", "CUDA float32")
    refused(lambda: fa.decode(q, k, v, lens, table.cpu()), "block_table is on cpu", "a host block table")
    refused(lambda: fa.decode(q, k, v, lens.cpu(), table), "cache_seqlens is on cpu", "host lengths")
    refused(lambda: fa.append_kv(kn, vn, k, v, lens, table.cpu()), "block_table is on cpu",
             "append with a host block table", keep)
    refused(lambda: fa.decode(q[..., :48], k[..., :48].contiguous(), v[..., :48].contiguous(), lens, table),
             "head_dim = 48", "head dim 48 on the GPU")


def main():
    return run_tests(globals(), torch is not None, "skipped: torch is not installed")


if __name__ == "__main__":
    sys.exit(main())
