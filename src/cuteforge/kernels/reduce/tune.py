"""The row reduction's problem factory for `cuteforge tune` (`autotune.problems`):

    cuteforge tune row_reduce --shapes 32768x4096 --dtype bfloat16 --param op=amax

Keyed as `ops.sum` / `mean` / `amax` / `amin` / `argmax` key a contiguous (M, N) input
with a fresh output (`ops/reduce.py` looks the stored winner up)."""

from __future__ import annotations

from typing import Any

import torch

from ...autotune.problems import ProblemInputs, register_problem, rows_shape
from ...signature import torch_dtype
from .spec import OPS, out_dtype, row_reduce

_REFS = {"sum": torch.sum, "mean": torch.mean, "amax": torch.amax, "amin": torch.amin, "argmax": torch.argmax}


def row_reduce_problem(shape: tuple[int, ...], dtype: str, params: dict[str, Any]) -> ProblemInputs:
    m, n = rows_shape("row_reduce", shape)
    op = params.setdefault("op", "sum")
    if op not in OPS:
        raise ValueError(f"row_reduce: op must be one of {OPS}, got {op!r}")
    if set(params) != {"op"}:
        raise ValueError(f"row_reduce: unknown parameter(s) {sorted(set(params) - {'op'})}; known: op")
    dt = torch_dtype(dtype)
    odt = out_dtype(op, dt)
    key = row_reduce.signature.fresh_key([torch.empty(m, n, dtype=dt, device="meta"), torch.empty(m, dtype=odt, device="meta")])

    def make() -> tuple[Any, ...]:
        return torch.randn(m, n, device="cuda", dtype=dt), torch.empty(m, device="cuda", dtype=odt)

    def reference(x: Any, out: Any) -> Any:
        return _REFS[op](x.float(), dim=-1)

    return ProblemInputs(key, params, {"M": m}, make, reference)


register_problem("row_reduce", row_reduce_problem)
