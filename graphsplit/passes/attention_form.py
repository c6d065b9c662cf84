"""Attention in SDPA's own form, where a model spells it otherwise: what context parallelism cuts.

Context parallelism gathers keys and values at `F.scaled_dot_product_attention` calls and computes a
causal mask by global position (ops/context_parallel.py). Two spellings common in models copied between
repositories hide that:

- a mask built from the sequence's size alone and passed as `attn_mask` (HF's `create_causal_mask`
  under torch.export: positions compared, packed sequences looked for). When it equals the causal
  mask on the example it becomes `is_causal=True` (all true: no mask), and its build is removed.
- attention written out (nanoGPT's `softmax((q @ k.transpose(-2, -1)) * scale` masked by a
  `tril` buffer sliced to the sequence, then `@ v`). When the mask is causal (or absent) the chain
  becomes one SDPA call with that scale.

Either rewrite keeps what the model computes (the same math, in fp32 to rounding); a mask that is
not causal, or a chain with anything else between its steps, is left alone, and --cp then names
what mixes the sequence. The mask is evaluated on CPU from what it reads: the inputs' sizes (an
intermediate's from the analysis, `annotate`), the inputs themselves only through their sizes, and
buffers' real values (the model file's constructor: `Loaded.build_buffers_only`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.fx as fx
import torch.nn.functional as F

from ..errors import GraphsplitError
from ..ir.meta import META_KEY, info, module_path
from ..ir.op_kinds import calls, op_name

SDPA_ARGS = ("attn_mask", "dropout_p", "is_causal", "scale", "enable_gqa")
SDPA = "scaled_dot_product_attention"  # fx's F.scaled_dot_product_attention and torch.export's ATen op (`calls`)


def _size_read(node: object) -> bool:
    """A read of a size, not of values: `x.size()`, `x.shape`, torch.export's `sym_size`."""
    return calls(node, "size", "sym_size") or (isinstance(node, fx.Node) and node.target is getattr
                                              and node.args[1:] == ("shape",))


class Buffers(Mapping[str, torch.Tensor]):
    """Buffers' real values by graph attribute, made by `load` on first use (running a model's
    constructor costs: only a mask that reads a buffer needs them)."""

    def __init__(self, load: Callable[[], Mapping[str, torch.Tensor]] | None) -> None:
        self._load, self._found = load, None

    def _values(self) -> Mapping[str, torch.Tensor]:
        if self._found is None:
            self._found = dict(self._load()) if self._load is not None else {}
        return self._found

    def __getitem__(self, key: str) -> torch.Tensor:
        return self._values()[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._values())

    def __len__(self) -> int:
        return len(self._values())


@dataclass(frozen=True)
class Known:
    """What a mask's build may read: the example inputs by placeholder name, buffers by graph attribute."""

    inputs: Mapping[str, torch.Tensor]
    buffers: Mapping[str, torch.Tensor]


def _build(mask: fx.Node, known: Known) -> list[fx.Node] | None:
    """The nodes computing `mask`, in graph order, when it reads sizes, buffers and constants alone
    (an input only through its size); None otherwise."""
    found: set[fx.Node] = set()
    todo = [mask]
    while todo:
        node = todo.pop()
        if node in found:
            continue
        found.add(node)
        if node.op == "get_attr":
            if str(node.target) not in known.buffers:
                return None
        elif node.op == "call_module":
            return None
        elif _size_read(node) and isinstance(node.args[0], fx.Node) and node.args[0].op != "placeholder":
            if info(node.args[0]).tensor is None:  # the analysis gives an intermediate's size
                return None
        else:
            todo.extend(node.all_input_nodes)
    if any(n.op == "placeholder" and any(u in found and not _size_read(u) for u in n.users) for n in found):
        return None
    order = {n: i for i, n in enumerate(mask.graph.nodes)}
    return sorted(found, key=order.__getitem__)


