"""Pictures of the DSL's own objects (tiled copies and MMAs, duck-typed, so nothing here
imports the DSL until a preset is built) and the `cuteforge viz` command's backend."""

from __future__ import annotations

import sys
from typing import Any

from .layout import Layout, _coerce, _fmt, _product, _to_int_tuple, make_layout_tv, parse_layout
from .svg import SVG, render, render_tv, save

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


def main_viz(kind: str, spec: list[str], out: str | None, fmt: str = "auto", crop_text: str | None = None) -> int:
    """``main_viz`` drawing only ``crop_text`` ('M0:M1,N0:N1') of the grid when given."""
    if crop_text:
        from .svg import crop, parse_crop

        with crop(*parse_crop(crop_text)):
            return _main_viz(kind, spec, out, fmt)
    return _main_viz(kind, spec, out, fmt)


def _main_viz(kind: str, spec: list[str], out: str | None, fmt: str = "auto") -> int:
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
