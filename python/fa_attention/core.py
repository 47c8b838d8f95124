"""The numpy API: a ctypes wrapper over the project's C ABI (common/fa_c.h).

    import fa_attention as fa
    O, L = fa.forward("05", Q, K, V, causal=True)          # host fp32 arrays
    dQ, dK, dV = fa.backward("06", Q, K, V, O, L, dO)
    O, L = fa.forward_masked(Q, K, V, causal=True, window=(64, 0), softcap=30.0)  # stage 13

Arrays are float32 in the layouts of docs/design.md §3: Q, O [batch, heads, seq_q, d];
K, V [batch, kv_heads, seq_k, d]; L [batch, heads, seq_q]. The library is found through
the environment variable FA_LIB, else in this package's folder (an installed wheel), else at
build/stages/libfa_c.so or build-gpu/stages/libfa_c.so under the repository that holds this package, else under the current directory or one of
its parents (library_candidates() lists them in order). Errors from the library raise
FaError with the library's message.
"""
import ctypes
import os
import pathlib

import numpy as np

__all__ = ["FaError", "Problem", "library", "library_candidates", "stages", "is_gpu",
           "has_backward", "problem", "forward", "backward", "forward_device", "backward_device",
           "set_option", "get_counter", "options", "attention_numpy", "Modifiers", "modifiers",
           "forward_masked", "backward_masked"]

_DTYPES = {"f32": 0, "f16": 1, "bf16": 2}  # enum fa_dtype


class FaError(RuntimeError):
    """An error code returned by the C ABI, with its message."""


class Modifiers(ctypes.Structure):
    """struct fa_modifiers (common/fa_c.h): stage 13's window, soft-cap, ALiBi, sinks, documents."""
    _fields_ = [("size", ctypes.c_uint32), ("has_window_left", ctypes.c_int32),
                ("has_window_right", ctypes.c_int32), ("n_alibi_slopes", ctypes.c_int32),
                ("window_left", ctypes.c_int64), ("window_right", ctypes.c_int64),
                ("softcap", ctypes.c_double), ("alibi_slopes", ctypes.POINTER(ctypes.c_float)),
                ("sinks", ctypes.POINTER(ctypes.c_float)), ("cu_seqlens_q", ctypes.POINTER(ctypes.c_int32)),
                ("cu_seqlens_k", ctypes.POINTER(ctypes.c_int32)), ("n_sinks", ctypes.c_int32),
                ("n_cu_seqlens", ctypes.c_int32)]


class Problem(ctypes.Structure):
    _fields_ = [(n, ctypes.c_int32) for n in
                ("batch", "heads", "kv_heads", "seq_q", "seq_k", "head_dim", "causal")] + \
               [("scale", ctypes.c_float)]


def library_candidates():
    """Where library() looks for libfa_c.so, in order: $FA_LIB alone when it is set; else this
    package's folder (where `pip install ./python` puts it); else build/ and build-gpu/ (the
    "default" and "gpu" CMake presets) of the repository that holds this package
    (python/fa_attention/ in it), then of the current directory and its parents."""
    if os.environ.get("FA_LIB"):
        return [pathlib.Path(os.environ["FA_LIB"])]
    roots = [pathlib.Path(__file__).resolve().parents[2]]
    cwd = pathlib.Path.cwd().resolve()
    roots += [cwd, *cwd.parents]
    found = [pathlib.Path(__file__).resolve().parent / "libfa_c.so"]
    for root in roots:
        for build in ("build", "build-gpu"):
            path = root / build / "stages" / "libfa_c.so"
            if path not in found:
                found.append(path)
    return found


def _default_path():
    candidates = library_candidates()
    for path in candidates:
        if path.is_file():
            return str(path)
    looked = "\n  ".join(map(str, candidates))
    raise FileNotFoundError("libfa_c.so not found: build the fa_c target "
                            "(cmake --preset default && cmake --build --preset default --target fa_c) "
                            f"or set FA_LIB to its path. Looked at:\n  {looked}")


