"""Every bad input gets one line, `error: <what is wrong and what to do>`, exit code 2.

One table, one row per kind of mistake a new user makes: model files, inputs, plan
flags, split points, micro-batches, checkpoint policies, out folders, inspect,
weights files, advise options, and click's own usage errors. Each row runs the
click command in this process (a subprocess costs seconds of torch import); a few
rows at the end run the real `python -m graphsplit` to prove the entry point
behaves the same. No row may start torchrun: `run` must refuse before launching.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

from graphsplit.cli import main
from graphsplit.cli_errors import INTERNAL_ERROR_EXIT
from graphsplit.runtime import atomic

from .conftest import EXAMPLES, MODELS

HEADER = "import torch\nimport torch.nn as nn\n\n\n"
NET = HEADER + '''class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(4, 4)
        self.b = nn.Linear(4, 4)

    def forward(self, x):
        return self.b(torch.relu(self.a(x)))


'''
BUILD = "def build_model():\n    return Net()\n\n\n"
INPUTS = "def example_inputs():\n    return (torch.randn(4, 4),)\n"

MODEL_FILES = {
    "base.py": NET + BUILD + INPUTS,
    "syntax.py": "def build_model(:\n    pass\n",
    "import_error.py": "import graphsplit_no_such_package\n",
    "build_raises.py": NET + "def build_model():\n    raise ValueError('config missing')\n\n\n" + INPUTS,
    "not_a_module.py": NET + "def build_model():\n    return 42\n\n\n" + INPUTS,
    "no_inputs.py": NET + BUILD,
    "inputs_raise.py": NET + BUILD + "def example_inputs():\n    raise RuntimeError('no data here')\n",
    "inputs_junk.py": NET + BUILD + "def example_inputs():\n    return 42\n",
    "inputs_no_tensor.py": NET + BUILD + "def example_inputs():\n    return (1, 2)\n",
    "wrong_kwarg.py": NET + BUILD + "def example_inputs():\n    return {'y': torch.randn(4, 4)}\n",
    "wrong_shape.py": NET + BUILD + "def example_inputs():\n    return (torch.randn(4, 5),)\n",
    "batch0.py": NET + BUILD + "def example_inputs():\n    return (torch.randn(0, 4),)\n",
    "batch5.py": NET + BUILD + "def example_inputs():\n    return (torch.randn(5, 4),)\n",
    "loss_not_callable.py": NET + BUILD + INPUTS + "\n\nloss_fn = 3\n\n\ndef example_target():\n    return torch.zeros(4)\n",
    "target_raises.py": NET + BUILD + INPUTS
    + "\n\ndef loss_fn(out, target):\n    return out.sum()\n\n\ndef example_target():\n    raise KeyError('labels')\n",
    "forward_asserts.py": NET.replace("        return self.b(", "        assert x.shape[1] == 4, f'expected 4 features, got {x.shape[1]}'\n"
                                      "        return self.b(") + BUILD + "def example_inputs():\n    return (torch.randn(4, 6),)\n",
    "no_params.py": HEADER + "class Net(nn.Module):\n    def forward(self, x):\n        return torch.relu(x) * 2\n\n\n"
    + BUILD + INPUTS,
    # README: a tp that cannot split the attention heads is refused, even where the vocabulary would split
    "gpt_vocab258.py": f"import sys\nsys.path.insert(0, {str(EXAMPLES)!r})\nimport gpt\n\n\n"
    "def build_model():\n    return gpt.GPT(gpt.GPTConfig(vocab_size=258))\n\n\nexample_inputs = gpt.example_inputs\n",
}


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The bad model files, weights files, plan.json folders and foreign folders the rows name."""
    root = tmp_path_factory.mktemp("bad")
    m = root / "m"
    m.mkdir()
    for name, text in MODEL_FILES.items():
        (m / name).write_text(text)
    (m / "notes.txt").write_text("not python\n")
    (m / "a_folder").mkdir()
    (m / "a_folder" / "model.py").write_text(MODEL_FILES["base.py"])

    from safetensors.torch import save_file

    w = root / "w"
    w.mkdir()
    good = {"a.weight": torch.zeros(4, 4), "a.bias": torch.zeros(4), "b.weight": torch.zeros(4, 4), "b.bias": torch.zeros(4)}
    save_file(good, str(w / "good.safetensors"))
    data = (w / "good.safetensors").read_bytes()
    (w / "truncated.safetensors").write_bytes(data[: len(data) - 16])
    (w / "garbage.safetensors").write_bytes(b"\x00\x01 not a safetensors file " * 8)
    save_file({**good, "a.weight": torch.zeros(3, 3)}, str(w / "wrong_shape.safetensors"))
    save_file({"encoder.a.weight": torch.zeros(4, 4)}, str(w / "wrong_names.safetensors"))
    torch.save({**good, "b.weight": torch.zeros(2, 4)}, w / "wrong_shape.pt")
    (w / "garbage.pt").write_bytes(b"garbage" * 10)
    (w / "a_folder").mkdir()

    p = root / "p"
    for name, content in {
        "no_plan": None,
        "bad_json": b"{not json",
        "json_list": b"[1, 2]",
        "binary": bytes(range(256)),
        "wrong_schema": b'{"name": "someone else\'s plan"}',
        "old_summary": json.dumps({"graphsplit_version": "0.0.1", "model": {"path": "m.py", "path_from_out": "m.py",
                                   "factory": "build_model"}, "plan": {}, "split": {"stage_starts": []}, "stages": [],
                                   "summary": {"stages": [{"index": 0}]}}).encode(),
    }.items():
        (p / name).mkdir(parents=True)
        if content is not None:
            (p / name / "plan.json").write_bytes(content)
    (p / "a_file").write_text("x")
    from graphsplit.api import transform
    from graphsplit.plan import Plan

    transform(str(m / "base.py"), Plan(pp=2), p / "stale")  # then the model "changes" under its saved split
    record = json.loads((p / "stale" / "plan.json").read_text())
    record["split"]["stage_starts"] = ["relu_renamed"]
    (p / "stale" / "plan.json").write_text(json.dumps(record))

    _write_checkpoint(root / "ckpt")
    (root / "a_folder.safetensors").mkdir()

    user = root / "user_folder"  # a user's own folder: never replaced
    user.mkdir()
    (user / "train.py").write_text("print('mine')\n")
    (user / "data.csv").write_text("1,2\n")
    return root


