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

print(f"{len(failures)} failed")
sys.exit(1 if failures else 0)
