"""The bytes autograd saves in one training step of the Llama example's program in bf16 (pp 1), eager and
under --compile, parameters aside; printed as two words. A process of its own: it joins a world of one,
and compiling leaves dynamo's caches behind."""

import os
import socket
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from measure_memory import SavedStorages  # noqa: E402  (this folder: the same count of saved bytes)

from graphsplit import Plan  # noqa: E402
from graphsplit.api import parallelize  # noqa: E402
from graphsplit.loader import load_model  # noqa: E402


def main() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK="0", WORLD_SIZE="1", LOCAL_RANK="0")
    torch.set_num_threads(1)
    loaded = load_model(str(ROOT / "examples" / "llama.py"))
    (idx,) = loaded.args
    found = []
    for compiled in (False, True):
        module = parallelize(loaded.build("cpu", seed=0), Plan(autocast="bf16", compile=compiled), (idx,),
                             loaded.loss_fn, loaded.target)
        saved = SavedStorages(module)
        module.train_step(idx, target=loaded.target)  # compiles
        with torch.autograd.graph.saved_tensors_hooks(saved.pack, lambda t: t):
            module.train_step(idx, target=loaded.target)
        found.append(saved.total())
    print(*found)


if __name__ == "__main__":
    main()
