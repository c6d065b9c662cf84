"""Tensor parallelism found from the graph (see rewrite.py)."""

from .rewrite import rewrite_loss, tensor_parallel_pass

__all__ = ["rewrite_loss", "tensor_parallel_pass"]
