"""einops on torch.fx's proxies: `rearrange`, `reduce`, `repeat` and `einsum` traced as the torch ops they are.

einops picks its backend by the tensor's type and knows no fx Proxy, so a model written with it
(lucidrains' repositories, many vision and audio models) fails torch.fx ("Tensor type unknown to
einops") and goes to torch.export, which then meets whatever else it cannot follow. This backend is
einops' own torch backend for proxies: the same torch calls, recorded. The sizes it reads
(`x.shape`, `len(x.shape)`) are the tracer's to decide (size_conditions.py), as for any model code.
einops finds a backend among the subclasses of its AbstractBackend whose `framework_name` is an
imported module: importing this module is the registration (trace.py does, where einops is installed).
"""

from __future__ import annotations

from typing import Any

import torch.fx as fx
from einops._backends import TorchBackend


class ProxyBackend(TorchBackend):
    framework_name = "torch.fx"  # a module imported wherever graphsplit traces

    def is_appropriate_type(self, tensor: Any) -> bool:
        return isinstance(tensor, fx.Proxy)

    def shape(self, x: Any) -> Any:
        # `x.size()`, not `x.shape`: fx's attribute proxy has no length, the tracer's call proxy does
        return x.size()

    def is_float_type(self, x: Any) -> bool:
        # only `reduce(..., 'mean')` asks, to refuse integer tensors; a Proxy's dtype is no value
        return True
