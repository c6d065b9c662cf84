"""Make an exported graph independent of the strides its kernels happened to return.

torch.export runs the model once, on the trace device's kernels, and records what ran: a
`.contiguous()` on a tensor that was contiguous there records nothing (it returned its input), so
a later `.view()` relies on that layout. Another kernel (SDPA on `meta`, where the analysis runs,
or on another GPU) returns other strides for the same op, and the view fails there although the
model itself would have copied first. Inductor meets the same problem after functionalization and
turns every view into a reshape (torch/_inductor/fx_passes/post_grad.py, `view_to_reshape`).

`reshape` is a view whenever a view is possible and a copy only where the view would raise, so
the rewrite changes nothing where the traced graph ran; it differs only where a copy breaks an
alias the program relies on: a value written in place (the schema's `alias_info.is_write`) while
it shares storage with the view. Such views are kept as views: on a device where their layout is
not viewable they fail loudly instead of computing on a copy that misses the write.
"""

from __future__ import annotations

import torch
import torch.fx as fx

from .aliasing import Storages

aten = torch.ops.aten


def views_to_reshapes(gm: fx.GraphModule) -> int:
    """Rewrite each `aten.view.default` whose storage nothing writes in place into
    `aten.reshape.default`; return how many were rewritten."""
    storages = Storages(gm)
    count = 0
    for node in gm.graph.find_nodes(op="call_function", target=aten.view.default):
        if not storages.is_written(node):
            node.target = aten.reshape.default
            count += 1
    if count:
        gm.recompile()
    return count
