"""The argument checks every op makes, in one wording: an error names the op (`where`) and
the argument, says what it got and what is accepted, and is raised before anything runs.

The ops (`cuteforge.ops`, `cuteforge.jax`) call these for their public arguments; a
kernel's own `Signature.bind` then checks the views it is handed against the kernel's
signature (rank, extents, dtypes, strides), which is a different job: the op's arguments
are not the kernel's operands (a 3-D x is a 2-D row view, a dim picks the kernel)."""

from __future__ import annotations

import numbers
from collections.abc import Iterable
from typing import Any

import torch

INT32_MAX = 2**31 - 1  # the kernels' in-row indices and launch grids are int32


def _dtype_name(dtype: Any) -> str:
    return str(dtype).removeprefix("torch.")


def tensor(where: str, name: str, t: Any, dtypes: Iterable[torch.dtype] | None = None) -> torch.Tensor:
    """`t` as a torch.Tensor of one of `dtypes` (any dtype where None)."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{where}: argument {name!r} must be a torch.Tensor, got {type(t).__name__}")
    if t.is_nested or t.layout != torch.strided:  # sparse, nested: the kernels read strided memory
        raise TypeError(f"{where}: argument {name!r} must be a dense (strided) tensor, got "
                        f"{'a nested tensor' if t.is_nested else t.layout}")
    if dtypes is not None:
        dtype_in(where, name, t, dtypes)
    return t


def dtype_in(where: str, name: str, t: Any, dtypes: Iterable[Any]) -> None:
    """`t`'s dtype is one of `dtypes` (torch's, or any dtype objects: JAX's)."""
    allowed = tuple(dtypes)
    if t.dtype not in allowed:
        raise TypeError(f"{where}: argument {name!r} has dtype {_dtype_name(t.dtype)}; supported: "
                        f"{', '.join(_dtype_name(d) for d in allowed)}")


def same_device(where: str, name: str, t: torch.Tensor, ref_name: str, ref: torch.Tensor) -> None:
    if t.device != ref.device:
        raise ValueError(f"{where}: argument {name!r} is on {t.device} but {ref_name!r} is on {ref.device}")


def same_dtype(where: str, name: str, t: Any, ref_name: str, ref: Any) -> None:
    if t.dtype != ref.dtype:
        raise TypeError(f"{where}: argument {name!r} has dtype {_dtype_name(t.dtype)} but {ref_name!r} has "
                        f"{_dtype_name(ref.dtype)}; they must match")


def matches(where: str, name: str, t: Any, ref_name: str, ref: torch.Tensor) -> None:
    """A tensor argument that must share `ref_name`'s device, dtype and shape (a residual
    beside x, a gradient beside its output)."""
    tensor(where, name, t)
    same_device(where, name, t, ref_name, ref)
    same_dtype(where, name, t, ref_name, ref)
    if t.shape != ref.shape:
        raise ValueError(f"{where}: argument {name!r} has shape {tuple(t.shape)} but {ref_name!r} has "
                         f"{tuple(ref.shape)}; they must match")


def on_cuda(where: str, name: str, t: torch.Tensor) -> None:
    """The ops' device check, made after every other check of the call: a caller with a
    CPU tensor sees the real problem first."""
    if not t.is_cuda:
        raise ValueError(f"{where}: argument {name!r} must be a CUDA tensor, got one on {t.device}")


def integer(where: str, name: str, value: Any) -> int:
    """An int argument (numpy's integers too; not a bool)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{where}: argument {name!r} must be an int, got {type(value).__name__}")
    return int(value)


def real(where: str, name: str, value: Any) -> float:
    """A float argument (ints and numpy's reals too; not a bool)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{where}: argument {name!r} must be a float, got {type(value).__name__}")
    return float(value)


def boolean(where: str, name: str, value: Any) -> bool:
    """A bool argument (numpy's bool too)."""
    if isinstance(value, bool):
        return value
    kind = type(value)
    if kind.__module__ == "numpy" and kind.__name__ in ("bool", "bool_"):
        return bool(value)
    got = kind.__name__ if kind.__module__ == "builtins" else f"{kind.__module__}.{kind.__qualname__}"  # numpy 2's "bool"
    raise TypeError(f"{where}: argument {name!r} must be a bool, got {got}")


def last_dim(where: str, name: str, value: Any, ndim: int, hint: str) -> int:
    """An op's `name` argument (dim, axis): an int (numpy's too) naming the last dim of an
    ndim-D input, the one the row kernels reduce over; `hint` says how to move another one
    last. Returns it as an int."""
    value = integer(where, name, value)
    if value not in (-1, ndim - 1):
        raise ValueError(f"{where}: argument {name!r} must be the last {name} (-1 or {ndim - 1}) of a {ndim}-D input, got {value}"
                         f" ({hint})")
    return value
