"""CuTe layout visualisation in pure Python: parse, evaluate and draw layouts as SVG/PNG.

Nothing here needs a GPU or imports ``cutlass``: layouts are parsed from CuTe notation
(``"(4,8):(8,1)"``) or taken from any object with static ``shape``/``stride`` (a DSL
``cute.Layout`` built at trace time works). Conventions follow CuTe exactly: a linear
index maps to a coordinate colexicographically (leftmost mode fastest), the offset is the
inner product of coordinate and stride, and a shape without strides is compact column-major.
"""

from __future__ import annotations

import colorsys
import math
import re
import sys
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Union
from xml.sax.saxutils import escape, quoteattr

IntTuple = Union[int, tuple["IntTuple", ...]]

__all__ = ["SVG", "IntTuple", "Layout", "main_viz", "make_layout_tv", "parse_layout", "render",
           "render_tiled_copy", "render_tiled_mma", "render_tv", "save"]

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


# ------------------------------------------------------------------------------ SVG
class SVG(str):
    """An SVG document: a plain ``str`` that Jupyter also displays as an image."""

    def _repr_svg_(self) -> str:
        return str(self)


_CELL_H = 32
_CHAR_W = 7.5  # approximate advance of a 12px monospace glyph
_TEXT = 'text-anchor="middle" dominant-baseline="central"'
_Cell = tuple[str, list[str], dict[str, int]]  # fill, label lines, data-* attributes


def _hsv_hex(h: float, s: float, v: float = 1.0) -> str:
    r, g, b = colorsys.hsv_to_rgb(h % 1.0, s, v)
    return f"#{round(r * 255):02x}{round(g * 255):02x}{round(b * 255):02x}"


def _offset_color(offset: int, lo: int, hi: int) -> str:
    """Pastel ramp from red (lowest offset) through green to violet (highest)."""
    return _hsv_hex(0.8 * (offset - lo) / (hi - lo) if hi > lo else 0.0, 0.35)