def _write_checkpoint(folder: Path) -> None:
    """A real (small) checkpoint, written in this process through a one-rank process group."""
    from datetime import timedelta

    import torch.distributed as dist

    from graphsplit.runtime.dcp.state import save_checkpoint

    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    owned = not dist.is_initialized()
    if owned:
        dist.init_process_group("gloo", rank=0, world_size=1, store=dist.HashStore(), timeout=timedelta(seconds=30))
    try:
        save_checkpoint(folder, {"a.weight": torch.zeros(4, 4)}, step=2, record={"plan": {}, "aliases": {}})
    finally:
        if owned:
            dist.destroy_process_group()


E, T = str(EXAMPLES), str(MODELS)
OUT = "OUT"  # the row gets --out <a fresh path>, which must not exist afterwards

# (id, argv ({m} models, {w} weights, {p} plan folders, {r} the fixture root), the one line must match)
ROWS = [
    # model files
    ("model-missing", ["transform", "{m}/nope.py", OUT], r"model file .*nope\.py does not exist; a model file defines build_model\(\)"),
    ("model-is-folder", ["transform", "{m}/a_folder", OUT], r"a_folder is a folder, not a model file \(it holds model\.py\)"),
    ("model-not-python", ["transform", "{m}/notes.txt", OUT], r"notes\.txt is not a Python file \(\.py\)"),
    ("model-syntax-error", ["transform", "{m}/syntax.py", OUT], r"importing .*syntax\.py failed: SyntaxError: .* \(syntax\.py:1\)"),
    ("model-import-error", ["transform", "{m}/import_error.py", OUT],
     r"importing .*import_error\.py failed: ModuleNotFoundError: .*graphsplit_no_such_package"),
    ("build-raises", ["transform", "{m}/build_raises.py", OUT], r"build_model\(\) in .* failed: ValueError: config missing \(build_raises\.py:\d+\)"),
    ("build-not-module", ["transform", "{m}/not_a_module.py", OUT], r"returned int, not an nn\.Module"),
    ("no-builder", ["transform", T + "/no_builder.py", "--pp", "2", OUT], r"defines no build_model\(\)"),
    ("wrong-factory", ["transform", "{m}/base.py:make_net", OUT], r"base\.py defines no make_net\(\)"),
    ("no-example-inputs", ["transform", "{m}/no_inputs.py", OUT], r"defines no example_inputs\(\)"),
    ("example-inputs-raise", ["transform", "{m}/inputs_raise.py", OUT], r"example_inputs\(\) in .* failed: RuntimeError: no data here"),
    ("example-inputs-junk", ["transform", "{m}/inputs_junk.py", OUT], r"example_inputs\(\) in .* returned int; return a tuple"),
    ("loss-not-callable", ["transform", "{m}/loss_not_callable.py", OUT], r"loss_fn in .* is not callable"),
    ("example-target-raises", ["transform", "{m}/target_raises.py", OUT], r"example_target\(\) in .* failed: KeyError"),
    ("untraceable", ["transform", T + "/untraceable.py", "--pp", "2", OUT], r"cannot trace DataDependent at untraceable\.py:\d+"),
    ("int-output", ["transform", T + "/int_output.py", "--pp", "2", OUT], "not a tensor"),
    # inputs
    ("inputs-no-tensor", ["transform", "{m}/inputs_no_tensor.py", OUT], r"holds no tensor; the batch must be a tensor"),
    ("inputs-wrong-kwarg", ["transform", "{m}/wrong_kwarg.py", OUT],
     r"example_inputs\(\) in .* does not fit Net\.forward\(x\): missing a required argument: 'x' \(given: y\)"),
    ("inputs-wrong-shape", ["transform", "{m}/wrong_shape.py", OUT],
     r"Linear in module 'a' at wrong_shape\.py:\d+ in forward fails on input shape\(s\) \(4, 5\): .*make example_inputs\(\) give"),
    ("forward-asserts", ["transform", "{m}/forward_asserts.py", OUT],
     r"Net\.forward raised AssertionError at forward_asserts\.py:\d+ on the example inputs: 'expected 4 features, got 6'; "
     r"make example_inputs\(\) give what the model expects"),
    ("inputs-batch-0", ["transform", "{m}/batch0.py", OUT], r"input 'x' of shape \(0, 4\) is an empty batch"),
    # plan flags
    ("pp-0", ["transform", E + "/mlp.py", "--pp", "0", OUT], r"Plan\.pp: must be a positive integer, got 0"),
    ("tp-negative", ["transform", E + "/mlp.py", "--tp", "-2", OUT], r"Plan\.tp: must be a positive integer, got -2"),
    ("dp-0", ["transform", E + "/mlp.py", "--dp", "0", OUT], r"Plan\.dp: must be a positive integer, got 0"),
    ("fsdp-without-dp", ["transform", "{m}/base.py", "--fsdp", OUT], r"--fsdp shards .* but dp=1; give --dp 2 or more"),
    ("sync-bn-without-dp", ["transform", "{m}/base.py", "--sync-bn", OUT], r"--sync-bn .* dp=1; give --dp 2 or more"),
    ("stages-per-rank-1f1b", ["transform", "{m}/base.py", "--pp", "2", "--stages-per-rank", "2", OUT],
     r"2 stages per rank needs an interleaved schedule"),
    ("pp-too-large", ["transform", E + "/mlp.py", "--pp", "50", OUT],
     r"50 pipeline stages need 49 cuts, but the model has too few places to cut: 18 among its 19 operations, "
     r"so it takes at most 19 stage\(s\); use --pp 19 or fewer"),
    ("pp-too-large-1-microbatch", ["transform", T + "/tiny.py", "--pp", "8", "--microbatches", "1", OUT], "need 7 cuts"),
    ("dp-not-dividing-batch", ["transform", "{m}/batch5.py", "--dp", "2", OUT],
     r"the batch of 5 .* cannot be shared equally by 2 data-parallel replicas; use a --dp that divides 5 \(1, 5\)"),
    ("tp-heads", ["transform", "{m}/gpt_vocab258.py", "--tp", "3", OUT],
     r"4 heads cannot be split over tp=3; use tp=4 \(tp must divide the number of heads: 1, 2, 4\)"),
    # a tied vocabulary tp does not divide is padded inside; the heads still refuse tp 3
    ("tp-heads-padded-vocab", ["transform", E + "/gpt.py", "--tp", "3", OUT],
     r"4 heads cannot be split over tp=3; use tp=4 \(tp must divide the number of heads: 1, 2, 4\)"),
    ("unknown-schedule", ["transform", E + "/mlp.py", "--schedule", "zigzag", OUT], r"Invalid value for '--schedule': 'zigzag'.*see graphsplit transform --help"),
    ("pp-not-a-number", ["transform", E + "/mlp.py", "--pp", "two", OUT], r"Invalid value for '--pp': 'two' is not a valid integer"),
    ("unknown-option", ["transform", E + "/mlp.py", "--ppp", "2", OUT], r"No such option '--ppp'"),
    ("missing-model", ["transform"], r"Missing argument 'MODEL'"),
    # micro-batches
    ("microbatches-0", ["transform", E + "/mlp.py", "--microbatches", "0", OUT], r"Plan\.microbatches: must be a positive integer"),
    ("microbatches-not-dividing", ["transform", E + "/mlp.py", "--pp", "2", "--microbatches", "3", OUT],
     r"the batch of 16 .* cannot be cut into equal micro-batches \(--microbatches 3\); give --microbatches dividing 16 \(1, 2, 4, 8, 16\)"),
    ("interleaved-microbatches", ["transform", E + "/mlp.py", "--pp", "2", "--schedule", "interleaved-1f1b", "--microbatches", "5", OUT],
     r"runs 2 rounds of micro-batches \(microbatches // pp\) and needs microbatches divisible by them, got 5 at pp=2"),
    ("looped-bfs-microbatches", ["transform", E + "/mlp.py", "--pp", "2", "--schedule", "looped-bfs", "--microbatches", "3", OUT],
     r"needs microbatches divisible by pp=2"),
    # split points
    ("split-unknown-module", ["transform", E + "/mlp.py", "--pp", "2", "--split-at", "blocks.3", OUT], "names no module"),
    ("split-duplicate", ["transform", E + "/mlp.py", "--pp", "4", "--split-at", "layers.2,layers.2,layers.4", OUT],
     r"'layers\.2' is given twice"),
    ("split-out-of-order", ["transform", E + "/mlp.py", "--pp", "4", "--split-at", "layers.6,layers.2,layers.4", OUT],
     r"split point 'layers\.2' does not start a new non-empty stage after the previous one; give split points in the order"),
    ("split-empty-first-stage", ["transform", E + "/mlp.py", "--pp", "2", "--split-at", "inp", OUT], r"split point 'inp' does not start"),
    ("split-only-comma", ["transform", E + "/mlp.py", "--pp", "2", "--split-at", ",", OUT], r"--split-at ',' has an empty name"),
    ("split-trailing-comma", ["transform", E + "/mlp.py", "--pp", "2", "--split-at", "layers.2,", OUT], r"has an empty name"),
    ("split-too-many", ["transform", E + "/mlp.py", "--pp", "2", "--split-at", "layers.2,layers.4", OUT],
     r"2 split points make 3 stages, but pp=2 .* needs 1 split points"),
    ("split-without-pp", ["transform", E + "/mlp.py", "--split-at", "layers.2", OUT], r"needs 0 split points; give no split points, or pp=2"),
    # checkpoint policies
    ("checkpoint-unknown", ["transform", E + "/mlp.py", "--checkpoint", "sometimes", OUT], r"unknown policy 'sometimes'"),
    ("checkpoint-every-0", ["transform", E + "/mlp.py", "--checkpoint", "every:0", OUT], r"every:K takes K, .* at least 1"),
    ("checkpoint-every-x", ["transform", E + "/mlp.py", "--checkpoint", "every:x", OUT], r"'every:x': every:K takes K"),
    ("checkpoint-module-no-equals", ["transform", E + "/mlp.py", "--checkpoint-module", "h.0", OUT], r"--checkpoint-module takes GLOB=POLICY"),
    ("checkpoint-module-bad-policy", ["transform", E + "/mlp.py", "--checkpoint-module", "layers.0=sometimes", OUT], r"unknown policy 'sometimes'"),
    ("checkpoint-module-no-match", ["transform", E + "/mlp.py", "--checkpoint-module", "h.*=none", OUT], r"'h\.\*' matches no module"),
    # out folders
    ("out-is-a-file", ["transform", E + "/mlp.py", "--out", "{m}/base.py"], r"--out .*base\.py exists and is not a folder"),
    ("out-is-users-folder", ["transform", E + "/mlp.py", "--out", "{r}/user_folder"],
     r"--out .*user_folder is a folder graphsplit did not write \(it holds data\.csv, train\.py\)"),
    ("out-under-a-file", ["transform", E + "/mlp.py", "--out", "{m}/base.py/build"], r"cannot write --out .*: .*base\.py is a file, not a folder"),
    # inspect
    ("inspect-missing", ["inspect", "{p}/nothing"], r"nothing does not exist; run graphsplit transform MODEL --out"),
    ("inspect-no-plan", ["inspect", "{p}/no_plan"], r"no_plan has no plan\.json"),
    ("inspect-bad-json", ["inspect", "{p}/bad_json"], r"plan\.json is not valid JSON"),
    ("inspect-json-list", ["inspect", "{p}/json_list"], r"not a plan\.json written by graphsplit transform \(it holds a JSON list"),
    ("inspect-binary", ["inspect", "{p}/binary"], r"plan\.json is not text"),
    ("inspect-wrong-schema", ["inspect", "{p}/wrong_schema"], r"not a plan\.json written by graphsplit transform \(no 'graphsplit_version'"),
    ("inspect-old-summary", ["inspect", "{p}/old_summary"], r"holds a summary this graphsplit cannot read \(KeyError"),
    ("inspect-a-file", ["inspect", "{p}/a_file"], r"a_file is a file, not a folder written by graphsplit transform"),
    ("inspect-open-no-report", ["inspect", "{p}/no_plan", "--open"], r"has no report\.html"),
    # run: refused before torchrun starts
    ("run-timeout-negative", ["run", "{m}/base.py", "--timeout", "-5"], r"--timeout must be a positive number, got -5"),
    ("run-timeout-0", ["run", "{m}/base.py", "--timeout", "0"], r"--timeout must be a positive number"),
    ("run-lr-negative", ["run", "{m}/base.py", "--lr", "-1"], r"--lr must be a non-negative number"),
    ("run-steps-0", ["run", "{m}/base.py", "--steps", "0"], r"--steps must be at least 1"),
    ("run-no-parameters", ["run", "{m}/no_params.py"], r"the model has no parameters to train"),
    ("run-plan-flags-on-folder", ["run", "{p}/old_summary", "--pp", "2"], r"drop the plan flags"),
    ("run-folder-wrong-schema", ["run", "{p}/wrong_schema"], r"not a plan\.json written by graphsplit transform"),
    ("run-folder-no-plan", ["run", "{p}/no_plan"], r"no_plan has no plan\.json"),
    ("run-folder-stale-split", ["run", "{p}/stale"],
     r"the saved split starts a stage at node 'relu_renamed', which the model no longer has .* run graphsplit transform again"),
    ("run-resume-not-checkpoint", ["run", "{m}/base.py", "--resume", "{r}/user_folder"], r"is not a graphsplit checkpoint"),
    # weights files
    ("weights-missing", ["run", "{m}/base.py", "--weights", "{w}/nope.safetensors"], r"weights file .* does not exist"),
    ("weights-folder", ["run", "{m}/base.py", "--weights", "{w}/a_folder"], r"weights file .*a_folder is a folder"),
    ("weights-truncated", ["run", "{m}/base.py", "--weights", "{w}/truncated.safetensors"],
     r"cannot read .*truncated\.safetensors as a \.safetensors file \(.*\): it is truncated or not a safetensors file"),
    ("weights-garbage", ["run", "{m}/base.py", "--weights", "{w}/garbage.safetensors"], r"cannot read .*garbage\.safetensors as a \.safetensors"),
    ("weights-garbage-check", ["run", "{m}/base.py", "--weights", "{w}/garbage.safetensors", "--check"], r"cannot read .* as a \.safetensors"),
    ("weights-wrong-shape", ["run", "{m}/base.py", "--weights", "{w}/wrong_shape.safetensors"],
     r"holds 'a\.weight' with shape \(3, 3\), the model's is \(4, 4\)"),
    ("weights-wrong-shape-check", ["run", "{m}/base.py", "--weights", "{w}/wrong_shape.safetensors", "--check"], r"holds 'a\.weight' with shape"),
    ("weights-wrong-names", ["run", "{m}/base.py", "--weights", "{w}/wrong_names.safetensors"],
     r"has no tensor 'a\.weight' \(4 of the model's 4 parameters missing; it holds 'encoder\.a\.weight'\)"),
    ("weights-torch-wrong-shape", ["run", "{m}/base.py", "--weights", "{w}/wrong_shape.pt"], r"holds 'b\.weight' with shape \(2, 4\)"),
    ("weights-torch-garbage", ["run", "{m}/base.py", "--weights", "{w}/garbage.pt"], r"cannot read .*garbage\.pt as a torch state dict"),
    # export-weights
    ("export-not-checkpoint", ["export-weights", "{r}/user_folder", "{r}/out.safetensors"], r"is not a graphsplit checkpoint"),
    ("export-not-safetensors", ["export-weights", "{r}/ckpt", "{r}/weights.txt"], r"weights\.txt should end in \.safetensors"),
    ("export-under-a-file", ["export-weights", "{r}/ckpt", "{m}/base.py/w.safetensors"], r"cannot write .*base\.py/w\.safetensors"),
    ("export-onto-a-folder", ["export-weights", "{r}/ckpt", "{r}/a_folder.safetensors"], r"cannot write .*a_folder\.safetensors: Is a directory"),
    ("export-missing-out", ["export-weights", "{r}/user_folder"], r"Missing argument 'OUT'"),
    # advise
    ("advise-gpus-0", ["advise", "{m}/base.py", "--gpus", "0", "--gpu-memory", "80GiB"], r"--gpus must be at least 1, got 0"),
    ("advise-nodes-0", ["advise", "{m}/base.py", "--gpus", "8", "--nodes", "0", "--gpu-memory", "80GiB"], r"--nodes must be at least 1"),
    ("advise-nodes-not-dividing", ["advise", "{m}/base.py", "--gpus", "8", "--nodes", "3", "--gpu-memory", "80GiB"],
     r"--gpus 8 cannot be spread evenly over --nodes 3; use --nodes 1, 2, 4, 8"),
    ("advise-memory-0", ["advise", "{m}/base.py", "--gpus", "8", "--gpu-memory", "0"], r"memory size '0' is under one byte"),
    ("advise-memory-unit", ["advise", "{m}/base.py", "--gpus", "8", "--gpu-memory", "80XB"], r"cannot read the memory size '80XB'"),
    ("advise-memory-two-dots", ["advise", "{m}/base.py", "--gpus", "8", "--gpu-memory", "1.2.3GiB"], r"cannot read the memory size '1\.2\.3GiB'"),
    ("advise-memory-negative", ["advise", "{m}/base.py", "--gpus", "8", "--gpu-memory", "-5GiB"], r"cannot read the memory size '-5GiB'"),
    ("advise-memory-missing", ["advise", "{m}/base.py", "--gpus", "8"], r"Missing option '--gpu-memory'"),
    ("advise-bad-model", ["advise", "{m}/syntax.py", "--gpus", "8", "--gpu-memory", "80GiB"], r"SyntaxError"),
]

