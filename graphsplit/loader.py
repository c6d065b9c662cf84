"""Load the user's `model.py[:factory]`.

Convention: the file defines `build_model()` (or the callable named after the
colon) and `example_inputs()` returning a tuple of positional inputs or a dict
of keyword inputs; optionally `loss_fn(output, target)` and `example_target()` (or `loss_fn(output)`
alone), and `train_data()` / `eval_data()` for `run` (runtime/data.py). Without a loss_fn, training
minimizes the model's own loss when its output holds one (runtime/training.own_loss).
The file's folder is importable while it loads, so sibling imports work.

Loading is deterministic: the file is imported and its example_inputs() / example_target()
called with the global RNG seeded (the plan's seed, `DEFAULT_SEED` unless told), so a file that
draws `torch.randn(4, 8)` without a seed gives the reference and every rank the same batch. The
caller's RNG state is restored afterwards; a file that seeds itself overrides ours.
"""

from __future__ import annotations

import functools
import importlib.util
import random
import sys
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import torch
import torch.nn as nn
from torch.nn.modules.module import register_module_parameter_registration_hook
from torch.overrides import TorchFunctionMode

from .errors import GraphsplitError

DEFAULT_SEED = 0  # Plan.seed's default: `load_model(spec)` and a rank of the default plan draw alike

CONVENTION = (
    "a model file defines build_model() (or name another callable: model.py:make_gpt) "
    "and example_inputs() returning a tuple or a dict of tensors"
)


@dataclass
class LoadedModel:
    """The pieces of a model file, with the model not yet built."""

    path: Path
    factory: str
    builder: Callable[[], nn.Module]
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    loss_fn: Callable[[Any, Any], torch.Tensor] | None
    target: Any | None
    # train_data() / eval_data(), not called yet: a dataset may be costly to open (runtime/data.py reads them)
    train_data: Callable[[], Any] | None = None
    eval_data: Callable[[], Any] | None = None
    seed: int = DEFAULT_SEED  # what load_model seeded with: a build without a seed draws from it
    # batch_dims(): input name -> the dim holding the batch, or None (that input goes whole to every
    # micro-batch and replica); None: found in the graph (analysis/batch/)
    batch_dims: dict[str, int | None] | None = None

    @property
    def spec(self) -> str:
        return f"{self.path}:{self.factory}"

    def build(self, device: str | torch.device = "meta", seed: int | None = None) -> nn.Module:
        """Build the model; on `meta` it costs no weight memory, and its plain tensor attributes (a
        RoPE table or a mask assigned as `self.x = tensor`, not registered as a buffer) keep their
        values: `meta` would lose them, and the graph reads them as constants (`plain_tensors`)."""
        meta = torch.device(device).type == "meta"
        try:
            if seed is None:  # the same model wherever it is built, the caller's generators left as they were
                with forked_generators():
                    seed_generators(self.seed)
                    with torch.device(device):
                        model = self._call_builder()
            else:
                seed_generators(seed)
                with torch.device(device):
                    model = self._call_builder()
        except GraphsplitError as exc:
            if not meta or not _meta_cannot(exc.__cause__):
                raise
            # the constructor itself cannot run on meta (`.to_sparse()` of a buffer): each parameter goes to
            # meta as it is registered, the rest is built for real (buffers cost little)
            with forked_generators():
                seed_generators(self.seed if seed is None else seed)
                return self.build_buffers_only()
        if meta and plain_tensors(model):
            self._restore_plain_tensors(model)
        return model

    def _restore_plain_tensors(self, model: nn.Module) -> None:
        """The values of `model`'s plain tensor attributes, from a build whose non-parameter tensors are
        real (`build_buffers_only`, seeded alike: random tables match)."""
        with forked_generators(), _RealFromMeta():
            seed_generators(self.seed)
            real = self.build_buffers_only()
        for owner, attr in plain_tensors(model):
            value = getattr(real.get_submodule(owner), attr, None)
            if isinstance(value, torch.Tensor) and value.device.type != "meta":
                setattr(model.get_submodule(owner), attr, value)

    def buffer_values(self) -> dict[str, torch.Tensor]:
        """Every buffer's real value by qualified name (`build_buffers_only`: parameters on meta)."""
        return dict(self.build_buffers_only().named_buffers(remove_duplicate=False))

    def build_buffers_only(self, keep_up_to: int = 0) -> nn.Module:
        """Parameters on `meta`, buffers real on CPU.

        A weights file holds parameters and persistent buffers, but no non-persistent
        buffer (a causal mask, a RoPE table): those only exist by running the model's
        constructor. Each parameter is moved to meta as it is registered, so memory
        peaks at one parameter, and initializers then run on meta for free.
        Parameters of at most `keep_up_to` elements stay real, with the values the
        constructor (and its init code) leaves in them.
        """

        def to_meta(module: nn.Module, name: str, param: nn.Parameter) -> nn.Parameter | None:
            if param.device.type == "meta" or param.numel() <= keep_up_to:
                return None  # kept as it is
            return nn.Parameter(param.detach().to("meta"), requires_grad=param.requires_grad)

        with parameter_registration(to_meta):
            return self._call_builder()

    def _call_builder(self) -> nn.Module:
        try:
            model = self.builder()
        except GraphsplitError:
            raise
        except Exception as exc:  # the user's code: say where it broke
            raise GraphsplitError(f"{self.factory}() in {self.path} failed: {_where(exc)}") from exc
        if not isinstance(model, nn.Module):
            raise GraphsplitError(
                f"{self.factory}() in {self.path} returned {type(model).__name__}, not an nn.Module"
            )
        return model