def _thread_color(tid: int) -> str:
    """Eight pastel hues cycled by thread; alternate groups of eight a shade deeper."""
    return _hsv_hex((tid % 8) / 8, 0.25 if (tid // 8) % 2 == 0 else 0.45)


def _grid_svg(rows: int, cols: int, cells: dict[tuple[int, int], _Cell], title: str) -> SVG:
    longest = max((len(line) for _, lines, _ in cells.values() for line in lines), default=1)
    cw, ch = max(36, round(_CHAR_W * longest) + 12), _CELL_H + 14 * (
        max((len(c[1]) for c in cells.values()), default=1) - 1)
    title_h = 28 if title else 0
    left = round(_CHAR_W * len(str(rows - 1))) + 16
    top = title_h + 22
    width = max(left + cols * cw + 8, round(_CHAR_W * 1.2 * len(title)) + 16)
    height = top + rows * ch + 8
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
           f'viewBox="0 0 {width} {height}" font-family="monospace" font-size="12">',
           f'<rect class="background" x="0" y="0" width="{width}" height="{height}" '
           'fill="#ffffff"/>']
    if title:
        out.append(f'<text class="title" x="{width / 2:g}" y="{title_h / 2 + 4:g}" '
                   f'font-size="14" font-weight="bold" {_TEXT}>{escape(title)}</text>')
    for m in range(rows):
        out.append(f'<text class="row-index" x="{left / 2:g}" y="{top + (m + 0.5) * ch:g}" '
                   f'fill="#606060" {_TEXT}>{m}</text>')
    for n in range(cols):
        out.append(f'<text class="col-index" x="{left + (n + 0.5) * cw:g}" y="{top - 11}" '
                   f'fill="#606060" {_TEXT}>{n}</text>')
    for m in range(rows):
        for n in range(cols):
            fill, lines, data = cells.get((m, n), ("#ffffff", [], {"data-m": m, "data-n": n}))
            x, y = left + n * cw, top + m * ch
            attrs = "".join(f" {k}={quoteattr(str(v))}" for k, v in data.items())
            out.append(f'<rect class="cell" x="{x}" y="{y}" width="{cw}" height="{ch}" '
                       f'fill="{fill}" stroke="#404040" stroke-width="1"{attrs}/>')
            cx, cy = x + cw / 2, y + ch / 2 - 7 * (len(lines) - 1)
            spans = "".join(f'<tspan x="{cx:g}" y="{cy + 14 * i:g}">{escape(line)}</tspan>'
                            for i, line in enumerate(lines))
            if spans:
                out.append(f'<text class="cell-label" {_TEXT}>{spans}</text>')
    out.append("</svg>")
    return SVG("\n".join(out) + "\n")


def _grid_view(lay: Layout) -> tuple[Layout, int, int]:
    """Rank-2 view: rank 1 becomes a 1 x N row, modes 1.. of rank > 2 fold into columns."""
    modes = lay.modes
    if len(modes) == 1:
        lay = Layout.of_modes([Layout(1, 0), modes[0]])
    elif len(modes) > 2:
        lay = Layout.of_modes([modes[0], Layout.of_modes(modes[1:])])
    rows, cols = (m.size for m in lay.modes)
    if rows * cols > MAX_CELLS:
        raise ValueError(f"{rows}x{cols} grid has more than {MAX_CELLS} cells; too large to draw")
    return lay, rows, cols


def render(layout: Any, *, title: str | None = None) -> SVG:
    """Draw a layout as an M x N grid of offsets ``layout(m, n)``, coloured by offset.

    ``layout`` is a ``Layout``, CuTe notation or a static DSL layout. Nested modes are
    indexed colexicographically within each top-level mode (see ``_grid_view`` for rank
    1 and rank > 2). ``title`` defaults to the layout's notation; ``""`` draws none.
    """
    lay = _coerce(layout)
    grid, rows, cols = _grid_view(lay)
    offsets = {(m, n): grid(m, n) for m in range(rows) for n in range(cols)}
    lo, hi = min(offsets.values()), max(offsets.values())
    cells = {(m, n): (_offset_color(o, lo, hi), [str(o)], {"data-m": m, "data-n": n,
                                                         "data-offset": o})
             for (m, n), o in offsets.items()}
    return _grid_svg(rows, cols, cells, str(lay) if title is None else title)


def render_tv(tv_layout: Any, tile_mn: Any, *, title: str | None = None) -> SVG:
    """Draw which thread/value owns each element of an M x N tile (cells ``T{t}V{v}``).

    ``tv_layout`` maps ``(thread, value)`` to an offset in the tile; ``tile_mn`` is the
    tile's shape ``(M, N)`` (column-major, as ``make_layout_tv`` returns it) or a layout
    giving the tile's own offsets. Cells are coloured by thread; when several (t, v) share
    a cell the first (lowest thread, then value) is shown, as CUTLASS's print_latex_tv does.
    """
    tv = _coerce(tv_layout)
    if tv.rank != 2:
        raise ValueError(f"TV layout {tv} must have rank 2: ((threads...),(values...))")
    if isinstance(tile_mn, (tuple, list, int)):
        tile = Layout.compact(_to_int_tuple(tile_mn))
    else:
        tile = _coerce(tile_mn)
    grid, rows, cols = _grid_view(tile)
    where: dict[int, tuple[int, int]] = {}
    for m in range(rows):
        for n in range(cols):
            where.setdefault(grid(m, n), (m, n))
    cells: dict[tuple[int, int], _Cell] = {}
    threads, values = tv.modes
    for t in range(threads.size):
        for v in range(values.size):
            offset = tv(t, v)
            if offset not in where:
                raise ValueError(f"TV layout {tv} sends (T{t},V{v}) to offset {offset}, "
                                 f"outside the {rows}x{cols} tile")
            m, n = where[offset]
            cells.setdefault((m, n), (_thread_color(t), [f"T{t}", f"V{v}"],
                                      {"data-m": m, "data-n": n, "data-tid": t, "data-vid": v}))
    return _grid_svg(rows, cols, cells, f"{tv} on {rows}x{cols}" if title is None else title)


# ------------------------------------------------------- DSL tiled copies and MMAs
# Duck-typed on the attributes of cutlass.cute's TiledCopy / MmaAtom / TiledMma (cute/atom.py),
# so nothing here imports the DSL. Those objects live only while a @cute.jit function is being
# traced: call these functions inside it (the SVG returned is a plain str that outlives it).
_MMA_DIMS = {"A": ((0, 2), "MxK"), "B": ((1, 2), "NxK"), "C": ((0, 1), "MxN")}


def _tv_of(obj: Any, attr: str, what: str) -> Layout:
    try:
        return _coerce(getattr(obj, attr))
    except (TypeError, ValueError) as e:  # e.g. basis (non-integer) strides of a TMA atom
        raise ValueError(f"cannot read {what} TV layout ({attr}) as a static integer layout: "
                         f"{e}") from e


def _mode_size(mode: Any) -> int:
    """Size of one mode of a tiler: an int or a (DSL) layout such as ``16:1``."""
    if isinstance(mode, int) and not isinstance(mode, bool):
        return mode
    if hasattr(mode, "shape"):
        return _product(_to_int_tuple(mode.shape))
    return int(mode)


def render_tiled_mma(tiled_mma: Any, operand: str = "C", *, title: str | None = None) -> SVG:
    """Draw which thread/value of a DSL ``TiledMma`` (or bare ``MmaAtom``) owns each element.

    ``operand`` ``"A"`` draws the M x K tile, ``"B"`` the N x K tile and ``"C"`` the M x N
    tile, all in CuTe's column-major (M,N)/(M,K)/(N,K) coordinates, using the tiled TV layouts
    (``tv_layout_X_tiled`` over ``get_tile_size``; an atom's ``tv_layout_X`` over
    ``shape_mnk``). Thread ids are the tiled MMA's linear thread index. Where several threads
    hold the same element (A and B are replicated across warps of the other dimension;
    shared-memory wgmma operands across the whole warpgroup), the lowest thread is shown.
    Call it while the DSL object exists, i.e. inside the ``@cute.jit`` function being traced.
    """
    op = operand.upper() if isinstance(operand, str) else operand
    if op not in _MMA_DIMS:
        raise ValueError(f"operand must be 'A', 'B' or 'C', got {operand!r}")
    (i, j), dims = _MMA_DIMS[op]
    if hasattr(tiled_mma, f"tv_layout_{op}_tiled"):
        kind = "TiledMma"
        tv = _tv_of(tiled_mma, f"tv_layout_{op}_tiled", f"{kind} {op}")
        tile = (int(tiled_mma.get_tile_size(i)), int(tiled_mma.get_tile_size(j)))
    elif hasattr(tiled_mma, f"tv_layout_{op}") and hasattr(tiled_mma, "shape_mnk"):
        kind = "MmaAtom"
        tv = _tv_of(tiled_mma, f"tv_layout_{op}", f"{kind} {op}")
        mnk = [_mode_size(x) for x in tiled_mma.shape_mnk]
        tile = (mnk[i], mnk[j])
    else:
        raise TypeError("render_tiled_mma expects a cute TiledMma or MmaAtom, got "
                        f"{type(tiled_mma).__name__}")
    if title is None:
        title = f"{kind} {op} ({dims} {tile[0]}x{tile[1]}): {tv}"
    return render_tv(tv, tile, title=title)


def render_tiled_copy(tiled_copy: Any, which: str = "src", *, title: str | None = None) -> SVG:
    """Draw which thread/value of a DSL ``TiledCopy`` owns each element of its M x N tile.

    ``which`` is ``"src"`` (``layout_src_tv_tiled``: what each thread reads) or ``"dst"``
    (``layout_dst_tv_tiled``: what it writes); they differ for e.g. ``ldmatrix``. The tile is
    ``tiler_mn`` (each mode's size), indexed column-major as CuTe does. Where several threads
    touch the same element the lowest is shown. Call it inside the ``@cute.jit`` trace.
    """
    if which not in ("src", "dst"):
        raise ValueError(f"which must be 'src' or 'dst', got {which!r}")
    attr = f"layout_{which}_tv_tiled"
    if not (hasattr(tiled_copy, attr) and hasattr(tiled_copy, "tiler_mn")):
        raise TypeError("render_tiled_copy expects a cute TiledCopy (build one from a copy atom "
                        f"with make_tiled_copy_tv / make_tiled_copy_A...), got "
                        f"{type(tiled_copy).__name__}")
    tv = _tv_of(tiled_copy, attr, f"TiledCopy {which}")
    tiler = tiled_copy.tiler_mn
    tile = tuple(_mode_size(x) for x in (tiler if isinstance(tiler, (tuple, list)) else (tiler,)))
    if title is None:
        title = f"TiledCopy {which} ({'x'.join(map(str, tile))}): {tv}"
    return render_tv(tv, tile, title=title)


# ------------------------------------------------------------------------- output
def _svg_to_png(svg: str, path: Path) -> None:
    """Redraw an SVG made by this module (rects and centred texts) with matplotlib."""
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
        from matplotlib.patches import Rectangle
    except ImportError as e:  # pragma: no cover - matplotlib is a dependency
        raise ImportError("PNG output needs matplotlib: pip install matplotlib") from e
    root = ET.fromstring(svg)
    width, height = float(root.get("width", 100)), float(root.get("height", 100))
    scale = min(2.0, 8192 / max(width, height))  # 2x for crispness, capped at 8192 px
    fig = Figure(figsize=(width / 100, height / 100), dpi=100 * scale)
    FigureCanvasAgg(fig)
    ax = fig.add_axes((0, 0, 1, 1), xlim=(0, width), ylim=(height, 0))
    ax.axis("off")
    num = lambda el, key, default=0.0: float(el.get(key, default))  # noqa: E731
    for el in root.iter():
        if el.tag.endswith("}rect"):
            ax.add_patch(Rectangle((num(el, "x"), num(el, "y")), num(el, "width"),
                                   num(el, "height"), facecolor=el.get("fill", "none"),
                                   edgecolor=el.get("stroke", "none"),
                                   linewidth=0.72 * num(el, "stroke-width", 0)))
        elif el.tag.endswith("}text"):
            size = 0.72 * num(el, "font-size", num(root, "font-size", 12))  # px -> pt @100dpi
            for span in [c for c in el if c.tag.endswith("}tspan")] or [el]:
                ax.text(num(span, "x"), num(span, "y"), span.text or "", ha="center",
                        va="center", family="monospace", fontsize=size,
                        color=el.get("fill", "black"), weight=el.get("font-weight", "normal"))
    fig.savefig(path, format="png", facecolor="white")


def save(svg: str, path: str | Path, *, fmt: str | None = None) -> Path:
    """Write ``svg`` to ``path`` as SVG or PNG (``fmt``, else from the suffix)."""
    path = Path(path)
    kind = (fmt or path.suffix.lstrip(".") or "svg").lower()
    if kind == "svg":
        path.write_text(str(svg), encoding="utf-8")
    elif kind == "png":
        _svg_to_png(str(svg), path)
    else:
        raise ValueError(f"cannot save {str(path)!r}: unknown format {kind!r} (use svg or png)")
    return path


MMA_PRESETS = ("sm80_16x8x16", "sm90_64x64x16", "sm90_64x128x16", "sm90_64x256x16")


def render_mma_preset(preset: str, operand: str = "C", atoms: str = "1x1x1") -> SVG:
    """An fp16->fp32 tiled MMA built with the DSL on the CPU (no GPU): the warp-level sm80
    16x8x16 MMA or the sm90 warpgroup MMA (operands from shared memory), tiled `atoms`
    (MxNxK atoms), and the thread-value layout of `operand` (A, B or C)."""
    if preset not in MMA_PRESETS:
        raise ValueError(f"unknown MMA preset {preset!r}; known: {', '.join(MMA_PRESETS)}")
    if operand not in ("A", "B", "C"):
        raise ValueError(f"operand must be A, B or C, got {operand!r}")
    try:
        grid = tuple(int(v) for v in atoms.lower().split("x"))
    except ValueError:
        grid = ()
    if len(grid) != 3 or min(grid) < 1:
        raise ValueError(f"atom grid must look like 2x2x1, got {atoms!r}")
    import os

    os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")
    import cutlass
    import cutlass.cute as cute
    from cutlass.cute.nvgpu import OperandMajorMode, warp, warpgroup

    if preset == "sm80_16x8x16":
        op = warp.MmaF16BF16Op(cutlass.Float16, cutlass.Float32, (16, 8, 16))
    else:
        n = int(preset.split("x")[1])
        op = warpgroup.MmaF16BF16Op(cutlass.Float16, cutlass.Float32, (64, n, 16), warpgroup.OperandSource.SMEM,
                                    OperandMajorMode.K, OperandMajorMode.K)
    out: dict[str, SVG] = {}

    @cute.jit
    def trace() -> None:  # layouts can only be read while the DSL traces
        out["svg"] = render_tiled_mma(cute.make_tiled_mma(op, grid), operand)

    trace()
    return out["svg"]


def main_viz(kind: str, spec: list[str], out: str | None, fmt: str = "auto") -> int:
    """Backend of ``cuteforge viz layout LAYOUT`` / ``cuteforge viz tv THR VAL``.

    Prints the SVG to stdout without ``out``; otherwise writes ``out`` (``fmt`` ``svg``/
    ``png``, or ``auto`` from the suffix) and prints its path. Bad input raises ValueError.
    """
    fmt = (fmt or "auto").lower()
    if fmt not in ("auto", "svg", "png"):
        raise ValueError(f"unknown format {fmt!r}: expected svg, png or auto")
    if out is None and fmt == "png":
        raise ValueError("PNG output needs a file: pass -o FILE.png")
    if kind == "layout":
        if len(spec) != 1:
            raise ValueError(f"viz layout takes one layout, e.g. '(4,8):(8,1)'; got {len(spec)}")
        svg = render(spec[0])
    elif kind == "tv":
        if len(spec) != 2:
            raise ValueError("viz tv takes a thread layout and a value layout, "
                             f"e.g. '(4,32):(32,1)' '(4,4):(4,1)'; got {len(spec)}")
        thr, val = parse_layout(spec[0]), parse_layout(spec[1])
        tiler, tv = make_layout_tv(thr, val)
        svg = render_tv(tv, tiler, title=f"thr {thr}  val {val}  ->  tv {tv} on {_fmt(tiler)}")
    elif kind == "mma":
        if not 1 <= len(spec) <= 3:
            raise ValueError("viz mma takes a preset and optionally an operand and an atom grid, "
                             f"e.g. 'sm80_16x8x16' 'C' '2x2x1'; got {len(spec)}")
        svg = render_mma_preset(*spec)
    else:
        raise ValueError(f"unknown viz kind {kind!r}: expected 'layout', 'tv' or 'mma'")
    if out is None:
        sys.stdout.write(svg)
        return 0
    print(save(svg, out, fmt=None if fmt == "auto" else fmt))
    return 0
