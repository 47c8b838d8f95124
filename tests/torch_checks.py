"""What the PyTorch tests (test_torch_ops.py, test_torch_decode.py, test_torch_masks.py) share:
a skip that pytest understands too, the check that a call is refused with a message, and the
runner that CTest uses when a test file runs as a script. Imports no torch: a file without
torch still reports "skipped" through run_tests."""
import sys


class Skipped(Exception):
    """A test that cannot run here (no GPU, no 9.x GPU, one GPU)."""


def skip(reason):
    """Skips the calling test: under pytest as pytest does, else by raising Skipped."""
    if "pytest" in sys.modules:
        import pytest
        pytest.skip(reason)
    raise Skipped(reason)


def refused(fn, says, what, untouched=()):
    """fn() raises ValueError (what the op or the stage refuses) whose message holds `says`;
    each (tensor, copy taken before) pair in `untouched` is unchanged."""
    try:
        fn()
    except ValueError as e:
        assert says in str(e), f"{what}: message '{e}' does not say '{says}'"
        for now, before in untouched:
            import torch  # only callers that have tensors pass them
            assert torch.equal(now, before), f"{what}: refused, yet a tensor was written"
        print(f"ok   {what} refused: {e}")
        return
    raise AssertionError(f"{what} was not refused")


def run_tests(namespace, have_torch, no_torch="skipped: torch is not installed"):
    """Runs every test_* function of `namespace` (a module's globals()), reports each failure
    and goes on; exit code 0, 1 when one failed, 77 (CTest's skip) without torch."""
    if not have_torch:
        print(no_torch)
        return 77
    tests = [(n, f) for n, f in namespace.items() if n.startswith("test_") and callable(f)]
    failed, skipped = [], []
    for name, fn in tests:
        try:
            fn()
        except Skipped as e:
            skipped.append(name)
            print(f"skip {name}: {e}")
        except Exception as e:  # noqa: BLE001 (report every test's failure, then fail)
            failed.append(name)
            print(f"FAIL {name}: {type(e).__name__}: {e}")
    print(f"{len(tests) - len(failed) - len(skipped)} passed, {len(skipped)} skipped, {len(failed)} failed")
    return 1 if failed else 0
