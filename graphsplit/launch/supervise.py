"""`graphsplit run`'s ranks under supervision: every one of them stops, and one line says why.

Two sides share a folder (the run's temporary folder, `ranks/` inside it):

- Each rank (`RankReporter`) writes its pid when it starts and, when it fails, a
  record: its error, or, when a collective failed under it (another rank died or
  stopped answering), which ranks did not reach a diagnosis barrier (gloo's
  `monitored_barrier` names them).
- The launcher (`supervise`) starts torchrun in its own session, so a Ctrl-C in the
  terminal reaches only the launcher, which then stops torchrun and every rank
  itself: SIGTERM, then SIGKILL after a few seconds. The same happens on SIGTERM,
  on `--timeout`, and a few seconds after a rank reported a failure (torchrun would
  wait 30 s for a rank that does not answer SIGTERM). It then explains the failure
  in one line, from the ranks' records and torchrun's own report (which gives the
  signal a rank died of): a rank's error, a rank killed by a signal, or a rank that
  stopped answering.

Collectives get a short timeout once set-up is over (`set_collective_timeout`), so a
hung rank is noticed within that time plus the diagnosis, not after torch's 30
minutes; set-up (imports, materializing large stages) keeps the run's whole timeout.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import time
import traceback
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

from ..errors import GraphsplitError
from ..runtime.atomic import write_file_atomically

RANKS_DIR = "ranks"
DEFAULT_COLLECTIVE_TIMEOUT_S = 30.0
DIAGNOSIS_TIMEOUT_S = 10.0  # how long the diagnosis barrier waits for the other ranks
STOP_GRACE_S = 3.0  # SIGTERM, then SIGKILL after this long
FAILURE_GRACE_S = 5.0  # after a rank's failure record, torchrun gets this long to stop the others itself
POLL_S = 0.1

# exit codes of `graphsplit run` besides 0, 1 (--check found a mismatch), 2 (bad input) and 3 (internal error)
EXIT_RUN_FAILED = 4
EXIT_TIMEOUT = 124  # as coreutils' timeout
EXIT_SIGNAL_BASE = 128  # 130 for SIGINT, 143 for SIGTERM, as a shell reports them


@dataclass
class RankRecord:
    """What a failing rank says about its failure."""

    rank: int
    kind: str  # "error": a GraphsplitError; "failed": an exception of its own; "collective": a collective failed
    message: str
    where: str = "while setting up"  # "during step 3", "while saving step 4"
    detail: str = ""  # its traceback
    unresponsive: list[int] = field(default_factory=list)  # ranks the diagnosis barrier missed
    time: float = 0.0


# -- the rank's side ------------------------------------------------------------------------------

_COLLECTIVE_SIGNS = ("gloo", "nccl", "Connection closed by peer", "Connection reset by peer", "Timed out waiting",
                     "monitoredBarrier", "Broken pipe")


def is_collective_failure(exc: BaseException) -> bool:
    """True when `exc` came out of a collective (a peer died or stopped answering), not this rank's own code."""
    import torch.distributed as dist

    if isinstance(exc, (dist.DistBackendError, dist.DistNetworkError, dist.DistStoreError)):
        return True
    return isinstance(exc, RuntimeError) and any(s in str(exc) for s in _COLLECTIVE_SIGNS)


def _unresponsive_in(text: str) -> list[int]:
    """The ranks gloo's monitored barrier names: rank 0 lists those that never arrived; the others can
    only name rank 0 when it is rank 0 that does not answer."""
    m = re.search(r"Ranks? ([\d, ]+) failed to pass monitoredBarrier", text)
    if m:
        return sorted(int(r) for r in re.findall(r"\d+", m.group(1)))
    m = re.search(r"waiting for send/recv from rank (\d+)", text)
    if m and "Connection closed by peer" not in text:
        return [int(m.group(1))]
    return []


