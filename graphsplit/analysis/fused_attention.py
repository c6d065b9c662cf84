"""Attention as a GPU runs it, on meta tensors too: `scaled_dot_product_attention` through the
memory-efficient kernel. The math path a CPU and meta take keeps the sequence x sequence probabilities
for backward, and on meta runs about fifteen decomposed ops a call (6 ms each call at a Llama's
shapes: most of a transform's analysis of an 80-layer model); the fused kernel's meta function gives
the same output and FLOPs at once."""

from __future__ import annotations

from typing import Any

import torch


class FusedAttention(torch.overrides.TorchFunctionMode):
    """Attention as a GPU runs it: `scaled_dot_product_attention` through the memory-efficient kernel,
    which keeps q, k, v, the output and its log-sum-exp for backward, where the math path a CPU (and
    meta) takes keeps the sequence x sequence probabilities.

    `on_meta`: only calls on meta tensors, and the ATen op an exported graph calls too (the meta
    analyses: shapes and FLOPs alike, at once); a call the kernel's meta function refuses (a mask
    of a kind it does not take) runs as written."""

    def __init__(self, on_meta: bool = False) -> None:
        super().__init__()
        self.on_meta = on_meta
        self.calls = (_SDPA, torch.ops.aten.scaled_dot_product_attention.default) if on_meta else (_SDPA,)

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        if func not in self.calls:
            return func(*args, **kwargs)
        given = {**dict(zip(_NAMES, args)), **kwargs}
        q, k, v = given["query"], given["key"], given["value"]
        if self.on_meta and not all(t.device.type == "meta" and t.dim() == 4 for t in (q, k, v)):
            return func(*args, **kwargs)  # the kernel takes (batch, heads, sequence, head_dim) alone
        if given.get("enable_gqa") and k.shape[-3] != q.shape[-3]:
            k = k.repeat_interleave(q.shape[-3] // k.shape[-3], dim=-3)
            v = v.repeat_interleave(q.shape[-3] // v.shape[-3], dim=-3)
        try:
            return torch.ops.aten._scaled_dot_product_efficient_attention(
                q, k, v, given.get("attn_mask"), True, given.get("dropout_p", 0.0), given.get("is_causal", False),
                scale=given.get("scale"))[0]
        except (RuntimeError, ValueError):
            if not self.on_meta:
                raise
            return func(*args, **kwargs)


_SDPA = torch.nn.functional.scaled_dot_product_attention
_NAMES = ("query", "key", "value", "attn_mask", "dropout_p", "is_causal", "scale", "enable_gqa")
