"""The C ABI through the numpy API of the fa_attention package (python/), checked against numpy."""
import ctypes
import os
import pathlib
import sys

import numpy as np

root = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(root / "python"))
sys.path.insert(1, str(root / "notebooks"))
import fa_attention as fa  # noqa: E402
import fa as notebooks_fa  # noqa: E402

failures = []


def check(cond, what):
    print(("ok   " if cond else "FAIL ") + what)
    if not cond:
        failures.append(what)


# The notebooks' fa.py is the package's numpy API, the same functions.
check(notebooks_fa.forward is fa.forward and notebooks_fa.library is fa.library
      and set(fa.__all__) <= set(dir(notebooks_fa)), "notebooks/fa.py re-exports fa_attention")

# Where the library is looked for: $FA_LIB alone when set, else the package's folder (an
# installed wheel), then build/ and build-gpu/ of the repository; a missing library is an
# error that names every place looked at.
saved = os.environ.pop("FA_LIB", None)
candidates = fa.library_candidates()
check(candidates[:3] == [root / "python" / "fa_attention" / "libfa_c.so", root / "build" / "stages" / "libfa_c.so",
                         root / "build-gpu" / "stages" / "libfa_c.so"],
      f"library looked for in the package, then build/, build-gpu/: {candidates[:3]}")
os.environ["FA_LIB"] = "/nonexistent/libfa_c.so"
try:
    fa.core._default_path()
    check(False, "a missing library is refused")
except FileNotFoundError as e:
    check("/nonexistent/libfa_c.so" in str(e) and "FA_LIB" in str(e), f"a missing library is refused: {e}")
if saved is None:
    del os.environ["FA_LIB"]
else:
    os.environ["FA_LIB"] = saved

names = fa.stages()
check(names[:5] == ["01_naive", "02_safe_softmax", "03_three_pass", "04_two_pass_online",
                    "05_one_pass_fused"], f"stage list starts with 01..05: {names}")

rng = np.random.default_rng(3)
for causal in (False, True):
    Q = rng.standard_normal((2, 4, 70, 32), dtype=np.float32)
    K = rng.standard_normal((2, 2, 50, 32), dtype=np.float32)
    V = rng.standard_normal((2, 2, 50, 32), dtype=np.float32)
    O_ref, L_ref = fa.attention_numpy(Q, K, V, causal=causal)
    for stage in [n for n in names if not fa.is_gpu(n)]:
        O, L = fa.forward(stage, Q, K, V, causal=causal)
        err_o = np.max(np.abs(O - O_ref))
        finite = np.isfinite(L_ref)
        err_l = np.max(np.abs(L[finite] - L_ref[finite]))
        check(err_o < 1e-5 and err_l < 1e-5 and np.array_equal(np.isfinite(L), finite),
              f"{stage} causal={causal}: |O-O_np|={err_o:.2e} |L-L_np|={err_l:.2e}")

# Errors come back as codes with a message that names the value; nothing crashes.
Q = np.zeros((1, 3, 4, 16), np.float32)
K = np.zeros((1, 2, 4, 16), np.float32)
try:
    fa.forward("05", Q, K, K)
    check(False, "heads=3 over kv_heads=2 refused")
except fa.FaError as e:
    check("heads = 3" in str(e), f"heads=3 over kv_heads=2 refused: {e}")
try:
    fa.forward("99", Q, K, K)
    check(False, "unknown stage refused")
except fa.FaError as e:
    check("is not a stage" in str(e), f"unknown stage refused: {e}")
try:
    fa.forward("05", Q[:, :2], K, K, dtype="bf16")
    check(False, "bf16 on a CPU stage refused")
except fa.FaError as e:
    check("bf16" in str(e), f"bf16 on a CPU stage refused: {e}")
lib = fa.library()
check(lib.fa_stage_name(-1) is None and lib.fa_stage_name(999) is None, "out-of-range stage index gives NULL")
check(lib.fa_stage_is_gpu(b"nope") == -1, "unknown stage: is_gpu = -1")
check(lib.fa_forward(b"05", None, None, None, None, None, None) == 1
      and b"NULL" in lib.fa_last_error(), "NULL problem refused with FA_ERR_INVALID")

