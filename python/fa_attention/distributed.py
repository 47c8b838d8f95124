"""Context parallelism: one attention over a sequence split across the ranks of a
torch.distributed process group, forward and backward (stage 12's ring, over torch.distributed).

    import torch.distributed as dist
    from fa_attention.distributed import shard, gather, ring_attention, ulysses_attention
    q, k, v = (shard(x, group) for x in (q_full, k_full, v_full))  # this rank's rows (zigzag)
    out = ring_attention(q, k, v, group, causal=True)              # this rank's rows of O
    out.backward(d_out)                                            # dq, dk, dv of those rows
    o_full = gather(out, group)                                    # every rank: all rows, in order

Each rank holds the rows of its shard of the sequence: q [b, h, n, d], k and v [b, hkv, n_k, d],
n = N/P. Which rows is the split (stage 12's names):
  "zigzag"  2P chunks of N/(2P) rows; rank r holds chunks r and 2P-1-r, in that order
            (under the causal mask every rank then does the same work);
  "plain"   P chunks of N/P rows; rank r holds chunk r.
shard() cuts a whole tensor so, and gather() puts the shards back in order.

Two strategies, both differentiable, both calling the project's op on each block
(torch.ops.fa_attention.forward / backward, with the stage named by `stage`):
  ring_attention     K/V travel a ring of ranks (P-1 sends of one K/V shard per rank), and
                     each rank merges the partial (O, L) of every block by the log-sum-exp
                     rule; the backward sends dK, dV around with their K/V.
  ulysses_attention  two all-to-alls turn "all heads, n rows" into "h/P heads, all N rows";
                     one attention per rank over the whole sequence; one all-to-all back.
                     Needs h and hkv divisible by P.

Backends: NCCL on CUDA tensors (fp16, bf16, fp32 as the stage allows), gloo on CPU tensors
(float32, a CPU stage such as "06"). `stage` None means the fastest stage of the device: "11"
on Hopper (10's forward with 11's backward), "09" on other GPUs (08's forward with 09's
backward), "06" on the CPU. Bad input raises ValueError naming the value and
what is allowed. With check=True (the default) the ranks also compare their shapes with each
other first: one small all_gather and a wait for its result, worth it because ranks that
disagree would otherwise wait on each other until the process group's timeout.

Causal is bottom-right as in the op; the ring's causal mask needs n_q = n_k (self-attention).
The notes: stages/12_ring_attention/README.md, "The ring over torch.distributed".
"""
import math

import torch
import torch.distributed as dist

# The op (importing torch_ops loads it): torch.ops.fa_attention.forward / backward,
#   _forward(q, k, v, causal, scale, stage) -> (O, L)
#   _backward(q, k, v, O, L, dO, causal, scale, stage) -> (dQ, dK, dV)
from fa_attention.torch_ops import _backward, _forward

SPLITS = ("zigzag", "plain")


# ---- the group, the split, the checks ----

def _group_size_rank(group, who):
    """(P, this process's rank in the group), or a ValueError that says why there is none."""
    if not (dist.is_available() and dist.is_initialized()):
        raise ValueError(f"{who}: torch.distributed is not initialised: call torch.distributed.init_process_group "
                         "first (backend 'nccl' for CUDA tensors, 'gloo' for CPU tensors)")
    rank = dist.get_rank(group)
    if rank < 0:
        raise ValueError(f"{who}: this process (global rank {dist.get_rank()}) is not a member of the group")
    return dist.get_world_size(group), rank


def _check_split(split, who):
    if split not in SPLITS:
        raise ValueError(f"{who}: split = {split!r} is not one of {', '.join(map(repr, SPLITS))}")


def _chunks_of(rank, P, split):
    """The chunks rank `rank` holds, in the order its shard stores them, out of 2P (zigzag) or P."""
    return [rank, 2 * P - 1 - rank] if split == "zigzag" else [rank]


def shard(x, group=None, split="zigzag", dim=2):
    """This rank's shard of the whole tensor x (the same on every rank) along `dim`: chunks r and
    2P-1-r of 2P (zigzag) or chunk r of P (plain), as a new contiguous tensor. Differentiable."""
    P, rank = _group_size_rank(group, "shard")
    _check_split(split, "shard")
    chunks = 2 * P if split == "zigzag" else P
    n = x.shape[dim]
    if n % chunks:
        raise ValueError(f"shard: the {split} split over {P} ranks cuts dim {dim} into {chunks} chunks of equal "
                         f"length, but its length {n} is not a multiple of {chunks}")
    pieces = x.chunk(chunks, dim)
    return torch.cat([pieces[c] for c in _chunks_of(rank, P, split)], dim)


