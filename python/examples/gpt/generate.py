"""Text generation with a KV cache through stage 14's ops: fa_attention.append_kv + decode.

    python3 python/examples/gpt/generate.py --device cpu --tiny          # the check, on the CPU
    python3 python/examples/gpt/generate.py                               # tokens/s on the GPU

Each step feeds the model only the new token. Every layer keeps its keys and values in a cache
(contiguous [batch, heads, capacity, d], or paged: a pool of blocks and a block table); the new
token's k and v are written into it by append_kv, and decode attends to the whole cache from
the new token's query alone. The prompt fills the cache the same way, 16 tokens at a time
(decode takes up to 16 new tokens per sequence, causal among themselves).

Three ways to generate the same tokens, greedily (the most likely next token each step):
- "fa-cache": the KV cache through append_kv + decode (stage 14);
- "sdpa-cache": the same cache in plain torch: the new k, v written by slice assignment and
  F.scaled_dot_product_attention over the cache's first len tokens;
- "recompute": no cache: the whole prefix through the model at every step
  (F.scaled_dot_product_attention);
- "fa-graph" (GPU): fa-cache with each one-token step captured once as a CUDA graph and replayed,
  which the ops allow because they never read the lengths on the host.
The check: fa-cache's tokens equal recompute's, token for token, and its logits stay within a
tolerance of recompute's at every step (a tie between two tokens closer than that tolerance is
reported, not counted as a failure). The timing: tokens per second of the generation after the
prompt (the prefill not counted), fa-cache (and fa-graph) against sdpa-cache and recompute, on
the same model (random weights: the speed does not depend on them) in bf16 on the GPU; on the
GPU fa-graph's tokens are first checked equal to fa-cache's.
"""
import argparse
import math
import pathlib
import sys
import time

import torch
import torch.nn.functional as F

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parents[1]))  # python/: fa_attention

from model import GPT, GPTConfig, attention_backend  # noqa: E402

CHUNK = 16  # new tokens per decode call while the prompt fills the cache (the stage's q_len limit)


def rotate(x, cos, sin):
    """model.apply_rotary with the angles of each sequence's own positions: x [batch, heads, n,
    d], cos and sin [batch, 1, n, d/2]. The same arithmetic (fp32, back to x's dtype)."""
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half].float(), x[..., half:].float()
    return torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1).type_as(x)


class KVCache:
    """One layer's keys and values for `batch` sequences of up to `capacity` tokens: contiguous
    [batch, heads, capacity, d], or paged (block_size set): a pool [blocks, heads, block_size,
    d] whose blocks are handed to the sequences in a shuffled order through the block table
    [batch, capacity / block_size] (int32), as a server that frees and reuses blocks would."""

    def __init__(self, batch, heads, capacity, head_dim, dtype, device, block_size=None, seed=0):
        self.table = None
        if block_size is None:
            shape = (batch, heads, capacity, head_dim)
        else:
            per_seq = math.ceil(capacity / block_size)
            order = torch.randperm(batch * per_seq, generator=torch.Generator().manual_seed(seed))
            self.table = order.to(torch.int32).view(batch, per_seq).to(device)
            shape = (batch * per_seq, heads, block_size, head_dim)
        self.k = torch.zeros(shape, dtype=dtype, device=device)
        self.v = torch.zeros(shape, dtype=dtype, device=device)


