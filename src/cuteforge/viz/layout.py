"""CuTe layout algebra in pure Python: parse CuTe notation, index, coalesce, and
`make_layout_tv` (the thread-value layout a thread and a value layout tile into).

Conventions follow CuTe exactly: a linear index maps to a coordinate colexicographically
(leftmost mode fastest), the offset is the inner product of coordinate and stride, and a
shape without strides is compact column-major.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any, Union

IntTuple = Union[int, tuple["IntTuple", ...]]


MAX_CELLS = 1 << 16  # refuse to draw more cells than this (the SVG would be huge)


def _fmt(t: IntTuple) -> str:
    return str(t) if isinstance(t, int) else "(" + ",".join(_fmt(x) for x in t) + ")"


def _flatten(t: IntTuple) -> list[int]:
    return [t] if isinstance(t, int) else [x for e in t for x in _flatten(e)]


def _product(t: IntTuple) -> int:
    return math.prod(_flatten(t))


def _congruent(a: IntTuple, b: IntTuple) -> bool:
    if isinstance(a, int) or isinstance(b, int):
        return isinstance(a, int) and isinstance(b, int)
    return len(a) == len(b) and all(_congruent(x, y) for x, y in zip(a, b))


def _compact_col_major(shape: IntTuple, current: int = 1) -> tuple[IntTuple, int]:
    """CuTe's default strides: prefix products of the shape, colexicographically."""
    if isinstance(shape, int):
        return current, current * shape
    strides = []
    for mode in shape:
        stride, current = _compact_col_major(mode, current)
        strides.append(stride)
    return tuple(strides), current


def _idx2crd(idx: int, shape: IntTuple) -> IntTuple:
    if isinstance(shape, int):
        return idx
    coord = []
    for i, mode in enumerate(shape):
        n = _product(mode)
        last = i == len(shape) - 1  # CuTe leaves the last mode unreduced
        coord.append(_idx2crd(idx if last else idx % n, mode))
        idx //= n
    return tuple(coord)


def _crd2off(coord: Any, shape: IntTuple, stride: IntTuple) -> int:
    if isinstance(coord, tuple):
        if isinstance(shape, int) or len(coord) != len(shape):
            raise ValueError(f"coordinate {coord} does not match shape {_fmt(shape)}")
        return sum(_crd2off(c, s, d) for c, s, d in zip(coord, shape, stride))
    if not isinstance(coord, int) or isinstance(coord, bool):
        raise TypeError(f"coordinate entries must be int, got {coord!r}")
    if not 0 <= coord < _product(shape):
        raise IndexError(f"coordinate {coord} out of range for mode {_fmt(shape)}")
    if isinstance(shape, int):
        return coord * stride  # type: ignore[operator]
    return _crd2off(_idx2crd(coord, shape), shape, stride)


@dataclass(frozen=True)
class Layout:
    """A CuTe layout: a function from coordinates (or a linear index) to offsets."""

    shape: IntTuple
    stride: IntTuple

    def __post_init__(self) -> None:
        if not _congruent(self.shape, self.stride):
            raise ValueError(f"shape {_fmt(self.shape)} and stride {_fmt(self.stride)} "
                             "have different profiles")
        for x in _flatten(self.shape) + _flatten(self.stride):
            if not isinstance(x, int) or isinstance(x, bool):
                raise TypeError(f"layout entries must be int, got {x!r}")
        if any(s <= 0 for s in _flatten(self.shape)):
            raise ValueError(f"shape entries must be positive, got {_fmt(self.shape)}")

    @classmethod
    def compact(cls, shape: IntTuple) -> Layout:
        """The compact column-major layout of ``shape`` (CuTe's ``make_layout(shape)``)."""
        return cls(shape, _compact_col_major(shape)[0])

    @property
    def rank(self) -> int:
        return 1 if isinstance(self.shape, int) else len(self.shape)

    @property
    def modes(self) -> list[Layout]:
        """The top-level modes (a rank-1 layout ``8:2`` has the single mode ``8:2``)."""
        if isinstance(self.shape, int):
            return [self]
        return [Layout(s, d) for s, d in zip(self.shape, self.stride)]  # type: ignore[arg-type]

    @classmethod
    def of_modes(cls, modes: list[Layout]) -> Layout:
        return cls(tuple(m.shape for m in modes), tuple(m.stride for m in modes))

    @property
    def size(self) -> int:
        return _product(self.shape)

    @property
    def cosize(self) -> int:
        """CuTe's codomain size: ``layout(size - 1) + 1``."""
        return self(self.size - 1) + 1

    def __call__(self, *coord: Any) -> int:
        """Offset of a linear (colexicographic) index, or of a natural/hierarchical coordinate.

        ``layout(i)``, ``layout((m, n))`` and ``layout(m, n)`` are all accepted; an int
        given for a nested mode is itself split colexicographically, as in CuTe.
        """
        return _crd2off(coord[0] if len(coord) == 1 else coord, self.shape, self.stride)

    def coord(self, index: int) -> IntTuple:
        """The natural coordinate of a linear index (CuTe ``idx2crd``)."""
        if not 0 <= index < self.size:
            raise IndexError(f"index {index} out of range for size {self.size}")
        return _idx2crd(index, self.shape)

    def index(self, coord: Any) -> int:
        """The linear (colexicographic) index of a coordinate (CuTe ``crd2idx``)."""
        return Layout.compact(self.shape)(coord)

    def __str__(self) -> str:
        return f"{_fmt(self.shape)}:{_fmt(self.stride)}"