def gather(x, group=None, split="zigzag", dim=2):
    """Every rank's shard of `split` along `dim`, put back in the sequence's order (all_gather):
    the whole tensor, on every rank. Not differentiable: it is for checking and for output."""
    P, _ = _group_size_rank(group, "gather")
    _check_split(split, "gather")
    if split == "zigzag" and x.shape[dim] % 2:
        raise ValueError(f"gather: a zigzag shard holds two chunks of equal length, but dim {dim} has odd "
                         f"length {x.shape[dim]}")
    shards = [torch.empty_like(x, memory_format=torch.contiguous_format) for _ in range(P)]
    dist.all_gather(shards, x.contiguous(), group=group)
    chunks = [None] * (2 * P if split == "zigzag" else P)
    for rank, s in enumerate(shards):
        for c, piece in zip(_chunks_of(rank, P, split), s.chunk(len(_chunks_of(rank, P, split)), dim)):
            chunks[c] = piece
    return torch.cat(chunks, dim)


_DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.float64)


def _check_inputs(q, k, v, group, split, causal, who, check):
    """Refuses what cannot run, with the value and what is allowed; returns (P, rank)."""
    P, rank = _group_size_rank(group, who)
    _check_split(split, who)
    if q.dim() != 4 or k.dim() != 4 or v.dim() != 4:
        raise ValueError(f"{who}: q, k, v must be 4-D ([b, h, n, d], [b, hkv, n_k, d]); got {tuple(q.shape)}, "
                         f"{tuple(k.shape)}, {tuple(v.shape)}")
    if k.shape != v.shape or k.shape[0] != q.shape[0] or k.shape[3] != q.shape[3]:
        raise ValueError(f"{who}: k and v must have one shape [b, hkv, n_k, d] with q's b and d; got q "
                         f"{tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}")
    if k.shape[1] == 0 or q.shape[1] % k.shape[1]:
        raise ValueError(f"{who}: kv heads {k.shape[1]} must divide heads {q.shape[1]} (GQA)")
    if not (q.device == k.device == v.device) or not (q.dtype == k.dtype == v.dtype):
        raise ValueError(f"{who}: q, k, v must share one device and dtype; got {q.device}/{q.dtype}, "
                         f"{k.device}/{k.dtype}, {v.device}/{v.dtype}")
    backend = str(dist.get_backend(group))
    wanted = {"cuda": "nccl", "cpu": "gloo"}.get(q.device.type)
    if wanted is None or wanted not in backend:
        raise ValueError(f"{who}: {q.device.type} tensors on a {backend!r} process group: use 'nccl' with CUDA "
                         "tensors or 'gloo' with CPU tensors")
    if split == "zigzag" and (q.shape[2] % 2 or k.shape[2] % 2):
        raise ValueError(f"{who}: a zigzag shard holds two chunks of equal length, but the local lengths are "
                         f"n = {q.shape[2]}, n_k = {k.shape[2]} (shard() cuts N into 2P chunks)")
    if check and P > 1:
        _check_same_on_every_rank(q, k, group, split, causal, who)
    return P, rank


def _check_same_on_every_rank(q, k, group, split, causal, who):
    """Every rank must call with the same shapes, dtype, mask and split: one all_gather of a few
    numbers, so that every rank sees every other's and all refuse together (no rank left waiting)."""
    mine = [*q.shape, k.shape[1], k.shape[2], _DTYPES.index(q.dtype) if q.dtype in _DTYPES else -1,
            int(causal), SPLITS.index(split)]
    numbers = torch.tensor(mine, dtype=torch.float64, device=q.device)
    everyone = [torch.empty_like(numbers) for _ in range(dist.get_world_size(group))]
    dist.all_gather(everyone, numbers, group=group)
    rows = [[int(x) for x in t.tolist()] for t in everyone]
    if any(row != rows[0] for row in rows):
        said = "; ".join(f"rank {r}: q {row[:4]}, kv heads {row[4]}, n_k {row[5]}, dtype "
                         f"{_DTYPES[row[6]] if row[6] >= 0 else '?'}, causal {bool(row[7])}, split {SPLITS[row[8]]}"
                         for r, row in enumerate(rows))
        raise ValueError(f"{who}: the ranks disagree on their shards (every rank must hold a shard of the same "
                         f"shape, dtype, mask and split): {said}")