@dataclass
class ModelInMemory(LoadedModel):
    """A model already built (with its weights), read as a model file is: for the planner, which
    traces and measures it on meta. `build("meta")` is a twin on meta (no weight copied); the twin's
    buffers stay real for `build_buffers_only`."""

    module: nn.Module | None = None

    def build(self, device: str | torch.device = "meta", seed: int | None = None) -> nn.Module:
        if torch.device(device).type != "meta":
            raise GraphsplitError(f"{self.factory} is a model in memory: the planner reads it on meta only")
        assert self.module is not None
        return meta_twin(self.module, buffers=True)

    def build_buffers_only(self, keep_up_to: int = 0) -> nn.Module:
        assert self.module is not None
        return meta_twin(self.module, buffers=False)


def model_in_memory(model: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any] | None = None,
                    loss_fn: Callable[[Any, Any], torch.Tensor] | None = None, target: Any = None,
                    batch_dims: dict[str, int | None] | None = None) -> ModelInMemory:
    """`model` with an example batch, as a `LoadedModel` the planner takes (`plan_model`, `price`)."""
    import inspect

    try:
        path = Path(inspect.getsourcefile(type(model)) or "<model>")
    except TypeError:  # a class made at run time
        path = Path("<model>")
    return ModelInMemory(path, type(model).__name__, lambda: model, args, dict(kwargs or {}), loss_fn, target,
                         batch_dims=batch_dims, module=model)


def meta_twin(model: nn.Module, buffers: bool = True) -> nn.Module:
    """A copy of `model` whose parameters (and, with `buffers`, buffers) are on meta: each module
    copied shallowly (its other attributes shared, a Lightning trainer too), tied tensors kept tied."""
    twins: dict[int, Any] = {}

    def on_meta(t: torch.Tensor) -> torch.Tensor:
        if id(t) not in twins:
            empty = torch.empty_like(t, device="meta")
            twins[id(t)] = nn.Parameter(empty, requires_grad=t.requires_grad) if isinstance(t, nn.Parameter) else empty
        return twins[id(t)]

    def twin(module: nn.Module) -> nn.Module:
        if id(module) in twins:
            return twins[id(module)]
        copy = type(module).__new__(type(module))
        copy.__dict__.update(module.__dict__)
        twins[id(module)] = copy
        copy._parameters = {k: None if p is None else on_meta(p) for k, p in module._parameters.items()}
        if buffers:
            copy._buffers = {k: None if b is None else on_meta(b) for k, b in module._buffers.items()}
        else:
            copy._buffers = dict(module._buffers)
        copy._modules = {k: None if m is None else twin(m) for k, m in module._modules.items()}
        return copy

    return twin(model)


def tensor_attributes(model: nn.Module) -> list[tuple[str, str]]:
    """(module name, attribute) of every tensor a module holds as a plain attribute, neither a parameter
    nor a buffer (a RoPE table or a mask assigned as `self.x = tensor`)."""
    return [(name, attr) for name, module in model.named_modules() for attr, value in vars(module).items()
            if isinstance(value, torch.Tensor) and not isinstance(value, nn.Parameter)]


