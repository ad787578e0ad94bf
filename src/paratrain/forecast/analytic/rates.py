"""Measured rates by shape: a table of GEMMs (M, N, K) and of attention (head dim, heads,
sequence) timed on one GPU (benchmarks/device/matmul_shapes.py), which a hardware profile names
in its [tables]. The analytic step prices each matmul by its own shape from it: a rate at a
shape not measured is interpolated from the nearest measured ones in log space (inverse
distance), so a GEMM a tensor-parallel split makes thin or short gets the thin GEMM's rate, not
the big one's. Pure; the table is read once."""

from __future__ import annotations

import functools
import json
import math
from dataclasses import dataclass, field
from pathlib import Path

from paratrain.errors import UserError

NEIGHBOURS = 6  # measured shapes an interpolated rate is made of: leaving each measured GEMM
# of the H100 table out and interpolating it from the rest, 6 gave the smallest median error of
# 1-8 (bf16 5.5%, float8 6.4%; 1 neighbour: 7.1%, 9.7%): tests/unit/test_plan_rates.py


@dataclass(frozen=True)
class Table:
    """One GPU's measured rates (TFLOP/s), as the sweep wrote them."""

    gemm: dict[str, list[tuple[float, float, float, float]]]
    """dtype ("bf16", "float8" tensorwise, "float8_rowwise") -> (log2 M, log2 N, log2 K, TFLOP/s)."""
    attention: dict[str, list[tuple[float, float, float, float, float]]]
    """backend ("flash", "cudnn"; "flash_gqa", "cudnn_gqa": k/v heads shared through enable_gqa)
    -> (log2 head_dim, log2 heads, log2 seq, forward, backward)."""
    source: str
    path: str
    memo: dict = field(default_factory=dict, compare=False, repr=False)
    """Rates already interpolated: a layout search asks the same few shapes thousands of times."""

    def gemm_tflops(self, m: float, n: float, k: float, dtype: str = "bf16") -> float:
        key = ("gemm", dtype, m, n, k)
        if key not in self.memo:
            rows = self.gemm.get(dtype)
            if not rows:
                raise UserError(f"rates {self.path}: no {dtype} GEMMs measured")
            self.memo[key] = _idw(rows, (math.log2(m), math.log2(n), math.log2(k)))[0]
        return self.memo[key]

    def attention_tflops(
        self, head_dim: int, heads: float, seq: int, backend: str = "flash"
    ) -> tuple[float, float]:
        """(forward, backward) TFLOP/s of causal attention at this head dim, head count (a
        rank's, under TP) and sequence length."""
        key = ("attention", backend, head_dim, heads, seq)
        if key not in self.memo:
            rows = self.attention.get(backend)
            if not rows:
                raise UserError(f"rates {self.path}: no {backend} attention measured")
            point = (math.log2(head_dim), math.log2(max(heads, 1)), math.log2(seq))
            self.memo[key] = _idw(rows, point)
        return self.memo[key]


def _idw(rows, point) -> tuple[float, ...]:
    """Inverse-distance weights (squared) over the NEIGHBOURS nearest rows; an exact match is
    itself. Rates are averaged as times are: in 1 / rate, so one fast outlier cannot pull a
    slow neighbourhood up."""
    d = len(point)
    near = sorted(rows, key=lambda r: sum((r[i] - point[i]) ** 2 for i in range(d)))[:NEIGHBOURS]
    weights = []
    for r in near:
        dist = sum((r[i] - point[i]) ** 2 for i in range(d))
        if dist < 1e-12:
            return tuple(r[d:])
        weights.append(1 / dist)
    total = sum(weights)
    width = len(near[0]) - d
    return tuple(
        total / sum(w / r[d + j] for w, r in zip(weights, near, strict=True)) for j in range(width)
    )


@functools.lru_cache(maxsize=8)
def load(path: str) -> Table:
    p = Path(path)
    try:
        data = json.loads(p.read_text())
    except OSError as e:
        raise UserError(
            f"hardware profile: cannot read its rates table {p} ({e.strerror})"
        ) from None
    except ValueError as e:
        raise UserError(f"hardware profile: its rates table {p} is not JSON ({e})") from None
    try:
        gemm = {
            dtype: [(math.log2(m), math.log2(n), math.log2(k), float(t)) for m, n, k, t in rows]
            for dtype, rows in data["gemm"].items()
        }
        attention = {
            backend: [
                (math.log2(hd), math.log2(h), math.log2(s), float(f), float(b))
                for hd, h, s, f, b in rows
            ]
            for backend, rows in data.get("attention", {}).items()
        }
    except (KeyError, TypeError, ValueError) as e:
        raise UserError(f"hardware profile: rates table {p} is malformed ({e!r})") from None
    return Table(gemm=gemm, attention=attention, source=str(data.get("source", "")), path=str(p))
