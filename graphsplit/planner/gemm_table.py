"""How a matmul's shape moves its rate: a hardware profile's measured GEMM grid, read as a factor on
the profile's `matmul_efficiency`.

A profile's `matmul_table` (bench/gpu_kernels.py --grid) holds the fraction of peak every M x K x N of
a log grid reached (M rows, K inner, N out, as `F.linear(x[M, K], w[N, K])` runs). Its large shapes
form a plateau; below it, a small dim starves the GPU (a 2,048-wide model at tp 8, K = 256, runs at
a third of it). The grid is read as its envelope, non-decreasing along each dim (`_envelope`). The planner prices a matmul at `matmul_efficiency` x min(1, grid / plateau): the
grid says how shape moves the rate, the profile's single figure (measured on whole training steps)
says where the plateau lies. The two are kept apart because the grid, timed as back-to-back calls of
one GEMM, reads a lower plateau than the same shapes reach inside a training step (0.66 against
0.78-0.81 on an H200; the cause is not established), while a step priced at 0.78 lands within 2%.

A linear's step runs three GEMMs: the forward (M, K, N), the input's gradient (M, N, K) and the
weight's (N, M, K); the op's factor is their harmonic mean (one rate for the three, as the FLOPs
are equal), so a small M (few tokens) or K (a row-parallel shard) costs where it really costs.
"""

from __future__ import annotations

from typing import Any

import numpy as np

PLATEAU_FROM = 4096  # every dim at least this: the grid's plateau


def _envelope(grid: np.ndarray) -> np.ndarray:
    """The grid made non-decreasing along each dim: a larger problem is never priced slower than a smaller
    one it contains. The measured large shapes scatter by +-8% (timing, wave quantization: 0.59-0.75 on an
    H200) around their level, which the profile's efficiency sets; read raw, the scatter would price some
    large shapes below the level the whole step was measured at."""
    for axis in range(3):
        grid = np.maximum.accumulate(grid, axis=axis)
    return grid


class GemmTable:
    """A measured grid of fractions of peak, by dtype, interpolated in log2 of each dim."""

    def __init__(self, table: dict[str, Any]) -> None:
        self.axis = np.log2(np.asarray(table["sizes"], dtype=np.float64))
        self.grids = {dtype: _envelope(np.asarray(table[dtype], dtype=np.float64)) for dtype in ("bfloat16", "float8")
                      if dtype in table}
        big = np.asarray(table["sizes"]) >= PLATEAU_FROM
        self.plateau = {dtype: float(np.median(grid[np.ix_(big, big, big)])) for dtype, grid in self.grids.items()}

    def fraction(self, m: np.ndarray, k: np.ndarray, n: np.ndarray, dtype: str) -> np.ndarray:
        """The grid at (m, k, n) (arrays), trilinear in log2, clamped to the grid's edges."""
        grid = self.grids.get(dtype, self.grids["bfloat16"])
        points = []
        for dim in (m, k, n):
            x = np.clip(np.log2(np.maximum(np.asarray(dim, dtype=np.float64), 1.0)), self.axis[0], self.axis[-1])
            lo = np.clip(np.searchsorted(self.axis, x, side="right") - 1, 0, len(self.axis) - 2)
            points.append((lo, (x - self.axis[lo]) / (self.axis[lo + 1] - self.axis[lo])))
        (i, a), (j, b), (k_, c) = points
        total = np.zeros(np.broadcast(i, j, k_).shape)
        for di in (0, 1):
            for dj in (0, 1):
                for dk in (0, 1):
                    weight = (a if di else 1 - a) * (b if dj else 1 - b) * (c if dk else 1 - c)
                    total = total + weight * grid[i + di, j + dj, k_ + dk]
        return total

    def scale(self, m: np.ndarray, k: np.ndarray, n: np.ndarray, dtype: str) -> np.ndarray:
        """The factor on the profile's efficiency for a linear's three GEMMs at (m, k, n): at most 1."""
        plateau = self.plateau.get(dtype, self.plateau["bfloat16"])
        inverse = sum(1.0 / np.maximum(self.fraction(*dims, dtype), 1e-6) for dims in ((m, k, n), (m, n, k), (n, m, k)))
        return np.minimum(1.0, 3.0 / inverse / plateau)


_PARSED: dict[int, tuple[dict[str, Any], GemmTable]] = {}  # id of a profile's grid -> (it, parsed)


def gemm_table(hw: Any) -> GemmTable | None:
    """The profile's grid, parsed once per profile; None when it has none (every matmul at its efficiency)."""
    table = getattr(hw, "matmul_table", None)
    if not table:
        return None
    found = _PARSED.get(id(table))
    if found is None or found[0] is not table:
        found = _PARSED[id(table)] = (table, GemmTable(table))
    return found[1]
