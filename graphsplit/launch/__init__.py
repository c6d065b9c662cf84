"""`graphsplit run`: the launcher (torchrun under supervision), each rank's worker, and the parity check against the untouched model."""
