"""Training checkpoints with torch.distributed.checkpoint (DCP), keyed by the original model's names.

- record.py     what makes a folder a checkpoint (`graphsplit.json`, written last) and its key names
- series.py     `run --save DIR`'s `DIR/step-<N>` series: find the newest, refuse foreign folders
- blocks.py     each rank's blocks of the original tensors (`Pieces`), DCP's protocol for them
- safe_read.py  reading a checkpoint without running code from it, every problem one line
- state.py      what a rank saves and loads (parameters, optimizer, step, RNG), a series' next
                step, export to safetensors

record.py and series.py import no DCP (it costs about a second per process): a run
that neither saves nor resumes never loads it.
"""
