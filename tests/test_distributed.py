"""fa_attention.distributed (ring and Ulysses attention over torch.distributed) on the CPU:
P = 2, 3 and 4 processes on the gloo backend, each a rank with its shard of the sequence,
the blocks computed by the op's CPU path (stage 06, float32).

Every rank makes the same whole q, k, v, dO (one seed), takes its shard, runs the strategy
forward and backward, and gathers O, dQ, dK, dV back into whole tensors. These are held to the
rule of tests/test_torch_ops.py against a float64 reference: the error is at most twice that of
the op called once on the whole tensors in one process (float32), plus 4 ulps of the largest
value. Cases: ring and Ulysses; causal and not; the zigzag and plain splits; GQA (h = 2P,
hkv = P); odd chunk lengths (3 rows); keys longer than queries. Then a ring of one rank (a
group of rank 0 alone) must be the op bit for bit, and every refusal must come as a ValueError
that names the value. Last, a ring whose rank 1 dies before it starts: rank 0 must raise (on
gloo the closed peer, at the latest the group's timeout), not wait forever.

The comparison catches a wrong ring or a wrong reorder. Planted by hand in distributed.py, one
at a time, each of these failed it (errors of O or of a gradient of 1 to 100 against the
passing run's 1e-6; the checks of the cases it does not touch still passed):
  - the later owner's zigzag block with our early half of rows instead of our late half;
  - the earlier owner's zigzag block with its late half of keys instead of its early half;
  - a missing block (the step with owner (rank - 1) % P skipped);
  - the merge's weights exchanged (w_part on the accumulator, w_acc on the part);
  - the backward given the block's own L (from a forward of the block) instead of the final L;
  - the dK/dV sums that arrive dropped instead of added (each rank's part alone goes on);
  - Ulysses' zigzag reorder left out on the way in (kept on the way back).

Runs as a script (CTest python_distributed; exit 77 = skipped without torch, torch.distributed
or gloo) or under pytest. No GPU is needed; the NCCL side is scripts/bench/bench_distributed.py.
"""
import math
import os
import pathlib
import sys
import tempfile
from datetime import timedelta

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent / "python"))

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

WORLD_SIZES = (2, 3, 4)
STAGE = "06"
D = 16
CHUNK = 3  # rows per zigzag chunk: N = 2P·3


def reference(q, k, v, causal):
    """float64 attention, bottom-right causal, GQA by repeating kv heads."""
    groups = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(groups, 1), v.repeat_interleave(groups, 1)
    s = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
    if causal:
        nq, nk = q.shape[2], k.shape[2]
        visible = torch.arange(nk)[None, :] <= torch.arange(nq)[:, None] + nk - nq
        s = s.masked_fill(~visible, -math.inf)
    return torch.softmax(s, -1) @ v


def with_grads(fn, q, k, v, d_o):
    """fn(q, k, v) and the gradients of <fn(q, k, v), d_o> in q, k, v."""
    q, k, v = (t.detach().clone().requires_grad_() for t in (q, k, v))
    o = fn(q, k, v)
    o.backward(d_o)
    return o.detach(), q.grad, k.grad, v.grad


class Checks:
    """Collects each check's verdict; rank 0 prints them. Every rank runs the same checks on the
    same gathered tensors, so all ranks agree and none is left waiting in a collective."""

    def __init__(self, rank, world):
        self.rank, self.world, self.failed, self.count = rank, world, [], 0

    def report(self, ok, what):
        self.count += 1
        if not ok:
            self.failed.append(what)
        if self.rank == 0:
            print(f"{'ok  ' if ok else 'FAIL'} P={self.world} {what}", flush=True)

    def close_to_exact(self, ours, single, exact, what):
        """|ours − exact| <= 2 |single − exact| + 4 ulp(max |exact|), in float32."""
        err = (ours.double() - exact).abs().max().item()
        base = (single.double() - exact).abs().max().item()
        floor = 4 * torch.finfo(torch.float32).eps * max(1.0, exact.abs().max().item())
        ok = err <= 2 * base + floor
        self.report(ok, f"{what}: err {err:.1e}, one call {base:.1e}")

    def refused(self, fn, says, what):
        try:
            fn()
        except ValueError as e:
            ok = all(s in str(e) for s in says)
            self.report(ok, f"refuses {what}: {e}")
            return
        except Exception as e:  # noqa: BLE001 (any other exception is a failure to report)
            self.report(False, f"refuses {what}: {type(e).__name__}: {e}")
            return
        self.report(False, f"refuses {what}: nothing raised")


