"""The norm forward's problem factory for `cuteforge tune` (`autotune.problems`):

    cuteforge tune norm_fwd --shapes 32768x4096,1024x262144 --dtype bfloat16 --param kind=layer
    cuteforge tune norm_fwd --shapes 32768x8192 --dtype float32 --param kind=rms --param residual=true

Parameters (the kernel's compile parameters, so the stored result is keyed by them):
`kind` rms | layer (default rms); `eps` (default the op's: 1e-6 rms, 1e-5 layer: tune
with the eps your model calls the op with); `bias` (LayerNorm with a bias; default
true for layer); `residual` (the fused residual add; default false); `weight` x |
float32 (the weight's dtype; default x's). Keyed as `ops.rms_norm` / `layer_norm` key a
contiguous (M, N) x with fresh outputs, so the op looks the stored winner up. The
backward is not tunable from the command line: its dweight partials are (Q, N) with Q
set by the config, so no one set of tensors serves every candidate."""

from __future__ import annotations

import math
from typing import Any

import torch

from ...autotune.problems import ProblemInputs, register_problem, rows_shape
from ...signature import torch_dtype
from .spec import norm_fwd

EPS = {"rms": 1e-6, "layer": 1e-5}  # the ops' defaults
KNOWN = ("kind", "eps", "bias", "residual", "weight")


def _flag(name: str, v: Any) -> bool:
    if isinstance(v, bool):
        return v
    if str(v).lower() in ("1", "true", "yes"):
        return True
    if str(v).lower() in ("0", "false", "no"):
        return False
    raise ValueError(f"norm_fwd: {name} must be true or false, got {v!r}")


def fwd_problem(shape: tuple[int, ...], dtype: str, params: dict[str, Any]) -> ProblemInputs:
    m, n = rows_shape("norm_fwd", shape)
    unknown = sorted(set(params) - set(KNOWN))
    if unknown:
        raise ValueError(f"norm_fwd: unknown parameter(s) {unknown}; known: {', '.join(KNOWN)}")
    kind = str(params.get("kind", "rms"))
    if kind not in EPS:
        raise ValueError(f"norm_fwd: kind must be rms or layer, got {kind!r}")
    try:
        eps = float(params.get("eps", EPS[kind]))
    except (TypeError, ValueError):
        eps = math.nan
    if not (math.isfinite(eps) and eps >= 0):  # as the ops require
        raise ValueError(f"norm_fwd: eps must be a finite number >= 0, got {params['eps']!r}")
    has_bias = _flag("bias", params.get("bias", kind == "layer"))
    if has_bias and kind == "rms":
        raise ValueError("norm_fwd: rms_norm takes no bias (bias=true needs kind=layer)")
    has_res = _flag("residual", params.get("residual", False))
    dt = torch_dtype(dtype)
    wname = str(params.get("weight", "x"))
    if wname not in ("x", "float32"):
        raise ValueError(f"norm_fwd: weight must be x or float32 (the weight's dtype), got {wname!r}")
    wdt = dt if wname == "x" else torch.float32
    compile_params = {"eps": eps, "has_bias": has_bias, "has_residual": has_res, "kind": kind}

    def tensors(device: str) -> list[torch.Tensor]:
        rows = [torch.empty(m, n, dtype=dt, device=device) for _ in range(4)]  # x, residual, y, residual_out
        vecs = [torch.empty(n, dtype=wdt, device=device) for _ in range(2)]  # weight, bias
        stats = [torch.empty(m, dtype=torch.float32, device=device) for _ in range(2)]  # mean, rstd
        return [rows[0], vecs[0], vecs[1], rows[1], rows[2], rows[3], *stats]

    key = norm_fwd.signature.fresh_key(tensors("meta"))

    def make() -> tuple[Any, ...]:
        x, w, b, r, y, ro, mean, rstd = tensors("cuda")
        for t in (x, r):
            t.copy_(torch.randn(m, n, device="cuda"))
        for t in (w, b):
            t.copy_(torch.randn(n, device="cuda"))
        return x, w, b, r, y, ro, mean, rstd

    def reference(x: Any, w: Any, b: Any, r: Any, *_: Any) -> Any:
        h = x.float() + r.float() if has_res else x.float()
        if kind == "rms":
            return h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps) * w.float()
        return torch.nn.functional.layer_norm(h, (n,), w.float(), b.float() if has_bias else None, eps)

    return ProblemInputs(key, compile_params, {"M": m}, make, reference, outputs=("y",))


register_problem("norm_fwd", fwd_problem)