# --------------------------------------------------------------------------- parsing
_TOKEN = re.compile(r"\s+|[(),:]|[^\s(),:]+")
_INT = re.compile(r"[+-]?\d+")


def parse_layout(text: str) -> Layout:
    """Parse CuTe notation: ``"(4,8):(8,1)"``, ``"8:1"``, ``"((2,2),4):((1,8),2)"`` or a
    shape alone (``"(4,8)"``, compact column-major). Raises ``ValueError`` naming the problem."""

    def fail(what: str) -> ValueError:
        return ValueError(f"invalid layout {text!r}: {what}")

    if not isinstance(text, str):
        raise TypeError(f"parse_layout expects a str, got {type(text).__name__}")
    depth = 0
    for i, ch in enumerate(text):
        depth += {"(": 1, ")": -1}.get(ch, 0)
        if depth < 0:
            raise fail(f"unbalanced parenthesis: unmatched ')' at position {i}")
    if depth > 0:
        raise fail(f"unbalanced parenthesis: {depth} '(' never closed")
    tokens = [(m.group(), m.start()) for m in _TOKEN.finditer(text) if not m.group().isspace()]
    if not tokens:
        raise fail("empty layout")
    for tok, at in tokens:
        if tok not in "(),:" and not _INT.fullmatch(tok):
            raise fail(f"non-integer {tok!r} at position {at}")
    pos = 0

    def peek() -> tuple[str, int]:
        return tokens[pos] if pos < len(tokens) else ("<end>", len(text))

    def parse_tree() -> IntTuple:
        nonlocal pos
        tok, at = peek()
        pos += 1
        if _INT.fullmatch(tok):
            return int(tok)
        if tok != "(":
            raise fail(f"expected an integer or '(' at position {at}, got {tok!r}")
        if peek()[0] == ")":
            raise fail(f"empty tuple '()' at position {at}")
        items = [parse_tree()]
        while True:
            tok, at = peek()
            pos += 1
            if tok == ")":
                return tuple(items)
            if tok != ",":
                raise fail(f"expected ',' or ')' at position {at}, got {tok!r}")
            items.append(parse_tree())

    shape = parse_tree()
    stride: IntTuple | None = None
    if peek()[0] == ":":
        pos += 1
        stride = parse_tree()
    if pos < len(tokens):
        tok, at = tokens[pos]
        raise fail(f"unexpected {tok!r} at position {at}")
    if any(s <= 0 for s in _flatten(shape)):
        raise fail(f"shape entries must be positive integers, got {_fmt(shape)}")
    if stride is None:
        return Layout.compact(shape)
    if not _congruent(shape, stride):
        raise fail(f"shape/stride profile mismatch: shape {_fmt(shape)} vs stride {_fmt(stride)}")
    return Layout(shape, stride)


def _to_int_tuple(x: Any) -> IntTuple:
    if isinstance(x, (tuple, list)):
        return tuple(_to_int_tuple(e) for e in x)
    return int(x)


