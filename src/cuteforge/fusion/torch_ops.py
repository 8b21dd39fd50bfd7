"""The fusion operations on torch tensors: `Pointwise.reference`, the unfused computation."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F


def _t(x: Any, like: Any) -> Any:
    return torch.as_tensor(x, dtype=like.dtype, device=like.device) if isinstance(x, (int, float)) else x


def _like(*xs: Any) -> Any:
    return next(x for x in xs if isinstance(x, torch.Tensor))


neg = torch.neg
abs = torch.abs  # noqa: A001
exp = torch.exp
tanh = torch.tanh
sqrt = torch.sqrt
rsqrt = torch.rsqrt
log = torch.log
sigmoid = torch.sigmoid
silu = F.silu
relu = torch.relu


def gelu(x: Any) -> Any:
    return F.gelu(x)


def gelu_tanh(x: Any) -> Any:
    return F.gelu(x, approximate="tanh")


def minimum(a: Any, b: Any) -> Any:
    like = _like(a, b)
    return torch.minimum(_t(a, like), _t(b, like))


def maximum(a: Any, b: Any) -> Any:
    like = _like(a, b)
    return torch.maximum(_t(a, like), _t(b, like))


def lt(a: Any, b: Any) -> Any:
    return a < b


def le(a: Any, b: Any) -> Any:
    return a <= b


def gt(a: Any, b: Any) -> Any:
    return a > b


def ge(a: Any, b: Any) -> Any:
    return a >= b


def eq(a: Any, b: Any) -> Any:
    return a == b


def ne(a: Any, b: Any) -> Any:
    return a != b


def where(c: Any, a: Any, b: Any) -> Any:
    return torch.where(c, a, b)
