"""Where the tensors a model's own code makes go.

Model code makes tensors of its own: `torch.arange(T)` for positions, `torch.zeros(n)` in a loss,
`torch.arange(batch)` as a contrastive loss's labels. Written without `device=`, each lands on the
default device, where the model's other tensors are when the model runs as its author runs it.
graphsplit runs that code in three places, and gives it the device it stands for in each:

- the analysis runs on `meta`: `on_meta()` makes `meta` the default device while the graph or the
  user's loss runs there (torch's `torch.device` context: it moves factory calls, nothing else);
- a stage's graph says where: `explicit_devices(graph)` gives every factory call without a device
  the graph's neutral device, `meta`, which a rank points at its own device when it materializes the
  stage (runtime/materialize.py), as it does for the devices torch.export records;
- the loss runs with the device of the output it reads (runtime/training.py: `make_loss`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
import torch.fx as fx

from .optable import makes_tensor

NEUTRAL = torch.device("meta")  # a graph's device for what it makes; each rank reads its own device there


@contextlib.contextmanager
def on_meta() -> Iterator[None]:
    """`with on_meta():` the analysis's meta world: factory calls without a device make meta tensors, as
    the analysis's are, and an op whose output's size follows the data (a nonzero, a boolean mask's
    selection) gives the largest it can be (every element counted; `NodeInfo.sizes_follow_data`)."""
    from torch.fx.experimental import _config

    with torch.device("meta"), _config.patch(meta_nonzero_assume_all_nonzero=True):
        yield


def explicit_devices(graph: fx.Graph) -> int:
    """Every factory call without a device (or with `device=None`) gets `device=meta`; the count."""
    changed = 0
    for node in graph.nodes:
        if makes_tensor(node) and node.kwargs.get("device") is None and not _device_in_args(node):
            node.kwargs = {**node.kwargs, "device": NEUTRAL}
            changed += 1
    return changed


def _device_in_args(node: fx.Node) -> bool:
    return any(isinstance(a, torch.device) for a in node.args)
