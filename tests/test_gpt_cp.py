"""The capstone's context-parallel training (python/examples/gpt/train_cp.py) on the CPU: P = 2
and 4 gloo processes, each with its zigzag shard of every sequence, against the same step
computed by one process on whole sequences.

On the first batch, before any optimizer step, the batch's loss and the gradient of every
weight must match the single process's: the loss within 1e-5 (relative) and each gradient
within 1e-4 of its largest entry (float32, stage 06 per block; the ring only changes the order
of the additions). Then a few steps of training must give the same losses as one process within
1e-3 (relative): the weights move together. Each of these mistakes, planted by hand in
train_cp.py one at a time, failed it:
  - the rotary angles of a shard's local positions (0 … n−1) instead of its places in the sequence;
  - the previous token taken from the shard (its chunks glued together) instead of the sequence;
  - each rank's loss divided by its own scored tokens instead of the batch's;
  - the gradients left as each rank's part (no all_reduce).

Runs as a script (CTest python_gpt_cp; exit 77 = skipped without torch, torch.distributed or
gloo, or without the op's library) or under pytest.
"""
import os
import pathlib
import sys
import tempfile
from datetime import timedelta

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "python" / "examples" / "gpt"))
sys.path.insert(0, str(ROOT / "python"))

try:
    import torch
    import torch.distributed as dist
    import torch.multiprocessing as mp
    HAVE_GLOO = dist.is_available() and dist.is_gloo_available()
except ImportError:
    torch = None
    HAVE_GLOO = False

if not HAVE_GLOO and "pytest" in sys.modules:
    import pytest
    pytest.skip("torch with torch.distributed and gloo is not installed", allow_module_level=True)

WORLD_SIZES = (2, 4)
STEPS = 4


def arguments(steps):
    import train_cp
    # 2 layers of 2 heads of 16, N = 48 (6 rows per zigzag chunk at P = 4), 4 pairs, 2 sequences.
    return train_cp.make_parser().parse_args(
        ["--seq", "48", "--pairs", "4", "--batch", "2", "--steps", str(steps), "--curriculum", "",
         "--layers", "2", "--heads", "2", "--head-dim", "16", "--lr", "3e-3", "--eval-every", "1000"])


def first_step(group):
    """The first batch's loss and every weight's gradient (summed over the group), no step."""
    import train_cp
    data, model, cp = train_cp.build(arguments(1), group, torch.device("cpu"))
    inputs, targets = (torch.from_numpy(x) for x in data.train_batch(0))
    loss, _, _ = cp.loss_and_counts(inputs, targets)
    loss.backward()
    cp.all_reduce_grads()
    whole = loss.detach().clone()
    dist.all_reduce(whole, group=group)
    return whole.item(), [p.grad.clone() for p in model.parameters()]


def losses(group):
    import train_cp
    rows, _ = train_cp.train(arguments(STEPS), group, torch.device("cpu"), log=lambda *a, **k: None)
    return [r["loss"] for r in rows]


def worker(rank, world, store_path, results):
    torch.set_num_threads(1)
    dist.init_process_group("gloo", store=dist.FileStore(store_path, world), rank=rank, world_size=world,
                            timeout=timedelta(seconds=60))
    failures = []
    try:
        alone = dist.new_group([0])  # rank 0 by itself: the single process's run (every rank must create it)
        loss, grads = first_step(dist.group.WORLD)
        curve = losses(dist.group.WORLD)
        if rank == 0:
            loss1, grads1 = first_step(alone)
            curve1 = losses(alone)
            if abs(loss - loss1) > 1e-5 * abs(loss1):
                failures.append(f"first loss {loss:.7f} against {loss1:.7f} in one process")
            for i, (g, g1) in enumerate(zip(grads, grads1)):
                scale = g1.abs().max().item()
                err = (g - g1).abs().max().item()
                if not err <= 1e-4 * scale + 1e-12:  # NaN fails
                    failures.append(f"gradient of weight {i} {tuple(g.shape)}: max error {err:.3e}, largest "
                                    f"entry {scale:.3e}")
            for step, (a, b) in enumerate(zip(curve, curve1)):
                if not abs(a - b) <= 1e-3 * abs(b):
                    failures.append(f"step {step}: loss {a:.6f} against {b:.6f} in one process")
        dist.barrier()
    finally:
        dist.destroy_process_group()
    results.put((rank, failures))


def main():
    if not HAVE_GLOO:
        print("skipped: torch with torch.distributed and gloo is not installed")
        return 77
    try:
        from fa_attention.torch_ops import attention  # noqa: F401  (the op's library: stage 06 per block)
    except ImportError as e:
        print(f"skipped: the op is not built ({e})")
        return 77
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    # fork: the ranks share this process's imports. torch imports torch._dynamo (about 1 CPU-s)
    # when a process makes its first optimizer: imported here, it is imported once instead of
    # once per rank (6 ranks in all).
    import torch._dynamo  # noqa: F401
    ctx = mp.get_context("fork")
    failed = []
    for world in WORLD_SIZES:
        results = ctx.SimpleQueue()
        with tempfile.TemporaryDirectory() as tmp:
            try:
                mp.start_processes(worker, (world, os.path.join(tmp, "store"), results), nprocs=world,
                                   start_method="fork")
            except Exception as e:  # noqa: BLE001
                failed.append(f"P={world}: a rank failed: {e}")
        while not results.empty():
            rank, bad = results.get()
            failed += [f"P={world}: {b}" for b in bad]
        print(f"P={world}: {'FAIL' if failed else 'pass'}")
    for f in failed:
        print(f"FAIL {f}")
    return 1 if failed else 0


def test_gpt_cp():  # pytest
    assert main() == 0


if __name__ == "__main__":
    sys.exit(main())
