"""`graphsplit run` stops every process it started, and says in one line why.

The process tests start a real run, interfere with it as a user or the machine
would (Ctrl-C, SIGTERM, a rank killed, a rank frozen), and look for the pids
of torchrun and of every rank afterwards.
"""

from __future__ import annotations

import os
import queue
import signal
import subprocess
import sys
import threading
import time

import pytest

from graphsplit.launch.supervise import (
    EXIT_RUN_FAILED,
    RankRecord,
    _alive,
    _descendants,
    _unresponsive_in,
    explain_failure,
    torchrun_exit_codes,
)

from .conftest import EXAMPLES

TORCHRUN_REPORT = """
torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
======================================================
graphsplit.launch.worker FAILED
------------------------------------------------------
Failures:
[1]:
  time      : 2026-11-22_17:17:59
  host      : localhost
  rank      : 0 (local_rank: 0)
  exitcode  : -15 (pid: 9004)  (SIGTERM)
  error_file: <N/A>
  traceback : Signal 15 (SIGTERM) received by PID 9004
------------------------------------------------------
Root Cause (first observed failure):
[0]:
  time      : 2026-11-22_17:17:59
  host      : localhost
  rank      : 1 (local_rank: 1)
  exitcode  : -9 (pid: 9005)  (SIGKILL)
  error_file: <N/A>
  traceback : Signal 9 (SIGKILL) received by PID 9005
======================================================
"""


def test_torchrun_report_gives_each_rank_exit_code():
    assert torchrun_exit_codes("Traceback ...\n" + TORCHRUN_REPORT) == {0: -15, 1: -9}
    assert torchrun_exit_codes("no report here") == {}


def test_killed_rank_is_named_before_the_ranks_that_lost_contact():
    lost = RankRecord(0, "collective", "RuntimeError: Connection reset by peer", "during step 3", time=1.0)
    exc = explain_failure([lost], TORCHRUN_REPORT, world=2)
    assert str(exc).startswith("rank 1 died during step 3: killed by SIGKILL"), str(exc)
    assert exc.exit_code == EXIT_RUN_FAILED
    # the killed rank's own progress file says where it was, whether or not another rank wrote a record
    assert str(explain_failure([], TORCHRUN_REPORT, world=2, progress={0: "during step 5", 1: "during step 4"})
               ).startswith("rank 1 died during step 4: killed by SIGKILL")


def test_a_rank_own_error_comes_first_with_its_traceback():
    own = RankRecord(2, "failed", "ValueError: bad shape", "during step 1", detail="Traceback ...", time=2.0)
    lost = RankRecord(0, "collective", "RuntimeError: Connection closed by peer", "during step 1", time=1.0)
    exc = explain_failure([lost, own], TORCHRUN_REPORT, world=4)
    assert str(exc) == "rank 2 failed during step 1: ValueError: bad shape; graphsplit --debug prints the rank's traceback"
    assert exc.detail == "Traceback ..."  # printed under --debug alone (cli_errors.fail)
    user = RankRecord(1, "error", "the plan needs 4 processes but 2 were started; ...", time=0.5)
    assert explain_failure([user, own], "", world=2).exit_code == 2


def test_unresponsive_rank_named_by_the_diagnosis_barrier():
    assert _unresponsive_in("[Rank 0]: Ranks 1, 3 failed to pass monitoredBarrier in 10000 ms") == [1, 3]
    assert _unresponsive_in("Rank 2 successfully reached monitoredBarrier, but received errors while waiting "
                            "for send/recv from rank 0. Please check rank 0 logs for faulty rank.") == [0]
    timed_out = RankRecord(0, "collective", "RuntimeError: Timed out waiting 30000ms for recv", "during step 4",
                           unresponsive=[1], time=1.0)
    exc = explain_failure([timed_out], "", world=2, collective_timeout_s=30)
    assert str(exc).startswith("rank 1 stopped responding during step 4: rank(s) 0 waited 30 s for it"), str(exc)


# -- real runs ------------------------------------------------------------------------------------