LEFTOVER = re.compile(r"^\..*\.(tmp|old)-")


def _argv(row: list[str], files: Path, out: Path) -> list[str]:
    subs = {"{m}": str(files / "m"), "{w}": str(files / "w"), "{p}": str(files / "p"), "{r}": str(files)}
    argv = []
    for arg in row:
        if arg == OUT:
            argv += ["--out", str(out)]
            continue
        for key, value in subs.items():
            arg = arg.replace(key, value)
        argv.append(arg)
    return argv


def _snapshot(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): (p.read_bytes() if p.is_file() else b"<dir>") for p in sorted(root.rglob("*"))}


@pytest.fixture
def no_launch(monkeypatch: pytest.MonkeyPatch) -> list[tuple]:
    """Fail loudly if a row gets as far as starting torchrun."""
    import graphsplit.launch.launcher

    launched: list[tuple] = []

    def refuse(*args: object, **kwargs: object) -> None:
        launched.append(args)
        raise AssertionError("the bad input reached torchrun")

    monkeypatch.setattr(graphsplit.launch.launcher, "_launch", refuse)
    return launched


def _invoke(argv: list[str]):
    return CliRunner().invoke(main, argv, prog_name="graphsplit")


def _assert_one_line(result, pattern: str) -> str:
    assert isinstance(result.exception, SystemExit), repr(result.exception)
    assert result.exit_code == 2, (result.exit_code, result.stderr)
    assert result.stdout == "", result.stdout
    assert "Traceback" not in result.stderr
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    assert re.search(pattern, lines[0]), lines[0]
    return lines[0]


