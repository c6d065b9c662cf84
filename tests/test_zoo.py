"""The model zoo (tests/models/zoo.py): HuggingFace architectures and diffusers' UNet2DModel,
unmodified, from tiny configs, each at pp 2, tp 2 and dp 2 x pp 2 x tp 2 on the local backend (five rows
whose features others cover at dp 2 x pp 2 x tp 2 only)
(every stage, tp shard and dp replica in this process, a thread per tp rank, real collectives, the
replicas one after the other on their shares of the batch, gradients averaged): loss, output and
every rank's gradient against the matching slice of the untouched model's (fp32, 1e-5 relative, or
the untouched model's own rounding noise x10). Each architecture is traced once; its three plans compile from copies of that trace.

On real processes: an HF model is test_hf_moe's Mixtral (tp 2); the dp2 x pp2 x tp2 mesh is
tests/test_fsdp.py's and test_parallelize's. A zoo row on real processes costs 30-75 s (each rank imports transformers and
traces), over this file's budget, so the zoo's rows are not checked on real processes:
`ZOO_ARCH=T5 graphsplit run tests/models/zoo_model.py --dp 2 --pp 2 --tp 2 --check` runs one (8 processes).

GPT-2, Llama, Mixtral, Qwen3-MoE and DeepSeek-V3 are checked in tests/test_hf_models.py and
tests/test_hf_moe.py. bench/zoo_table.py runs the same check on every row and prints the README's
table.
"""

from __future__ import annotations

import pytest

from graphsplit import GraphsplitError, Plan
from graphsplit.ir.sharding import Shard
from graphsplit.ir.traced_model import Traced
from graphsplit.launch.parity import check_locally
from graphsplit.rewrite import rewrite_loaded, trace_loaded

from .models import zoo

pytest.importorskip("transformers")  # the test extras install it and diffusers

PLANS = {"pp2": Plan(pp=2), "tp2": Plan(tp=2), "dp2-pp2-tp2": Plan(dp=2, pp=2, tp=2)}
# arch-major: one trace, three plans; a row whose features others cover at the plan that composes them all
CASES = [(arch.name, plan) for arch in zoo.ARCHS for plan in (PLANS if arch.suite else ["dp2-pp2-tp2"])]

_traces: dict[str, Traced] = {}


def traced(name: str) -> Traced:
    """The architecture's trace, made once (tracing through torch.export costs seconds; the rest of
    a plan's check, about one), kept for the refusals below (a few MB each at these sizes)."""
    if name not in _traces:
        _traces[name] = trace_loaded(zoo.loaded(zoo.BY_NAME[name]))
    return _traces[name]


@pytest.mark.parametrize("name, plan", CASES, ids=[f"{n}-{p}" for n, p in CASES])
def test_zoo_architecture_matches_untouched_model(name, plan):
    if zoo.BY_NAME[name].library == "diffusers":
        pytest.importorskip("diffusers")  # only its own row: no transformers row is skipped with it
    program, cmp = check_locally(zoo.loaded(zoo.BY_NAME[name]), PLANS[plan], traced=traced(name))
    assert cmp.ok, cmp.failures
    assert len(program.stages) == PLANS[plan].pp
    if PLANS[plan].tp > 1:
        assert program.param_shardings, "tp sharded something"
        assert any(k.startswith("grad") and k.endswith("(rank 1)") for k in cmp.max_diff), "rank 1's gradients compared"
    if name == "ModernBERT" and plan == "tp2":  # its fused Wqkv viewed as (3, heads, head_dim): q, k, v per rank
        assert program.param_shardings["model.layers.0.attn.Wqkv.weight"] == Shard(0, (32, 32, 32))
        assert not [r for r in program.replicated if ".attn." in r["module"]], program.replicated


@pytest.mark.parametrize("name, plan, message", [
    # a query head count tp does not divide: refused, naming the projection and the tp that fits
    ("ViT", Plan(tp=8), "attention in 'vit.layers.0.attention.q_proj': 4 heads cannot be split over tp=8; "
                        "use tp=4 (tp must divide the number of heads: 1, 2, 4)"),
    ("ModernBERT", Plan(tp=8), "attention in 'model.layers.0.attn.Wqkv': 4 heads cannot be split over tp=8; "
                               "use tp=4 (tp must divide the number of heads: 1, 2, 4)"),
])
def test_zoo_refusals_are_one_line_naming_the_module_and_what_to_do(name, plan, message):
    with pytest.raises(GraphsplitError) as err:
        rewrite_loaded(zoo.loaded(zoo.BY_NAME[name]), plan, traced=traced(name))
    text = str(err.value)
    assert message in text and "\n" not in text


def test_token_ids_outside_the_vocabulary_fail_under_vocab_parallel_tp_as_in_the_untouched_model():
    """A tokenizer larger than the model's vocabulary: the untouched model's lookup raises; the
    vocab-parallel embedding (each rank its rows, ids outside them masked) would embed the id as
    zeros on every rank, silently. It fails instead, saying what to do."""
    loaded = zoo.loaded(zoo.BY_NAME["GPT-NeoX"])
    ids = loaded.kwargs["input_ids"].clone()
    ids[0, 0] = zoo.VOCAB + 3
    loaded.kwargs = {"input_ids": ids}
    program = rewrite_loaded(loaded, Plan(tp=2), traced=traced("GPT-NeoX")).program
    assert program.param_shardings["gpt_neox.embed_in.weight"] == Shard(0)  # vocab-parallel
    with pytest.raises(RuntimeError, match=r"token id outside the vocabulary of 64 rows .*resize the model's embedding"):
        check_locally(loaded, Plan(tp=2), traced=traced("GPT-NeoX"))


def test_the_architecture_count_in_readme_and_models_md_is_the_suite_s():
    """README.md and docs/models.md say how many HF and diffusers architectures are checked: this file's
    rows and tests/test_hf_models.py's and tests/test_hf_moe.py's models, every one of them in the suite."""
    import re
    from pathlib import Path

    from .test_hf_models import HF
    from .test_hf_moe import FAMILIES

    count = len(zoo.ARCHS) + len(HF) + len(FAMILIES)
    root = Path(__file__).resolve().parents[1]
    readme = (root / "README.md").read_text()
    assert re.search(rf"\b{count} architectures from HF transformers and diffusers", readme), count
    models = (root / "docs" / "models.md").read_text()
    table = models[models.index("## The model zoo"):models.index("## Mixtures of experts")]
    rows = [line for line in table.splitlines() if line.startswith("| ") and not line.startswith("| architecture")]
    assert len(rows) == count and f"{count} architectures: {count}/{count} at every plan" in table
