"""The command line, end to end, as a user runs it."""

import ast
import json
import os
import shutil
import subprocess
import sys

import pytest
from click.testing import CliRunner

from graphsplit.cli import main

from .conftest import EXAMPLES, MODELS


def real_cli(*args, timeout=300):
    """`python -m graphsplit ARGS`, the real entry point in a process of its own."""
    env = dict(os.environ, COLUMNS="200")
    return subprocess.run(
        [sys.executable, "-m", "graphsplit", *map(str, args)], capture_output=True, text=True, timeout=timeout, env=env
    )


def cli(*args):
    """`graphsplit ARGS` through click's runner in this process: the same command, stdout, stderr and
    exit code, without importing torch again for each call (`run` still launches real ranks)."""
    result = CliRunner(env={"COLUMNS": "200"}).invoke(main, [str(a) for a in args])
    return subprocess.CompletedProcess(args, result.exit_code, result.stdout, result.stderr)


def test_transform_writes_plan_and_stage_code(tmp_path):
    out = tmp_path / "gpt"
    r = real_cli("transform", EXAMPLES / "gpt.py", "--pp", "4", "--out", out)
    assert r.returncode == 0, r.stderr
    assert "balance" in r.stdout and "wte.weight" in r.stdout or "lm_head.weight" in r.stdout
    record = json.loads((out / "plan.json").read_text())
    assert record["model"]["factory"] == "build_model"
    assert record["model"]["path"].endswith("gpt.py")
    assert record["plan"]["pp"] == 4
    assert len(record["split"]["stage_starts"]) == 3
    tied = [name for name, p in record["parameters"].items() if p["stages"] == [0, 3]]
    assert len(tied) == 1
    assert all(p["sharding"] == "replicate" for p in record["parameters"].values())
    for s in range(4):
        source = (out / f"stage_{s}.py").read_text()
        ast.parse(source)
        assert f"class Stage{s}" in source and "def forward" in source
    dot = (out / "graph.dot").read_text()
    assert dot.count("subgraph cluster_stage") == 4
    assert "KiB / micro-batch" in dot  # the tensors crossing each boundary
    assert (out / "graph.svg").exists() == (shutil.which("dot") is not None)


def test_transform_json_summary_on_stdout(tmp_path):
    r = cli("transform", EXAMPLES / "unet.py", "--pp", "4", "--json", "--out", tmp_path / "u")
    assert r.returncode == 0, r.stderr
    summary = json.loads(r.stdout)
    assert summary["transform_seconds"] > 0
    assert len(summary["stages"]) == 4
    assert summary["balance"] >= 1.0
    assert all(st["flops"] > 0 and st["params"] > 0 for st in summary["stages"])
    assert [b["from_stage"] for b in summary["boundaries"]] == [0, 1, 2]
    assert all(b["bytes"] == sum(v["bytes"] for v in b["values"]) for b in summary["boundaries"])
    assert "wrote" in r.stderr


# Bad input (one line, exit 2, nothing written) is tests/test_bad_input.py's table.


def test_failed_transform_keeps_the_previous_output(tmp_path):
    out = tmp_path / "out"
    assert cli("transform", EXAMPLES / "mlp.py", "--pp", "2", "--out", out).returncode == 0
    before = (out / "plan.json").read_text()
    r = cli("transform", EXAMPLES / "mlp.py", "--pp", "2", "--split-at", "nope", "--out", out)
    assert r.returncode == 2
    assert (out / "plan.json").read_text() == before


@pytest.mark.slow
def test_run_transformed_folder_with_check(tmp_path):
    # the model holds every kind of grad-mode region (no_grad, enable_grad inside it, inference_mode,
    # detach, frozen parameters): real ranks train exactly what the untouched model trains
    out = tmp_path / "grad_modes"
    assert cli("transform", MODELS / "grad_modes.py", "--pp", "2", "--out", out).returncode == 0
    # the real entry point: the ranks' own lines reach the user's terminal through it
    r = real_cli("run", out, "--steps", "2", "--check", "--optimizer", "adamw", "--lr", "0.001")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "step   2  loss" in r.stdout
    assert "check passed" in r.stdout


@pytest.mark.slow
def test_run_check_fails_loudly_on_a_mismatch():
    # a model that sorts its examples against each other: taken as routing (said in a note), it is not,
    # and the untouched model on the whole batch says so
    r = cli("run", MODELS / "sorted_batch.py", "--pp", "2", "--steps", "1", "--check")
    assert r.returncode == 1, r.stdout + r.stderr
    assert "note: assumed: the batch dim is sorted along it at sorted_batch.py:18" in r.stdout
    assert "on the whole global batch (one forward, one backward)" in r.stdout
    assert "check FAILED" in r.stdout and "MISMATCH loss" in r.stdout


@pytest.mark.slow
def test_run_cuts_a_seq_first_model_along_its_batch_on_real_ranks():
    # torch's pipelining schedule cuts the [sequence, batch] input along dim 1 (its chunk spec), the
    # target arrives batch-first and is turned back for the loss, the dp shares are cut along dim 1
    r = cli("run", MODELS / "seq_first.py", "--pp", "2", "--dp", "2", "--steps", "1", "--check")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "batch: src dim 1 (found in the graph)" in r.stdout
    assert "check passed" in r.stdout


def test_run_refuses_plan_flags_with_a_transformed_folder(tmp_path):
    out = tmp_path / "mlp"
    assert cli("transform", EXAMPLES / "mlp.py", "--pp", "2", "--out", out).returncode == 0
    r = cli("run", out, "--pp", "4")
    assert r.returncode == 2 and "drop the plan flags" in r.stderr


def test_inspect_prints_the_saved_summary(tmp_path):
    out = tmp_path / "llama"
    assert cli("transform", EXAMPLES / "llama.py", "--tp", "2", "--pp", "2", "--out", out).returncode == 0
    r = cli("inspect", out)
    assert r.returncode == 0, r.stderr
    assert "llama.py:build_model" in r.stdout and "balance" in r.stdout and "all-reduce" in r.stdout
    as_json = json.loads(cli("inspect", out, "--json").stdout)
    assert as_json["collectives"]["per_block"]["layers.0"]["forward"] == {"all_reduce": 2}
    missing = cli("inspect", tmp_path / "nothing")
    assert missing.returncode == 2 and "run graphsplit transform" in missing.stderr