class RankReporter:
    """One rank's side: its pid when it starts, a record when it fails."""

    def __init__(self, run_dir: str | Path | None) -> None:
        self.rank = int(os.environ.get("RANK", "0"))
        self.folder = Path(run_dir) / RANKS_DIR if run_dir is not None else None
        self.where = "while setting up"  # what the rank is doing, for its record
        self._diagnosis_group: Any = None
        if self.folder is not None:
            self.folder.mkdir(parents=True, exist_ok=True)
            write_file_atomically(self.folder / f"rank{self.rank}.pid", str(os.getpid()))

    def at(self, where: str) -> None:
        """What this rank is doing now ("during step 3"), kept in memory for its own record and in a file
        (rank<r>.where) for the launcher: a rank killed outright (SIGKILL) writes nothing, and the
        ranks that lose contact with it may be stopped before their records are written."""
        self.where = where
        if self.folder is not None:
            write_file_atomically(self.folder / f"rank{self.rank}.where", where)

    def join_diagnosis_group(self) -> None:
        """Every rank, right after init_process_group: a gloo group of its own, so the diagnosis barrier
        works whatever state a failed collective left the training groups in (and under nccl). Made with
        the diagnosis timeout: the ranks other than 0 wait for rank 0 that long (gloo gives their side of
        a monitored barrier the group's own timeout)."""
        import torch.distributed as dist

        self._diagnosis_group = dist.new_group(backend="gloo", timeout=timedelta(seconds=DIAGNOSIS_TIMEOUT_S))

    def setup_done(self, timeout_s: float) -> None:
        """All ranks meet once set-up (which takes as long as it takes) is over; on gloo a rank that never
        gets there is named."""
        import torch.distributed as dist

        if dist.get_backend() == "gloo":
            dist.monitored_barrier(timeout=timedelta(seconds=timeout_s), wait_all_ranks=True)
        else:
            dist.barrier()

    def failed(self, exc: BaseException) -> None:
        """Write this rank's record (after a diagnosis barrier when a collective failed)."""
        if self.folder is None:
            return
        kind, unresponsive = "failed", []
        if isinstance(exc, GraphsplitError):
            kind = "error"
        elif is_collective_failure(exc):
            kind = "collective"
            unresponsive = _unresponsive_in(str(exc))
            if not unresponsive and self._diagnosis_group is not None:
                import torch.distributed as dist

                try:
                    dist.monitored_barrier(self._diagnosis_group, timeout=timedelta(seconds=DIAGNOSIS_TIMEOUT_S),
                                           wait_all_ranks=True)
                except Exception as diag:  # noqa: BLE001 - what it says is the diagnosis
                    unresponsive = _unresponsive_in(str(diag))
        message = str(exc) if kind == "error" else _cause(exc)
        record = RankRecord(self.rank, kind, message, self.where, "".join(traceback.format_exception(exc)),
                            unresponsive, time.time())
        write_file_atomically(self.folder / f"rank{self.rank}.json", json.dumps(asdict(record)))


def set_collective_timeout(groups: list[Any], seconds: float) -> None:
    """Every rank: the timeout of each collective from now on, on these groups and the default one.

    Private torch API, the way torchtitan sets its training timeout after set-up: a
    process group's timeout is otherwise fixed when it is made. A barrier first, so no rank
    runs a collective under the short timeout while another is still setting up.
    """
    import torch.distributed as dist
    from torch.distributed import distributed_c10d

    dist.barrier()
    for group in [None, *groups]:
        distributed_c10d._set_pg_timeout(timedelta(seconds=seconds), group)


def _cause(exc: BaseException) -> str:
    """`Type: message (at model.py:12)` of what went wrong first: torch's wrappers (pipelining's "[Stage 0]
    failed to run forward", raised from the model's own error) give way to the exception they were
    raised from, and the place is the innermost frame of the model's code."""
    from ..ir.user_source import internal

    while exc.__cause__ is not None:
        exc = exc.__cause__
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if not internal(f.filename)]
    at = f" (at {Path(frames[-1].filename).name}:{frames[-1].lineno})" if frames else ""
    return f"{type(exc).__name__}: {_first_line(exc)}{at}"


def _first_line(exc: BaseException) -> str:
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    return (lines[0] if lines else type(exc).__name__)[:300]




# -- the launcher's side --------------------------------------------------------------------------


class _Signalled(Exception):
    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


@contextlib.contextmanager
def _signals_raise() -> Iterator[None]:
    """SIGTERM and SIGHUP raise in the launcher (SIGINT already raises KeyboardInterrupt), so the
    launcher can stop the ranks before it exits."""

    def handler(signum: int, frame: Any) -> None:
        raise _Signalled(signum)

    saved = {}
    for sig in (signal.SIGTERM, signal.SIGHUP):
        try:
            saved[sig] = signal.signal(sig, handler)
        except ValueError:  # not the main thread: the caller handles its own signals
            pass
    try:
        yield
    finally:
        for sig, old in saved.items():
            signal.signal(sig, old)