# Invalid input is FA_ERR_INVALID (1) from every entry point, with a message naming the
# value; the messages formatted through a stream (scale) must not crash a process that has
# numpy (and so the system libstdc++) loaded.
f32p = ctypes.POINTER(ctypes.c_float)
Q = np.zeros((1, 2, 4, 16), np.float32)
O = np.full((1, 2, 4, 16), 7.0, np.float32)
L = np.full((1, 2, 4), 7.0, np.float32)
ptrs = [a.ctypes.data_as(f32p) for a in (Q, Q, Q, O, L)]
for fields, says in [(dict(scale=float("nan")), b"scale = nan"), (dict(scale=-1.0), b"scale = -1"),
                     (dict(heads=3), b"heads = 3"), (dict(seq_q=-1), b"seq_q = -1"),
                     (dict(causal=2), b"causal = 2")]:
    p = fa.Problem(1, 2, 2, 4, 4, 16, 0, 0.0)
    for k, v in fields.items():
        setattr(p, k, v)
    for call in ("fa_forward", "fa_forward_dtype"):
        args = [b"05", ctypes.byref(p)] + ([0] if call == "fa_forward_dtype" else []) + ptrs
        rc = getattr(lib, call)(*args)
        msg = lib.fa_last_error()
        check(rc == 1 and says in msg and np.all(O == 7.0) and np.all(L == 7.0),
              f"{call} with {fields}: code {rc} (want 1), '{msg.decode()}', outputs untouched")
p = fa.Problem(1, 2, 2, 4, 4, 16, 0, 0.0)
for dtype in (-1, 3):
    rc = lib.fa_forward_dtype(b"05", ctypes.byref(p), dtype, *ptrs)
    msg = lib.fa_last_error()
    check(rc == 1 and f"dtype = {dtype}".encode() in msg, f"dtype {dtype} refused: code {rc}, '{msg.decode()}'")

# Options from the stage's option table: listed, set per thread, 0 restores the default.
opts = fa.options("06")
check(list(opts) == ["block_q", "block_k", "sram_bytes", "threads", "count_traffic"]
      and opts["threads"][:2] == (1, "1 to 1024, or 0 for the default (1)"), f"stage 06 options listed: {opts}")
check(fa.options("05") == {}, "a stage without options lists none")
try:
    fa.options("99")
    check(False, "options of an unknown stage refused")
except fa.FaError as e:
    check("is not a stage" in str(e), f"options of an unknown stage refused: {e}")
fa.set_option("06", "threads", 2)
check(fa.get_counter("06", "threads") == 2, "threads set to 2")
fa.set_option("06", "threads", 0)
check(fa.get_counter("06", "threads") == 1, "threads 0 restores the default, 1")
try:
    fa.set_option("06", "threads", 1 << 30)
    check(False, "threads = 2^30 refused")
except fa.FaError as e:
    check("threads = 1073741824 is not allowed" in str(e), f"threads = 2^30 refused: {e}")

# Stage 13 through fa_forward_masked / fa_backward_masked: the CPU step under every modifier
# against a float64 numpy reference that decides the mask element by element (modifiers.h's
# definitions), then its refusals.


