"""The sharding rules, one module per op-family group; importing this package fills
`decision.RULES`. A family with no rule (`OpKind.OTHER`, convolutions, ...) gets
`fallback.unknown` (the rule of `OpKind.OTHER`): its sharded inputs are gathered,
its output is whole."""

from . import (
           attention,
           cross_entropy,
           einsum,
           embedding,
           experts,
           fallback,
           matrix,
           pointwise,
           reductions,
           sizes,
           structure,
           views,
)

__all__ = ["attention", "cross_entropy", "einsum", "embedding", "experts", "fallback", "matrix", "pointwise", "reductions", "sizes",
           "structure", "views"]
