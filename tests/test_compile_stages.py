"""--compile: every stage module under torch.compile computes what the untouched model computes.

The local backend (a thread per tp rank) runs the compiled stages: loss, output and every
rank's gradient against the untouched model's (fp32, 1e-5 relative, or the untouched model's own noise x10). The backend
is "aot_eager" (dynamo's graphs and AOT autograd, no code generation): inductor would only add
minutes of C++ builds on this CPU; bench/compile_step.py times inductor.
"""

from torch._dynamo.utils import counters

from graphsplit import Plan
from graphsplit.launch.parity import check_locally
from graphsplit.loader import load_model

from .conftest import MODELS

SHALLOW = str(MODELS / "shallow_gpt.py")


def _compiled_graphs() -> int:
    return int(counters["stats"]["unique_graphs"])


def test_compiled_tp_stages_equal_the_untouched_model():
    """Each tp collective is a graph break: the pieces between them are compiled, the all-reduces
    run eagerly on the threads' hub, and the gradients still match slice by slice."""
    before = _compiled_graphs()
    program, cmp = check_locally(load_model(str(MODELS / "tp_mlp.py")), Plan(tp=2, compile=True),
                                 compile_backend="aot_eager")
    assert cmp.ok, cmp.failures
    assert {"loss", "output[0]", "grad up.weight (rank 1)", "grad down.weight (rank 1)"} <= set(cmp.max_diff)
    assert program.param_shardings  # up column-parallel, down row-parallel: the collectives ran
    assert _compiled_graphs() > before  # dynamo compiled something: the check ran compiled code


def test_compiled_pipeline_stages_with_checkpointed_blocks_equal_the_untouched_model():
    before = _compiled_graphs()
    program, cmp = check_locally(load_model(SHALLOW), Plan(pp=2, checkpoint="blocks", compile=True),
                                 compile_backend="aot_eager")
    assert cmp.ok, cmp.failures
    assert len(program.stages) == 2 and "grad h.1.mlp.c_fc.weight (rank 0)" in cmp.max_diff
    assert _compiled_graphs() > before

