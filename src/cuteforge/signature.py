"""What a kernel accepts, and the compile key derived from the tensors of one call.

A `Signature` names each tensor argument's dims with symbols. A symbol used by two
arguments means equal extents (one shared `cute.sym_int`, which TVM-FFI then enforces at
call time). Symbols listed in `static` are compile-time constants: their values go into
the key and the kernel is specialized on them. Everything else stays dynamic.

`Signature.bind` validates the torch tensors of a call (clear errors naming the argument)
and returns a `BoundKey` of hashable scalars only: dtypes, static extents, and the
vector width every argument is aligned to. Data pointers, strides of dynamic dims and
the tensors themselves never enter a key, so a key never forces a recompile.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import torch

FLOAT_DTYPES: tuple[torch.dtype, ...] = (torch.float32, torch.bfloat16, torch.float16)

# torch dtype -> cutlass type name (resolved lazily: importing cutlass costs ~1-2 s).
_CUTLASS_NAMES = {
    torch.float32: "Float32",
    torch.float16: "Float16",
    torch.bfloat16: "BFloat16",
    torch.float64: "Float64",
    torch.int64: "Int64",
    torch.int32: "Int32",
    torch.int16: "Int16",
    torch.int8: "Int8",
    torch.uint8: "Uint8",
    torch.bool: "Boolean",
    torch.float8_e4m3fn: "Float8E4M3FN",
    torch.float8_e5m2: "Float8E5M2",
}
_BY_NAME = {str(d).removeprefix("torch."): d for d in _CUTLASS_NAMES}
MAX_VECTOR_BYTES = 16  # widest global load/store a thread issues


def dtype_name(dtype: torch.dtype) -> str:
    """torch.bfloat16 -> 'bfloat16' (the form keys and file names use)."""
    return str(dtype).removeprefix("torch.")


def torch_dtype(name: str) -> torch.dtype:
    try:
        return _BY_NAME[name]
    except KeyError:
        raise ValueError(f"unknown dtype {name!r}; known: {sorted(_BY_NAME)}") from None


def cutlass_dtype(dtype: torch.dtype | str) -> Any:
    """torch dtype (or its name) -> the cutlass numeric type."""
    import cutlass

    d = torch_dtype(dtype) if isinstance(dtype, str) else dtype
    if d not in _CUTLASS_NAMES:
        raise TypeError(f"no cutlass type for {d}")
    return getattr(cutlass, _CUTLASS_NAMES[d])


@dataclass(frozen=True)
class TensorArg:
    """One tensor argument: its name, a symbol per dim, and the dtypes it may have.

    The `leading` dim (default: the last) must have unit stride; the other strides are
    free and dynamic. `leading=0` on a 2-D argument takes column-major matrices.
    `dtype_like` ties the dtype to another argument's.
    """

    name: str
    dims: tuple[str, ...]
    dtypes: tuple[torch.dtype, ...] = FLOAT_DTYPES
    dtype_like: str | None = None
    leading: int = -1

    def __post_init__(self) -> None:
        if not self.dims:
            raise ValueError(f"tensor argument {self.name!r} needs at least one dim")
        if not -len(self.dims) <= self.leading < len(self.dims):
            raise ValueError(f"tensor argument {self.name!r}: leading={self.leading} is not one of its dims")
        object.__setattr__(self, "leading", self.leading % len(self.dims))


@dataclass(frozen=True)
class BoundKey:
    """The part of a compile key that a call's tensors determine. Scalars only."""

    dtypes: tuple[str, ...]
    static: tuple[tuple[str, int], ...]
    vec: tuple[int, ...]  # elements per aligned vector access, per argument


