"""Training one model with one attention backend: the loop, its evaluation and its clock.

    trainer = Trainer(data, cfg, "08+09", device, lr=1e-3, total_steps=500)
    rows = run(trainer, steps=500, eval_every=50, val=data.val_batches(4))

With documents=True (data.TextData(documents=True)) every token attends only within its file:
the batches carry each token's document, and the backend must take a document mask
(model.DOCUMENT_BACKENDS: stage 13 with cu_seqlens, or sdpa with the dense mask).

Every backend starts from the same weights (the model is built on the CPU after
torch.manual_seed(seed)) and sees the same batches (data.train_batch(step)), so their loss
curves differ only by the attention's rounding. On a GPU the forward and backward run under
bf16 autocast (the stages take bf16; LayerNorm, softmax and the loss stay fp32); on the CPU
everything is fp32 (the CPU stages take fp32).

The clock: each step sits between two CUDA events (on the CPU, two perf_counter readings), so
a step's time is the GPU's time from its first kernel to its last, and the losses are read back
only at evaluation points, so that reading them does not stall the queue. Evaluation is not
timed. tokens_per_s is left empty for the first `timing_warmup` steps (allocator, kernel
selection and library loading happen there).
"""
import math
import time

import torch

from model import DOCUMENT_BACKENDS, GPT, Documents, attention_backend


class Trainer:
    def __init__(self, data, cfg, backend, device, lr, total_steps, seed=0, weight_decay=0.1, documents=False):
        if documents and not getattr(data, "documents", False):
            raise ValueError("documents=True needs data that marks documents (data.TextData(documents=True))")
        if documents and backend not in DOCUMENT_BACKENDS:
            raise ValueError(f"backend '{backend}' has no document mask (backends with one: "
                             f"{', '.join(DOCUMENT_BACKENDS)})")
        self.data, self.cfg, self.backend, self.documents = data, cfg, backend, documents
        self.device = torch.device(device)
        self.lr, self.total_steps = lr, total_steps
        torch.manual_seed(seed)
        self.model = GPT(cfg, attention_backend(backend)).to(self.device)
        # Weight decay on the matrices only (not on LayerNorm gains and biases).
        params = [p for p in self.model.parameters() if p.requires_grad]
        groups = [{"params": [p for p in params if p.dim() >= 2], "weight_decay": weight_decay},
                  {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}]
        fused = self.device.type == "cuda"
        self.opt = torch.optim.AdamW(groups, lr=lr, betas=(0.9, 0.95), fused=fused)
        self.warmup = max(1, min(100, total_steps // 10))

    def autocast(self):
        if self.device.type == "cuda":
            return torch.autocast("cuda", dtype=torch.bfloat16)
        return torch.autocast("cpu", enabled=False)

    def lr_at(self, step):
        """Linear warm-up, then a cosine decay to a tenth of the peak at total_steps."""
        if step < self.warmup:
            return self.lr * (step + 1) / self.warmup
        progress = min(1.0, (step - self.warmup) / max(1, self.total_steps - self.warmup))
        return self.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))

    def to_device(self, batch):
        """inputs, targets and the batch's Documents (None without document masking)."""
        inputs, targets = batch[:2]
        documents = Documents.of(batch[2], self.device) if self.documents else None
        return (torch.from_numpy(inputs).to(self.device, non_blocking=True),
                torch.from_numpy(targets).to(self.device, non_blocking=True), documents)

    def train_step(self, step):
        """One optimizer step on batch `step`; returns the loss as a (not yet read) tensor."""
        inputs, targets, documents = self.to_device(self.data.train_batch(step))
        for group in self.opt.param_groups:
            group["lr"] = self.lr_at(step)
        with self.autocast():
            _, loss = self.model(inputs, targets, documents=documents)
        self.opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
        self.opt.step()
        return loss.detach()

    @torch.no_grad()
    def evaluate(self, batches):
        """Mean loss and accuracy (argmax = target) over the positions with a target."""
        self.model.eval()
        total_loss, correct, count = 0.0, 0, 0
        for batch in batches:
            inputs, targets, documents = self.to_device(batch)
            with self.autocast():
                logits, loss = self.model(inputs, targets, documents=documents)
            scored = targets != -1
            n = int(scored.sum())
            total_loss += loss.item() * n
            correct += int((logits.argmax(-1) == targets)[scored].sum())
            count += n
        self.model.train()
        return total_loss / count, correct / count

    def tokens_per_step(self):
        return self.data.train_batch(0)[0].size


