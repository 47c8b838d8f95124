"""A small GPT whose attention is pluggable: PyTorch's SDPA or one of the project's stages.

    cfg = GPTConfig(n_layer=6, n_head=6, head_dim=64, context=1024)
    model = GPT(cfg, attention_backend("08+09"))   # stage 08's forward, stage 09's backward
    logits, loss = model(tokens, targets)          # tokens, targets [batch, T]; target -1 = no loss

The model is the usual pre-LayerNorm decoder: token embedding, blocks of
    x ← x + Attention(LN(x))      (causal, rotary positions on q and k)
    x ← x + MLP(LN(x))            (4·d_model hidden units, GELU)
then a final LayerNorm and the output layer tied to the embedding. Nothing in it depends on
the backend but the one call `self.attend(q, k, v)` on [batch, heads, T, head_dim] tensors, so
two models built with the same seed and fed the same batches differ only by their attention's
rounding.
"""
import math
import pathlib
import sys
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))  # python/: fa_attention

# Backend name → the stage that runs it (None: PyTorch's SDPA). A training backend needs a
# backward, so "08+09" runs stage 09 (08's forward kernel with 09's backward) and "10+11" stage
# 11; "06" is the CPU stage with both passes, for the CPU smoke test.
BACKENDS = {"sdpa": None, "sdpa-cudnn": None, "sdpa-flash": None, "08+09": "09", "10+11": "11", "06": "06"}
# SDPA held to one of its kernels: "sdpa" lets PyTorch choose; these are the controls, two
# vendor kernels of the same exact attention whose curves show how far rounding alone moves
# a training run.
SDPA_KERNEL = {"sdpa-cudnn": "CUDNN_ATTENTION", "sdpa-flash": "FLASH_ATTENTION"}


def attention_backend(name):
    """attend(q, k, v) -> causal softmax(q kᵀ/√d) v for q, k, v [batch, heads, T, head_dim]."""
    if name not in BACKENDS:
        raise ValueError(f"attention backend '{name}' is unknown (backends: {', '.join(BACKENDS)})")
    stage = BACKENDS[name]
    if name in SDPA_KERNEL:
        from torch.nn.attention import SDPBackend, sdpa_kernel
        kernel = getattr(SDPBackend, SDPA_KERNEL[name])

        def attend(q, k, v):
            with sdpa_kernel(kernel):  # the backward runs the kernel the forward chose
                return F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return attend
    if stage is None:
        return lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True)
    from fa_attention.torch_ops import attention
    return lambda q, k, v: attention(q, k, v, causal=True, stage=stage)


@dataclass
class GPTConfig:
    vocab: int = 256          # bytes
    context: int = 1024       # the longest sequence the rotary table covers
    n_layer: int = 6
    n_head: int = 6
    head_dim: int = 64
    previous_token: bool = False  # also embed each position's previous token (the recall model)

    @property
    def d_model(self):
        return self.n_head * self.head_dim


def rotary_table(context, head_dim, base=10000.0):
    """cos and sin [context, head_dim/2] of the angles t·θ_i, θ_i = base^(−2i/head_dim)."""
    theta = base ** (-torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim)
    angles = torch.arange(context, dtype=torch.float32)[:, None] * theta[None, :]
    return angles.cos(), angles.sin()


def apply_rotary(x, cos, sin):
    """Rotates each pair (x_i, x_{i+d/2}) of x [batch, heads, T, d] by the angle of its position,
    so that q·k depends on the positions only through their difference. Computed in fp32, and
    returned in x's dtype (the stages take bf16 under autocast, not fp32)."""
    T, half = x.shape[-2], x.shape[-1] // 2
    cos, sin = cos[:T], sin[:T]                            # [T, d/2]
    x1, x2 = x[..., :half].float(), x[..., half:].float()
    rotated = torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1)
    return rotated.type_as(x)


