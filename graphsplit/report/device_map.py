"""A device map from graphsplit's balanced split: single-process model parallelism, as HF's
`device_map` and `accelerate.dispatch_model` run it (each module's weights on one device, its
inputs moved there as the forward reaches it).

The `--pp N` plan's ops are cut into N balanced parts, as its stages are, but only between
repeated blocks and top-level modules; part s is device s. A module holding parameters or buffers
goes where it is first called (a weight tied to the LM head stays with the embedding, as accelerate
keeps tied weights together). The map is then written as accelerate writes its own: a module whose
whole subtree lies on one device is one entry.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch.nn as nn

from ..analysis.balance import balanced_cuts
from ..analysis.cost import node_cost
from ..errors import GraphsplitError
from ..ir.meta import META_KEY, block_of, info
from ..ir.program import Program
from ..plan import Plan
from ..runtime.atomic import write_file_atomically


def device_map(program: Program, model: nn.Module) -> dict[str, int]:
    """Module (or parameter) name -> device index, covering every parameter and buffer of `model`.

    The cut is graphsplit's balanced one over the stages' ops, but only between repeated blocks and
    top-level modules: a module that adds tensors of two children (a decoder layer's residual) runs
    on one device, as HF's `_no_split_modules` asks."""
    devices = program.plan.num_stages
    # the traced graph in the model's own order (the stages' graphs reorder ops around their cuts)
    ops = [node for node in program.traced.gm.graph.nodes
           if node.op in ("call_function", "call_method", "call_module") and META_KEY in node.meta]
    # the units a device holds whole: repeated blocks, and the outermost modules that contain none
    # ("model.embed_tokens", "lm_head"); a module holding blocks ("model", "model.layers") is no unit
    containers = {""}
    for node in ops:
        block = block_of(info(node).module)
        while block:
            block = block.rpartition(".")[0]
            containers.add(block)

    def unit_of(module: str) -> str:
        block = block_of(module)
        if block:
            return block
        parts = module.split(".")
        return next((".".join(parts[:i]) for i in range(1, len(parts) + 1) if ".".join(parts[:i]) not in containers), "")

    units: list[tuple[str, float, list[str]]] = []  # (unit, cost, modules called in it), in graph order
    for node in ops:
        module = info(node).module
        unit = unit_of(module)
        if not units or units[-1][0] != unit:
            units.append((unit, 0.0, []))
        name, cost, called = units[-1]
        called.append(module)
        units[-1] = (name, cost + node_cost(node), called)
    first_unit: dict[str, int] = {}  # module (and the modules above it) -> the first unit calling it
    for index, (_, _, called) in enumerate(units):
        for module in called:
            while True:
                first_unit.setdefault(module, index)
                if not module:
                    break
                module = module.rpartition(".")[0]
    owners: dict[int, list[str]] = {}
    holders: dict[str, int | None] = {}  # module with tensors of its own -> its device
    for name, module in model.named_modules():
        own = [p for _, p in module.named_parameters(recurse=False, remove_duplicate=False)]
        if own or list(module.named_buffers(recurse=False)):
            holders[name] = None
            for p in own:
                owners.setdefault(id(p), []).append(name)
    # a unit calling a module that shares a weight with an earlier unit's module runs with that unit
    # (accelerate keeps tied weights on one device): it takes no device of its own in the balance
    anchor = list(range(len(units)))
    for names in owners.values():
        calls = sorted({first_unit[n] for n in names if n in first_unit})
        for later in calls[1:]:
            anchor[later] = min(anchor[later], calls[0])
    for i in range(len(units)):
        anchor[i] = anchor[anchor[i]]
    free = [i for i in range(len(units)) if anchor[i] == i]
    cost = {i: 0.0 for i in free}
    for i, (_, c, _) in enumerate(units):
        cost[anchor[i]] += c
    # a cut may fall only where no module called before it is called again after it (the root's own
    # ops, module '', belong to no unit)
    names = [units[i][0] for i in free]
    last = {name: k for k, name in enumerate(names) if name}
    valid = np.zeros(len(free) + 1, dtype=bool)
    reach = -1
    for k in range(1, len(free)):
        if names[k - 1]:
            reach = max(reach, last[names[k - 1]])
        valid[k] = reach < k
    if int(valid.sum()) < devices - 1:
        raise GraphsplitError(f"--device-map: the model has {int(valid.sum()) + 1} top-level modules and blocks to "
                              f"place on {devices} devices; use --pp {int(valid.sum()) + 1} or fewer")
    cuts = balanced_cuts(np.array([cost[i] for i in free]), np.zeros(len(free) + 1), valid, devices)
    device = {i: int(np.searchsorted(cuts, k, side="right")) for k, i in enumerate(free)}
    for name in holders:
        if name in first_unit:
            holders[name] = device[anchor[first_unit[name]]]
    # a module the graph never calls (an unused head) goes with the module before it
    previous = 0
    for name, placed in holders.items():
        holders[name] = previous = placed if placed is not None else previous
    # a tied weight's modules go where it is first used, whichever unit called them
    for names_ in owners.values():
        if len(names_) > 1:
            first = min(int(holders[n]) for n in names_)  # type: ignore[arg-type]
            for n in names_:
                holders[n] = first
    return _compact(model, holders)


def _compact(model: nn.Module, holders: dict[str, int | None]) -> dict[str, int]:
    """One entry per largest subtree on one device; a module's own tensors by their names when its
    children lie elsewhere."""
    found: dict[str, int] = {}

    def devices(prefix: str) -> set[int]:
        return {d for name, d in holders.items() if d is not None and (not prefix or name == prefix
                                                                        or name.startswith(prefix + "."))}

    def visit(prefix: str, module: nn.Module) -> None:
        here = devices(prefix)
        if not here:
            return
        if len(here) == 1:
            found[prefix] = here.pop()
            return
        if prefix in holders:
            own = [n for n, _ in module.named_parameters(recurse=False, remove_duplicate=False)]
            own += [n for n, _ in module.named_buffers(recurse=False)]
            for tensor in own:
                found[f"{prefix}.{tensor}" if prefix else tensor] = int(holders[prefix])  # type: ignore[arg-type]
        for child, sub in module.named_children():
            visit(f"{prefix}.{child}" if prefix else child, sub)

    visit("", model)
    return found


def check_device_map_target(path: Path, plan: Plan) -> None:
    """Refuse, before any work, a plan a device map cannot express or a path it cannot be written to."""
    if plan.tp > 1 or plan.dp > 1 or plan.stages_per_rank > 1:
        raise GraphsplitError(
            "--device-map spreads the model's layers over the devices of one process: use it with --pp "
            f"alone (this plan has tp={plan.tp}, dp={plan.dp}, {plan.stages_per_rank} stages per rank)")
    if path.is_dir():
        raise GraphsplitError(f"--device-map {path} is a folder; give a file name such as {path}/device_map.json")
    if not path.parent.is_dir():
        raise GraphsplitError(f"--device-map {path}: folder {path.parent} does not exist; create it or choose another path")


def write_device_map(path: Path, program: Program, model: nn.Module) -> dict[str, int]:
    """Write `device_map(program, model)` as JSON (whole or not at all)."""
    check_device_map_target(path, program.plan)
    found = device_map(program, model)
    write_file_atomically(path, json.dumps(found, indent=2) + "\n")
    return found
