"""Device maps: graphsplit's (`transform --device-map`) against accelerate's `infer_auto_device_map`.

    python bench/device_map.py                # HF Llama, 16 layers, 2 and 4 devices
    python bench/device_map.py --devices 2 4 8

Both place an unmodified HF LlamaForCausalLM (built on meta from a config: 16 layers, width 512,
vocabulary 32000, untied LM head) on N devices of equal memory. accelerate fills device 0 up to
its limit, then device 1, ... (keeping `_no_split_modules` whole); graphsplit cuts at blocks
where the compute per device is most even. Each map is scored by graphsplit's cost model (FLOPs +
8 x bytes moved of every op, summed per device) as max / mean (1.00 = even), with the largest
device's parameter bytes; the ratio column is accelerate / graphsplit (above 1: graphsplit's map
keeps every device busier). The memory limit is 1.5 x an even share of the weights (at 1.25 accelerate sends layers to disk:
it keeps room for the largest layer on each device).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
from accelerate import infer_auto_device_map  # noqa: E402
from transformers import LlamaConfig, LlamaForCausalLM  # noqa: E402

from graphsplit.analysis.cost import node_cost  # noqa: E402
from graphsplit.api import transform  # noqa: E402
from graphsplit.ir.meta import META_KEY, info  # noqa: E402
from graphsplit.loader import LoadedModel  # noqa: E402
from graphsplit.plan import Plan  # noqa: E402
from graphsplit.report.device_map import device_map  # noqa: E402


def build_model() -> torch.nn.Module:
    config = LlamaConfig(hidden_size=512, intermediate_size=1408, num_hidden_layers=16, num_attention_heads=8,
                         num_key_value_heads=4, vocab_size=32000, max_position_embeddings=256, use_cache=False,
                         tie_word_embeddings=False)
    return LlamaForCausalLM(config)


def loaded_model() -> LoadedModel:
    ids = torch.zeros(2, 128, dtype=torch.long)
    return LoadedModel(path=Path(__file__), factory="build_model", builder=build_model, args=(), kwargs={"input_ids": ids},
                       loss_fn=None, target=None)


def device_of(name: str, found: dict) -> object:
    keys = [k for k in found if k == "" or name == k or name.startswith(k + ".")]
    return found[max(keys, key=len)] if keys else None


def score(program, model: torch.nn.Module, found: dict, devices: int) -> tuple[float, int]:
    """(max / mean of the cost per device, the largest device's parameter bytes)."""
    cost = [0.0] * devices
    last: object = 0
    for node in program.traced.gm.graph.nodes:
        if node.op.startswith("call") and META_KEY in node.meta:
            module = info(node).module
            where = device_of(module, found)
            if where is None:  # the root's own ops run where their inputs are: with the op before
                where = last
            cost[int(where)] += node_cost(node)
            last = where
    weights = [0] * devices
    for name, p in model.named_parameters():
        weights[int(device_of(name, found))] += p.numel() * p.element_size()
    return max(cost) / (sum(cost) / devices), max(weights)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--devices", type=int, nargs="+", default=[2, 4])
    args = parser.parse_args()
    loaded = loaded_model()
    model = loaded.build("meta")
    total = sum(p.numel() * p.element_size() for p in model.parameters())
    print(f"HF LlamaForCausalLM, 16 layers, width 512, vocabulary 32000: {total / 2**20:.0f} MiB of fp32 weights")
    print(f"{'devices':>8} {'graphsplit max/mean':>20} {'accelerate max/mean':>20} {'ratio':>6} "
          f"{'graphsplit MiB':>15} {'accelerate MiB':>15} {'limit MiB':>10}")
    for n in args.devices:
        program = transform(loaded, Plan(pp=n)).program
        ours = device_map(program, model)
        limit = int(total / n * 1.5)
        theirs = infer_auto_device_map(model, max_memory={i: limit for i in range(n)},
                                       no_split_module_classes=model._no_split_modules)
        (a, wa), (b, wb) = score(program, model, ours, n), score(program, model, theirs, n)
        print(f"{n:>8} {a:>20.2f} {b:>20.2f} {b / a:>6.2f} {wa / 2**20:>15.0f} {wb / 2**20:>15.0f} {limit / 2**20:>10.0f}")


if __name__ == "__main__":
    main()