def test_the_table_covers_many_kinds() -> None:
    assert len(ROWS) >= 40
    assert len({row[0] for row in ROWS}) == len(ROWS)


@pytest.mark.parametrize("row, pattern", [(r[1], r[2]) for r in ROWS], ids=[r[0] for r in ROWS])
def test_bad_input_is_one_line(files: Path, tmp_path: Path, no_launch: list, row: list[str], pattern: str) -> None:
    out = tmp_path / "out"
    before = _snapshot(files)
    result = _invoke(_argv(row, files, out))
    _assert_one_line(result, pattern)
    assert not no_launch
    assert not out.exists(), "a refused command created its --out"
    assert _snapshot(files) == before, "a refused command changed a file or folder it was given"
    leftovers = [p for p in (*tmp_path.rglob(".*"), *files.rglob(".*")) if LEFTOVER.match(p.name)]
    assert not leftovers


def test_out_replaces_only_graphsplit_output(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An empty folder and an earlier transform's output are written; `.` (the user's own folder) is not."""
    out = tmp_path / "build"
    out.mkdir()
    assert _invoke(["transform", str(EXAMPLES / "mlp.py"), "--out", str(out)]).exit_code == 0
    first = (out / "plan.json").read_text()
    (out / "stage_9.py").write_text("stale")  # a file of an older, larger split: gone after the replace
    result = _invoke(["transform", str(EXAMPLES / "mlp.py"), "--pp", "2", "--out", str(out)])
    assert result.exit_code == 0, result.stderr
    assert (out / "plan.json").read_text() != first and not (out / "stage_9.py").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["build"]

    home = tmp_path / "project"
    home.mkdir()
    (home / "model.py").write_text(MODEL_FILES["base.py"])
    monkeypatch.chdir(home)
    before = _snapshot(home)
    line = _assert_one_line(_invoke(["transform", "model.py", "--out", "."]), r"--out \. is a folder graphsplit did not write")
    assert "model.py" in line
    assert _snapshot(home) == before


def test_unwritable_out_is_one_line_and_leaves_nothing(tmp_path: Path) -> None:
    """A path the process cannot create: through a file, or under a folder it cannot write (not as root,
    which may write anywhere), or on a file system that refuses (/proc)."""
    targets = [tmp_path / "a_file" / "out"]
    (tmp_path / "a_file").write_text("x")
    if os.geteuid() != 0:
        locked = tmp_path / "locked"
        locked.mkdir()
        locked.chmod(0o555)
        targets.append(locked / "out")
    if Path("/proc/self").is_dir():
        targets.append(Path("/proc/graphsplit-test-out"))
    for out in targets:
        _assert_one_line(_invoke(["transform", str(EXAMPLES / "mlp.py"), "--out", str(out)]), r"cannot write --out ")
        assert not out.exists()
        assert not [p for p in out.parent.iterdir() if LEFTOVER.match(p.name)] if out.parent.is_dir() else True


def test_a_failed_swap_puts_the_previous_folder_back(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The swap's second rename fails (a disk error, a race): the old folder is back, whole, and no
    `.old-` or `.tmp-` folder remains."""
    final = tmp_path / "out"
    final.mkdir()
    (final / "plan.json").write_text("previous")
    tmp = atomic.temporary_sibling(final, "--out")
    (tmp / "plan.json").write_text("new")
    real_replace = os.replace

    def failing(src: object, dst: object) -> None:
        if Path(str(src)) == tmp:
            raise OSError(28, "No space left on device", str(dst))
        real_replace(src, dst)

    monkeypatch.setattr(atomic.os, "replace", failing)
    with pytest.raises(atomic.GraphsplitError, match=r"cannot write --out .*out: No space left on device"):
        atomic.swap_into_place(tmp, final, "--out")
    shutil.rmtree(tmp)  # the caller's part, as write_artifacts does
    assert (final / "plan.json").read_text() == "previous"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]


