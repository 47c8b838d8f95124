"""What the PyTorch tests (test_torch_ops.py, test_torch_decode.py, test_torch_masks.py) share:
a skip that pytest understands too, the check that a call is refused with a message, the
runner of a test file that runs as a script, and the runner of several files in one process:

    python3 tests/torch_checks.py test_torch_ops test_torch_masks test_torch_decode

(CTest python_torch). Each file's tests run as its own main() runs them, file after file; the
process imports torch, torch.compile's compiler and opcheck's machinery once, where a process
per file spends about 3.5 of its 5.5 CPU-s on them. test_torch_ops comes first: its GPU cases
draw their inputs from torch's global generator, which then starts from where it starts in a
process of their own. Imports no torch: a file without torch still reports "skipped" through
run_tests."""
import importlib
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


def run_files(names):
    """Runs the tests of the test files `names` (modules beside this file) in this process, one
    file after another; exit code 1 when a test of any file failed, 77 when every file skipped
    (no torch), else 0."""
    codes = []
    for name in names:
        print(f"== {name}.py", flush=True)
        codes.append(importlib.import_module(name).main())
    if codes and all(code == 77 for code in codes):
        return 77
    return 1 if any(code not in (0, 77) for code in codes) else 0


if __name__ == "__main__":
    sys.exit(run_files(sys.argv[1:]))