def _default_stage(q, stage):
    """The fastest stage for q's device: 11 (10's forward) on Hopper, 09 on other GPUs, 06 on the CPU."""
    if stage is not None:
        return stage
    if not q.is_cuda:
        return "06"
    return "11" if torch.cuda.get_device_capability(q.device)[0] == 9 else "09"


# ---- the ring: a transport, the merge, the blocks ----

class _Ring:
    """One exchange on the ring at a time: send a tensor to the next rank, receive one of the
    same shape from the previous (stage 12's Transport: start, compute, finish).

    On NCCL, batch_isend_irecv runs the transfer on the process group's own CUDA stream, which
    first waits for what the current stream has queued (so the tensor sent is written); the
    attention queued after start() runs beside it, and finish() makes the current stream, not
    the host, wait for the transfer. That internal stream is the side stream; the caching
    allocator knows the tensors are in use there. On gloo the transfer runs on gloo's threads and
    finish() waits on the host. Both backends take batch_isend_irecv (on gloo it posts the
    isend and irecv one by one); the tag keeps the K/V ring and the dK/dV ring apart on gloo."""

    def __init__(self, group, tag):
        P, rank = dist.get_world_size(group), dist.get_rank(group)
        group = group if group is not None else dist.group.WORLD
        self.group, self.tag = group, tag
        # P2POp names its peer by global rank (the rank in the default group).
        self.next = dist.get_global_rank(group, (rank + 1) % P)
        self.prev = dist.get_global_rank(group, (rank - 1) % P)
        self.pending = None

    def start(self, send):
        receive = torch.empty_like(send)
        ops = [dist.P2POp(dist.isend, send, self.next, self.group, self.tag),
               dist.P2POp(dist.irecv, receive, self.prev, self.group, self.tag)]
        self.pending = (dist.batch_isend_irecv(ops), receive)

    def finish(self):
        requests, receive = self.pending
        for request in requests:
            request.wait()
        self.pending = None
        return receive


def _merge(O_acc, L_acc, O_part, L_part):
    """(O, L) over the union of two disjoint key sets from each set's (O, L): stage 12's rule
    (merge.h), in fp32. O [b, h, n, d], L [b, h, n]; returns new tensors.
    L = log(e^{L_acc} + e^{L_part}),  O = e^{L_acc − L}·O_acc + e^{L_part − L}·O_part,
    evaluated with t = e^{L_small − L_big} ≤ 1: L = L_big + log(1 + t), weights 1/(1+t) and
    t/(1+t), so nothing overflows and the weights do not carry the rounding of L."""
    acc_bigger = L_acc >= L_part  # False where either is NaN: the NaN then reaches t, L and both weights
    L_big = torch.where(acc_bigger, L_acc, L_part)
    L_small = torch.where(acc_bigger, L_part, L_acc)
    # A side that saw no key (L = −∞, O = 0) has no weight; two such give L = −∞, not −∞ − (−∞) = NaN.
    t = torch.where(L_big == -math.inf, 0.0, torch.exp(L_small - L_big))
    L = L_big + torch.log1p(t)
    w_big, w_small = 1.0 / (1.0 + t), t / (1.0 + t)
    w_acc = torch.where(acc_bigger, w_big, w_small).unsqueeze(-1)  # [b, h, n, 1]
    w_part = torch.where(acc_bigger, w_small, w_big).unsqueeze(-1)
    return w_acc * O_acc + w_part * O_part, L