class CachedGPT:
    """Runs a GPT (model.py) one step at a time over per-layer KV caches. `attention` is
    "fa" (append_kv + decode) or "sdpa" (slice writes + scaled_dot_product_attention)."""

    def __init__(self, model, batch, capacity, attention="fa", block_size=None):
        from fa_attention import torch_ops
        self.ops = torch_ops
        self.model, self.attention = model, attention
        cfg = model.cfg
        p = next(model.parameters())
        if capacity > cfg.context:
            raise ValueError(f"capacity {capacity} exceeds the model's context {cfg.context} (its rotary table)")
        if model.embed_previous is not None:
            raise ValueError("generation does not keep the previous token (the recall model's embedding)")
        if attention == "sdpa" and block_size is not None:
            raise ValueError("the sdpa cache is contiguous (block_size None)")
        self.caches = [KVCache(batch, cfg.n_head, capacity, cfg.head_dim, p.dtype, p.device, block_size, seed=i)
                       for i in range(cfg.n_layer)]
        self.lens = torch.zeros(batch, dtype=torch.int32, device=p.device)  # tokens in each sequence's cache
        self.pos = 0  # the same for every sequence: the prompts have one length

    @torch.no_grad()
    def step(self, tokens):
        """tokens [batch, n] (n <= 16), the next n tokens of every sequence -> logits [batch, n,
        vocab]; their keys and values join the caches."""
        model, cfg = self.model, self.model.cfg
        batch, n = tokens.shape
        self.lens += n
        # The new tokens' positions, from the lengths on the device (a CUDA graph replays this
        # step at every position): [batch, n], and their rotary angles [batch, 1, n, d/2].
        pos = (self.lens.long() - n)[:, None] + torch.arange(n, device=tokens.device)
        cos, sin = model.cos[pos][:, None], model.sin[pos][:, None]
        x = model.embed(tokens)
        for block, cache in zip(model.blocks, self.caches):
            a = block.attn
            qkv = a.qkv(block.ln1(x)).view(batch, n, 3, cfg.n_head, cfg.head_dim)
            q, k, v = qkv.permute(2, 0, 3, 1, 4)                # each [batch, heads, n, head_dim]
            q, k = rotate(q, cos, sin), rotate(k, cos, sin)
            if self.attention == "fa":
                self.ops.append_kv(k, v, cache.k, cache.v, self.lens, cache.table)
                o = self.ops.decode(q, cache.k, cache.v, self.lens, cache.table, causal=True)
            else:
                end = self.pos + n
                cache.k[:, :, self.pos:end], cache.v[:, :, self.pos:end] = k, v
                mask = None
                if n > 1:  # the new tokens are causal among themselves and see the whole past
                    mask = torch.ones(n, end, dtype=torch.bool, device=x.device).tril(self.pos)
                o = F.scaled_dot_product_attention(q, cache.k[:, :, :end], cache.v[:, :, :end], attn_mask=mask)
            x = x + a.proj(o.transpose(1, 2).reshape(batch, n, cfg.d_model))
            x = x + block.mlp(block.ln2(x))
        self.pos += n
        return F.linear(model.ln_f(x), model.embed.weight)

    def prefill(self, prompt):
        """The prompt [batch, T] into the caches, CHUNK tokens per call; the last position's logits."""
        for start in range(0, prompt.shape[1], CHUNK):
            logits = self.step(prompt[:, start:start + CHUNK])
        return logits[:, -1]


@torch.no_grad()
def generate_cached(model, prompt, new_tokens, attention="fa", block_size=None, on_step=None):
    """Greedy generation over the KV caches: prompt [batch, T] -> the new tokens [batch,
    new_tokens]. on_step(i, logits [batch, vocab]) sees the logits that chose token i."""
    gen = CachedGPT(model, prompt.shape[0], prompt.shape[1] + new_tokens, attention, block_size)
    logits = gen.prefill(prompt)
    out = []
    for i in range(new_tokens):
        if on_step:
            on_step(i, logits)
        nxt = logits.argmax(-1)
        out.append(nxt)
        if i + 1 < new_tokens:
            logits = gen.step(nxt[:, None])[:, -1]
    return torch.stack(out, 1)


class GraphedGPT:
    """CachedGPT with "fa" attention whose one-token step is a CUDA graph: captured once after
    the prompt, replayed for every new token. It can be, because nothing in the step depends on
    the host's idea of the position: the lengths advance on the GPU, the rotary angles are
    gathered from them, and the ops never read them back."""

    def __init__(self, model, batch, capacity, block_size=None):
        device = next(model.parameters()).device
        self.tokens = torch.zeros(batch, 1, dtype=torch.long, device=device)  # the step's input
        scratch = CachedGPT(model, batch, capacity, "fa", block_size)
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):  # warm-up outside the capture (cuBLAS, the op), as torch's docs do
            for _ in range(2):
                scratch.step(self.tokens)
        torch.cuda.current_stream().wait_stream(side)
        del scratch
        self.gen = CachedGPT(model, batch, capacity, "fa", block_size)
        self.graph = None

    def prefill(self, prompt):
        logits = self.gen.prefill(prompt)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph):  # recorded, not run: the lengths advance at each replay
            self.logits = self.gen.step(self.tokens)[:, -1]
        return logits

    def step(self, next_tokens):
        """next_tokens [batch] -> logits [batch, vocab] (a view that the next replay overwrites)."""
        self.tokens.copy_(next_tokens[:, None])
        self.graph.replay()
        return self.logits