def _evaluate(nodes: list[fx.Node], known: Known) -> Any:
    """`nodes` (a mask's build, in order) run on CPU."""
    env: dict[fx.Node, Any] = {}

    def on_cpu(value: Any) -> Any:
        return torch.device("cpu") if isinstance(value, torch.device) else value

    for node in nodes:
        if node.op == "placeholder":
            env[node] = known.inputs[node.name]
        elif node.op == "get_attr":
            env[node] = known.buffers[str(node.target)]
        elif _size_read(node) and node.args[0] not in env:  # an intermediate's size, from the analysis
            shape = torch.Size(int(s) for s in info(node.args[0]).tensor.shape)
            rest = node.args[1:]
            env[node] = shape if not rest or rest[0] == "shape" else shape[rest[0]]
        else:
            args = fx.node.map_aggregate(fx.node.map_arg(node.args, env.__getitem__), on_cpu)
            kwargs = fx.node.map_aggregate(fx.node.map_arg(node.kwargs, env.__getitem__), on_cpu)
            if node.op == "call_method":
                env[node] = getattr(args[0], str(node.target))(*args[1:], **kwargs)
            else:
                env[node] = node.target(*args, **kwargs)
    return env[nodes[-1]]


def _allowed(mask: fx.Node, known: Known, fill: bool = False) -> tuple[torch.Tensor, list[fx.Node]] | None:
    """Which (query, key) pairs `mask` lets attend, as a [..., T, T] bool tensor, and its build; `fill`:
    the mask is masked_fill's (True: masked out). None when it cannot be evaluated."""
    built = _build(mask, known)
    if built is None:
        return None
    try:
        with torch.no_grad():
            value = _evaluate(built, known)
    except Exception:  # noqa: BLE001 - a build graphsplit cannot run on CPU: left as it is (and refused)
        return None
    if not isinstance(value, torch.Tensor) or value.dim() < 2 or value.shape[-1] != value.shape[-2]:
        return None
    if fill:
        return (~value.bool() if value.dtype == torch.bool else value == 0), built
    if value.dtype == torch.bool:
        return value, built
    if not bool(((value == 0) | (value <= torch.finfo(value.dtype).min / 2)).all()):
        return None  # an additive mask with other values (a bias): not a mask
    return value == 0, built


def _causal(allowed: torch.Tensor) -> bool | None:
    """True: the causal mask; False: no mask (every pair attends); None: another mask."""
    if bool(allowed.all()):
        return False
    length = allowed.shape[-1]
    if bool((allowed == torch.ones(length, length, dtype=torch.bool).tril()).all()):
        return True
    return None


def _refuse(mask: fx.Node, allowed: torch.Tensor) -> None:
    """A mask context parallelism cannot reproduce (it masks by global position, causally): one line."""
    length = allowed.shape[-1]
    window = next((w for w in range(1, length) if bool((allowed == torch.ones(length, length, dtype=torch.bool)
                                                         .tril().triu(-w + 1)).all())), None)
    what = f"a sliding window of {window} tokens" if window else "neither causal nor full"
    source = info(mask).source
    raise GraphsplitError(f"--cp: the attention mask{f' at {source}' if source else ''} is {what}; context parallelism "
                          "masks by global position, causally or not at all; drop --cp")


def _remove(gm: fx.GraphModule, nodes: Sequence[fx.Node]) -> None:
    """Erase what of `nodes` nothing reads any more (and the metadata asserts export left on them)."""
    for dead in reversed(nodes):
        for user in list(dead.users):
            if not user.users and user.target is torch.ops.aten._assert_tensor_metadata.default:
                gm.graph.erase_node(user)
        if not dead.users and dead.op != "placeholder":
            gm.graph.erase_node(dead)


def causal_masks(gm: fx.GraphModule, known: Known) -> int:
    """SDPA calls whose `attn_mask`, built from sizes alone, is causal (or all true): `is_causal=True`
    (or no mask), the build removed (module doc). Returns how many calls changed."""
    changed = 0
    for node in list(gm.graph.nodes):
        if not calls(node, SDPA):
            continue
        q, k, v, *rest = node.args
        kwargs = dict(zip(SDPA_ARGS, rest), **node.kwargs)
        mask = kwargs.get("attn_mask")
        if not isinstance(mask, fx.Node) or kwargs.get("is_causal"):
            continue
        found = _allowed(mask, known)
        if found is None:
            continue
        causal = _causal(found[0])
        if causal is None:
            _refuse(mask, found[0])
        kwargs.pop("attn_mask")
        if causal:
            kwargs["is_causal"] = True
        node.args, node.kwargs = (q, k, v), kwargs
        _remove(gm, found[1])
        changed += 1
    return changed


def _only_user(node: fx.Node) -> fx.Node | None:
    return next(iter(node.users)) if len(node.users) == 1 else None