class StepClock:
    """Per-step times: CUDA events on a GPU (read once at the end), perf_counter on the CPU."""

    def __init__(self, device):
        self.cuda = torch.device(device).type == "cuda"
        self.marks = []

    def start(self):
        if self.cuda:
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            self.marks.append([event, None])
        else:
            self.marks.append([time.perf_counter(), None])

    def stop(self):
        if self.cuda:
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            self.marks[-1][1] = event
        else:
            self.marks[-1][1] = time.perf_counter()

    def seconds(self):
        if self.cuda:
            torch.cuda.synchronize()
            return [a.elapsed_time(b) / 1e3 for a, b in self.marks]
        return [b - a for a, b in self.marks]


def measure(trainer, steps=8, warmup=3, val=None):
    """(seconds per training step, seconds per evaluation batch) after `warmup` steps: what
    run_all.py sizes the runs from. Trains the trainer's model, so use a throwaway one."""
    clock = StepClock(trainer.device)
    for step in range(warmup + steps):
        clock.start()
        trainer.train_step(step)
        clock.stop()
    step_s = sorted(clock.seconds()[warmup:])[steps // 2]      # the median
    eval_s = 0.0
    if val:
        trainer.evaluate(val[:1])                               # warm-up of the no-grad path
        if trainer.device.type == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        trainer.evaluate(val[:1])
        eval_s = time.perf_counter() - start
    return step_s, eval_s


def run(trainer, steps, eval_every, val, timing_warmup=10, deadline=None, log=print):
    """Trains `steps` steps and returns one row per step: step, seq (its sequence length), loss,
    val_loss and val_accuracy
    (at step 0, every eval_every steps and the last step; else None), tokens_per_s (None during
    the timing warm-up). Stops early, with a message, at a non-finite loss or past `deadline`
    (a time.monotonic() value)."""
    clock = StepClock(trainer.device)
    tokens = trainer.tokens_per_step()
    losses, evals, stopped = [], {}, None
    for step in range(steps):
        clock.start()
        losses.append(trainer.train_step(step))
        clock.stop()
        last = step == steps - 1
        if step % eval_every == 0 or last:
            evals[step] = trainer.evaluate(val)
            seen = torch.stack(losses[-eval_every:]).float()
            log(f"  {trainer.backend:>10} step {step:5d}  loss {seen[-1].item():.4f}  "
                f"val_loss {evals[step][0]:.4f}  val_acc {evals[step][1]:.3f}")
            if not torch.isfinite(seen).all():
                stopped = f"non-finite loss by step {step}"
        if not stopped and not last and deadline is not None and time.monotonic() > deadline:
            stopped = f"time budget spent at step {step}"
            evals[step] = trainer.evaluate(val)
        if stopped:
            log(f"  {trainer.backend}: stopped early: {stopped}")
            break
    seconds = clock.seconds()
    rows = []
    for step, (loss, dt) in enumerate(zip(torch.stack(losses).float().tolist(), seconds)):
        val_loss, val_acc = evals.get(step, (None, None))
        rows.append(dict(step=step, seq=trainer.data.seq_at(step), loss=loss, val_loss=val_loss, val_accuracy=val_acc,
                         tokens_per_s=tokens / dt if step >= timing_warmup else None))
    return rows, stopped