def plain_tensors(model: nn.Module) -> list[tuple[str, str]]:
    """The plain tensor attributes (`tensor_attributes`) on `meta`: building on meta lost their values."""
    return [(name, attr) for name, attr in tensor_attributes(model)
            if getattr(model.get_submodule(name), attr).device.type == "meta"]


class _RealFromMeta(TorchFunctionMode):
    """While a model is built with its parameters on meta: a tensor made after a parameter's device
    (`self.weight.new_zeros(n)`, `torch.zeros_like(self.weight)`: loralib's `lora_ind`) is made on the
    CPU, with its values, instead of on meta."""

    _MAKERS = frozenset({"new_zeros", "new_ones", "new_full", "new_empty", "new_tensor", "zeros_like", "ones_like",
                         "full_like", "empty_like"})

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        source = args[0] if args else None
        if getattr(func, "__name__", "") in self._MAKERS and isinstance(source, torch.Tensor) \
                and source.device.type == "meta" and kwargs.get("device") is None:
            kwargs = {**kwargs, "device": "cpu"}
        return func(*args, **kwargs)


def _meta_cannot(exc: BaseException | None) -> bool:
    """An op of the constructor's has no meta kernel (or reads a meta tensor's values)."""
    text = str(exc)
    return isinstance(exc, NotImplementedError | RuntimeError) and ("Meta" in text or "meta" in text)


RegistrationHook = Callable[[nn.Module, str, nn.Parameter], nn.Parameter | None]


@contextmanager
def parameter_registration(hook: RegistrationHook) -> Iterator[None]:
    """Inside, every parameter a module registers passes through `hook(module, name, param)`,
    whose answer (if not None) is registered instead: torch's global registration hook, so
    no torch class is patched."""
    handle = register_module_parameter_registration_hook(hook)
    try:
        yield
    finally:
        handle.remove()


def _where(exc: BaseException) -> str:
    """`Type: message (file:line)` for the innermost frame of an exception."""
    if isinstance(exc, SyntaxError):  # where the parser stopped, not importlib's frame
        return f"{type(exc).__name__}: {exc.msg} ({Path(exc.filename or '?').name}:{exc.lineno})"
    frames = traceback.extract_tb(exc.__traceback__)
    loc = f" ({Path(frames[-1].filename).name}:{frames[-1].lineno})" if frames else ""
    return f"{type(exc).__name__}: {exc}{loc}"


def _import_file(path: Path) -> ModuleType:
    name = f"graphsplit_user_{path.stem}_{abs(hash(str(path.resolve())))}"
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise GraphsplitError(f"cannot import {path}: not a Python file")
    module = importlib.util.module_from_spec(spec)
    folder = str(path.resolve().parent)
    sys.path.insert(0, folder)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except Exception as exc:
        sys.modules.pop(name, None)
        raise GraphsplitError(f"importing {path} failed: {_where(exc)}") from exc
    finally:
        if sys.path and sys.path[0] == folder:
            sys.path.pop(0)
    return module


def _call(module: ModuleType, path: Path, name: str) -> Any:
    try:
        return getattr(module, name)()
    except Exception as exc:
        raise GraphsplitError(f"{name}() in {path} failed: {_where(exc)}") from exc


def _output_only(loss_fn: Callable[[Any], torch.Tensor]) -> Callable[[Any, Any], torch.Tensor]:
    """loss_fn(output) of a file without example_target(), called as every loss is: (output, target)."""

    @functools.wraps(loss_fn)
    def loss(output: Any, target: Any = None) -> torch.Tensor:
        return loss_fn(output)

    return loss


def seed_generators(seed: int) -> None:
    """Seed every global generator a model file may draw from while it builds the model or its
    examples: torch's, Python's `random` and NumPy's (Time-Series-Library picks FEDformer's Fourier
    modes with `np.random.shuffle`): each process then builds the same model."""
    torch.manual_seed(seed)
    random.seed(seed)
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        numpy.random.seed(seed % 2**32)


