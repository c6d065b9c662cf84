"""What a rank runs: micro-batches and the loss, materializing its stages, per-rank initialization, weights files, DCP checkpoints, atomic folder writes."""
