"""Where the tensors a model's own code makes go.

Model code makes tensors of its own: `torch.arange(T)` for positions, `torch.zeros(n)` in a loss,
`torch.arange(batch)` as a contrastive loss's labels. Written without `device=`, each lands on the
default device, where the model's other tensors are when the model runs as its author runs it.
graphsplit runs that code in three places, and gives it the device it stands for in each:

- the analysis runs on `meta`: `on_meta()` makes `meta` the default device while the user's loss runs
  there (torch's `torch.device` context: it moves factory calls, nothing else);
- a stage's graph says where: `explicit_devices(graph)` gives every factory call without a device
  the graph's neutral device, `meta`, which a rank points at its own device when it materializes the
  stage (runtime/materialize.py), as it does for the devices torch.export records;
- the loss runs with the device of the output it reads: its graph's factory calls read that device
  (`explicit_devices(graph, like=...)`), and its Python runs under it (runtime/training.py: `make_loss`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
import torch.fx as fx

from .factories import makes_tensor

NEUTRAL = torch.device("meta")  # a graph's device for what it makes; each rank reads its own device there


@contextlib.contextmanager
def meta_sizes() -> Iterator[None]:
    """`with meta_sizes():` a graph runs on meta as the analysis runs it: an op whose output's size follows
    the data (a nonzero, a boolean mask's selection) gives the largest it can be (every element counted;
    `NodeInfo.sizes_follow_data`): a torch config switch, and the shapes of ops torch has no meta kernel
    for (meta_kernels.py)."""
    from torch.fx.experimental import _config

    from .meta_kernels import missing_kernels

    with _config.patch(meta_nonzero_assume_all_nonzero=True), missing_kernels():
        yield


@contextlib.contextmanager
def on_meta() -> Iterator[None]:
    """`with on_meta():` the user's own Python (a loss_fn) runs as the analysis's graphs do: `meta_sizes`,
    and factory calls without a device make meta tensors. (A graph needs no such default: its factory
    calls say their device, `explicit_devices`; torch's device context costs a Python call per op.)"""
    with torch.device("meta"), meta_sizes():
        yield


def explicit_devices(graph: fx.Graph, like: fx.Node | None = None) -> int:
    """Every factory call without a device (or with `device=None`) gets `device=meta`, or with `like` (a
    placeholder: a loss graph's first output) that value's device, read in the graph: the loss's tensors
    then sit where what it reads sits, on meta in the analysis and on the rank's device in the program.
    The count."""
    device: object = NEUTRAL
    changed = 0
    for node in list(graph.nodes):
        if makes_tensor(node) and node.kwargs.get("device") is None and not _device_in_args(node):
            if like is not None and device is NEUTRAL:
                with graph.inserting_after(like):
                    device = graph.call_function(getattr, (like, "device"))
            node.kwargs = {**node.kwargs, "device": device}
            changed += 1
    return changed


def _device_in_args(node: fx.Node) -> bool:
    return any(isinstance(a, torch.device) for a in node.args)
