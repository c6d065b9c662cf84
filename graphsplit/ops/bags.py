"""A piece of the batch's embedding-bag offsets, made its own: checked to hold one index per bag, and
counted from its first.

`embedding_bag(weight, indices, offsets)` reads `offsets` as positions in `indices`. Batch discovery
lets a call be cut with the batch when it has as many indices as offsets (analysis/batch/layout.py:
one index per bag, DLRM's Criteo features): the pipeline and the replicas cut the indices and the
offsets into equal consecutive pieces. The offsets of piece m are then m*b, m*b + 1, .. (global
positions): counted from its first they are the piece's own. That holds only where every bag of the
whole batch holds one index; a batch with bags of other sizes would pair rows with the wrong bags, so
each piece checks, and raises naming the call: its offsets consecutive from a multiple of the piece's
size and as many indices as offsets (piece by piece, these hold for every piece exactly when the whole
batch's offsets are 0, 1, .., B - 1).
"""

from __future__ import annotations

import torch

from ..errors import GraphsplitError


def own_offsets(indices: torch.Tensor, offsets: torch.Tensor, where: str) -> torch.Tensor:
    """`offsets` of this piece of the batch counted from its first (see the module docstring)."""
    if offsets.device.type == "meta" or isinstance(offsets, torch._subclasses.FakeTensor):
        return offsets
    n = offsets.shape[0]
    if n == 0:
        return offsets
    first = offsets[:1]
    own = offsets - first
    steps = torch.arange(n, device=offsets.device, dtype=offsets.dtype)
    if indices.shape[0] != n or int(first) % n or not torch.equal(own, steps):
        raise GraphsplitError(
            f"embedding_bag at {where}: graphsplit cuts its indices and offsets with the batch, one index per bag, "
            f"as the example inputs have them; this batch's bags hold other counts ({indices.shape[0]} indices, "
            f"{n} offsets from {int(first)}): give one index per bag, or run with --dp 1 --microbatches 1")
    return own