def _block(rank, owner, n, n_k, split, causal):
    """Which part of the K/V shard of rank `owner` this rank's queries attend to: (query rows,
    key rows, causal) as slices of the local shards (n query rows, n_k key rows), or None when no
    query sees any of its keys. With the causal mask (n = n_k; stage 12, "The split and the
    three kinds of pair"):
      - owner = rank: the diagonal. The shard's own bottom-right mask is the problem's: in a
        zigzag shard [chunk r; chunk 2P-1-r] the early rows see the early keys causally and no
        late key, the late rows every early key and the late keys causally, which is the n x n
        mask of the shard itself, because both chunks have n/2 rows and r < 2P-1-r.
      - plain: an earlier owner's keys are all visible (a full block), a later owner's none.
      - zigzag, an earlier owner (owner < rank): its early chunk lies before both of ours and its
        late chunk after both: all our rows against its first half of keys.
      - zigzag, a later owner: both its chunks lie between our two: our late half of rows against
        all of its keys, our early half against none.
    Every zigzag step after the first is then n·n/2 score entries on every rank: the balance."""
    # [torch block]
    rows, keys = slice(0, n), slice(0, n_k)
    if not causal:
        return rows, keys, False
    if owner == rank:
        return rows, keys, True
    if split == "plain":
        return (rows, keys, False) if owner < rank else None
    if owner < rank:
        return rows, slice(0, n_k // 2), False
    return slice(n // 2, n), keys, False
    # [torch block]


# ---- ring attention ----

class _RingAttention(torch.autograd.Function):

    @staticmethod
    def forward(ctx, q, k, v, group, causal, scale, stage, split):
        P, rank = dist.get_world_size(group), dist.get_rank(group)
        n = q.shape[2]
        # [torch ring forward]
        kv_ring = _Ring(group, tag=0)
        kv = torch.stack((k, v))  # [2, b, hkv, n, d]: K and V of one shard travel as one message
        O_acc = torch.zeros(q.shape, dtype=torch.float32, device=q.device)          # [b, h, n, d]
        L_acc = torch.full(q.shape[:3], -math.inf, dtype=torch.float32, device=q.device)  # [b, h, n]: no key yet
        for step in range(P):
            owner = (rank - step) % P  # whose K/V is in hand: they move one rank on per step
            more = step + 1 < P
            if more:  # pass the shard on while computing with it: the next rank needs it next step
                kv_ring.start(kv)
            block = _block(rank, owner, n, k.shape[2], split, causal)
            if block is not None:
                rows, keys, block_causal = block
                O_part, L_part = _forward(q[:, :, rows], kv[0][:, :, keys], kv[1][:, :, keys], block_causal,
                                          scale, stage)
                O_acc[:, :, rows], L_acc[:, :, rows] = _merge(O_acc[:, :, rows], L_acc[:, :, rows],
                                                              O_part.float(), L_part)
            if more:
                kv = kv_ring.finish()
        O = O_acc.to(q.dtype)  # rounded once, as one call's O
        # [torch ring forward]
        ctx.save_for_backward(q, k, v, O, L_acc)
        ctx.ring = (group, causal, scale, stage, split)
        return O

    @staticmethod
    def backward(ctx, dO):
        q, k, v, O, L = ctx.saved_tensors
        group, causal, scale, stage, split = ctx.ring
        P, rank = dist.get_world_size(group), dist.get_rank(group)
        n = q.shape[2]
        dO = dO.contiguous()
        kv_ring, dkv_ring = _Ring(group, tag=0), _Ring(group, tag=1)
        kv = torch.stack((k, v))
        dq = torch.zeros(q.shape, dtype=torch.float32, device=q.device)
        for step in range(P):
            owner = (rank - step) % P
            more = step + 1 < P
            if more:
                kv_ring.start(kv)
            # This step's part of dK, dV of the shard in hand, in a tensor of its own: last step's
            # sums may still be on their way to the next rank. fp32: they are summed over P ranks.
            dkv = torch.zeros(kv.shape, dtype=torch.float32, device=q.device)  # [2, b, hkv, n, d]
            block = _block(rank, owner, n, k.shape[2], split, causal)
            if block is not None:
                rows, keys, block_causal = block
                # The whole problem's O and L for these rows: P_ij = e^{S_ij − L_i} and D_i are the
                # whole problem's, so the block's dQ, dK, dV are exact parts of the whole.
                dq_part, dk_part, dv_part = _backward(q[:, :, rows], kv[0][:, :, keys], kv[1][:, :, keys],
                                                      O[:, :, rows], L[:, :, rows], dO[:, :, rows],
                                                      block_causal, scale, stage)
                dq[:, :, rows] += dq_part
                dkv[0][:, :, keys] += dk_part
                dkv[1][:, :, keys] += dv_part
            if P > 1:
                # The sums of this shard from the ranks that held it before join ours, and the
                # total moves on: after the last step the next rank is the shard's owner.
                if step > 0:
                    dkv += dkv_ring.finish()
                dkv_ring.start(dkv)
            if more:
                kv = kv_ring.finish()
        if P > 1:
            dkv = dkv_ring.finish()  # the sums of our own shard, from every rank, home
        return dq.to(q.dtype), dkv[0].to(k.dtype), dkv[1].to(v.dtype), None, None, None, None, None


def ring_attention(q, k, v, group=None, causal=False, split="zigzag", stage=None, scale=None, check=True):
    """softmax(scale · q kᵀ [+ causal mask]) v over the whole sequence, for this rank's rows.
    q [b, h, n, d], k and v [b, hkv, n, d] (n_k may differ from n without the mask): this rank's
    shards of `split` (shard()). Returns this rank's rows of O; differentiable in q, k, v."""
    P, _ = _check_inputs(q, k, v, group, split, causal, "ring_attention", check)
    if causal and q.shape[2] != k.shape[2]:
        raise ValueError(f"ring_attention: the causal ring needs as many key rows as query rows per rank "
                         f"(self-attention); got n = {q.shape[2]}, n_k = {k.shape[2]}")
    scale = 0.0 if scale is None else float(scale)  # 0 means 1/sqrt(d) to the op
    return _RingAttention.apply(q.contiguous(), k.contiguous(), v.contiguous(), group, bool(causal), scale,
                                _default_stage(q, stage), split)


# ---- Ulysses: all-to-all over heads ----

class _AllToAll(torch.autograd.Function):
    """x [P, ...]: piece i goes to rank i, and piece j of the result came from rank j. Its
    gradient goes back the same way: the same all-to-all on the gradient."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        x = x.contiguous()  # all_to_all_single cuts dim 0 of the memory as it lies
        out = torch.empty_like(x)
        dist.all_to_all_single(out, x, group=group)
        return out

    @staticmethod
    def backward(ctx, grad):
        return _AllToAll.apply(grad.contiguous(), ctx.group), None


def _natural_order(P, n, device):
    """Indices that put the rows of the P gathered zigzag shards (rank order: chunks 0, 2P-1, 1,
    2P-2, ...) into the sequence's order; their argsort puts them back."""
    c = n // 2  # rows per chunk
    position = [2 * chunk if chunk < P else 2 * (2 * P - 1 - chunk) + 1 for chunk in range(2 * P)]
    return torch.cat([torch.arange(p * c, (p + 1) * c, device=device) for p in position])


def _seq_to_heads(x, group, split):
    """[b, h, n, d], n rows of every head -> [b, h/P, N, d], every row of this rank's h/P heads."""
    P = dist.get_world_size(group)
    b, h, n, d = x.shape
    x = x.reshape(b, P, h // P, n, d).transpose(0, 1)      # [P, b, h/P, n, d]: piece i, heads of rank i
    x = _AllToAll.apply(x, group)                            # [P, b, h/P, n, d]: piece j, rows of rank j
    x = x.permute(1, 2, 0, 3, 4).reshape(b, h // P, P * n, d)  # [b, h/P, N, d], rows in rank order
    if split == "zigzag":
        x = x.index_select(2, _natural_order(P, n, x.device))
    return x


def _heads_to_seq(x, group, split):
    """The inverse of _seq_to_heads: [b, h/P, N, d] -> [b, h, n, d]."""
    P = dist.get_world_size(group)
    b, hp, N, d = x.shape
    n = N // P
    if split == "zigzag":
        x = x.index_select(2, torch.argsort(_natural_order(P, n, x.device)))
    x = x.reshape(b, hp, P, n, d).permute(2, 0, 1, 3, 4)   # [P, b, h/P, n, d]: piece j, rows of rank j
    x = _AllToAll.apply(x, group)                            # [P, b, h/P, n, d]: piece i, heads of rank i
    return x.transpose(0, 1).reshape(b, P * hp, n, d)


def ulysses_attention(q, k, v, group=None, causal=False, split="zigzag", stage=None, scale=None, check=True):
    """The same result as ring_attention(), by all-to-all: q, k, v go from "every head, this
    rank's rows" to "h/P heads (hkv/P kv heads), every row", the op attends over the whole
    sequence, and O comes back. h and hkv must be divisible by P. Differentiable: the backward is
    the same all-to-alls reversed around the op's backward."""
    P, _ = _check_inputs(q, k, v, group, split, causal, "ulysses_attention", check)
    h, hkv = q.shape[1], k.shape[1]
    if h % P or hkv % P:
        raise ValueError(f"ulysses_attention: scatters the heads over the {P} ranks, so heads ({h}) and kv heads "
                         f"({hkv}) must both be divisible by {P}; use ring_attention for these")
    q, k, v = (_seq_to_heads(t, group, split) for t in (q, k, v))
    # The op with its own autograd (python/csrc/fa_torch.cpp): query head i of this rank's h/P
    # reads kv head i // (h/hkv) of its hkv/P, the same pairing as on the whole.
    o = _forward(q, k, v, bool(causal), 0.0 if scale is None else float(scale), _default_stage(q, stage))[0]
    return _heads_to_seq(o, group, split)
