"""--fsdp: FSDP2 `fully_shard` over the dp axis (ZeRO-3), under pipeline and tensor parallelism."""

import pytest
import torch
from click.testing import CliRunner
from safetensors.torch import load_file

from graphsplit import Plan
from graphsplit.cli import main
from graphsplit.launch.launcher import RunOptions, run_training
from graphsplit.runtime.dcp import safe_read
from graphsplit.runtime.dcp.state import export_weights

from .conftest import EXAMPLES


def test_fsdp_needs_data_parallel_replicas():
    done = CliRunner().invoke(main, ["transform", str(EXAMPLES / "mlp.py"), "--pp", "2", "--fsdp"])
    assert done.exit_code == 2
    assert "--fsdp shards parameters over the data-parallel replicas but dp=1; give --dp 2 or more" in done.output


@pytest.mark.slow
@pytest.mark.timeout(500)
def test_fsdp_3d_matches_the_untouched_model_and_its_checkpoint_loads_without_fsdp(tmp_path):
    lines: list[str] = []
    plan = Plan(dp=2, pp=2, tp=2, fsdp=True)
    opts = RunOptions(steps=5, optimizer="adamw", check=True, timeout_s=300, save=str(tmp_path / "fsdp"))
    cmp = run_training(str(EXAMPLES / "gpt.py"), plan, opts, echo=lines.append)
    assert cmp is not None and cmp.ok, "\n".join(lines)
    assert any("loss curve    5 steps" in line for line in lines)

    # the dp-sharded blocks, AdamW state included, load into ranks that do not shard over dp
    run_training(str(EXAMPLES / "gpt.py"), Plan(tp=2), RunOptions(steps=0, optimizer="adamw", timeout_s=300,
                 resume=str(tmp_path / "fsdp"), save=str(tmp_path / "plain")), echo=lines.append)
    export_weights(tmp_path / "fsdp", tmp_path / "a.safetensors")
    export_weights(tmp_path / "plain", tmp_path / "b.safetensors")
    a, b = load_file(tmp_path / "a.safetensors"), load_file(tmp_path / "b.safetensors")
    assert set(a) == set(b) and all(torch.equal(a[k], b[k]) for k in a)
    stored = safe_read.stored_keys(tmp_path / "plain" / "step-5")
    assert "optimizer/h.0.attn.c_attn.weight/exp_avg_sq" in stored


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_fsdp_with_tensor_parallel_and_no_pipeline(tmp_path):
    lines: list[str] = []
    cmp = run_training(str(EXAMPLES / "llama.py"), Plan(dp=2, tp=2, fsdp=True),
                       RunOptions(steps=3, optimizer="adamw", check=True, timeout_s=240), echo=lines.append)
    assert cmp is not None and cmp.ok, "\n".join(lines)
