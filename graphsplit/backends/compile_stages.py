"""--compile: each stage module runs under `torch.compile`, in place.

    apply_compile(modules, backend="inductor")

`nn.Module.compile()` compiles the module's call and keeps the module itself:
parameter names, state_dict keys, `named_grads`, checkpoints, and the DDP / FSDP2 /
`PipelineStage` wrapping around it are unchanged (`torch.compile(module)` would
return an `OptimizedModule` whose names start with `_orig_mod.`).

What dynamo sees in a stage graph:
- tp collectives (ops/tp.py) are `torch.compiler.disable`d: each is a graph
  break, so a stage compiles to the pieces between its collectives (about four
  per transformer block at tp > 1) and the collectives run eagerly on the
  stage's process group, or on the local backend's threads;
- activation-checkpoint regions are non-reentrant `torch.utils.checkpoint`,
  which dynamo traces as a higher-order op (recompute included);
- autocast regions are traced as autocast regions.

The stage, not each block, is the unit: a stage's blocks are separate fx code
objects, so dynamo would not reuse one block's compilation for the next anyway,
and one graph per piece fuses across block boundaries. Under FSDP each block
region is an FSDP unit inside the compiled stage: FSDP2's hooks are
dynamo-disabled (torch's `_dynamo_disable`), so each region's call is a graph
break, as a tp collective is, and the hooks run eagerly around it.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch.nn as nn

# inductor generates C++ on CPU (needs a C++ compiler) and Triton on GPU; tests pass
# "aot_eager" (the same graphs and autograd, no code generation) to stay fast
DEFAULT_BACKEND = "inductor"


def apply_compile(modules: Iterable[nn.Module], backend: str = DEFAULT_BACKEND) -> None:
    """Compile every module of `modules` in place (`nn.Module.compile`)."""
    from ..ops.eager import disable_for_compile
    from ..ops.float8 import prime

    disable_for_compile()
    for module in modules:
        prime(module)
        module.compile(backend=backend)