def _coerce(obj: Any) -> Layout:
    """A ``Layout`` from a Layout, CuTe notation, or a static DSL layout (by shape/stride)."""
    if isinstance(obj, Layout):
        return obj
    if isinstance(obj, str):
        return parse_layout(obj)
    if hasattr(obj, "shape") and hasattr(obj, "stride"):
        try:
            return Layout(_to_int_tuple(obj.shape), _to_int_tuple(obj.stride))
        except (TypeError, ValueError):
            return parse_layout(str(obj))  # e.g. a non-int static element; let notation decide
    raise TypeError(f"expected a Layout, CuTe notation string or DSL layout, got {obj!r}")


# ---------------------------------------------------------------- TV layouts (algebra)
def _coalesce(modes: list[tuple[int, int]]) -> list[tuple[int, int]]:
    out: list[tuple[int, int]] = []
    for s, d in modes:
        if s == 1:
            continue
        if out and d == out[-1][0] * out[-1][1]:
            out[-1] = (out[-1][0] * s, out[-1][1])
        else:
            out.append((s, d))
    return out


def _right_inverse(modes: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """CuTe ``right_inverse`` of a coalesced flat layout: follow strides 1, s0, s0*s1, ..."""
    by_stride: dict[int, tuple[int, int]] = {}
    position = 1
    for s, d in modes:
        by_stride.setdefault(d, (s, position))
        position *= s
    out, current = [], 1
    while current in by_stride:
        s, p = by_stride.pop(current)
        out.append((s, p))
        current *= s
    return _coalesce(out)


def _scale(t: IntTuple, k: int) -> IntTuple:
    return t * k if isinstance(t, int) else tuple(_scale(e, k) for e in t)


def _mode_layout(modes: list[tuple[int, int]]) -> tuple[IntTuple, IntTuple]:
    modes = _coalesce(modes)
    if not modes:
        return 1, 0
    if len(modes) == 1:
        return modes[0]
    return tuple(s for s, _ in modes), tuple(d for _, d in modes)


def _rank2(layout: Layout, what: str) -> Layout:
    if layout.rank > 2:
        raise ValueError(f"{what} {layout} must have rank 1 or 2")
    return Layout.of_modes((layout.modes + [Layout(1, 0)])[:2])


def make_layout_tv(thr_layout: Any, val_layout: Any) -> tuple[tuple[int, ...], Layout]:
    """Pure-Python ``cute.make_layout_tv``: returns ``(tiler_mn, tv_layout)``.

    ``thr_layout`` maps (M,N) thread coordinates to thread ids, ``val_layout`` (M,N) value
    coordinates to value ids; both must be compact. As in CuTe, ``layout_mn =
    raked_product(thr, val)``, ``tiler_mn = product_each(layout_mn.shape)`` and
    ``tv_layout = right_inverse(layout_mn) o (T,V):(1,T)``.
    """
    thr0, val0 = _coerce(thr_layout), _coerce(val_layout)
    thr, val = _rank2(thr0, "thr_layout"), _rank2(val0, "val_layout")
    for name, lay in (("thr_layout", thr), ("val_layout", val)):
        if sorted(lay(i) for i in range(lay.size)) != list(range(lay.size)):
            raise ValueError(f"{name} {lay} must be compact (a bijection onto [0, {lay.size}))")
    t = thr.size
    # raked_product: ((V0,T0),(V1,T1)) : ((T*v0,t0),(T*v1,t1)), values scaled past threads
    layout_mn = Layout.of_modes([Layout((vm.shape, tm.shape), (_scale(vm.stride, t), tm.stride))
                                 for tm, vm in zip(thr.modes, val.modes)])
    tiler = tuple(m.size for m in layout_mn.modes)
    inverse = _right_inverse(_coalesce(list(zip(_flatten(layout_mn.shape),
                                                _flatten(layout_mn.stride)))))
    # compose with (T,V):(1,T), i.e. split the inverse's domain at T
    thr_modes: list[tuple[int, int]] = []
    rest = t
    while rest > 1:
        s, d = inverse.pop(0)
        if rest % s == 0:
            thr_modes.append((s, d))
            rest //= s
        else:  # a coalesced mode straddling T: rest divides s for compact inputs
            thr_modes.append((rest, d))
            inverse.insert(0, (s // rest, d * rest))
            rest = 1
    (ts, td), (vs, vd) = _mode_layout(thr_modes), _mode_layout(inverse)
    # CuTe appends the size-1 mode only up to max(rank(thr), rank(val))
    return tiler[: max(thr0.rank, val0.rank)], Layout((ts, vs), (td, vd))
