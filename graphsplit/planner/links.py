"""The links collectives cross: which link a group of ranks uses, and a ring collective's time on it."""

from __future__ import annotations

from .hardware import Hardware


def ring_seconds(nbytes: float, ranks: int, bandwidth: float, latency: float, steps_factor: float) -> float:
    """A ring collective over `ranks`: `steps_factor` x (ranks - 1) / ranks of the bytes cross each link
    (2 for all-reduce, 1 for all-gather or reduce-scatter), plus one latency per step."""
    if ranks <= 1 or nbytes <= 0:
        return 0.0
    return steps_factor * (ranks - 1) / ranks * nbytes / bandwidth + steps_factor * (ranks - 1) * latency


def group_link(hw: Hardware, span: int) -> tuple[float, float]:
    """(bandwidth, latency) of a group whose ranks lie `span` apart in the world: inside one node or not."""
    if span <= hw.gpus_per_node:
        return hw.intra_node_bandwidth * hw.link_efficiency, hw.intra_node_latency
    return hw.inter_node_bandwidth * hw.link_efficiency, hw.inter_node_latency


def send_flops_per_byte(hw: Hardware, tp: int, low_precision: bool) -> float:
    """What a byte sent between pipeline stages costs on `hw` in FLOPs of its matmul rate (the dtype's):
    the weight the planner gives sends in the cut (Plan.send_flops_per_byte), pp neighbours lying tp apart
    in the (dp, pp, tp) mesh. Three significant figures, so a plan file reads plainly."""
    bandwidth, _ = group_link(hw, 2 * tp)
    weight = hw.flops("bfloat16" if low_precision else "float32") / bandwidth
    return float(f"{weight:.3g}")
