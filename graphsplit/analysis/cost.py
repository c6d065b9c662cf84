"""The cost model: one number per node that pipeline balance is measured in.

cost = FLOPs + BYTES_TO_FLOPS * bytes moved: a roofline in FLOP units. Matmuls
and convolutions are dominated by their FLOPs, norms and elementwise ops by
the memory they read and write. 8 FLOP/byte is a conservative machine balance
(an H100 is near 300 for bf16 matmuls, but non-fused elementwise kernels rarely
reach peak bandwidth), which keeps memory-bound layers from looking free.
"""

from __future__ import annotations

import torch.fx as fx

from ..ir.meta import info

BYTES_TO_FLOPS = 8.0


def node_cost(node: fx.Node) -> float:
    ni = info(node)
    return float(ni.flops) + BYTES_TO_FLOPS * float(ni.bytes_moved)


def send_weight(flops_per_byte: float | None) -> float:
    """What a byte sent to the next stage costs: a plan's `send_flops_per_byte` (set from the hardware),
    BYTES_TO_FLOPS where it gives none."""
    return BYTES_TO_FLOPS if flops_per_byte is None else float(flops_per_byte)


def boundary_cost(nbytes: int, flops_per_byte: float | None = None) -> float:
    """Cost charged to a stage for sending `nbytes` to the next one."""
    return send_weight(flops_per_byte) * float(nbytes)