def check_strategy(c, strategy, causal, split, n_k_factor=1):
    """One strategy on one problem: gathered O and gradients against float64 and one call."""
    from fa_attention.distributed import gather, shard
    from fa_attention.torch_ops import attention
    P = c.world
    b, h, hkv, n = 2, 2 * P, P, 2 * P * CHUNK
    g = torch.Generator().manual_seed(100 * P + 10 * causal + (split == "zigzag"))
    q = torch.randn(b, h, n, D, generator=g)
    k, v = (torch.randn(b, hkv, n * n_k_factor, D, generator=g) for _ in range(2))
    d_o = torch.randn(b, h, n, D, generator=g)

    exact = with_grads(lambda q, k, v: reference(q, k, v, causal), q.double(), k.double(), v.double(), d_o.double())
    single = with_grads(lambda q, k, v: attention(q, k, v, causal=causal, stage=STAGE), q, k, v, d_o)
    mine = with_grads(lambda q, k, v: strategy(q, k, v, causal=causal, split=split, stage=STAGE),
                      *(shard(t, split=split) for t in (q, k, v)), shard(d_o, split=split))
    ours = [gather(t, split=split) for t in mine]
    what = f"{strategy.__name__} causal={causal} {split} h={h} hkv={hkv} n={n} n_k={n * n_k_factor}"
    for name, o, s, e in zip(("O", "dQ", "dK", "dV"), ours, single, exact):
        c.close_to_exact(o, s, e, f"{what} {name}")


def check_one_rank_ring(c):
    """A group of one rank: the ring is one block, merged into the identity: the op bit for bit."""
    from fa_attention.distributed import ring_attention
    from fa_attention.torch_ops import attention
    alone = dist.new_group([0])  # every rank takes part in making a group
    if c.rank != 0:
        x = torch.zeros(1, 2, 4, D)
        c.refused(lambda: ring_attention(x, x, x, group=alone), ["not a member"], "a group without this rank")
        return
    g = torch.Generator().manual_seed(5)
    q, k, v, d_o = (torch.randn(1, 4, 10, D, generator=g) for _ in range(4))
    ring = with_grads(lambda q, k, v: ring_attention(q, k, v, group=alone, causal=True, stage=STAGE), q, k, v, d_o)
    single = with_grads(lambda q, k, v: attention(q, k, v, causal=True, stage=STAGE), q, k, v, d_o)
    same = all(torch.equal(a, b) for a, b in zip(ring, single))
    c.report(same, "a ring of one rank is the op bit for bit (O, dQ, dK, dV)")


