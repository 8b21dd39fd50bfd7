"""Drawing layouts as SVG (and PNG through matplotlib): a grid per layout, colored by
offset, or by warp for thread-value layouts (lanes a shade apart, warp boundaries drawn
as thick lines). `crop(rows, cols)` draws part of a large grid; PNGs fit ~2000 px."""

from __future__ import annotations

import colorsys
import contextlib
import contextvars
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from xml.sax.saxutils import escape, quoteattr

from .layout import MAX_CELLS, Layout, _coerce, _to_int_tuple


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


PNG_MAX_PX = 2000  # the longer side of a PNG, whatever the layout's size
_CROP: contextvars.ContextVar[tuple[range, range] | None] = contextvars.ContextVar("cuteforge_viz_crop", default=None)


@contextlib.contextmanager
def crop(rows: range | tuple[int, int], cols: range | tuple[int, int]) -> Iterator[None]:
    """Draw only rows x cols of the grids rendered inside (a zoom into a large layout)."""
    r = rows if isinstance(rows, range) else range(*rows)
    c = cols if isinstance(cols, range) else range(*cols)
    token = _CROP.set((r, c))
    try:
        yield
    finally:
        _CROP.reset(token)


def parse_crop(text: str) -> tuple[range, range]:
    """'M0:M1,N0:N1' (ends exclusive; either side may be empty: ':16,0:64')."""
    try:
        parts = [p.split(":") for p in text.split(",")]
        (a, b), (c, d) = parts
        return range(int(a or 0), int(b) if b else 1 << 30), range(int(c or 0), int(d) if d else 1 << 30)
    except ValueError:
        raise ValueError(f"--crop {text!r}: expected ROWS,COLS as M0:M1,N0:N1, e.g. 0:16,0:32") from None


def warp_of(tid: int) -> int:
    return tid // 32


def _thread_color(tid: int) -> str:
    """One hue per warp (golden-ratio steps, so neighbouring warps differ clearly); the 32
    lanes of a warp alternate two shades so that single threads stay readable."""
    return _hsv_hex((warp_of(tid) * 0.381966) % 1.0, 0.22 if tid % 2 == 0 else 0.34)


def _grid_svg(rows: int, cols: int, cells: dict[tuple[int, int], _Cell], title: str) -> SVG:
    window = _CROP.get()
    if window is not None:
        rr = range(max(window[0].start, 0), min(window[0].stop, rows))
        cr = range(max(window[1].start, 0), min(window[1].stop, cols))
        if not rr or not cr:
            raise ValueError(f"crop rows {window[0].start}:{window[0].stop}, cols {window[1].start}:"
                             f"{window[1].stop} is outside the {rows}x{cols} grid")
        cells = {(m - rr.start, n - cr.start): c for (m, n), c in cells.items() if m in rr and n in cr}
        title = f"{title} [rows {rr.start}:{rr.stop}, cols {cr.start}:{cr.stop} of {rows}x{cols}]"
        rows, cols, row0, col0 = len(rr), len(cr), rr.start, cr.start
    else:
        row0 = col0 = 0
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
                   f'fill="#606060" {_TEXT}>{m + row0}</text>')
    for n in range(cols):
        out.append(f'<text class="col-index" x="{left + (n + 0.5) * cw:g}" y="{top - 11}" '
                   f'fill="#606060" {_TEXT}>{n + col0}</text>')
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
    # warp boundaries: a thick line wherever a cell's warp differs from its neighbour's
    warp = {mn: warp_of(c[2]["data-tid"]) for mn, c in cells.items() if "data-tid" in c[2]}
    for (m, n), w in warp.items():
        x, y = left + n * cw, top + m * ch
        if warp.get((m, n + 1), w) != w:
            out.append(f'<line class="warp-edge" x1="{x + cw}" y1="{y}" x2="{x + cw}" y2="{y + ch}" stroke="#000000" stroke-width="3"/>')
        if warp.get((m + 1, n), w) != w:
            out.append(f'<line class="warp-edge" x1="{x}" y1="{y + ch}" x2="{x + cw}" y2="{y + ch}" stroke="#000000" stroke-width="3"/>')
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


# ------------------------------------------------------------------------- output
def _svg_to_png(svg: str, path: Path) -> None:
    """Redraw an SVG made by this module (rects and centred texts) with matplotlib."""
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
        from matplotlib.patches import Rectangle
    except ImportError:
        raise RuntimeError("PNG output needs matplotlib: pip install 'cuteforge[plot]' (or write .svg)") from None
    root = ET.fromstring(svg)
    width, height = float(root.get("width", 100)), float(root.get("height", 100))
    scale = min(2.0, PNG_MAX_PX / max(width, height))  # 2x for small grids; large ones fit PNG_MAX_PX
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
        elif el.tag.endswith("}line"):
            ax.plot([num(el, "x1"), num(el, "x2")], [num(el, "y1"), num(el, "y2")], color=el.get("stroke", "black"),
                    linewidth=0.72 * num(el, "stroke-width", 1) * scale, solid_capstyle="projecting")
        elif el.tag.endswith("}text"):
            size = 0.72 * num(el, "font-size", num(root, "font-size", 12))  # px -> pt at 100 dpi
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