_lib = None


def library(path=None):
    """Loads (once) and returns the ctypes handle of libfa_c.so (see library_candidates())."""
    global _lib
    if _lib is not None and path is None:
        return _lib
    lib = ctypes.CDLL(path or _default_path())
    f32p, vp, pp = ctypes.POINTER(ctypes.c_float), ctypes.c_void_p, ctypes.POINTER(Problem)
    lib.fa_stage_count.restype = ctypes.c_int
    lib.fa_stage_name.restype = ctypes.c_char_p
    lib.fa_stage_name.argtypes = [ctypes.c_int]
    lib.fa_last_error.restype = ctypes.c_char_p
    for name in ("fa_stage_has_backward", "fa_stage_is_gpu"):
        getattr(lib, name).argtypes = [ctypes.c_char_p]
    lib.fa_forward.argtypes = [ctypes.c_char_p, pp] + [f32p] * 5
    lib.fa_backward.argtypes = [ctypes.c_char_p, pp] + [f32p] * 9
    lib.fa_forward_dtype.argtypes = [ctypes.c_char_p, pp, ctypes.c_int] + [f32p] * 5
    lib.fa_backward_dtype.argtypes = [ctypes.c_char_p, pp, ctypes.c_int] + [f32p] * 9
    lib.fa_forward_device.argtypes = [ctypes.c_char_p, pp, ctypes.c_int] + [vp] * 6
    lib.fa_backward_device.argtypes = [ctypes.c_char_p, pp, ctypes.c_int] + [vp] * 10
    mp = ctypes.POINTER(Modifiers)
    lib.fa_forward_masked.argtypes = [pp, mp] + [f32p] * 5
    lib.fa_backward_masked.argtypes = [pp, mp] + [f32p] * 10
    lib.fa_forward_masked_device.argtypes = [pp, mp, ctypes.c_int] + [vp] * 6
    lib.fa_backward_masked_device.argtypes = [pp, mp, ctypes.c_int] + [vp] * 11
    lib.fa_set_option.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_int64]
    lib.fa_get_counter.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.POINTER(ctypes.c_int64)]
    lib.fa_stage_options.restype = ctypes.c_char_p
    lib.fa_stage_options.argtypes = [ctypes.c_char_p]
    _lib = lib
    return lib


def _check(rc):
    if rc != 0:
        raise FaError(library().fa_last_error().decode())


def stages():
    """Names of every stage in the library, in order."""
    lib = library()
    return [lib.fa_stage_name(i).decode() for i in range(lib.fa_stage_count())]


def is_gpu(stage):
    return library().fa_stage_is_gpu(stage.encode()) == 1


def has_backward(stage):
    return library().fa_stage_has_backward(stage.encode()) == 1


def problem(Q, K, causal=False, scale=0.0):
    """The fa_problem for arrays Q [b, h, Nq, d] and K [b, hkv, Nk, d]."""
    b, h, nq, d = Q.shape
    bk, hkv, nk, dk = K.shape
    if (bk, dk) != (b, d):
        raise ValueError(f"Q {Q.shape} and K {K.shape} disagree in batch or head_dim")
    return Problem(b, h, hkv, nq, nk, d, int(bool(causal)), float(scale))


def _f32(x):
    return np.ascontiguousarray(x, dtype=np.float32)


def _ptr(x):
    return x.ctypes.data_as(ctypes.POINTER(ctypes.c_float))


def forward(stage, Q, K, V, causal=False, scale=0.0, dtype="f32"):
    """Runs a stage's forward on host arrays; returns (O, L) as float32 arrays."""
    Q, K, V = _f32(Q), _f32(K), _f32(V)
    p = problem(Q, K, causal, scale)
    O = np.full(Q.shape, np.nan, dtype=np.float32)
    L = np.full(Q.shape[:3], np.nan, dtype=np.float32)
    _check(library().fa_forward_dtype(stage.encode(), ctypes.byref(p), _DTYPES[dtype],
                                      _ptr(Q), _ptr(K), _ptr(V), _ptr(O), _ptr(L)))
    return O, L


