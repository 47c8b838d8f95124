"""FlashAttention stages from Python, over the C ABI of libfa_c.so (common/fa_c.h).

Two APIs:

- the numpy API (this module, from fa_attention.core): forward/backward of any stage on
  float32 host arrays, stage options and counters, and a float64 numpy reference;

      import fa_attention as fa
      O, L = fa.forward("05", Q, K, V, causal=True)

- the PyTorch API (fa_attention.torch_ops, imported on its own since it needs torch): a
  torch.library custom op with autograd for CUDA tensors on the GPU stages and float32 CPU
  tensors on any stage;

      from fa_attention.torch_ops import attention
      out = attention(q, k, v, causal=True, stage="08")
      out = attention(q, k, v, causal=True, window=(255, 0), cu_seqlens_q=cu, cu_seqlens_k=cu)  # stage 13

  and stage 14's decoding ops, also reachable here without importing torch_ops first:

      fa.append_kv(k_new, v_new, k_cache, v_cache, cache_seqlens)   # in place
      out = fa.decode(q, k_cache, v_cache, cache_seqlens)           # [b, h, q_len, d]
"""
from fa_attention.core import *  # noqa: F401,F403
from fa_attention.core import __all__  # noqa: F401


def __getattr__(name):
    # fa_attention.decode / append_kv: the torch ops, imported on first use, so that the numpy
    # API keeps working where torch is not installed.
    if name in ("decode", "decode_with_lse", "append_kv"):
        from fa_attention import torch_ops
        return getattr(torch_ops, name)
    raise AttributeError(f"module 'fa_attention' has no attribute {name!r}")
