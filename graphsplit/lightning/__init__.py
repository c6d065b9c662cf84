"""graphsplit under Lightning (`pip install graphsplit[lightning]`): `GraphsplitStrategy` for the Trainer,
`GraphsplitFabricStrategy` for Fabric.

    from graphsplit.lightning import GraphsplitStrategy
    Trainer(devices=4, strategy=GraphsplitStrategy(pp=2, tp=2)).fit(module, data)
"""

from .fabric import GraphsplitFabricStrategy
from .strategy import GraphsplitStrategy

__all__ = ["GraphsplitFabricStrategy", "GraphsplitStrategy"]
