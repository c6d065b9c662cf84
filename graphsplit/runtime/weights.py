"""Read a weights file tensor by tensor: a `.safetensors` file or a torch state dict.

`open_weights(path)` returns a mapping from the model's parameter names to
tensors that reads each tensor only when asked (safetensors: `safe_open`;
torch: `torch.load(mmap=True)`), so a rank copies its own shards without the
whole model ever being in its memory.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from pathlib import Path

import torch
import torch.nn as nn

from ..errors import GraphsplitError


class _Safetensors(Mapping[str, torch.Tensor]):
    def __init__(self, path: Path) -> None:
        from safetensors import safe_open

        try:  # the header is read and checked against the file's length here
            self._file = safe_open(str(path), framework="pt")
            self._keys = list(self._file.keys())
        except Exception as exc:  # safetensors' own error type, or an OSError
            detail = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise GraphsplitError(f"cannot read {path} as a .safetensors file ({detail}): it is truncated or not "
                                  "a safetensors file; write it again with safetensors.torch.save_file") from exc

    def shape(self, key: str) -> tuple[int, ...]:
        """The tensor's shape from the header, without reading its data."""
        return tuple(self._file.get_slice(key).get_shape())

    def __getitem__(self, key: str) -> torch.Tensor:
        if key not in self._keys:
            raise KeyError(key)
        return self._file.get_tensor(key)

    def __iter__(self) -> Iterator[str]:
        return iter(self._keys)

    def __len__(self) -> int:
        return len(self._keys)


def open_weights(path: str | Path) -> Mapping[str, torch.Tensor]:
    path = Path(path)
    if path.is_dir():
        raise GraphsplitError(f"weights file {path} is a folder; give a .safetensors file or a torch state dict "
                              "(a checkpoint folder from run --save is read with --resume)")
    if not path.is_file():
        raise GraphsplitError(f"weights file {path} does not exist; give a .safetensors file or a torch state dict")
    if path.suffix == ".safetensors":
        return _Safetensors(path)
    try:
        state = torch.load(path, mmap=True, weights_only=True, map_location="cpu")
    except Exception as exc:
        raise GraphsplitError(f"cannot read {path} as a torch state dict ({type(exc).__name__}); "
                              "give a .safetensors file or a file written by torch.save(model.state_dict())") from exc
    if not isinstance(state, Mapping) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise GraphsplitError(f"{path} is not a state dict of tensors; save it with torch.save(model.state_dict())")
    return state


def check_weights(weights: Mapping[str, torch.Tensor], model: nn.Module, path: str | Path) -> None:
    """Every parameter of `model` (built on meta) is in `weights` under one of its names, in its shape.

    Run before any rank starts, so a wrong file is one line here, not a failure on every rank.
    Buffers may be absent (the ranks take them from the constructor); extra tensors are ignored."""
    names: dict[int, list[str]] = {}
    params: dict[int, torch.Tensor] = {}
    for name, p in model.named_parameters(remove_duplicate=False):
        names.setdefault(id(p), []).append(name)  # a tied weight may be saved under any of its names
        params[id(p)] = p
    missing = [aliases[0] for aliases in names.values() if not any(n in weights for n in aliases)]
    if missing:
        held = sorted(weights)[:2]
        holds = f"it holds {', '.join(map(repr, held))}{', ...' if len(weights) > 2 else ''}" if held else "it is empty"
        raise GraphsplitError(
            f"weights file {path} has no tensor {missing[0]!r} ({len(missing)} of the model's {len(names)} parameters "
            f"missing; {holds}); save it from this model with torch.save(model.state_dict()) or safetensors"
        )
    for key, aliases in names.items():
        want = tuple(params[key].shape)
        for name in (n for n in aliases if n in weights):
            have = weights.shape(name) if isinstance(weights, _Safetensors) else tuple(weights[name].shape)
            if have != want:
                raise GraphsplitError(f"weights file {path} holds {name!r} with shape {have}, the model's is {want}; "
                                      "give the weights of this model (same configuration)")