def supervise(cmd: list[str], env: dict[str, str], world: int, run_dir: Path, timeout_s: float, log: Path,
              collective_timeout_s: float = DEFAULT_COLLECTIVE_TIMEOUT_S) -> None:
    """Run torchrun (`cmd`) to the end; on any failure or stop, every process is gone when this raises.

    Raises GraphsplitError with one line naming the failing rank and its error or signal
    (the rank's traceback in `detail`), or saying what stopped the run.
    """
    started = time.monotonic()
    with open(log, "w") as err, _signals_raise():
        proc = subprocess.Popen(cmd, env=env, stderr=err, start_new_session=True)
        stopped: str | None = None
        try:
            first_failure: float | None = None
            while proc.poll() is None:
                now = time.monotonic()
                if now - started > timeout_s:
                    stopped = "timeout"
                    break
                if first_failure is None and _records(run_dir):
                    first_failure = now
                if first_failure is not None and now - first_failure > FAILURE_GRACE_S:
                    stopped = "failure"
                    break
                time.sleep(POLL_S)
        except KeyboardInterrupt:
            stopped = "SIGINT"
        except _Signalled as sig:
            stopped = str(sig)
        finally:
            if proc.poll() is None:
                n = stop_all(proc, run_dir)
            else:
                n = 0
                for pid in _worker_pids(run_dir):  # torchrun is gone: none of its ranks may stay
                    n += _kill_if_alive(pid)
    if stopped in ("SIGINT", "SIGTERM", "SIGHUP"):
        how = "Ctrl-C (SIGINT)" if stopped == "SIGINT" else stopped
        raise GraphsplitError(f"stopped by {how}: torchrun and its {world} ranks were stopped "
                              f"({n} processes signalled); nothing is written after the stop",
                              exit_code=EXIT_SIGNAL_BASE + int(signal.Signals[stopped]))
    if stopped == "timeout":
        raise GraphsplitError(f"training did not finish within --timeout {timeout_s:g} s: torchrun and its {world} "
                              f"ranks were stopped; raise --timeout if the run needs longer", exit_code=EXIT_TIMEOUT)
    if stopped is None and proc.returncode == 0:
        return
    raise explain_failure(_records(run_dir), log.read_text(errors="replace"), world, collective_timeout_s,
                          _progress(run_dir))


def stop_all(proc: subprocess.Popen, run_dir: Path) -> int:
    """SIGTERM to torchrun and every rank, SIGKILL to whatever is left after STOP_GRACE_S; returns how
    many processes were signalled."""
    pids = set(_descendants(proc.pid)) | set(_worker_pids(run_dir))
    targets = [proc.pid, *sorted(pids)]
    for pid in targets:
        _signal(pid, signal.SIGTERM)
    deadline = time.monotonic() + STOP_GRACE_S
    while time.monotonic() < deadline and (proc.poll() is None or any(_alive(p) for p in pids)):
        time.sleep(POLL_S)
    # ranks that started while we waited are found again
    for pid in [proc.pid, *sorted(pids | set(_descendants(proc.pid)) | set(_worker_pids(run_dir)))]:
        if _alive(pid):
            _signal(pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=STOP_GRACE_S)
    return len(targets)


def _kill_if_alive(pid: int) -> int:
    if not _alive(pid):
        return 0
    _signal(pid, signal.SIGKILL)
    return 1


