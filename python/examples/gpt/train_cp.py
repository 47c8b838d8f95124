"""The recall model trained with context parallelism: each sequence split across the P processes
of a torch.distributed group, its attention the ring of fa_attention.distributed.

    torchrun --nproc-per-node 4 python/examples/gpt/train_cp.py --seq 65536 --steps 400 --out OUT
    torchrun --nproc-per-node 1 python/examples/gpt/train_cp.py --seq 65536 --steps 400 --out OUT

Every rank builds the same model (one seed) and makes the same whole batch (data.RecallData,
one seed per step), then keeps its zigzag shard of each sequence: chunks r and 2P−1−r of 2P.
Everything in the model but attention works token by token, so a rank computes its own tokens'
embeddings, MLPs and logits alone; attention is `ring_attention`, which passes the shards of K
and V around the ring (stage 12's idea as an autograd function). Two things a shard cannot
take from its own tokens are handed in whole: each token's place in the sequence (the rotary
angles) and the token before it (the recall model's previous-token embedding).

The loss is the whole batch's mean: each rank sums the cross-entropy of its tokens and divides
by the number of scored tokens in the whole batch (every rank has the whole targets). The
gradient of every weight is then the sum of the ranks' gradients (an all_reduce), the same
number a single process computes from the whole sequence up to the order of the additions:
with P = 1 this script is plain training, which is what a context-parallel run is held to
(tests/test_gpt_cp.py on CPU processes; on GPUs the two loss curves side by side).

Writes OUT/cp_P{P}_N{seq}.csv (rank 0): device, commit ($FA_COMMIT), ranks, step, seq, loss, val_loss,
val_accuracy, tokens_per_s (validation every --eval-every steps and at the last; tokens/s from
step 10 on). scripts/results/cp_table.py makes the table of the notes from these files.
"""
import argparse
import csv
import math
import os
import pathlib
import sys
import time
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.nn.functional as F

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))  # python/: fa_attention

from data import RecallData  # noqa: E402
from fa_attention.distributed import ring_attention, shard  # noqa: E402
from model import GPT, GPTConfig  # noqa: E402


class ContextParallel:
    """One rank's view of a batch: its shard of every sequence, and the model run on it."""

    def __init__(self, model, group, stage, split="zigzag"):
        self.model, self.group, self.split = model, group, split
        self.P = dist.get_world_size(group)
        for block in model.blocks:  # every attention layer becomes the ring over the group
            block.attn.attend = lambda q, k, v: ring_attention(q.contiguous(), k.contiguous(), v.contiguous(),
                                                               group=group, causal=True, split=split, stage=stage,
                                                               check=False)

    def cut(self, x, dim=1):
        return shard(x, group=self.group, split=self.split, dim=dim)

    def loss_and_counts(self, inputs, targets):
        """This rank's share of the batch's mean loss (its tokens' summed cross-entropy over the
        whole batch's scored count), its correct answers and that count."""
        T = inputs.shape[1]
        previous = F.pad(inputs[:, :-1], (1, 0))           # the token before each, from the whole sequence
        positions = torch.arange(T, device=inputs.device)
        tok, prev, tgt = self.cut(inputs), self.cut(previous), self.cut(targets)
        logits, _ = self.model(tok, None, positions=self.cut(positions, dim=0), previous=prev)
        scored = int((targets != -1).sum())                # the whole batch's, known on every rank
        loss = F.cross_entropy(logits.float().flatten(0, 1), tgt.flatten(), ignore_index=-1,
                               reduction="sum") / scored
        correct = ((logits.argmax(-1) == tgt) & (tgt != -1)).sum()
        return loss, correct, scored

    def all_reduce_grads(self):
        """Every weight's gradient summed over the ranks (one flat buffer: one collective)."""
        grads = [p.grad for p in self.model.parameters() if p.grad is not None]
        flat = torch.cat([g.flatten() for g in grads])
        dist.all_reduce(flat, group=self.group)
        offset = 0
        for g in grads:
            g.copy_(flat[offset:offset + g.numel()].view_as(g))
            offset += g.numel()


def lr_at(step, lr, total, warmup):
    """Linear warm-up, then a cosine decay to a tenth of the peak (train.py's schedule)."""
    if step < warmup:
        return lr * (step + 1) / warmup
    progress = min(1.0, (step - warmup) / max(1, total - warmup))
    return lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))