def test_internal_error_says_so_and_debug_shows_the_traceback(monkeypatch: pytest.MonkeyPatch) -> None:
    """graphsplit's own bug is not dressed up as bad input: exit 3, one line saying 'internal error'
    and how to report it; --debug (or GRAPHSPLIT_DEBUG=1) prints the traceback after that line."""
    import graphsplit.api

    def bug(*args: object, **kwargs: object) -> None:
        raise KeyError("stage_starts")

    monkeypatch.setattr(graphsplit.api, "transform", bug)
    monkeypatch.delenv("GRAPHSPLIT_DEBUG", raising=False)
    result = _invoke(["transform", str(EXAMPLES / "mlp.py")])
    assert result.exit_code == INTERNAL_ERROR_EXIT
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and "Traceback" not in result.stderr
    assert re.match(r"error: internal error in graphsplit .*\(KeyError: 'stage_starts'\); this is a bug, not your input: "
                    r"please report it .*graphsplit --debug", lines[0]), lines[0]
    debug = _invoke(["--debug", "transform", str(EXAMPLES / "mlp.py")])
    assert debug.exit_code == INTERNAL_ERROR_EXIT
    first, *rest = debug.stderr.splitlines()
    assert first == lines[0] and rest[0].startswith("Traceback") and "KeyError" in rest[-1]
    monkeypatch.setenv("GRAPHSPLIT_DEBUG", "1")
    assert "Traceback" in _invoke(["transform", str(EXAMPLES / "mlp.py")]).stderr
    monkeypatch.delenv("GRAPHSPLIT_DEBUG")
    assert "Traceback" not in _invoke(["transform", str(EXAMPLES / "mlp.py")]).stderr, "--debug leaked into the next call"