@contextmanager
def forked_generators() -> Iterator[None]:
    """Inside, draw freely: torch's, Python's and NumPy's global generators are restored on exit."""
    numpy = sys.modules.get("numpy")
    python_state, numpy_state = random.getstate(), numpy.random.get_state() if numpy is not None else None
    try:
        with torch.random.fork_rng(devices=[]):
            yield
    finally:
        random.setstate(python_state)
        numpy = numpy or sys.modules.get("numpy")
        if numpy_state is not None:
            numpy.random.set_state(numpy_state)


def load_model(spec: str, seed: int = DEFAULT_SEED) -> LoadedModel:
    """Load `path/to/model.py[:factory]`, the global generators seeded with `seed` while the file
    is imported and its example functions run (the caller's generator states are left as they were)."""
    with forked_generators():
        seed_generators(seed)
        loaded = _load(spec)
    loaded.seed = seed
    return loaded


def _load(spec: str) -> LoadedModel:
    path_str, _, factory = spec.partition(":")
    factory = factory or "build_model"
    path = Path(path_str)
    if path.is_dir():
        found = sorted(p.name for p in path.glob("*.py"))[:3]
        hint = f" (it holds {', '.join(found)})" if found else ""
        raise GraphsplitError(f"{path} is a folder, not a model file{hint}; give the .py file that defines the model; "
                              f"{CONVENTION}")
    if not path.is_file():
        raise GraphsplitError(f"model file {path} does not exist; {CONVENTION}")
    if path.suffix != ".py":
        raise GraphsplitError(f"{path} is not a Python file (.py); give the model's .py file; {CONVENTION}")
    module = _import_file(path)
    builder = getattr(module, factory, None)
    if not callable(builder):
        raise GraphsplitError(f"{path} defines no {factory}(); {CONVENTION}")
    if not callable(getattr(module, "example_inputs", None)):
        raise GraphsplitError(f"{path} defines no example_inputs(); {CONVENTION}")
    inputs = _call(module, path, "example_inputs")
    if isinstance(inputs, torch.Tensor):
        args, kwargs = (inputs,), {}
    elif isinstance(inputs, (tuple, list)):
        args, kwargs = tuple(inputs), {}
    elif isinstance(inputs, dict):
        args, kwargs = (), dict(inputs)
    else:
        raise GraphsplitError(
            f"example_inputs() in {path} returned {type(inputs).__name__}; return a tuple of "
            "positional inputs or a dict of keyword inputs"
        )
    if not any(isinstance(v, torch.Tensor) for v in (*args, *kwargs.values())):
        raise GraphsplitError(f"example_inputs() in {path} holds no tensor; the batch must be a tensor")
    loss_fn = getattr(module, "loss_fn", None)
    if loss_fn is not None and not callable(loss_fn):
        raise GraphsplitError(f"loss_fn in {path} is not callable; define loss_fn(output, target)")
    has_target = callable(getattr(module, "example_target", None))
    if loss_fn is not None and not has_target:  # the loss needs nothing but the output: loss_fn(output)
        loss_fn = _output_only(loss_fn)
    target = _call(module, path, "example_target") if has_target else None
    declared = _batch_dims(module, path) if hasattr(module, "batch_dims") else None
    data: dict[str, Any] = {}
    for name in ("train_data", "eval_data"):
        fn = getattr(module, name, None)
        if fn is not None and not callable(fn):
            raise GraphsplitError(f"{name} in {path} is not callable; define {name}() returning an iterable of "
                                  "(inputs, target) batches or a torch.utils.data.Dataset")
        data[name] = fn
    return LoadedModel(path, factory, builder, args, kwargs, loss_fn, target, **data, batch_dims=declared)


def _batch_dims(module: Any, path: Path) -> dict[str, int | None]:
    """The model file's `batch_dims()`: a dict of input name -> dim or None, checked for its form."""
    declared = _call(module, path, "batch_dims") if callable(module.batch_dims) else module.batch_dims
    if not isinstance(declared, dict) or not all(
            isinstance(k, str) and (v is None or (isinstance(v, int) and not isinstance(v, bool)))
            for k, v in declared.items()):
        raise GraphsplitError(f"batch_dims() in {path} must return a dict of input name -> the batch dim (an int) or "
                              "None (the input has no batch), e.g. {'src': 1, 'pos_ids': None}")
    return dict(declared)
