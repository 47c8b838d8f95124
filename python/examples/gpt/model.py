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

Document masking: model(tokens, targets, documents=Documents.of(doc_ids, device)) makes every
token attend only to the earlier tokens of its own document (data.py: a file of the repository),
through `self.attend(q, k, v, documents)`. Stage 13 ("13") takes the batch's rows laid end to
end as one packed row with cu_seqlens; SDPA builds the dense mask (causal and same document)
instead. Rotary positions need no reset at a document's start: q·k depends only on the
distance between two positions, and both lie in one document.
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
BACKENDS = {"sdpa": None, "sdpa-cudnn": None, "sdpa-flash": None, "08+09": "09", "10+11": "11", "06": "06",
            "13": "13"}
# The backends that take documents: stage 13 (cu_seqlens) and sdpa (a dense mask).
DOCUMENT_BACKENDS = ("sdpa", "13")
# SDPA held to one of its kernels: "sdpa" lets PyTorch choose; these are the controls, two
# vendor kernels of the same exact attention whose curves show how far rounding alone moves
# a training run.
SDPA_KERNEL = {"sdpa-cudnn": "CUDNN_ATTENTION", "sdpa-flash": "FLASH_ATTENTION"}


class Documents:
    """The documents of a batch: ids [batch, T] (each token's document, on the model's device)
    for a dense mask, and cu_seqlens (int32, on the CPU: the op reads it there without waiting
    for the GPU) of the rows laid end to end, for stage 13."""

    def __init__(self, ids, cu_seqlens, max_seqlen):
        self.ids, self.cu_seqlens, self.max_seqlen = ids, cu_seqlens, max_seqlen

    @staticmethod
    def of(doc_ids, device):
        from data import cu_seqlens_of
        cu, longest = cu_seqlens_of(doc_ids)
        return Documents(torch.from_numpy(doc_ids).to(device), torch.from_numpy(cu), longest)

    def dense_mask(self):
        """[batch, 1, T, T] bool: key j is seen by query i when j <= i in the same document."""
        T = self.ids.shape[1]
        causal = torch.ones(T, T, dtype=torch.bool, device=self.ids.device).tril()
        return (self.ids[:, None, :, None] == self.ids[:, None, None, :]) & causal


def packed(x):
    """[batch, heads, T, d] -> [1, heads, batch·T, d]: the rows end to end, as cu_seqlens counts them."""
    batch, heads, T, d = x.shape
    return x.transpose(0, 1).reshape(1, heads, batch * T, d)


def unpacked(x, batch):
    """packed()'s inverse."""
    _, heads, n, d = x.shape
    return x.reshape(heads, batch, n // batch, d).transpose(0, 1)


def attention_backend(name):
    """attend(q, k, v[, documents]) -> causal softmax(q kᵀ/√d) v for q, k, v [batch, heads, T,
    head_dim], within each document when `documents` (a Documents) is given (DOCUMENT_BACKENDS)."""
    if name not in BACKENDS:
        raise ValueError(f"attention backend '{name}' is unknown (backends: {', '.join(BACKENDS)})")
    stage = BACKENDS[name]

    def no_documents(documents):
        if documents is not None:
            raise ValueError(f"attention backend '{name}' has no document mask (backends with one: "
                             f"{', '.join(DOCUMENT_BACKENDS)})")

    if name in SDPA_KERNEL:
        from torch.nn.attention import SDPBackend, sdpa_kernel
        kernel = getattr(SDPBackend, SDPA_KERNEL[name])

        def attend(q, k, v, documents=None):
            no_documents(documents)
            with sdpa_kernel(kernel):  # the backward runs the kernel the forward chose
                return F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return attend
    if stage is None:
        def attend_sdpa(q, k, v, documents=None):
            if documents is None:
                return F.scaled_dot_product_attention(q, k, v, is_causal=True)
            return F.scaled_dot_product_attention(q, k, v, attn_mask=documents.dense_mask())
        return attend_sdpa
    from fa_attention.torch_ops import attention
    if name == "13":
        def attend_documents(q, k, v, documents=None):
            if documents is None:
                return attention(q, k, v, causal=True, stage=stage)
            cu, longest = documents.cu_seqlens, documents.max_seqlen
            o = attention(packed(q), packed(k), packed(v), causal=True, cu_seqlens_q=cu, cu_seqlens_k=cu,
                          max_seqlen_q=longest, max_seqlen_k=longest)
            return unpacked(o, q.shape[0])
        return attend_documents

    def attend_stage(q, k, v, documents=None):
        no_documents(documents)
        return attention(q, k, v, causal=True, stage=stage)
    return attend_stage


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

    def forward(self, x, cos, sin, documents=None):
        batch, T, C = x.shape
        qkv = self.qkv(x).view(batch, T, 3, self.n_head, self.head_dim)
        q, k, v = qkv.permute(2, 0, 3, 1, 4)               # each [batch, heads, T, head_dim]
        q, k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
        # [batch, heads, T, head_dim]; without documents the call is attend(q, k, v), which an
        # attend of three arguments (train_cp.py's ring) also takes
        o = self.attend(q, k, v) if documents is None else self.attend(q, k, v, documents)
        return self.proj(o.transpose(1, 2).reshape(batch, T, C))


class Block(nn.Module):
    def __init__(self, cfg, attend):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(cfg.d_model), nn.LayerNorm(cfg.d_model)
        self.attn = CausalSelfAttention(cfg, attend)
        self.mlp = nn.Sequential(nn.Linear(cfg.d_model, 4 * cfg.d_model), nn.GELU(),
                                 nn.Linear(4 * cfg.d_model, cfg.d_model))

    def forward(self, x, cos, sin, documents=None):
        x = x + self.attn(self.ln1(x), cos, sin, documents)
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

    def forward(self, tokens, targets=None, positions=None, previous=None, documents=None):
        """tokens [batch, T] -> logits [batch, T, vocab] and, with targets [batch, T], the mean
        cross-entropy over the positions whose target is not −1. With `documents` (a Documents
        of the batch) each token attends only within its document.

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
            x = block(x, cos, sin, documents)
        logits = F.linear(self.ln_f(x), self.embed.weight)  # output layer tied to the embedding
        if targets is None:
            return logits, None
        loss = F.cross_entropy(logits.float().flatten(0, 1), targets.flatten(), ignore_index=-1)
        return logits, loss

    def num_params(self):
        return sum(p.numel() for p in self.parameters())