@torch.no_grad()
def generate_graphed(model, prompt, new_tokens, block_size=None):
    """generate_cached's tokens, each step a replay of one CUDA graph (GPU only)."""
    gen = GraphedGPT(model, prompt.shape[0], prompt.shape[1] + new_tokens, block_size)
    logits = gen.prefill(prompt)
    out = []
    for i in range(new_tokens):
        out.append(logits.argmax(-1))
        if i + 1 < new_tokens:
            logits = gen.step(out[-1])
    return torch.stack(out, 1)


@torch.no_grad()
def generate_recompute(model, prompt, new_tokens, on_step=None):
    """Greedy generation without a cache: the whole prefix through the model at every step."""
    tokens = prompt
    for i in range(new_tokens):
        logits = model(tokens)[0][:, -1]
        if on_step:
            on_step(i, logits)
        tokens = torch.cat([tokens, logits.argmax(-1, keepdim=True)], 1)
    return tokens[:, prompt.shape[1]:]


def check(model, prompt, new_tokens, block_size=None, atol=None):
    """fa-cache against recompute: the same tokens, and logits within atol at every step. In
    fp32 atol defaults to 1e-4; in bf16 or f16 to four times the distance of sdpa-cache (the
    same cache in plain torch, the same dtype) from recompute, at least 1e-2: rounding in the
    model's dtype moves every cached path that far. Where the two choose different tokens,
    recompute's logits of the two may differ by at most 2·atol (a tie that rounding may break
    either way): the check stops there, since the sequences then differ, and says so. Returns
    (tokens compared, max logit error, atol)."""
    full_logits = []
    want = generate_recompute(model, prompt, new_tokens, on_step=lambda i, l: full_logits.append(l.float()))

    def compare(attention, block):
        """Tokens of `attention` equal to want's before the first step where any sequence
        differs (n), and the logit errors of the steps up to that one (same histories)."""
        errors = []
        got = generate_cached(model, prompt, new_tokens, attention, block,
                              on_step=lambda i, l: errors.append((l.float() - full_logits[i]).abs().max().item()))
        same = (got == want).all(0)
        n = new_tokens if bool(same.all()) else int((~same).nonzero()[0])
        return got, n, errors[:n + 1]

    if atol is None:
        if next(model.parameters()).dtype == torch.float32:
            atol = 1e-4
        else:
            atol = max(1e-2, 4 * max(compare("sdpa", None)[2]))
    got, n, errors = compare("fa", block_size)
    worst = max(errors)
    assert worst <= atol, f"fa-cache logits differ from recompute's by {worst:.3g} (> {atol:.3g})"
    if n < new_tokens:
        rows = (got[:, n] != want[:, n]).nonzero()[:, 0]
        logits = full_logits[n][rows]
        gap = (logits.gather(1, want[rows, n, None]) - logits.gather(1, got[rows, n, None])).max().item()
        assert gap <= 2 * atol, \
            f"token {n}: fa-cache chose {got[rows, n].tolist()}, recompute {want[rows, n].tolist()} ({gap:.3g} better)"
        print(f"note: token {n} is a tie (recompute's logits of the two tokens {gap:.2g} apart); compared up to it")
    return n, worst, atol


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize()