def _last_dim(node: fx.Node) -> bool:
    dim = node.kwargs.get("dim", node.args[1] if len(node.args) > 1 else None)
    spec = info(node).tensor
    return dim == -1 or (spec is not None and dim == len(spec.shape) - 1)


def _number(value: Any, known: Known) -> float | None:
    """`value` as a number when it is one or is computed from sizes and constants alone (a scale)."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    built = _build(value, known) if isinstance(value, fx.Node) else None
    if not built:
        return None
    try:
        found = _evaluate(built, known)
    except Exception:  # noqa: BLE001 - not a number graphsplit can compute
        return None
    if isinstance(found, torch.Tensor) and found.numel() == 1 and found.is_floating_point():
        return float(found)
    return float(found) if isinstance(found, int | float) and not isinstance(found, bool) else None


def written_attention(gm: fx.GraphModule, known: Known) -> int:
    """`softmax(mask(scale * (q @ k.transpose(-2, -1)))) @ v` with a causal (or no) mask, each step
    read only by the next: one SDPA call (module doc). Returns how many chains became one."""
    changed = 0
    for soft in list(gm.graph.nodes):
        # _softmax's third argument is half_to_float, softmax's a dtype: either changes the result's dtype
        if not calls(soft, "softmax", "_softmax") or not _last_dim(soft) or soft.kwargs.get("dtype") is not None \
                or (len(soft.args) > 2 and soft.args[2] not in (None, False)):
            continue
        out = _only_user(soft)
        if not calls(out, "matmul") or out.args[0] is not soft:
            continue
        chain, x, scale, causal, build = [soft, out], soft.args[0], 1.0, False, []
        if calls(x, "masked_fill") and _only_user(x) is soft and x.args[2] == float("-inf"):
            found = _allowed(x.args[1], known, fill=True)
            if found is None:
                continue
            verdict = _causal(found[0])
            if verdict is None:
                _refuse(x, found[0])
            chain.append(x)
            causal, build, x = verdict, found[1], x.args[0]
        if calls(x, "mul", "div") and "rounding_mode" not in x.kwargs and _only_user(x) in chain:
            step, (a, b) = x, x.args[:2]
            divides = op_name(step) == "div"
            by, x = (b, a) if divides or _number(b, known) is not None else (a, b)
            number = _number(by, known)
            if not number:
                continue
            scale = 1.0 / number if divides else number
            chain.append(step)
            if isinstance(by, fx.Node):  # 1 / sqrt(k.size(-1)): computed from a size, removed with the chain
                build += _build(by, known) or []
        if not (calls(x, "matmul") and _only_user(x) in chain):
            continue
        q, kt = x.args[:2]
        dims = kt.args[1:3] if calls(kt, "transpose") else ()
        if not (len(dims) == 2 and all(isinstance(a, int) for a in dims) and _only_user(kt) is x
                and sorted(a % 4 for a in dims) == [2, 3]):
            continue
        spec = info(q).tensor
        if spec is None or len(spec.shape) != 4:
            continue
        chain += [x, kt]
        k, v = kt.args[0], out.args[1]
        with gm.graph.inserting_before(out):
            sdpa = gm.graph.call_function(F.scaled_dot_product_attention, (q, k, v),
                                          {"is_causal": causal, "scale": scale})
        sdpa.meta.update({k: v for k, v in soft.meta.items() if k != META_KEY})  # its module stack, its trace
        info(sdpa).module, info(sdpa).source = info(soft).module or module_path(soft), info(soft).source
        info(sdpa).tensor, info(sdpa).value = info(out).tensor, "tensor"
        out.replace_all_uses_with(sdpa)
        order = {n: i for i, n in enumerate(gm.graph.nodes)}
        _remove(gm, sorted({*chain, *build}, key=order.__getitem__))
        changed += 1
    return changed


def attention_form(gm: fx.GraphModule, names: Sequence[str], flat: Sequence[Any],
                   buffers: Callable[[], Mapping[str, torch.Tensor]] | None = None) -> int:
    """Both rewrites of the module doc on `gm` (annotated: the analysis gives intermediates' sizes);
    `buffers`: the model's buffers' real values by graph attribute, made when a mask reads one. Returns
    how many attention calls changed."""
    known = Known({n: t for n, t in zip(names, flat) if isinstance(t, torch.Tensor)}, Buffers(buffers))
    changed = causal_masks(gm, known) + written_attention(gm, known)
    if changed:
        gm.graph.lint()
        gm.recompile()
    return changed