class CausalSelfAttention(nn.Module):
    def __init__(self, cfg, attend):
        super().__init__()
        self.n_head, self.head_dim = cfg.n_head, cfg.head_dim
        self.qkv = nn.Linear(cfg.d_model, 3 * cfg.d_model, bias=False)
        self.proj = nn.Linear(cfg.d_model, cfg.d_model, bias=False)
        self.attend = attend

    def forward(self, x, cos, sin):
        batch, T, C = x.shape
        qkv = self.qkv(x).view(batch, T, 3, self.n_head, self.head_dim)
        q, k, v = qkv.permute(2, 0, 3, 1, 4)               # each [batch, heads, T, head_dim]
        q, k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
        o = self.attend(q, k, v)                           # [batch, heads, T, head_dim]
        return self.proj(o.transpose(1, 2).reshape(batch, T, C))


class Block(nn.Module):
    def __init__(self, cfg, attend):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(cfg.d_model), nn.LayerNorm(cfg.d_model)
        self.attn = CausalSelfAttention(cfg, attend)
        self.mlp = nn.Sequential(nn.Linear(cfg.d_model, 4 * cfg.d_model), nn.GELU(),
                                 nn.Linear(4 * cfg.d_model, cfg.d_model))

    def forward(self, x, cos, sin):
        x = x + self.attn(self.ln1(x), cos, sin)
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    def __init__(self, cfg, attend):
        super().__init__()
        self.cfg = cfg
        self.embed = nn.Embedding(cfg.vocab, cfg.d_model)
        self.embed_previous = nn.Embedding(cfg.vocab, cfg.d_model) if cfg.previous_token else None
        self.blocks = nn.ModuleList(Block(cfg, attend) for _ in range(cfg.n_layer))
        self.ln_f = nn.LayerNorm(cfg.d_model)
        cos, sin = rotary_table(cfg.context, cfg.head_dim)
        self.register_buffer("cos", cos, persistent=False)
        self.register_buffer("sin", sin, persistent=False)
        self.apply(self._init)
        # GPT-2's scaling: the layers that write into the residual stream start smaller, so its
        # variance does not grow with depth.
        for block in self.blocks:
            for layer in (block.attn.proj, block.mlp[2]):
                nn.init.normal_(layer.weight, std=0.02 / math.sqrt(2 * cfg.n_layer))

    @staticmethod
    def _init(module):
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, std=0.02)
        if isinstance(module, nn.Linear) and module.bias is not None:
            nn.init.zeros_(module.bias)

    def forward(self, tokens, targets=None, positions=None, previous=None):
        """tokens [batch, T] -> logits [batch, T, vocab] and, with targets [batch, T], the mean
        cross-entropy over the positions whose target is not −1.

        A context-parallel rank (train_cp.py) holds a shard of the sequence, not its first T
        tokens: `positions` [T] are its tokens' places in the whole sequence (for the rotary
        angles; default 0 … T−1) and `previous` [batch, T] the token before each one (default:
        taken from `tokens`, which is right only for a whole sequence)."""
        x = self.embed(tokens)                             # [batch, T, d_model]
        if self.embed_previous is not None:
            # Position t also sees token t−1 (position 0 sees token 0): the job of the first
            # layer of an induction head, given here so that one attention layer can recall.
            if previous is None:
                previous = F.pad(tokens[:, :-1], (1, 0))
            x = x + self.embed_previous(previous)
        cos, sin = (self.cos, self.sin) if positions is None else (self.cos[positions], self.sin[positions])
        for block in self.blocks:
            x = block(x, cos, sin)
        logits = F.linear(self.ln_f(x), self.embed.weight)  # output layer tied to the embedding
        if targets is None:
            return logits, None
        loss = F.cross_entropy(logits.float().flatten(0, 1), targets.flatten(), ignore_index=-1)
        return logits, loss

    def num_params(self):
        return sum(p.numel() for p in self.parameters())
