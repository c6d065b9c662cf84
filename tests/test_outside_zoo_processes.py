"""Every outside model that traces (tests/test_outside_zoo.py's table), once on real gloo processes:
`graphsplit run --check` at pp 2, at dp 2 x pp 2 where the loss couples the samples. Files of their own,
this one and test_outside_zoo_processes_2.py (every other model each), so the suite's two workers share
the zoo's runs (the suite distributes whole files)."""

import pytest

from graphsplit import Plan
from graphsplit.launch.launcher import RunOptions, run_training

from .test_outside_zoo import OUTSIDE, PARTLY, TRAINS, WHOLE_BATCH_LOSS

ON_PROCESSES = [*TRAINS, *PARTLY]


def check_on_processes(name: str) -> None:
    """Every model that traces, once on real gloo processes: `graphsplit run --check` at pp 2 (torch's
    pipelining schedule, the stages' sends, each rank building its own stage); at dp 2 x pp 2 where the
    loss couples the samples (each replica gathers the replicas' outputs)."""
    lines: list[str] = []
    plan = Plan(dp=2, pp=2) if name in WHOLE_BATCH_LOSS else Plan(pp=2)  # what the local backend cannot run
    cmp = run_training(str(OUTSIDE / f"{name}_tiny.py"), plan, RunOptions(steps=2, check=True, timeout_s=200),
                       echo=lines.append)
    assert cmp is not None and cmp.ok, "\n".join(lines)
    assert lines[-1].startswith("check passed"), lines[-1]


@pytest.mark.slow
@pytest.mark.timeout(240)
@pytest.mark.parametrize("name", ON_PROCESSES[::2])
def test_on_real_processes_at_pp2(name):
    check_on_processes(name)
