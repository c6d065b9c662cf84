"""What a graph's communicators share (tp_comm.TPComm, cp.CPComm, ep.EPComm): each is a module of the
graph holding the collectives of one mesh axis. Unbound (a copied stage, the analysis on meta) its
collectives are shaped but not run; `bind` gives it what they run over (a process group, or the local
backend's link). A copy starts unbound: a process group is not copied, and a copied stage is bound
again where it runs."""

from __future__ import annotations

from typing import Any, ClassVar

import torch.nn as nn


class Communicator(nn.Module):
    axis: ClassVar[str]  # the mesh axis: "tp", "cp", "ep"

    def __init__(self, degree: int) -> None:
        super().__init__()
        self.degree = degree
        self.link: Any = None

    def bind(self, link: Any) -> None:
        self.link = link

    def __deepcopy__(self, memo: dict[int, Any]) -> Communicator:
        return type(self)(self.degree)

    def extra_repr(self) -> str:
        return f"{self.axis}={self.degree}, bound={self.bound}"

    @property
    def bound(self) -> bool:
        return self.link is not None
