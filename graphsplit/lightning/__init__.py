"""graphsplit under Lightning (`pip install graphsplit[lightning]`): `GraphsplitStrategy` for the Trainer.

    from graphsplit.lightning import GraphsplitStrategy
    Trainer(devices=4, strategy=GraphsplitStrategy(pp=2, tp=2)).fit(module, data)
"""

from .strategy import GraphsplitStrategy

__all__ = ["GraphsplitStrategy"]