def backward(stage, Q, K, V, O, L, dO, causal=False, scale=0.0, dtype="f32"):
    """Runs a stage's backward on host arrays; returns (dQ, dK, dV)."""
    Q, K, V, O, L, dO = map(_f32, (Q, K, V, O, L, dO))
    p = problem(Q, K, causal, scale)
    dQ = np.full(Q.shape, np.nan, dtype=np.float32)
    dK = np.full(K.shape, np.nan, dtype=np.float32)
    dV = np.full(V.shape, np.nan, dtype=np.float32)
    _check(library().fa_backward_dtype(stage.encode(), ctypes.byref(p), _DTYPES[dtype],
                                       _ptr(Q), _ptr(K), _ptr(V), _ptr(O), _ptr(L), _ptr(dO),
                                       _ptr(dQ), _ptr(dK), _ptr(dV)))
    return dQ, dK, dV


def forward_device(stage, p, dtype, q, k, v, o, l, stream=0):
    """Forward on device pointers (ints, e.g. torch's data_ptr()); p is a Problem."""
    _check(library().fa_forward_device(stage.encode(), ctypes.byref(p), _DTYPES[dtype],
                                       q, k, v, o, l, stream or None))


def backward_device(stage, p, dtype, q, k, v, o, l, do, dq, dk, dv, stream=0):
    """Backward on device pointers."""
    _check(library().fa_backward_device(stage.encode(), ctypes.byref(p), _DTYPES[dtype],
                                        q, k, v, o, l, do, dq, dk, dv, stream or None))


def modifiers(window=None, softcap=0.0, alibi_slopes=None, sinks=None, cu_seqlens_q=None, cu_seqlens_k=None):
    """The fa_modifiers of stage 13, and the arrays it points into (keep both alive while it is
    used). window: (left, right), either None for unbounded; softcap 0 for none; slopes and
    sinks one per query head; cu_seqlens_q/k int arrays of documents + 1 entries, or None.
    Values are checked by the library (stage 13's checks), not here."""
    m = Modifiers()
    m.size = ctypes.sizeof(Modifiers)
    keep = []
    if window is not None:
        left, right = window
        m.has_window_left, m.window_left = (0, 0) if left is None else (1, int(left))
        m.has_window_right, m.window_right = (0, 0) if right is None else (1, int(right))
    m.softcap = float(softcap or 0.0)

    def array(values, ctype, dtype):
        a = np.ascontiguousarray(values, dtype=dtype)
        keep.append(a)
        return a.ctypes.data_as(ctypes.POINTER(ctype)), a.size

    if alibi_slopes is not None:
        m.alibi_slopes, m.n_alibi_slopes = array(alibi_slopes, ctypes.c_float, np.float32)
    if sinks is not None:
        m.sinks, m.n_sinks = array(sinks, ctypes.c_float, np.float32)
    if cu_seqlens_q is not None or cu_seqlens_k is not None:
        if cu_seqlens_q is None or cu_seqlens_k is None or len(cu_seqlens_q) != len(cu_seqlens_k):
            raise ValueError("cu_seqlens_q and cu_seqlens_k go together, with as many entries "
                             f"(got {cu_seqlens_q} and {cu_seqlens_k})")
        m.cu_seqlens_q, m.n_cu_seqlens = array(cu_seqlens_q, ctypes.c_int32, np.int32)
        m.cu_seqlens_k, _ = array(cu_seqlens_k, ctypes.c_int32, np.int32)
    return m, keep