class Run:
    """`graphsplit run` in a subprocess, its stdout read line by line as it comes."""

    def __init__(self, *args: str) -> None:
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        # SIGINT at its default: a suite started in the background or under nohup hands its children
        # SIGINT ignored, and Python then installs no KeyboardInterrupt handler (Ctrl-C would do nothing)
        self.proc = subprocess.Popen([sys.executable, "-m", "graphsplit", "run", *args], stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True, env=env,
                                     preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
        self.lines: queue.Queue[str] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.put(line)

    def wait_for(self, text: str, timeout: float = 120) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                if text in self.lines.get(timeout=1):
                    return
            except queue.Empty:
                assert self.proc.poll() is None, self.proc.stderr.read() if self.proc.stderr else ""
        raise AssertionError(f"no {text!r} within {timeout} s")

    def ranks(self) -> list[int]:
        """The pids of the workers (python -m graphsplit.launch.worker) under this run."""
        pids = []
        for pid in _descendants(self.proc.pid):
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    if b"graphsplit.launch.worker" in f.read() and _parent_is_torchrun(pid):
                        pids.append(pid)
            except OSError:
                pass
        return sorted(pids)

    def finish(self, timeout: float) -> tuple[int, str, float]:
        start = time.monotonic()
        _, err = self.proc.communicate(timeout=timeout)
        return self.proc.returncode, err, time.monotonic() - start


def _parent_is_torchrun(pid: int) -> bool:
    with open(f"/proc/{pid}/stat") as f:
        ppid = int(f.read().rpartition(")")[2].split()[1])
    with open(f"/proc/{ppid}/cmdline", "rb") as f:
        return b"torch.distributed.run" in f.read()


def _gone_within(pids: list[int], seconds: float) -> list[int]:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and any(_alive(p) for p in pids):
        time.sleep(0.2)
    return [p for p in pids if _alive(p)]


def _long_run(tmp_path, *extra: str) -> Run:
    return Run(str(EXAMPLES / "mlp.py"), "--pp", "2", "--steps", "100000", "--save", str(tmp_path / "ckpt"), *extra)


@pytest.mark.slow
def test_interrupt_stops_every_rank_and_saves_nothing(tmp_path):
    """Ctrl-C and SIGTERM, each to its own run (both runs at once: the suite's budget)."""
    for sig in (signal.SIGINT, signal.SIGTERM):
        (tmp_path / sig.name).mkdir()
    runs = {sig: _long_run(tmp_path / sig.name) for sig in (signal.SIGINT, signal.SIGTERM)}
    for sig, run in runs.items():
        run.wait_for("step   3")
        ranks = run.ranks()
        assert len(ranks) == 2
        run.proc.send_signal(sig)
        code, err, took = run.finish(timeout=30)
        assert took < 10, f"the launcher took {took:.1f} s to stop"
        assert not _gone_within(ranks, 10 - took), "a rank outlived the launcher"
        assert code == 128 + sig
        first = err.strip().splitlines()[0]
        assert first.startswith(f"error: stopped by {'Ctrl-C (SIGINT)' if sig == signal.SIGINT else 'SIGTERM'}"), err
        assert not (tmp_path / sig.name / "ckpt").exists(), "a checkpoint was written after the stop"


@pytest.mark.slow
def test_timeout_stops_every_rank(tmp_path):
    run = _long_run(tmp_path, "--timeout", "15")
    ranks: set[int] = set()
    while run.proc.poll() is None:  # every rank seen before the timeout hits
        ranks.update(run.ranks())
        time.sleep(0.5)
    code, err, _ = run.finish(timeout=60)
    assert len(ranks) == 2
    assert not _gone_within(sorted(ranks), 10)
    assert code == 124 and err.startswith("error: training did not finish within --timeout 15 s"), err
    assert not (tmp_path / "ckpt").exists()


@pytest.mark.slow
def test_killed_rank_is_named_with_its_signal(tmp_path):
    run = _long_run(tmp_path)
    run.wait_for("step   3")
    ranks = run.ranks()
    os.kill(ranks[1], signal.SIGKILL)
    killed_at = time.monotonic()
    code, err, _ = run.finish(timeout=60)
    assert not _gone_within(ranks, max(0.0, 60 - (time.monotonic() - killed_at)))
    first = err.strip().splitlines()[0]
    assert code == EXIT_RUN_FAILED
    assert first.startswith("error: rank 1 died during step") and "killed by SIGKILL" in first, err


@pytest.mark.slow
def test_frozen_rank_is_named_and_every_rank_stops_within_a_minute(tmp_path):
    run = _long_run(tmp_path, "--collective-timeout", "5")
    run.wait_for("step   3")
    ranks = run.ranks()
    os.kill(ranks[0], signal.SIGSTOP)  # alive, holding its connections, answering nothing
    frozen_at = time.monotonic()
    try:
        code, err, _ = run.finish(timeout=60)
        took = time.monotonic() - frozen_at
        assert not _gone_within(ranks, max(0.0, 60 - took))
    finally:
        for pid in ranks:
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)
    first = err.strip().splitlines()[0]
    assert code == EXIT_RUN_FAILED
    assert first.startswith("error: rank 0 stopped responding during step"), err
    assert took < 5 + 10 + 5 + 15, f"stopped {took:.0f} s after the rank froze"