def _signal(pid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.kill(pid, sig)


def _alive(pid: int) -> bool:
    """Running, not a zombie waiting for a parent that is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rpartition(")")[2].split()[0] != "Z"
    except FileNotFoundError:
        return False
    except OSError:  # no /proc (macOS): ask the kernel
        try:
            os.kill(pid, 0)
        except (ProcessLookupError, PermissionError):
            return False
        return True


def _descendants(root: int) -> list[int]:
    """Every process under `root` (Linux /proc; elsewhere the ranks' pid files do the job)."""
    children: dict[int, list[int]] = {}
    try:
        entries = os.listdir("/proc")
    except OSError:
        return []
    for entry in entries:
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                ppid = int(f.read().rpartition(")")[2].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        children.setdefault(ppid, []).append(int(entry))
    found, todo = [], [root]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def _worker_pids(run_dir: Path) -> list[int]:
    pids = []
    for path in (run_dir / RANKS_DIR).glob("rank*.pid"):
        with contextlib.suppress(OSError, ValueError):
            pids.append(int(path.read_text()))
    return pids


def _progress(run_dir: Path) -> dict[int, str]:
    """rank -> what it was last doing (RankReporter.at)."""
    out = {}
    for path in (run_dir / RANKS_DIR).glob("rank*.where"):
        with contextlib.suppress(OSError, ValueError):
            out[int(path.stem.removeprefix("rank"))] = path.read_text()
    return out


def _records(run_dir: Path) -> list[RankRecord]:
    out = []
    for path in sorted((run_dir / RANKS_DIR).glob("rank*.json")):
        with contextlib.suppress(OSError, ValueError, TypeError):
            out.append(RankRecord(**json.loads(path.read_text())))
    return sorted(out, key=lambda r: r.time)


_FAILURE = re.compile(r"rank\s*:\s*(\d+).*?\n\s*exitcode\s*:\s*(-?\d+)", re.S)


def torchrun_exit_codes(log_text: str) -> dict[int, int]:
    """rank -> exit code from torchrun's failure report (negative: killed by that signal)."""
    report = log_text[log_text.rfind("Failures:"):] if "Failures:" in log_text else ""
    return {int(rank): int(code) for rank, code in _FAILURE.findall(report)}


def _signal_name(code: int) -> str:
    try:
        return signal.Signals(-code).name
    except ValueError:
        return f"signal {-code}"


def explain_failure(records: list[RankRecord], log_text: str, world: int,
                    collective_timeout_s: float = DEFAULT_COLLECTIVE_TIMEOUT_S,
                    progress: dict[int, str] | None = None) -> GraphsplitError:
    """One line for a failed run, most telling cause first (`progress`: rank -> what it was doing,
    for a rank that wrote no record):

    1. a rank's own error (a GraphsplitError as it is; any other exception with its rank and step);
    2. a rank killed by a signal other than the SIGTERM that stops the rest (SIGKILL: the kernel's
       out-of-memory killer, or someone; SIGSEGV...), from torchrun's report;
    3. a rank that stopped answering, named by the diagnosis barrier of the ranks that waited for it;
    4. otherwise what torchrun said.
    """
    own = [r for r in records if r.kind in ("error", "failed")]
    if own:
        first = own[0]
        if first.kind == "error":
            return GraphsplitError(first.message, exit_code=2)
        return GraphsplitError(f"rank {first.rank} failed {first.where}: {first.message}; graphsplit --debug "
                               "prints the rank's traceback", detail=first.detail, exit_code=EXIT_RUN_FAILED)
    codes = torchrun_exit_codes(log_text)
    recorded = {r.rank for r in records}
    killed = {rank: code for rank, code in codes.items()
              if code < 0 and -code != signal.SIGTERM and rank not in recorded}
    where = f" {records[0].where}" if records else ""
    if killed:
        rank, code = sorted(killed.items())[0]
        hint = " (the kernel's out-of-memory killer sends it, or it was killed by hand)" if -code == signal.SIGKILL else ""
        if progress and rank in progress:  # what the killed rank itself was doing
            where = f" {progress[rank]}"
        return GraphsplitError(f"rank {rank} died{where}: killed by {_signal_name(code)}{hint}; "
                               f"the other ranks were stopped", exit_code=EXIT_RUN_FAILED)
    missing = sorted({r for rec in records for r in rec.unresponsive})
    if missing:
        who = ", ".join(map(str, missing))
        waited = ", ".join(str(r) for r in sorted(recorded - set(missing))) or "the others"
        return GraphsplitError(
            f"rank{'s' if len(missing) > 1 else ''} {who} stopped responding{where}: rank(s) {waited} "
            f"waited {collective_timeout_s:g} s for {'them' if len(missing) > 1 else 'it'} in a collective; all "
            "ranks were stopped (raise --collective-timeout if a step can legitimately take longer)",
            detail=records[0].detail if records else None, exit_code=EXIT_RUN_FAILED)
    if records:
        first = records[0]
        return GraphsplitError(f"rank {first.rank} lost contact with the other ranks {first.where}: "
                               f"{first.message}", detail=first.detail, exit_code=EXIT_RUN_FAILED)
    if codes:
        rank, code = sorted(codes.items(), key=lambda kv: kv[1] > 0)[0]
        what = f"killed by {_signal_name(code)}" if code < 0 else f"exited with code {code}"
        return GraphsplitError(f"rank {rank} {what}; the other ranks were stopped",
                               detail=_tail(log_text), exit_code=EXIT_RUN_FAILED)
    return GraphsplitError("torchrun failed before any rank reported (its log's last lines follow)",
                           detail=_tail(log_text), exit_code=EXIT_RUN_FAILED)


def _tail(text: str, lines: int = 40) -> str:
    return "\n".join(text.splitlines()[-lines:])