@dataclass(frozen=True)
class Signature:
    args: tuple[TensorArg, ...]
    static: tuple[str, ...] = ()
    _index: dict[str, int] = field(default_factory=dict, compare=False, hash=False, repr=False)

    def __init__(self, *args: TensorArg, static: tuple[str, ...] | list[str] = ()) -> None:
        object.__setattr__(self, "args", tuple(args))
        object.__setattr__(self, "static", tuple(static))
        object.__setattr__(self, "_index", {a.name: i for i, a in enumerate(args)})
        if len(self._index) != len(args):
            raise ValueError("tensor argument names must be unique")
        symbols = {d for a in args for d in a.dims}
        for s in self.static:
            if s not in symbols:
                raise ValueError(f"static dim {s!r} is not a dim of any argument")
        for a in args:
            if a.dtype_like is not None and a.dtype_like not in self._index:
                raise ValueError(f"{a.name}.dtype_like names unknown argument {a.dtype_like!r}")

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(a.name for a in self.args)

    def bind(self, tensors: tuple[torch.Tensor, ...] | list[torch.Tensor], where: str = "") -> BoundKey:
        """Validate one call's tensors and derive their key. Errors name the argument."""
        return self._bind(tensors, where, fresh=False)

    def fresh_key(self, tensors: tuple[torch.Tensor, ...] | list[torch.Tensor]) -> BoundKey:
        """The key `bind` gives tensors of these dtypes, shapes and strides at fresh
        (256-byte aligned) allocations, on any device ("meta" included): what an op's
        call with freshly allocated operands looks up, computed without a GPU (problem
        factories of `cuteforge tune`)."""
        return self._bind(tensors, "", fresh=True)

    def _bind(self, tensors: tuple[torch.Tensor, ...] | list[torch.Tensor], where: str, fresh: bool) -> BoundKey:
        prefix = f"{where}: " if where else ""
        if len(tensors) != len(self.args):
            raise TypeError(f"{prefix}expected {len(self.args)} tensors ({', '.join(self.names)}), got {len(tensors)}")
        extents: dict[str, int] = {}
        dtypes: list[str] = []
        vecs: list[int] = []
        for spec, t in zip(self.args, tensors):
            if not isinstance(t, torch.Tensor):
                raise TypeError(f"{prefix}argument {spec.name!r} must be a torch.Tensor, got {type(t).__name__}")
            if t.dtype not in spec.dtypes:
                allowed = ", ".join(dtype_name(d) for d in spec.dtypes)
                raise TypeError(f"{prefix}argument {spec.name!r} has dtype {dtype_name(t.dtype)}; supported: {allowed}")
            if spec.dtype_like is not None:
                other = tensors[self._index[spec.dtype_like]]
                if t.dtype != other.dtype:
                    raise TypeError(
                        f"{prefix}argument {spec.name!r} has dtype {dtype_name(t.dtype)} but "
                        f"{spec.dtype_like!r} has {dtype_name(other.dtype)}; they must match"
                    )
            shape = t.shape
            if len(shape) != len(spec.dims):
                raise ValueError(f"{prefix}argument {spec.name!r} must have rank {len(spec.dims)}, got shape {tuple(shape)}")
            for sym, n in zip(spec.dims, shape):
                seen = extents.setdefault(sym, n)
                if seen != n:
                    raise ValueError(
                        f"{prefix}argument {spec.name!r} has {sym}={n}, but an earlier argument has {sym}={seen}"
                    )
            stride = t.stride()
            lead = spec.leading
            if stride[lead] != 1 and shape[lead] > 1:
                what = "contiguous rows (last-dim stride 1)" if lead == len(shape) - 1 else f"unit stride in dim {lead}"
                raise ValueError(f"{prefix}argument {spec.name!r} must have {what}, got strides {tuple(stride)}")
            dtypes.append(dtype_name(t.dtype))
            outer = stride[:lead] + stride[lead + 1 :]
            vecs.append(vector_width(256 if fresh else t.data_ptr(), outer, t.element_size()))
        # last: a call on the wrong device hears first about what else is wrong with it
        for spec, t in zip(self.args, tensors):
            if not (t.is_cuda or fresh):
                raise ValueError(f"{prefix}argument {spec.name!r} must be a CUDA tensor, got one on {t.device}")
        static = tuple((s, extents[s]) for s in self.static)
        return BoundKey(tuple(dtypes), static, tuple(vecs))

    def fake_args(self, key: BoundKey) -> list[Any]:
        """Fake tensors for `cute.compile`: static dims as ints, the rest as shared symbols."""
        import cutlass.cute as cute

        static = dict(key.static)
        symbols: dict[str, Any] = {}
        fakes = []
        for spec, dname, vec in zip(self.args, key.dtypes, key.vec):
            shape = []
            for d in spec.dims:
                if d in static:
                    shape.append(static[d])
                else:
                    if d not in symbols:
                        symbols[d] = cute.sym_int(symbol=d)
                    shape.append(symbols[d])
            strides = [1 if i == spec.leading else cute.sym_int64(divisibility=vec) for i in range(len(spec.dims))]
            dt = cutlass_dtype(dname)
            fakes.append(
                cute.runtime.make_fake_tensor(
                    dt, tuple(shape), tuple(strides), assumed_align=vec * dt.width // 8
                )
            )
        return fakes


def vector_width(data_ptr: int, outer_strides: tuple[int, ...] | list[int], element_size: int) -> int:
    """Largest power-of-two element count v (v * element_size <= 16 bytes) such that every
    row of the tensor starts v-element aligned: the pointer and all outer strides agree."""
    v = MAX_VECTOR_BYTES // element_size
    if v <= 1 or data_ptr % element_size:
        return 1
    # Lowest set bit of (pointer in elements | strides | v): v caps it.
    bits = (data_ptr // element_size) | v
    for s in outer_strides:
        bits |= s
    return bits & -bits


SCALAR_TYPES = (int, float, str, bool, type(None))


def key_scalar(value: Any, what: str) -> Any:
    """`value` as a compile-key part: numpy scalars become Python ones (also inside tuples);
    then `check_key_part`."""
    if type(value).__module__ == "numpy" and getattr(value, "ndim", None) == 0 and hasattr(value, "item"):
        value = value.item()
    elif isinstance(value, tuple):
        value = tuple(key_scalar(v, f"{what}[{i}]") for i, v in enumerate(value))
    check_key_part(value, what)
    return value


def check_key_part(value: Any, what: str) -> None:
    """Reject anything but hashable scalars (and tuples / frozen dataclasses of them).

    A tensor in a key hashes by identity and a NaN equals nothing, itself included:
    every call would miss and recompile.
    """
    if isinstance(value, float) and math.isnan(value):
        raise ValueError(f"{what} is NaN; a NaN never equals itself, so it cannot be part of a compile key")
    if isinstance(value, SCALAR_TYPES) or isinstance(value, torch.dtype):
        return
    if isinstance(value, torch.Tensor):
        raise TypeError(
            f"{what} holds a torch.Tensor; compile keys take hashable scalars only "
            "(pass the tensor as a kernel argument, or its value with .item() if it is a constant)"
        )
    if isinstance(value, tuple):
        for i, v in enumerate(value):
            check_key_part(v, f"{what}[{i}]")
        return
    params = getattr(value, "__dataclass_params__", None)
    if params is not None and params.frozen:
        for name in value.__dataclass_fields__:
            check_key_part(getattr(value, name), f"{what}.{name}")
        return
    raise TypeError(
        f"{what} is a {type(value).__name__}; compile keys take ints, floats, strings, bools, "
        "None, torch dtypes, tuples of those and frozen dataclasses"
    )