def make_parser():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seq", type=int, default=65536, help="sequence length N (the whole sequence)")
    ap.add_argument("--pairs", type=int, default=16)
    ap.add_argument("--batch", type=int, default=1, help="sequences of N tokens per step")
    ap.add_argument("--steps", type=int, default=400)
    ap.add_argument("--curriculum", default="64:0.3,512:0.5",
                    help="shorter sequences first, LENGTH:FRACTION of the steps (as many tokens per step)")
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--eval-every", type=int, default=50)
    ap.add_argument("--eval-batches", type=int, default=1)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--head-dim", type=int, default=64)
    ap.add_argument("--stage", default=None, help="the op's stage per block (default: 11 on Hopper, 09 on "
                                                   "other GPUs, 06 on the CPU)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=None, help="folder for the CSV (rank 0)")
    ap.add_argument("--timeout-s", type=int, default=300, help="the process group's timeout")
    return ap


def build(args, group, device):
    """(data, model, ContextParallel) of a run: the same on every rank (one seed)."""
    P = dist.get_world_size(group)
    phases = tuple((int(n), int(args.steps * float(f))) for n, f in
                   (item.split(":") for item in args.curriculum.split(",") if item) if int(n) < args.seq)
    data = RecallData(seq=args.seq, pairs=args.pairs, batch=args.batch, seed=args.seed, phases=phases)
    for n in [args.seq] + [n for n, _ in phases]:
        if n % (2 * P):
            raise ValueError(f"train_cp: a sequence of {n} tokens does not cut into 2P = {2 * P} equal chunks")
    cfg = GPTConfig(context=args.seq, n_layer=args.layers, n_head=args.heads, head_dim=args.head_dim,
                    previous_token=True)
    torch.manual_seed(args.seed)
    model = GPT(cfg, attend=None).to(device)               # the same weights on every rank
    return data, model, ContextParallel(model, group, args.stage)  # None: the device's fastest stage


def train(args, group, device, log=print):
    """Trains on this rank; returns the rows (every rank computes the same losses) and the model."""
    P = dist.get_world_size(group)
    data, model, cp = build(args, group, device)
    params = [p for p in model.parameters() if p.requires_grad]
    groups = [{"params": [p for p in params if p.dim() >= 2], "weight_decay": 0.1},
              {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}]
    opt = torch.optim.AdamW(groups, lr=args.lr, betas=(0.9, 0.95))
    warmup = max(1, min(100, args.steps // 10))
    cuda = device.type == "cuda"
    autocast = torch.autocast("cuda", dtype=torch.bfloat16) if cuda else torch.autocast("cpu", enabled=False)
    val = data.val_batches(args.eval_batches)

    def on_device(batch):
        return tuple(torch.from_numpy(x).to(device) for x in batch)

    def evaluate():
        model.eval()
        loss_sum = torch.zeros(2, dtype=torch.float64, device=device)   # Σ loss·count, Σ correct
        count = 0
        with torch.no_grad(), autocast:
            for batch in val:
                loss, correct, scored = cp.loss_and_counts(*on_device(batch))
                loss_sum += torch.stack([loss.double() * scored, correct.double()])
                count += scored
        dist.all_reduce(loss_sum, group=group)
        model.train()
        return (loss_sum[0] / count).item(), (loss_sum[1] / count).item()

    rows = []
    for step in range(args.steps):
        inputs, targets = on_device(data.train_batch(step))
        for g in opt.param_groups:
            g["lr"] = lr_at(step, args.lr, args.steps, warmup)
        if cuda:
            torch.cuda.synchronize()
        start = time.perf_counter()
        with autocast:
            loss, _, _ = cp.loss_and_counts(inputs, targets)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        cp.all_reduce_grads()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        whole = loss.detach().clone()
        dist.all_reduce(whole, group=group)                # the batch's mean loss
        if cuda:
            torch.cuda.synchronize()
        seconds = time.perf_counter() - start
        row = dict(step=step, seq=data.seq_at(step), loss=whole.item(), val_loss=None, val_accuracy=None,
                   tokens_per_s=inputs.numel() / seconds if step >= 10 else None)
        if step % args.eval_every == 0 or step == args.steps - 1:
            row["val_loss"], row["val_accuracy"] = evaluate()
            log(f"  P={P} step {step:5d} seq {row['seq']:6d}  loss {row['loss']:.4f}  "
                f"val_loss {row['val_loss']:.4f}  val_acc {row['val_accuracy']:.3f}")
        rows.append(row)
    return rows, model


def main():
    args = make_parser().parse_args()
    cuda = torch.cuda.is_available()
    backend = "nccl" if cuda else "gloo"
    if cuda:
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
    dist.init_process_group(backend, timeout=timedelta(seconds=args.timeout_s))
    rank, P = dist.get_rank(), dist.get_world_size()
    device = torch.device("cuda", torch.cuda.current_device()) if cuda else torch.device("cpu")
    log = print if rank == 0 else (lambda *a, **k: None)
    log(f"train_cp: P = {P} ({backend}), N = {args.seq}, {args.steps} steps")
    try:
        rows, _ = train(args, dist.group.WORLD, device, log)
    except ValueError as e:
        print(f"rank {rank}: {e}", file=sys.stderr)
        dist.destroy_process_group()
        return 2
    if rank == 0 and args.out:
        out = pathlib.Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        name = out / f"cp_P{P}_N{args.seq}.csv"
        device_name = torch.cuda.get_device_name() if cuda else "cpu"
        with name.open("w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=["device", "commit", "ranks", "step", "seq", "loss", "val_loss",
                                              "val_accuracy", "tokens_per_s"])
            w.writeheader()
            commit = os.environ.get("FA_COMMIT", "unknown")
            for r in rows:
                w.writerow(dict(device=device_name, commit=commit, ranks=P, **r))
        timed = [r["tokens_per_s"] for r in rows if r["tokens_per_s"] and r["seq"] == args.seq]
        if timed:
            log(f"train_cp: {sorted(timed)[len(timed) // 2]:,.0f} tokens/s at N = {args.seq} (median); wrote {name}")
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