def check_refusals(c):
    from fa_attention.distributed import gather, ring_attention, shard, ulysses_attention
    P, n = c.world, 2 * c.world * CHUNK
    x = torch.zeros(1, 2 * P, n // P, D)
    c.refused(lambda: ring_attention(x, x, x, split="striped"), ["'striped'", "'zigzag'", "'plain'"], "a split name")
    c.refused(lambda: shard(torch.zeros(1, 1, 2 * P + 1, D)), [str(2 * P + 1), str(2 * P)],
              "a length that 2P chunks do not divide")
    c.refused(lambda: gather(torch.zeros(1, 1, 3, D)), ["odd length 3"], "gathering an odd zigzag shard")
    c.refused(lambda: ring_attention(x, x[:, :, :2], x[:, :, :2], causal=True, split="plain"),
              [f"n = {n // P}", "n_k = 2"], "a causal ring with n_k != n")
    odd = torch.zeros(1, 2, 3, D)
    c.refused(lambda: ring_attention(odd, odd, odd), ["n = 3"], "an odd zigzag shard")
    c.refused(lambda: ring_attention(x, x, x[..., :8]), ["k (1,", "v (1,"], "k and v of different shapes")
    c.refused(lambda: ring_attention(x, x[:, :3], x[:, :3]), ["kv heads 3", f"heads {2 * P}"], "GQA heads")
    c.refused(lambda: ring_attention(x[0], x, x), ["4-D"], "a 3-D q")
    c.refused(lambda: ring_attention(x.double(), x, x), ["torch.float64"], "mixed dtypes")
    y = torch.zeros(1, P + 1, n // P, D)
    c.refused(lambda: ulysses_attention(y, y, y), [f"heads ({P + 1})", f"by {P}"], "heads not divisible by P")
    y = torch.zeros(1, 2 * P, n // P, D)
    z = torch.zeros(1, 1, n // P, D)
    c.refused(lambda: ulysses_attention(y, z, z), ["kv heads (1)"], "kv heads not divisible by P")
    # Ranks that disagree: rank 0's shard is two rows longer. Every rank sees every shape and
    # every rank refuses, none is left waiting.
    rows = n // P + (2 if c.rank == 0 else 0)
    w = torch.zeros(1, 2 * P, rows, D)
    c.refused(lambda: ring_attention(w, w, w), ["disagree", f"rank 0: q [1, {2 * P}, {n // P + 2}"],
              "shards of different shapes on different ranks")
    c.refused(lambda: ulysses_attention(w, w, w), ["disagree"], "different shapes (Ulysses)")


def worker(rank, world, store_path, results):
    torch.set_num_threads(1)
    from fa_attention.distributed import ring_attention, ulysses_attention
    c = Checks(rank, world)
    x = torch.zeros(1, 2, 4, D)
    c.refused(lambda: ring_attention(x, x, x), ["not initialised", "init_process_group"], "no process group")
    dist.init_process_group("gloo", store=dist.FileStore(store_path, world), rank=rank, world_size=world,
                            timeout=timedelta(seconds=30))  # a hang becomes an error
    try:
        for strategy in (ring_attention, ulysses_attention):
            for causal in (False, True):
                for split in ("zigzag", "plain"):
                    check_strategy(c, strategy, causal, split)
        check_strategy(c, ring_attention, False, "zigzag", n_k_factor=2)   # keys longer than queries
        check_strategy(c, ulysses_attention, True, "zigzag", n_k_factor=2)  # bottom-right, Nk = 2 Nq
        if world == 2:
            check_refusals(c)
            check_one_rank_ring(c)
        dist.barrier()
    finally:
        dist.destroy_process_group()
    results.put((rank, c.count, c.failed))


DEAD_RANK_TIMEOUT_S = 10


def dead_rank_worker(rank, world, store_path, results):
    """Rank 1 leaves before the ring starts; rank 0 must get an error, not wait forever."""
    import time
    torch.set_num_threads(1)
    from fa_attention.distributed import ring_attention
    dist.init_process_group("gloo", store=dist.FileStore(store_path, world), rank=rank, world_size=world,
                            timeout=timedelta(seconds=DEAD_RANK_TIMEOUT_S))
    if rank == 1:
        os._exit(0)  # a rank that dies: no clean-up, its sockets simply close
    x = torch.randn(1, 2, 8, D)
    start = time.monotonic()
    try:
        ring_attention(x, x, x, causal=True, check=False)
        results.put((rank, ["a ring with a dead rank returned instead of raising"]))
    except RuntimeError as e:  # gloo: the peer closed, or the group's timeout
        took = time.monotonic() - start
        late = took > DEAD_RANK_TIMEOUT_S + 20
        results.put((rank, [f"the error came after {took:.0f} s (timeout {DEAD_RANK_TIMEOUT_S} s): {e}"] if late else []))
    os._exit(0)  # the group cannot be destroyed cleanly without its other rank


def check_dead_rank(ctx):
    """The failures of a ring whose rank 1 died (one entry per problem; empty when rank 0 raised)."""
    results = ctx.SimpleQueue()
    with tempfile.TemporaryDirectory() as tmp:
        procs = [ctx.Process(target=dead_rank_worker, args=(r, 2, os.path.join(tmp, "store"), results))
                 for r in range(2)]
        for proc in procs:
            proc.start()
        for proc in procs:
            proc.join(DEAD_RANK_TIMEOUT_S + 60)
        hung = [proc for proc in procs if proc.is_alive()]
        for proc in hung:
            proc.kill()
    if hung:
        return ["a ring with a dead rank hung (rank 0 still waiting after the timeout and a minute)"]
    failures = []
    while not results.empty():
        failures += results.get()[1]
    return failures if failures or procs[0].exitcode == 0 else [f"rank 0 exited with {procs[0].exitcode}"]


def main():
    if not HAVE_GLOO:
        print("skipped: torch with torch.distributed and gloo is not installed")
        return 77
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")  # the ranks are processes of this machine
    # fork: the children share this process's imports (fast); this process computes nothing
    # before, so no thread pool is copied half-started. torch imports symbolic_shapes (and
    # sympy with it, 0.5 CPU-s) at a process's first backward: imported here, it is imported
    # once instead of once per rank (9 ranks in all).
    import torch.fx.experimental.symbolic_shapes  # noqa: F401
    ctx = mp.get_context("fork")
    passed, failed = 0, []
    for world in WORLD_SIZES:
        results = ctx.SimpleQueue()
        with tempfile.TemporaryDirectory() as tmp:
            try:
                mp.start_processes(worker, (world, os.path.join(tmp, "store"), results), nprocs=world,
                                   start_method="fork")
            except Exception as e:  # noqa: BLE001 (a rank that died: report and go on)
                failed.append(f"P={world}: a rank failed: {e}")
        while not results.empty():
            rank, count, bad = results.get()
            if rank == 0:
                passed += count - len(bad)
            failed += [f"P={world} rank {rank}: {b}" for b in bad]
    dead = check_dead_rank(ctx)
    failed += [f"dead rank: {f}" for f in dead]
    passed += 0 if dead else 1
    for f in failed:
        print(f"FAIL {f}")
    print(f"{passed} checks passed on rank 0, {len(failed)} failures")
    return 1 if failed else 0


def test_distributed():  # pytest
    assert main() == 0


if __name__ == "__main__":
    sys.exit(main())