@torch.no_grad()
def time_generation(model, prompt, new_tokens, method, block_size=None):
    """Seconds to generate new_tokens after the prompt (the prompt's prefill not counted for
    the cached methods; recompute has none: every step runs the whole prefix)."""
    device = prompt.device
    if method == "recompute":
        sync(device)
        t0 = time.perf_counter()
        generate_recompute(model, prompt, new_tokens)
        sync(device)
        return time.perf_counter() - t0
    if method == "fa-graph":
        gen = GraphedGPT(model, prompt.shape[0], prompt.shape[1] + new_tokens, block_size)
        step = gen.step
    else:
        gen = CachedGPT(model, prompt.shape[0], prompt.shape[1] + new_tokens, method, block_size)
        step = lambda tokens: gen.step(tokens[:, None])[:, -1]  # noqa: E731
    logits = gen.prefill(prompt)
    sync(device)
    t0 = time.perf_counter()
    for _ in range(new_tokens):
        logits = step(logits.argmax(-1))
    sync(device)
    return time.perf_counter() - t0


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--tiny", action="store_true", help="a tiny fp32 model, a few tokens: the CPU check")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--prompt", type=int, default=2048, help="prompt tokens per sequence")
    ap.add_argument("--new", type=int, default=128, help="tokens to generate per sequence")
    ap.add_argument("--layers", type=int, default=6)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--block-size", type=int, default=None, help="a paged cache of this block size")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--check-tokens", type=int, default=16, help="tokens compared against recompute")
    ap.add_argument("--check-only", action="store_true", help="the check, no timing")
    ap.add_argument("--no-graph", action="store_true", help="on the GPU, leave out fa-graph (CUDA graph steps)")
    args = ap.parse_args(argv)
    device = torch.device(args.device)
    if args.tiny:
        args.batch, args.prompt, args.new, args.layers, args.heads, args.head_dim = 2, 21, 6, 2, 2, 32
        args.check_tokens, args.repeats = 6, 1
    dtype = torch.float32 if device.type == "cpu" else torch.bfloat16
    cfg = GPTConfig(context=args.prompt + max(args.new, args.check_tokens), n_layer=args.layers, n_head=args.heads,
                    head_dim=args.head_dim)
    torch.manual_seed(0)
    model = GPT(cfg, attention_backend("sdpa")).to(device, dtype).eval()
    prompt = torch.randint(0, cfg.vocab, (args.batch, args.prompt), device=device)
    print(f"model: {args.layers} layers, {args.heads} heads of {args.head_dim}, {dtype}, {device}; "
          f"batch {args.batch}, prompt {args.prompt}, {args.new} new tokens"
          + (f", paged cache (block {args.block_size})" if args.block_size else ", contiguous cache"))

    # The check: greedy tokens of fa-cache against full recomputation.
    n, worst, atol = check(model, prompt, args.check_tokens, args.block_size)
    print(f"check: fa-cache equals recompute for {n} tokens x {args.batch} sequences "
          f"(logits within {worst:.2g}, tolerance {atol:.2g})")
    graphs = device.type == "cuda" and not args.no_graph
    if graphs:
        eager = generate_cached(model, prompt, args.check_tokens, "fa", args.block_size)
        replayed = generate_graphed(model, prompt, args.check_tokens, args.block_size)
        if torch.equal(eager, replayed):
            print(f"check: fa-graph (each step one CUDA graph replay) equals fa-cache for {args.check_tokens} tokens")
        else:  # the same kernels on the same data: expected bit for bit; reported, and still timed
            first = int((eager != replayed).any(0).nonzero()[0])
            print(f"WARNING: fa-graph's tokens differ from fa-cache's from token {first} on")
    if args.check_only:
        return 0

    # The timing: median of `repeats` runs after a warm-up.
    methods = {"fa-cache": ("fa", args.block_size), "sdpa-cache": ("sdpa", None), "recompute": ("recompute", None)}
    if graphs:
        methods["fa-graph"] = ("fa-graph", args.block_size)
    speed = {}
    for name, (method, block) in methods.items():
        time_generation(model, prompt, min(args.new, 4), method, block)  # warm-up
        times = sorted(time_generation(model, prompt, args.new, method, block) for _ in range(args.repeats))
        speed[name] = args.batch * args.new / times[len(times) // 2]
    print(f"tokens/s after the prompt (batch {args.batch} x {args.new} new tokens, median of {args.repeats} runs):")
    for name, s in speed.items():
        print(f"  {name:<11} {s:10.1f}   fa-cache / this: {speed['fa-cache'] / s:5.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
