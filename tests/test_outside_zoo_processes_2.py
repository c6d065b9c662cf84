"""The other half of tests/test_outside_zoo_processes.py's models on real gloo processes."""

import pytest

from .test_outside_zoo_processes import ON_PROCESSES, check_on_processes


@pytest.mark.slow
@pytest.mark.timeout(240)
@pytest.mark.parametrize("name", ON_PROCESSES[1::2])
def test_on_real_processes_at_pp2(name):
    check_on_processes(name)
