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

from .errors import GraphsplitError


class _Safetensors(Mapping[str, torch.Tensor]):
    def __init__(self, path: Path) -> None:
        from safetensors import safe_open

        self._file = safe_open(str(path), framework="pt")
        self._keys = list(self._file.keys())

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