def forward_masked(Q, K, V, causal=False, scale=0.0, **mods):
    """Stage 13's CPU step on host arrays under the modifiers of modifiers() (keywords window,
    softcap, alibi_slopes, sinks, cu_seqlens_q, cu_seqlens_k); returns (O, L)."""
    Q, K, V = _f32(Q), _f32(K), _f32(V)
    p = problem(Q, K, causal, scale)
    m, _keep = modifiers(**mods)
    O = np.full(Q.shape, np.nan, dtype=np.float32)
    L = np.full(Q.shape[:3], np.nan, dtype=np.float32)
    _check(library().fa_forward_masked(ctypes.byref(p), ctypes.byref(m), _ptr(Q), _ptr(K), _ptr(V),
                                       _ptr(O), _ptr(L)))
    return O, L


def backward_masked(Q, K, V, O, L, dO, causal=False, scale=0.0, **mods):
    """Stage 13's backward on host arrays; returns (dQ, dK, dV, dsinks) (dsinks None without
    sinks)."""
    Q, K, V, O, L, dO = map(_f32, (Q, K, V, O, L, dO))
    p = problem(Q, K, causal, scale)
    m, _keep = modifiers(**mods)
    dQ = np.full(Q.shape, np.nan, dtype=np.float32)
    dK = np.full(K.shape, np.nan, dtype=np.float32)
    dV = np.full(V.shape, np.nan, dtype=np.float32)
    dsinks = np.full(max(m.n_sinks, 0), np.nan, dtype=np.float32)
    _check(library().fa_backward_masked(ctypes.byref(p), ctypes.byref(m), _ptr(Q), _ptr(K), _ptr(V), _ptr(O),
                                        _ptr(L), _ptr(dO), _ptr(dQ), _ptr(dK), _ptr(dV),
                                        _ptr(dsinks) if dsinks.size else None))
    return dQ, dK, dV, (dsinks if m.n_sinks > 0 else None)


def set_option(stage, name, value):
    """Sets a stage-specific option (e.g. stage 06 "block_q"); 0 restores the default.
    Options are per thread: they apply to this thread's later calls only."""
    _check(library().fa_set_option(stage.encode(), name.encode(), int(value)))


def get_counter(stage, name):
    """Reads a stage-specific counter of this thread's last run (e.g. stage 06 "reads")."""
    v = ctypes.c_int64(0)
    _check(library().fa_get_counter(stage.encode(), name.encode(), ctypes.byref(v)))
    return v.value


def options(stage):
    """The stage's options from its option table: {name: (default, allowed, help)}, e.g.
    options("06")["threads"] == (1, "1 to 1024, or 0 for the default (1)", "worker threads ...")."""
    text = library().fa_stage_options(stage.encode())
    if text is None:
        raise FaError(library().fa_last_error().decode())
    table = {}
    for line in text.decode().splitlines():
        name, default, allowed, help_text = line.split("\t")
        table[name] = (int(default), allowed, help_text)
    return table


def attention_numpy(Q, K, V, causal=False, scale=0.0):
    """Plain float64 numpy attention (bottom-right causal, GQA): returns (O, L)."""
    Q, K, V = (np.asarray(x, dtype=np.float64) for x in (Q, K, V))
    b, h, nq, d = Q.shape
    hkv, nk = K.shape[1], K.shape[2]
    scale = scale or 1.0 / np.sqrt(d)
    K = np.repeat(K, h // hkv, axis=1)
    V = np.repeat(V, h // hkv, axis=1)
    S = scale * Q @ np.swapaxes(K, -1, -2)
    if causal:
        visible = np.arange(nk)[None, :] <= np.arange(nq)[:, None] + nk - nq
        S = np.where(visible, S, -np.inf)
    m = S.max(axis=-1, keepdims=True) if nk else np.full((b, h, nq, 1), -np.inf)
    m_safe = np.where(np.isfinite(m), m, 0.0)
    E = np.exp(S - m_safe)
    l = E.sum(axis=-1, keepdims=True)
    with np.errstate(invalid="ignore", divide="ignore"):
        O = np.where(l > 0, E @ V / np.where(l > 0, l, 1.0), 0.0)
        L = np.where(l[..., 0] > 0, (m_safe + np.log(np.where(l > 0, l, 1.0)))[..., 0], -np.inf)
    return O, L
