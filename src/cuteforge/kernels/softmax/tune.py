"""Softmax's problem factories for `cuteforge tune` (`autotune.problems`):

    cuteforge tune softmax_fwd --shapes 32768x4096,4096x65536 --dtype bfloat16 [--param mode=log_softmax]
    cuteforge tune softmax_bwd --shapes 32768x4096 --dtype float32 [--param mode=log_softmax_bwd]

Keyed as `ops.softmax` / `log_softmax` and their backward key contiguous (M, N) operands
with fresh outputs (their parameters too: `same_heads` where the rows are realigned), so
the ops look the stored winner up. Candidates: the ops' own
heuristic for (M, N) first (it depends on M), then the family's list around it."""

from __future__ import annotations

from typing import Any

import torch

from ...arch import target_arch
from ...autotune.problems import ProblemInputs, register_problem, rows_shape
from ...signature import torch_dtype
from .config import candidate_configs
from .spec import BWD_MODES, FWD_MODES, config_for, kernel_params, softmax_bwd, softmax_fwd


def _configs(m: int, n: int, bits: int, backward: bool, mode: str, key: Any) -> list[Any]:
    out = [config_for(target_arch(), n, bits, backward, m, mode, key)]  # the op's default first
    return out + [c for c in candidate_configs(n, bits, backward) if c not in out]


def _mode(name: str, params: dict[str, Any], modes: tuple[str, ...]) -> str:
    mode = params.setdefault("mode", modes[0])
    if mode not in modes:
        raise ValueError(f"{name}: mode must be one of {modes}, got {mode!r}")
    if set(params) != {"mode"}:
        raise ValueError(f"{name}: unknown parameter(s) {sorted(set(params) - {'mode'})}; known: mode")
    return mode


def fwd_problem(shape: tuple[int, ...], dtype: str, params: dict[str, Any]) -> ProblemInputs:
    m, n = rows_shape("softmax_fwd", shape)
    mode = _mode("softmax_fwd", params, FWD_MODES)
    dt = torch_dtype(dtype)
    rows = torch.empty(m, n, dtype=dt, device="meta")
    key = softmax_fwd.signature.fresh_key([rows, rows])

    def make() -> tuple[Any, ...]:
        return torch.randn(m, n, device="cuda", dtype=dt), torch.empty(m, n, device="cuda", dtype=dt)

    def reference(x: Any, y: Any) -> Any:
        return (torch.softmax if mode == "softmax" else torch.log_softmax)(x.float(), dim=-1)

    # contiguous operands: every row as far from 16 bytes as a fresh output's (same_heads)
    return ProblemInputs(key, dict(kernel_params(mode, key, True)), {"M": m}, make, reference,
                         configs=_configs(m, n, dt.itemsize * 8, False, mode, key))


def bwd_problem(shape: tuple[int, ...], dtype: str, params: dict[str, Any]) -> ProblemInputs:
    m, n = rows_shape("softmax_bwd", shape)
    mode = _mode("softmax_bwd", params, BWD_MODES)
    dt = torch_dtype(dtype)
    rows = torch.empty(m, n, dtype=dt, device="meta")
    key = softmax_bwd.signature.fresh_key([rows, rows, rows])
    log = mode == "log_softmax_bwd"

    def make() -> tuple[Any, ...]:
        x = torch.randn(m, n, device="cuda")
        y = (torch.log_softmax if log else torch.softmax)(x, dim=-1).to(dt)
        return torch.randn(m, n, device="cuda", dtype=dt), y, torch.empty(m, n, device="cuda", dtype=dt)

    def reference(dy: Any, y: Any, dx: Any) -> Any:
        dy, y = dy.float(), y.float()
        if log:
            return dy - torch.exp(y) * dy.sum(-1, keepdim=True)
        return y * (dy - (dy * y).sum(-1, keepdim=True))

    return ProblemInputs(key, dict(kernel_params(mode, key, True)), {"M": m}, make, reference,
                         configs=_configs(m, n, dt.itemsize * 8, True, mode, key), outputs=("dx",))


register_problem("softmax_fwd", fwd_problem)
register_problem("softmax_bwd", bwd_problem)