def test_a_file_system_error_anywhere_is_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    import graphsplit.api

    def denied(*args: object, **kwargs: object) -> None:
        raise PermissionError(13, "Permission denied", "/data/cache")

    monkeypatch.setattr(graphsplit.api, "transform", denied)
    _assert_one_line(_invoke(["transform", str(EXAMPLES / "mlp.py")]), r"^error: Permission denied: /data/cache; check that path")


# The real entry point, in a subprocess: the same one line and exit code (graphsplit's own error and
# click's usage error; every other row of the table above goes through the same `main`)
SUBPROCESS_ROWS = [
    (["transform", MODELS / "untraceable.py", "--pp", "2"], r"cannot trace DataDependent at untraceable\.py:\d+"),
    (["transform", EXAMPLES / "mlp.py", "--pp", "two"], r"Invalid value for '--pp'"),
]


@pytest.mark.parametrize("args, pattern", SUBPROCESS_ROWS, ids=["untraceable", "click-usage"])
def test_the_real_command_prints_the_same_one_line(tmp_path: Path, args: list, pattern: str) -> None:
    out = tmp_path / "out"
    env = dict(os.environ, COLUMNS="200")
    env.pop("GRAPHSPLIT_DEBUG", None)
    r = subprocess.run([sys.executable, "-m", "graphsplit", *map(str, args), "--out", str(out)],
                       capture_output=True, text=True, timeout=300, env=env)
    assert r.returncode == 2 and r.stdout == ""
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), r.stderr
    assert re.search(pattern, lines[0]), lines[0]
    assert not out.exists() and not list(tmp_path.iterdir())
