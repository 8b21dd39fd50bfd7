"""Cross-entropy's problem factories for `cuteforge tune` (`autotune.problems`):

    cuteforge tune cross_entropy_fwd --shapes 32768x4096,4096x131072 --dtype bfloat16
    cuteforge tune cross_entropy_bwd --shapes 32768x4096 --dtype bfloat16 [--param ignore_index=-1]

Keyed as `ops.cross_entropy` keys contiguous (M, N) logits and (M,) int64 targets with
fresh outputs. The forward's result also serves the reduced forward (mean / sum in one
launch), which runs the same row loop under the same config (`ops/cross_entropy.py`).
`ignore_index` (default -100, as torch) is a compile parameter: tune with your model's."""

from __future__ import annotations

from typing import Any

import torch

from ...autotune.problems import ProblemInputs, register_problem, rows_shape
from ...signature import torch_dtype
from .spec import cross_entropy_bwd, cross_entropy_fwd


def _params(name: str, params: dict[str, Any]) -> dict[str, Any]:
    unknown = sorted(set(params) - {"ignore_index"})
    if unknown:
        raise ValueError(f"{name}: unknown parameter(s) {unknown}; known: ignore_index")
    value = params.get("ignore_index", -100)
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{name}: ignore_index must be an integer, got {value!r}")
    return {"ignore_index": value}


def _tensors(m: int, n: int, dt: torch.dtype, device: str, backward: bool) -> list[torch.Tensor]:
    f32 = torch.float32
    logits = torch.empty(m, n, dtype=dt, device=device)
    target = torch.empty(m, dtype=torch.int64, device=device)
    rows = [torch.empty(m, dtype=f32, device=device) for _ in range(2)]  # loss, lse / lse, dloss
    return [logits, target, *rows] + ([torch.empty(m, n, dtype=dt, device=device)] if backward else [])


def _problem(kernel: Any, shape: tuple[int, ...], dtype: str, params: dict[str, Any],
             backward: bool) -> tuple[int, int, dict[str, Any], torch.dtype, Any]:
    """(M, N, parameters, dtype, key): the shape and parameters checked, the key bound as
    `ops.cross_entropy` binds it."""
    m, n = rows_shape(kernel.name, shape)
    p = _params(kernel.name, params)
    dt = torch_dtype(dtype)
    return m, n, p, dt, kernel.signature.fresh_key(_tensors(m, n, dt, "meta", backward))


def _random(m: int, n: int, dt: torch.dtype, backward: bool) -> list[torch.Tensor]:
    """The CUDA operands with logits ~ 4 N(0, 1) and targets in [0, N)."""
    tensors = _tensors(m, n, dt, "cuda", backward)
    tensors[0].copy_(torch.randn(m, n, device="cuda") * 4)
    tensors[1].copy_(torch.randint(0, n, (m,), device="cuda"))
    return tensors


def fwd_problem(shape: tuple[int, ...], dtype: str, params: dict[str, Any]) -> ProblemInputs:
    m, n, p, dt, key = _problem(cross_entropy_fwd, shape, dtype, params, False)

    def make() -> tuple[Any, ...]:
        return tuple(_random(m, n, dt, False))

    def reference(logits: Any, target: Any, *_: Any) -> Any:
        return torch.nn.functional.cross_entropy(logits.float(), target, reduction="none", ignore_index=p["ignore_index"])

    return ProblemInputs(key, p, {"M": m}, make, reference, outputs=("loss",))


def bwd_problem(shape: tuple[int, ...], dtype: str, params: dict[str, Any]) -> ProblemInputs:
    m, n, p, dt, key = _problem(cross_entropy_bwd, shape, dtype, params, True)

    def make() -> tuple[Any, ...]:
        logits, target, lse, dloss, dlogits = _random(m, n, dt, True)
        lse.copy_(torch.logsumexp(logits.float(), -1))
        dloss.copy_(torch.randn(m, device="cuda"))
        return logits, target, lse, dloss, dlogits

    def reference(logits: Any, target: Any, lse: Any, dloss: Any, dlogits: Any) -> Any:
        g = torch.exp(logits.float() - lse[:, None])
        keep = target != p["ignore_index"]
        rows = torch.arange(m, device=logits.device)[keep]
        g[rows, target[keep]] -= 1.0
        return g * (dloss * keep)[:, None]

    return ProblemInputs(key, p, {"M": m}, make, reference, outputs=("dlogits",))


register_problem("cross_entropy_fwd", fwd_problem)
register_problem("cross_entropy_bwd", bwd_problem)
