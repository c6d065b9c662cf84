"""A matmul's shape in the planner's price: the hardware profile's measured GEMM grid (planner/gemm_table.py)."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest

from graphsplit import GraphsplitError, Plan
from graphsplit.loader import load_model
from graphsplit.planner import load_hardware
from graphsplit.planner.gemm_table import PLATEAU_FROM, gemm_table
from graphsplit.planner.profile import profile_model
from graphsplit.planner.stages import op_seconds

from .conftest import EXAMPLES

H200 = load_hardware("h200")


def _scale(m: int, k: int, n: int) -> float:
    return float(gemm_table(H200).scale(np.array([m]), np.array([k]), np.array([n]), "bfloat16")[0])


def test_the_grid_is_read_as_its_envelope_and_exactly_at_its_points():
    grid = gemm_table(H200)
    raw = np.asarray(H200.matmul_table["bfloat16"])
    for dtype, cube in grid.grids.items():
        for axis in range(3):
            assert (np.diff(cube, axis=axis) >= 0).all(), (dtype, axis)
    sizes = np.asarray(H200.matmul_table["sizes"])
    assert (grid.grids["bfloat16"] >= raw).all() and grid.grids["bfloat16"].max() == raw.max()
    i, j, k = 2, 5, 7  # a grid point is read as itself
    got = grid.fraction(np.array([sizes[i]]), np.array([sizes[j]]), np.array([sizes[k]]), "bfloat16")
    assert got[0] == pytest.approx(grid.grids["bfloat16"][i, j, k])
    big = sizes >= PLATEAU_FROM
    assert grid.plateau["bfloat16"] == pytest.approx(float(np.median(grid.grids["bfloat16"][np.ix_(big, big, big)])))


def test_large_gemms_keep_the_profiles_efficiency_and_starved_shards_lose_it():
    # an 8B Llama's FFN at 16,384 tokens: on the plateau, priced at the efficiency the whole step was measured at
    assert _scale(16384, 4096, 14336) == 1.0
    # a 2,048-wide model at tp 8 on 2,048 tokens: the attention output projection's K is 256
    assert _scale(2048, 256, 2048) < 0.5
    # more of any dim never prices slower
    ladder = [_scale(2048, k, 2048) for k in (128, 256, 512, 1024, 2048, 4096, 8192)]
    assert ladder == sorted(ladder) and ladder[0] < ladder[-1]
    # beyond the grid: read at its edge
    assert _scale(64, 64, 64) == _scale(256, 256, 256) and _scale(10**6, 4096, 4096) == 1.0


def test_a_malformed_table_is_refused_in_one_line(tmp_path):
    data = json.loads((EXAMPLES.parent / "graphsplit" / "planner" / "hardware" / "h200.json").read_text())
    data["matmul_table"]["sizes"] = data["matmul_table"]["sizes"][::-1]
    path = tmp_path / "mine.json"
    path.write_text(json.dumps(data))
    with pytest.raises(GraphsplitError, match="matmul_table needs ascending 'sizes'"):
        load_hardware(str(path))


def test_each_linear_is_priced_at_its_own_shape_under_tp():
    """The table records each linear's K and N as a tp rank runs it; the price follows the grid there."""
    loaded = load_model(str(EXAMPLES / "gpt.py"))
    profile = profile_model(loaded, (2,))
    whole, shard = (profile.table(Plan(tp=tp, autocast="bf16")) for tp in (1, 2))
    ops = np.flatnonzero(whole.gemm_k > 0)
    assert len(ops) >= 4 * 4 + 1  # every block's four linears (and attention's two matmuls), the LM head
    width = int(loaded.build("cpu").wte.weight.shape[1])
    pairs = set(zip(whole.gemm_k[ops].tolist(), whole.gemm_n[ops].tolist()))
    assert (width, 3 * width) in pairs and (width, 4 * width) in pairs and (4 * width, width) in pairs
    halves = set(zip(shard.gemm_k[shard.gemm_k > 0].tolist(), shard.gemm_n[shard.gemm_k > 0].tolist()))
    assert (width, 3 * width // 2) in halves and (2 * width, width) in halves  # column: N / 2, row: K / 2


MLP = """
import torch
import torch.nn as nn


def build_model():
    return nn.Sequential(nn.Linear(512, 2048), nn.GELU(), nn.Linear(2048, 512))


def example_inputs():
    return (torch.randn(8, 512),)
"""


def test_a_gemm_bound_by_its_flops_is_priced_at_its_shape(tmp_path):
    """No grid and the same profile with one price every op alike but the GEMMs, which a small shard slows."""
    (tmp_path / "mlp.py").write_text(MLP)
    profile = profile_model(load_model(str(tmp_path / "mlp.py")), (2,))
    shard = profile.table(Plan(tp=2, autocast="bf16"))
    gemms = shard.gemm_k > 0
    assert sorted(zip(shard.gemm_k[gemms].tolist(), shard.gemm_n[gemms].tolist())) == [(512, 1024), (1024, 512)]
    plain = dataclasses.replace(H200, name="h200 without its grid", matmul_table=None)
    b = 2048  # rows enough that these GEMMs are bound by their FLOPs, few enough that the grid falls off
    with_grid, without = op_seconds(shard, b, H200), op_seconds(shard, b, plain)
    assert np.array_equal(with_grid[~gemms], without[~gemms])
    assert (with_grid[gemms] > 1.2 * without[gemms]).all()
