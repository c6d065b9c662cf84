"""--sync-bn: BatchNorm statistics over all dp replicas, equal to BatchNorm on the replicas' batches joined."""

import pytest
import torch
import torch.nn as nn
from click.testing import CliRunner
from safetensors.torch import load_file

from graphsplit import Plan
from graphsplit.cli import main
from graphsplit.launch.launcher import RunOptions, run_training
from graphsplit.launch.reference import reference_step, reference_train
from graphsplit.loader import load_model
from graphsplit.ops.sync_batch_norm import DataParallelBatchNorm
from graphsplit.runtime.dcp.state import export_weights

from .conftest import EXAMPLES

RESNET = str(EXAMPLES / "resnet.py")


def test_the_swapped_layer_keeps_the_tensors_and_is_batchnorm_without_a_group():
    torch.manual_seed(0)
    bn = nn.BatchNorm2d(5, momentum=0.3)
    bn.weight.data.uniform_()
    new = DataParallelBatchNorm.replacing(bn)
    assert new.weight is bn.weight and new.running_mean is bn.running_mean
    assert set(new.state_dict()) == set(bn.state_dict())
    x = torch.randn(4, 5, 3, 3)
    ref = nn.BatchNorm2d(5, momentum=0.3)
    ref.load_state_dict(bn.state_dict())
    torch.testing.assert_close(new(x), ref(x))  # no dp group: plain BatchNorm, running stats included
    torch.testing.assert_close(bn.running_var, ref.running_var)


@pytest.mark.parametrize("args, message", [
    ([RESNET, "--pp", "2", "--sync-bn"], "--sync-bn shares BatchNorm statistics across data-parallel replicas but dp=1"),
    ([str(EXAMPLES / "gpt.py"), "--dp", "2", "--sync-bn"], "--sync-bn: the model has no BatchNorm layer"),
])
def test_sync_bn_errors(args, message):
    done = CliRunner().invoke(main, ["transform", *args])
    assert done.exit_code == 2 and message in done.output and done.output.count("\n") == 1


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_sync_bn_matches_batchnorm_over_the_joined_replicas(tmp_path):
    plan = Plan(dp=2, pp=2, sync_bn=True)
    loaded = load_model(RESNET)
    # the test means something: per-replica statistics give another result
    joined = reference_step(loaded.build("cpu", seed=0), loaded.args, loaded.kwargs, loaded.target, loaded.loss_fn, 4, 2)
    apart = reference_step(loaded.build("cpu", seed=0), loaded.args, loaded.kwargs, loaded.target, loaded.loss_fn, 4, 1)
    assert (joined.output - apart.output).abs().max() > 1e-3

    lines: list[str] = []
    opts = RunOptions(steps=3, check=True, timeout_s=240, save=str(tmp_path / "ckpt"))
    cmp = run_training(RESNET, plan, opts, echo=lines.append)
    assert cmp is not None and cmp.ok, "\n".join(lines)

    # every replica updated its running statistics from the global ones: they equal the reference's
    export_weights(tmp_path / "ckpt", tmp_path / "w.safetensors")
    saved = load_file(tmp_path / "w.safetensors")
    model = loaded.build("cpu", seed=0)
    reference_train(model, loaded, plan, 3)
    buffers = dict(model.named_buffers())
    assert any(k.endswith("running_var") for k in saved)
    for name, value in buffers.items():
        torch.testing.assert_close(saved[name].to(value.dtype), value, rtol=1e-4, atol=1e-5, msg=name)
