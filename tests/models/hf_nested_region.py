"""Minimal repro (no transformers needed) of why HF Llama fails under `graphsplit run`.

HF Llama's rotary embedding computes cos/sin under `@torch.no_grad()` (and an autocast-off
region). torch.export (the fallback when fx cannot trace, here forced by **kwargs as in
every HF forward) keeps such a region as a nested GraphModule `submod_1` called through
`torch.ops.higher_order.wrap_with_set_grad_enabled` (`wrap_with_autocast` for autocast).
The model is traced on meta, so the nested graph holds `device='meta'` (in `_assert_tensor_metadata` and
`aten.to.device`), and materialize._retarget_devices only rewrites the outer graph:

    graphsplit run tests/models/hf_nested_region.py --steps 1 --check
    -> RuntimeError: Tensor device mismatch! Expected: meta, Got: cpu
"""

import torch
import torch.nn as nn


class GradModeRegion(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(8, 8)
        self.register_buffer("scale", torch.ones(8), persistent=False)

    def forward(self, x, **kwargs):  # **kwargs: fx is refused, export is used (as for HF models)
        with torch.no_grad():  # HF's rotary embedding: @torch.no_grad() forward
            s = self.scale.float() * 2.0
        return self.lin(x) * s


def build_model():
    return GradModeRegion()


def example_inputs():
    return (torch.randn(4, 8, generator=torch.Generator().manual_seed(0)),)
