"""What a plan does to the state a model writes in its own forward (a step counter, an EMA written in
place): said, since it differs from the untouched model on the whole batch on purpose."""

from __future__ import annotations

from ..ir.aliasing import Storages
from ..ir.program import Program


def written_buffers(program: Program) -> list[str]:
    """The model's buffers its forward writes in place (`self.calls += 1` on a buffer, `.data.lerp_`)."""
    gm = program.traced.gm
    storages = Storages(gm)
    own = {name for name, _ in gm.named_buffers()}
    return sorted({str(n.target) for n in gm.graph.find_nodes(op="get_attr")
                   if str(n.target) in own and storages.is_written(n)})


def state_notes(program: Program) -> list[str]:
    """One line where the model writes its own buffers in forward and the plan runs forward more than once a
    step, or on several replicas."""
    plan = program.plan
    names = written_buffers(program)
    if not names or (plan.num_microbatches == 1 and plan.dp == 1):
        return []
    listed = ", ".join(names)
    calls = f"once per micro-batch ({plan.num_microbatches} a step)" if plan.num_microbatches > 1 else "once a step"
    replicas = f"; each of the {plan.dp} dp replicas writes its own copy" if plan.dp > 1 else ""
    return [f"forward writes the buffer{'s' if len(names) > 1 else ''} {listed} in place: the program writes "
            f"{'them' if len(names) > 1 else 'it'} {calls}, where the untouched model on the whole batch does so once"
            f"{replicas}"]