def masked_reference(Q, K, V, dO, causal, scale, window=None, softcap=0.0, alibi_slopes=None, sinks=None,
                     cu_seqlens_q=None, cu_seqlens_k=None):
    """Dense float64 attention under the modifiers: (O, L, dQ, dK, dV, dsinks)."""
    Q, K, V, dO = (np.asarray(x, np.float64) for x in (Q, K, V, dO))
    b, h, nq, d = Q.shape
    hkv, nk = K.shape[1], K.shape[2]
    cu_q = list(cu_seqlens_q) if cu_seqlens_q is not None else [0, nq]
    cu_k = list(cu_seqlens_k) if cu_seqlens_k is not None else [0, nk]
    keep = np.zeros((nq, nk), bool)
    dist = np.zeros((nq, nk))  # j - diag, for ALiBi
    for doc in range(len(cu_q) - 1):
        n_q, n_k = cu_q[doc + 1] - cu_q[doc], cu_k[doc + 1] - cu_k[doc]
        for i in range(n_q):
            diag = i + n_k - n_q
            for j in range(n_k):
                ok = (not causal or j <= diag)
                if window is not None and window[0] is not None:
                    ok = ok and j >= diag - window[0]
                if window is not None and window[1] is not None:
                    ok = ok and j <= diag + window[1]
                keep[cu_q[doc] + i, cu_k[doc] + j] = ok
                dist[cu_q[doc] + i, cu_k[doc] + j] = j - diag
    Kr, Vr = np.repeat(K, h // hkv, axis=1), np.repeat(V, h // hkv, axis=1)
    raw = scale * Q @ np.swapaxes(Kr, -1, -2)
    S = softcap * np.tanh(raw / softcap) if softcap else raw.copy()
    if alibi_slopes is not None:
        S = S + np.asarray(alibi_slopes, np.float64)[None, :, None, None] * dist
    S = np.where(keep, S, -np.inf)
    sink = np.asarray(sinks, np.float64)[None, :, None] if sinks is not None else np.full((1, h, 1), -np.inf)
    both = np.concatenate([np.broadcast_to(sink, (b, h, nq))[..., None], S], axis=-1)
    m = both.max(axis=-1, keepdims=True)
    m = np.where(np.isfinite(m), m, 0.0)
    with np.errstate(divide="ignore"):
        L = (m + np.log(np.exp(both - m).sum(axis=-1, keepdims=True)))[..., 0]
    P = np.where(np.isfinite(L)[..., None], np.exp(S - np.where(np.isfinite(L), L, 0.0)[..., None]), 0.0)
    O = P @ Vr
    D = (dO * O).sum(-1)
    dS = P * (dO @ np.swapaxes(Vr, -1, -2) - D[..., None])
    if softcap:
        dS = dS * (1 - np.tanh(raw / softcap) ** 2)
    dQ = scale * dS @ Kr
    group = lambda x: x.reshape(b, hkv, h // hkv, nk, d).sum(axis=2)  # noqa: E731
    dK = group(scale * np.swapaxes(dS, -1, -2) @ Q)
    dV = group(np.swapaxes(P, -1, -2) @ dO)
    dsinks = -(np.exp(sink - np.where(np.isfinite(L), L, np.inf)) * D).sum(axis=(0, 2)) if sinks is not None else None
    return O, L, dQ, dK, dV, dsinks


def max_err(a, b):
    finite = np.isfinite(b)
    return float(np.max(np.abs(a[finite] - b[finite]), initial=0.0)) if np.array_equal(np.isfinite(a), finite) \
        else float("inf")


slopes4 = [2.0 ** (-8 * (i + 1) / 4) for i in range(4)]  # the usual geometric series, 4 heads
masked_cases = [
    # documents (one empty, one of one token, rows past the last), causal, a left window, every
    # score modifier and sinks, GQA
    dict(shape=(1, 4, 2, 50, 50, 16), causal=True,
         mods=dict(window=(7, None), softcap=2.0, alibi_slopes=slopes4, sinks=[0.5, -1.0, 2.0, 0.0],
                   cu_seqlens_q=[0, 13, 13, 14, 40], cu_seqlens_k=[0, 20, 21, 22, 45])),
    # no documents, a two-sided window over seq_q != seq_k, batch 2
    dict(shape=(2, 2, 2, 37, 29, 8), causal=False, mods=dict(window=(5, 3), softcap=30.0)),
]
for case in masked_cases:
    b, h, hkv, nq, nk, d = case["shape"]
    Q = rng.standard_normal((b, h, nq, d), dtype=np.float32)
    K = rng.standard_normal((b, hkv, nk, d), dtype=np.float32)
    V = rng.standard_normal((b, hkv, nk, d), dtype=np.float32)
    dO = rng.standard_normal((b, h, nq, d), dtype=np.float32)
    mods = case["mods"]
    O, L = fa.forward_masked(Q, K, V, causal=case["causal"], **mods)
    dQ, dK, dV, dsinks = fa.backward_masked(Q, K, V, O, L, dO, causal=case["causal"], **mods)
    ref = masked_reference(Q, K, V, dO, case["causal"], 1 / np.sqrt(d), **mods)
    errs = [max_err(x, r) for x, r in zip((O, L, dQ, dK, dV), ref[:5])]
    if ref[5] is not None:
        errs.append(max_err(dsinks, ref[5]))
    check(max(errs) < 1e-4 and (dsinks is None) == (ref[5] is None),
          f"fa_forward_masked / fa_backward_masked {case['shape']} {sorted(mods)}: max errors "
          + " ".join(f"{e:.1e}" for e in errs))

# Bad modifiers: FA_ERR_INVALID with the stage's message naming the value, outputs untouched;
# the device entries refuse the same, before they look for a GPU.
p = fa.Problem(1, 2, 2, 8, 8, 16, 0, 0.0)
Q = np.zeros((1, 2, 8, 16), np.float32)
O = np.full((1, 2, 8, 16), 7.0, np.float32)
L = np.full((1, 2, 8), 7.0, np.float32)
dsinks = np.full(2, 7.0, np.float32)
ptrs = [a.ctypes.data_as(f32p) for a in (Q, Q, Q, O, L)]
bwd_ptrs = [a.ctypes.data_as(f32p) for a in (Q, Q, Q, Q, L, Q, O, O, O, dsinks)]
for mods, says in [(dict(cu_seqlens_q=[1, 8], cu_seqlens_k=[0, 8]), b"cu_seqlens_q starts at 1"),
                   (dict(cu_seqlens_q=[0, 5, 3], cu_seqlens_k=[0, 4, 8]), b"cu_seqlens_q decreases at entry 2"),
                   (dict(cu_seqlens_q=[0, 4, 8], cu_seqlens_k=[0, 4, 9]), b"cu_seqlens_k ends at 9"),
                   (dict(window=(-1, None)), b"window_left = -1"),
                   (dict(window=(None, -3)), b"window_right = -3"),
                   (dict(softcap=-1.0), b"softcap = -1"),
                   (dict(softcap=float("inf")), b"softcap = inf"),
                   (dict(alibi_slopes=[0.5]), b"alibi_slopes has 1 entries"),
                   (dict(sinks=[0.0, 1.0, 2.0]), b"sinks has 3 entries")]:
    m, keep = fa.modifiers(**mods)
    rc = lib.fa_forward_masked(ctypes.byref(p), ctypes.byref(m), *ptrs)
    msg = lib.fa_last_error()
    rc_b = lib.fa_backward_masked(ctypes.byref(p), ctypes.byref(m), *bwd_ptrs)
    msg_b = lib.fa_last_error()
    rc_d = lib.fa_forward_masked_device(ctypes.byref(p), ctypes.byref(m), 2, *[None] * 6)
    msg_d = lib.fa_last_error()
    check(rc == rc_b == rc_d == 1 and says in msg and says in msg_b and says in msg_d and b"13_masks" in msg
          and np.all(O == 7.0) and np.all(L == 7.0) and np.all(dsinks == 7.0),
          f"modifiers {mods}: codes {rc}, {rc_b}, {rc_d} (want 1), '{msg.decode()}', outputs untouched")
m, keep = fa.modifiers(cu_seqlens_q=[0, 8], cu_seqlens_k=[0, 8])
p2 = fa.Problem(2, 2, 2, 8, 8, 16, 0, 0.0)
rc = lib.fa_forward_masked(ctypes.byref(p2), ctypes.byref(m), *ptrs)
check(rc == 1 and b"batch = 2 with cu_seqlens" in lib.fa_last_error(), "documents with batch = 2 refused")
m, keep = fa.modifiers()
for field, value, says in [("size", 8, b"fa_modifiers.size = 8"), ("has_window_left", 2, b"has_window_left = 2"),
                           ("n_sinks", 2, b"sinks is NULL but n_sinks = 2"),
                           ("n_cu_seqlens", -1, b"n_cu_seqlens = -1")]:
    bad = fa.Modifiers.from_buffer_copy(m)
    setattr(bad, field, value)
    rc = lib.fa_forward_masked(ctypes.byref(p), ctypes.byref(bad), *ptrs)
    msg = lib.fa_last_error()
    check(rc == 1 and says in msg and np.all(O == 7.0), f"fa_modifiers.{field} = {value} refused: '{msg.decode()}'")
rc = lib.fa_forward_masked(ctypes.byref(p), None, *ptrs)
check(rc == 1 and b"modifiers pointer is NULL" in lib.fa_last_error(), "NULL modifiers refused")
m, keep = fa.modifiers(sinks=[0.0, 1.0])
rc = lib.fa_backward_masked(ctypes.byref(p), ctypes.byref(m), *bwd_ptrs[:-1], None)
check(rc == 1 and b"dsinks is NULL" in lib.fa_last_error() and np.all(O == 7.0), "sinks without dsinks refused")
rc = lib.fa_forward_masked_device(ctypes.byref(p), ctypes.byref(m), 0, *[None] * 6)
check(rc == 1 and b"dtype = 0" in lib.fa_last_error(), "fp32 on the device entry refused")

print(f"{len(failures)} failed")
sys.exit(1 if failures else 0)
