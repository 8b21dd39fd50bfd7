"""CPU tests for cuteforge.viz: layout parsing/evaluation, TV layouts, SVG/PNG output."""

from __future__ import annotations

import random
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cuteforge.viz import (
    SVG,
    IntTuple,
    Layout,
    main_viz,
    make_layout_tv,
    parse_layout,
    render,
    render_tiled_copy,
    render_tiled_mma,
    render_tv,
    save,
)

NS = "{http://www.w3.org/2000/svg}"


def cells(svg: str) -> list[ET.Element]:
    return [r for r in ET.fromstring(svg).iter(f"{NS}rect") if r.get("class") == "cell"]


def labels(svg: str) -> list[str]:
    root = ET.fromstring(svg)
    return ["".join(t.itertext()) for t in root.iter(f"{NS}text") if t.get("class") == "cell-label"]


def grid(svg: str, key: str = "data-offset") -> dict[tuple[int, int], int]:
    return {(int(r.get("data-m")), int(r.get("data-n"))): int(r.get(key)) for r in cells(svg)}


# ------------------------------------------------------------------ layout semantics
def test_row_major_offsets() -> None:
    lay = parse_layout("(4,8):(8,1)")
    assert lay == Layout((4, 8), (8, 1))
    assert (lay.size, lay.cosize, lay.rank) == (32, 32, 2)
    assert all(lay(m, n) == 8 * m + n for m in range(4) for n in range(8))
    assert lay((3, 7)) == 31
    # a linear index walks the coordinates colexicographically: m fastest
    assert [lay(i) for i in range(6)] == [0, 8, 16, 24, 1, 9]


def test_shape_only_is_compact_col_major() -> None:
    lay = parse_layout("(4,8)")
    assert lay == Layout((4, 8), (1, 4))
    assert [lay(i) for i in range(32)] == list(range(32))
    assert lay(1, 2) == 9
    assert parse_layout("((2,2),4)") == Layout(((2, 2), 4), ((1, 2), 4))
    assert parse_layout("8") == Layout(8, 1)


def test_scalar_layout() -> None:
    lay = parse_layout("8:2")
    assert (lay.shape, lay.stride, lay.rank, lay.size, lay.cosize) == (8, 2, 1, 8, 15)
    assert lay(3) == 6
    assert str(lay) == "8:2"


NESTED = [[0, 2, 8, 10], [1, 3, 9, 11], [4, 6, 12, 14], [5, 7, 13, 15]]


def test_nested_layout() -> None:
    lay = parse_layout("((2,2),(2,2)):((1,4),(2,8))")
    assert [[lay(m, n) for n in range(4)] for m in range(4)] == NESTED
    assert [lay(i) for i in range(16)] == [0, 1, 4, 5, 2, 3, 6, 7, 8, 9, 12, 13, 10, 11, 14, 15]
    assert lay(((1, 1), (0, 1))) == 1 + 4 + 8  # natural coordinate
    assert lay((3, 2)) == 13  # hierarchical: ints inside the top-level modes
    assert (lay.size, lay.cosize) == (16, 16)


def test_coordinate_index_conventions() -> None:
    lay = parse_layout("(4,8):(8,1)")
    assert lay.coord(5) == (1, 1)
    assert lay.index((1, 1)) == 5
    nested = parse_layout("((2,2),(2,2)):((1,4),(2,8))")
    assert nested.coord(13) == ((1, 0), (1, 1))
    assert nested.index(((1, 0), (1, 1))) == 13
    assert nested.index((1, 3)) == 13
    with pytest.raises(IndexError):
        lay.coord(32)
    with pytest.raises(IndexError):
        lay(4, 0)
    with pytest.raises(ValueError):
        lay((1, 2, 3))


@pytest.mark.parametrize(
    "text, cosize",
    [("(4,8):(8,1)", 32), ("(4,2):(1,8)", 12), ("8:0", 1), ("(2,3):(0,5)", 11),
     ("((2,2),3):((1,10),100)", 212), ("(4,32):(32,1)", 128)],
)
def test_cosize(text: str, cosize: int) -> None:
    assert parse_layout(text).cosize == cosize


def test_whitespace_and_str() -> None:
    lay = parse_layout("  ( (2, 2) , 4 ) : ( (1, 8), 2 ) ")
    assert lay == Layout(((2, 2), 4), ((1, 8), 2))
    assert str(lay) == "((2,2),4):((1,8),2)"
    assert str(parse_layout("(4):(1)")) == "(4):(1)"  # rank-1 tuple kept distinct from 4:1


@pytest.mark.parametrize(
    "text, problem",
    [
        ("(4,8:(8,1)", "unbalanced parenthesis"),
        ("(4,8)):(8,1)", "unbalanced parenthesis"),
        ("((4,8):(8,1)", "unbalanced parenthesis"),
        ("(4,8):(8,1,2)", "profile mismatch"),
        ("((2,2),4):(1,4)", "profile mismatch"),
        ("(4,a):(1,4)", "non-integer 'a'"),
        ("4.5:1", "non-integer '4.5'"),
        ("(4,8):(8,1)x", "non-integer 'x'"),
        ("", "empty layout"),
        ("   ", "empty layout"),
        ("()", "empty tuple"),
        ("(4,,8)", "expected an integer"),
        ("(4 8)", "expected ',' or ')'"),
        ("4:1:2", "unexpected ':'"),
        ("(4,8):", "expected an integer"),
        ("(0,4)", "must be positive"),
        ("(-2,4):(1,2)", "must be positive"),
    ],
)
def test_malformed_layouts(text: str, problem: str) -> None:
    with pytest.raises(ValueError) as info:
        parse_layout(text)
    message = str(info.value)
    assert repr(text) in message
    assert problem in message


def test_layout_constructor_checks() -> None:
    with pytest.raises(ValueError, match="different profiles"):
        Layout((4, 8), (1,))
    with pytest.raises(ValueError, match="positive"):
        Layout((4, 0), (1, 4))
    with pytest.raises(TypeError):
        Layout((4, 8.0), (1, 4))  # type: ignore[arg-type]


# ------------------------------------------------------------------ property tests
shapes = st.recursive(
    st.integers(1, 5), lambda inner: st.lists(inner, min_size=1, max_size=3).map(tuple), max_leaves=7
)


@st.composite
def layouts(draw: st.DrawFn) -> Layout:
    shape = draw(shapes)

    def strides(s: IntTuple) -> IntTuple:
        return draw(st.integers(-4, 99)) if isinstance(s, int) else tuple(strides(e) for e in s)

    return Layout(shape, strides(shape))


@settings(max_examples=200, deadline=None)
@given(layouts())
def test_str_parse_round_trip(lay: Layout) -> None:
    assert parse_layout(str(lay)) == lay
    assert parse_layout(str(lay).replace(",", ", ").replace(":", " : ")) == lay


@settings(max_examples=100, deadline=None)
@given(layouts())
def test_index_coordinate_consistency(lay: Layout) -> None:
    for i in range(min(lay.size, 64)):
        crd = lay.coord(i)
        assert lay.index(crd) == i
        assert lay(crd) == lay(i)
    compact = Layout.compact(lay.shape)
    assert compact == parse_layout(str(compact).split(":")[0])
    assert [compact(i) for i in range(min(lay.size, 64))] == list(range(min(lay.size, 64)))
    if min(_leaves(lay.stride)) >= 0:  # CuTe's cosize = layout(size-1)+1 is the max offset + 1
        assert lay.cosize == max(lay(i) for i in range(lay.size)) + 1


def _leaves(t: IntTuple) -> list[int]:
    return [t] if isinstance(t, int) else [x for e in t for x in _leaves(e)]


# ---------------------------------------------------------------------- TV layouts
DOC_TABLE = [  # from the docstring of cute.make_layout_tv: (tid, vid) per (m, n)
    ["T0V0", "T0V1", "T1V0", "T1V1", "T2V0", "T2V1"],
    ["T0V2", "T0V3", "T1V2", "T1V3", "T2V2", "T2V3"],
    ["T3V0", "T3V1", "T4V0", "T4V1", "T5V0", "T5V1"],
    ["T3V2", "T3V3", "T4V2", "T4V3", "T5V2", "T5V3"],
]


def tv_table(tv: Layout, tiler: tuple[int, int]) -> list[list[str]]:
    table = [[""] * tiler[1] for _ in range(tiler[0])]
    for t in range(Layout.compact(tv.shape[0]).size):
        for v in range(Layout.compact(tv.shape[1]).size):
            off = tv(t, v)
            table[off % tiler[0]][off // tiler[0]] = f"T{t}V{v}"
    return table


def test_make_layout_tv_doc_example() -> None:
    tiler, tv = make_layout_tv("(2,3):(3,1)", "(2,2):(2,1)")
    assert tiler == (4, 6)
    assert str(tv) == "((3,2),(2,2)):((8,2),(4,1))"
    assert tv_table(tv, tiler) == DOC_TABLE


def test_make_layout_tv_128_threads() -> None:
    tiler, tv = make_layout_tv("(4,32):(32,1)", "(4,4):(4,1)")
    assert tiler == (16, 128)
    assert str(tv) == "((32,4),(4,4)):((64,4),(16,1))"
    for t in range(128):  # thread t owns the 4x4 block at (4*(t//32), 4*(t%32)), values row-major
        for v in range(16):
            off = tv(t, v)
            assert (off % 16, off // 16) == (4 * (t // 32) + v // 4, 4 * (t % 32) + v % 4)


def test_make_layout_tv_small_cases() -> None:
    # rank 1: thread t owns elements 2t, 2t+1; CuTe keeps the tiler rank 1
    tiler, tv = make_layout_tv("4:1", "2:1")
    assert (tiler, str(tv)) == ((8,), "(4,2):(2,1)")
    # column-major 2x2 threads, each holding a 1x2 row: T0 (0,0..1), T1 (1,0..1), T2 (0,2..3)
    tiler, tv = make_layout_tv("(2,2):(1,2)", "(1,2):(1,1)")
    assert tiler == (2, 4)
    assert tv_table(tv, tiler) == [["T0V0", "T0V1", "T2V0", "T2V1"], ["T1V0", "T1V1", "T3V0", "T3V1"]]
    # one thread holding everything: the TV layout is the tile's own column-major order
    tiler, tv = make_layout_tv("1:1", "(2,3):(3,1)")
    assert tiler == (2, 3)
    assert [tv(0, v) for v in range(6)] == [0, 2, 4, 1, 3, 5]


def test_make_layout_tv_rejects_non_compact() -> None:
    with pytest.raises(ValueError, match="compact"):
        make_layout_tv("(2,2):(2,2)", "1:1")
    with pytest.raises(ValueError, match="rank 1 or 2"):
        make_layout_tv("(2,2,2)", "1:1")
    with pytest.raises(ValueError, match="unbalanced"):
        make_layout_tv("(2,2", "1:1")


# ---------------------------------------------------------------------------- SVG
def test_render_row_major() -> None:
    svg = render("(4,8):(8,1)")
    assert isinstance(svg, str) and isinstance(svg, SVG)
    assert svg._repr_svg_() == str(svg)
    assert len(cells(svg)) == 32
    assert grid(svg) == {(m, n): 8 * m + n for m in range(4) for n in range(8)}
    assert sorted(labels(svg), key=int) == [str(i) for i in range(32)]
    root = ET.fromstring(svg)
    assert [t.text for t in root.iter(f"{NS}text") if t.get("class") == "title"] == ["(4,8):(8,1)"]
    assert len({c.get("fill") for c in cells(svg)}) == 32  # coloured by offset


def test_render_nested_and_ranks() -> None:
    svg = render(parse_layout("((2,2),(2,2)):((1,4),(2,8))"), title="")
    assert grid(svg) == {(m, n): NESTED[m][n] for m in range(4) for n in range(4)}
    assert not [t for t in ET.fromstring(svg).iter(f"{NS}text") if t.get("class") == "title"]
    row = render("8:2")  # rank 1: a 1 x N row
    assert grid(row) == {(0, n): 2 * n for n in range(8)}
    folded = render("(2,3,4)")  # rank 3: modes 1.. fold into the columns
    assert grid(folded) == {(m, n): m + 2 * n for m in range(2) for n in range(12)}


def test_render_dsl_like_object_and_escaping() -> None:
    dsl = SimpleNamespace(shape=((2, 2), 4), stride=((1, 8), 2))
    assert grid(render(dsl)) == grid(render("((2,2),4):((1,8),2)"))
    svg = render("4:1", title="<a & b>")
    assert "&lt;a &amp; b&gt;" in svg
    ET.fromstring(svg)
    with pytest.raises(TypeError):
        render(3.5)


def test_render_tv_cells() -> None:
    tiler, tv = make_layout_tv("(2,3):(3,1)", "(2,2):(2,1)")
    svg = render_tv(tv, tiler)
    assert len(cells(svg)) == 24
    by_cell = {(int(r.get("data-m")), int(r.get("data-n"))): r for r in cells(svg)}
    assert {mn: f"T{r.get('data-tid')}V{r.get('data-vid')}" for mn, r in by_cell.items()} == {
        (m, n): DOC_TABLE[m][n] for m in range(4) for n in range(6)
    }
    assert sorted(labels(svg)) == sorted(x for row in DOC_TABLE for x in row)
    fills: dict[str, set[str]] = {}
    for r in by_cell.values():
        fills.setdefault(r.get("data-tid"), set()).add(r.get("fill"))
    assert all(len(f) == 1 for f in fills.values())  # one colour per thread ...
    colours = {int(t): next(iter(f)) for t, f in fills.items()}
    assert all(colours[t] != colours[t + 1] for t in range(5))  # ... neighbouring lanes a shade apart


def test_render_tv_partial_and_errors() -> None:
    svg = render_tv("(2,2):(1,2)", (4, 2))  # 2 threads x 2 values cover half of a 4x2 tile
    assert len(cells(svg)) == 8
    assert sorted(labels(svg)) == ["T0V0", "T0V1", "T1V0", "T1V1"]
    row = render_tv(*reversed(make_layout_tv("4:1", "2:1")))  # rank-1 tile (8,): a 1 x 8 row
    assert [f"T{r.get('data-tid')}V{r.get('data-vid')}" for r in cells(row)] == [
        f"T{i // 2}V{i % 2}" for i in range(8)
    ]
    with pytest.raises(ValueError, match="outside the 2x2 tile"):
        render_tv("(2,2):(1,4)", (2, 2))
    with pytest.raises(ValueError, match="rank 2"):
        render_tv("8:1", (2, 4))


# ------------------------------------------------------------------ files and CLI
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def test_save_svg_and_png(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    svg = render_tv(*reversed(make_layout_tv("(2,3):(3,1)", "(2,2):(2,1)")))
    out = save(svg, tmp_path / "tv.svg")
    assert out.read_text() == svg
    png = save(svg, tmp_path / "tv.png").read_bytes()
    assert png[:8] == PNG_MAGIC and len(png) > 2000
    width, height = int.from_bytes(png[16:20], "big"), int.from_bytes(png[20:24], "big")
    root = ET.fromstring(svg)
    assert (width, height) == (2 * int(root.get("width")), 2 * int(root.get("height")))
    assert save(render("4:1"), tmp_path / "noext", fmt="png").read_bytes()[:8] == PNG_MAGIC
    with pytest.raises(ValueError, match="unknown format"):
        save(svg, tmp_path / "tv.jpg")


def test_main_viz(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main_viz("layout", ["(4,8):(8,1)"], None, "auto") == 0
    printed = capsys.readouterr().out
    assert len(cells(printed)) == 32
    target = tmp_path / "tv.svg"
    assert main_viz("tv", ["(4,32):(32,1)", "(4,4):(4,1)"], str(target), "auto") == 0
    assert capsys.readouterr().out.strip() == str(target)
    assert len(cells(target.read_text())) == 16 * 128
    for kind, spec, out, fmt in [
        ("layout", ["(4,8:(8,1)"], None, "auto"),
        ("layout", ["4:1", "4:1"], None, "auto"),
        ("tv", ["(4,32):(32,1)"], None, "auto"),
        ("nope", ["4:1"], None, "auto"),
        ("layout", ["4:1"], None, "png"),
        ("layout", ["4:1"], None, "gif"),
    ]:
        with pytest.raises(ValueError):
            main_viz(kind, spec, out, fmt)


def test_main_viz_png(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("matplotlib")
    target = tmp_path / "layout.png"
    assert main_viz("layout", ["((2,2),(4,2)):((1,8),(2,16))"], str(target), "auto") == 0
    assert capsys.readouterr().out.strip() == str(target)
    assert target.read_bytes()[:8] == PNG_MAGIC


def test_import_does_not_load_cutlass() -> None:
    """Drawing layouts stays off the DSL: importing and using cuteforge.viz loads no cutlass."""
    code = (
        "import sys, cuteforge.viz as v; "
        "v.render('(4,8):(8,1)'); v.make_layout_tv('(4,32):(32,1)', '(4,4):(4,1)'); "
        "assert not [n for n in sys.modules if n.startswith('cutlass')], 'cutlass was imported'"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


# ------------------------------------------------- ground truth: the CuTe DSL itself
def _random_compact(rng: random.Random) -> Layout:
    modes = [rng.choice([1, 2, 3, 4, 8]) if rng.random() < 0.7 else (rng.randint(1, 4), rng.randint(1, 4))
             for _ in range(rng.choice([1, 2, 2]))]
    leaves = _leaves(tuple(modes))
    strides, current = [0] * len(leaves), 1
    for i in rng.sample(range(len(leaves)), len(leaves)):
        strides[i], current = current, current * leaves[i]
    it = iter(strides)
    nest = [next(it) if isinstance(m, int) else tuple(next(it) for _ in m) for m in modes]
    return Layout(modes[0], nest[0]) if len(modes) == 1 else Layout(tuple(modes), tuple(nest))


def test_against_cute_dsl() -> None:
    """make_layout_tv, offsets and cosize agree with cutlass.cute (traced on the CPU)."""
    cute = pytest.importorskip("cutlass.cute")
    rng = random.Random(1234)
    cases = [(_random_compact(rng), _random_compact(rng)) for _ in range(60)]
    plain = [parse_layout(t) for t in ["((2,3),(4,2)):((1,8),(2,50))", "(4,8):(8,1)", "7:3"]]
    got: list[tuple[str, str]] = []
    evals: list[tuple[list[int], int, str]] = []

    @cute.jit
    def trace() -> None:
        for thr, val in cases:
            tiler, tv = cute.make_layout_tv(
                cute.make_layout(thr.shape, stride=thr.stride),
                cute.make_layout(val.shape, stride=val.stride),
            )
            got.append((str(tiler), str(tv)))
        for lay in plain:
            dsl = cute.make_layout(lay.shape, stride=lay.stride)
            evals.append(([dsl(i) for i in range(lay.size)], cute.cosize(dsl), render(dsl)))

    trace()
    for (thr, val), (tiler, tv) in zip(cases, got, strict=True):
        mine_tiler, mine_tv = make_layout_tv(thr, val)
        assert (str(mine_tiler).replace(" ", ""), str(mine_tv)) == (tiler.replace(" ", ""), tv)
    for lay, (offsets, cosize, svg) in zip(plain, evals, strict=True):
        assert offsets == [lay(i) for i in range(lay.size)]
        assert cosize == lay.cosize
        assert svg == render(lay)


# ------------------------------------------- tiled copies and MMAs (DSL objects, duck-typed)
def owners(svg: str) -> dict[tuple[int, int], tuple[int, int]]:
    """(m, n) -> (thread, value) drawn in that cell."""
    return {(int(r.get("data-m")), int(r.get("data-n"))): (int(r.get("data-tid")), int(r.get("data-vid")))
            for r in cells(svg) if r.get("data-tid") is not None}


def sm80_c(t: int, v: int) -> tuple[int, int]:
    """PTX mma.m16n8k16 accumulator: lane t holds rows t//4 (+8 for v>=2), cols 2*(t%4) + v%2."""
    return t // 4 + 8 * (v // 2), 2 * (t % 4) + v % 2


def expected(n_thr: int, n_val: int, where: Any) -> dict[tuple[int, int], tuple[int, int]]:
    """Cell -> lowest (thread, value) mapped there by the hand-written ``where(t, v)``."""
    out: dict[tuple[int, int], tuple[int, int]] = {}
    for t in range(n_thr):
        for v in range(n_val):
            out.setdefault(where(t, v), (t, v))
    return out


SM80_ATOM = SimpleNamespace(  # the sm80 16x8x16 atom as the DSL prints it (no cutlass needed)
    shape_mnk=(16, 8, 16), tv_layout_A="((4,8),(2,2,2)):((32,1),(16,8,128))",
    tv_layout_B="((4,8),(2,2)):((16,1),(8,64))", tv_layout_C="((4,8),(2,2)):((32,1),(16,8))")


def test_render_mma_atom_duck_typed() -> None:
    svg = render_tiled_mma(SM80_ATOM)  # operand C by default
    assert owners(svg) == {sm80_c(t, v): (t, v) for t in range(32) for v in range(4)}
    assert len(cells(svg)) == 16 * 8
    assert "MmaAtom C (MxN 16x8)" in svg
    # A (M x K 16x16): rows t//4 (+8), cols 2*(t%4) + v%2 (+8 for v>=4); B (N x K 8x16)
    assert owners(render_tiled_mma(SM80_ATOM, "A")) == {
        (t // 4 + 8 * (v // 2 % 2), 2 * (t % 4) + v % 2 + 8 * (v // 4)): (t, v) for t in range(32) for v in range(8)}
    assert owners(render_tiled_mma(SM80_ATOM, "b")) == {
        (t // 4, 2 * (t % 4) + v % 2 + 8 * (v // 2)): (t, v) for t in range(32) for v in range(4)}
    with pytest.raises(ValueError, match="operand"):
        render_tiled_mma(SM80_ATOM, "D")
    with pytest.raises(TypeError, match="TiledMma or MmaAtom"):
        render_tiled_mma(SimpleNamespace(tv_layout_C="4:1"))
    with pytest.raises(TypeError, match="TiledCopy"):
        render_tiled_copy(SM80_ATOM)
    with pytest.raises(ValueError, match="which"):
        render_tiled_copy(SM80_ATOM, "both")
    bad = SimpleNamespace(layout_src_tv_tiled="(4,2):(2,1)", tiler_mn=(2, 2))
    with pytest.raises(ValueError, match="outside the 2x2 tile"):
        render_tiled_copy(bad)
    basis = SimpleNamespace(layout_src_tv_tiled=SimpleNamespace(shape=(4, 2), stride=("1@0", "1@1")),
                            tiler_mn=(4, 2))
    with pytest.raises(ValueError, match="static integer layout"):
        render_tiled_copy(basis)


def test_tiled_copy_and_mma_from_cute_dsl() -> None:
    """Build the objects with cutlass.cute on the CPU (traced, sm_90a) and check every cell."""
    cute = pytest.importorskip("cutlass.cute")
    import cutlass
    from cutlass.cute.nvgpu import OperandMajorMode, warp, warpgroup

    svgs: dict[str, str] = {}

    @cute.jit
    def trace() -> None:
        universal = cute.make_copy_atom(cute.nvgpu.CopyUniversalOp(), cutlass.Float32, num_bits_per_copy=64)
        tc = cute.make_tiled_copy_tv(universal, cute.make_layout((4, 8), stride=(8, 1)), cute.make_layout((1, 2)))
        svgs["copy_src"], svgs["copy_dst"] = render_tiled_copy(tc), render_tiled_copy(tc, "dst")
        op = warp.MmaF16BF16Op(cutlass.Float16, cutlass.Float32, (16, 8, 16))
        svgs["atom_C"] = render_tiled_mma(cute.make_mma_atom(op))
        mma = cute.make_tiled_mma(op, (2, 2, 1))
        for x in "ABC":
            svgs[f"mma_{x}"] = render_tiled_mma(mma, x)
        ldsm = cute.make_copy_atom(warp.LdMatrix8x8x16bOp(transpose=False, num_matrices=4), cutlass.Float16)
        tc_a = cute.make_tiled_copy_A(ldsm, mma)
        svgs["ldsm_src"], svgs["ldsm_dst"] = render_tiled_copy(tc_a, "src"), render_tiled_copy(tc_a, "dst")
        wg = cute.make_tiled_mma(warpgroup.MmaF16BF16Op(
            cutlass.Float16, cutlass.Float32, (64, 64, 16), warpgroup.OperandSource.SMEM,
            OperandMajorMode.K, OperandMajorMode.K))
        svgs["wg_A"], svgs["wg_C"] = render_tiled_mma(wg, "A"), render_tiled_mma(wg, "C")

    trace()
    # universal copy, threads row-major 4x8, 1x2 values each: thread t owns (t//8, 2*(t%8) + v)
    copy = expected(32, 2, lambda t, v: (t // 8, 2 * (t % 8) + v))
    assert owners(svgs["copy_src"]) == owners(svgs["copy_dst"]) == copy and len(copy) == 4 * 16
    assert owners(svgs["atom_C"]) == expected(32, 4, sm80_c)
    # 2x2 warps over (M, N): warp w = t//32 adds 16 rows for w%2 and 8 columns for w//2
    def tiled_c(t: int, v: int) -> tuple[int, int]:
        m, n = sm80_c(t % 32, v)
        return 16 * (t // 32 % 2) + m, 8 * (t // 64) + n

    assert owners(svgs["mma_C"]) == expected(128, 4, tiled_c) and len(cells(svgs["mma_C"])) == 32 * 16
    # A (32x16, MxK) is shared by the two N-warps, B (16x16, NxK) by the two M-warps
    def tiled_a(t: int, v: int) -> tuple[int, int]:
        lane = t % 32
        return 16 * (t // 32 % 2) + lane // 4 + 8 * (v // 2 % 2), 2 * (lane % 4) + v % 2 + 8 * (v // 4)

    def tiled_b(t: int, v: int) -> tuple[int, int]:
        lane = t % 32
        return 8 * (t // 64) + lane // 4, 2 * (lane % 4) + v % 2 + 8 * (v // 2)

    assert owners(svgs["mma_A"]) == expected(128, 8, tiled_a) and len(owners(svgs["mma_A"])) == 32 * 16
    assert {t for t, _ in owners(svgs["mma_A"]).values()} == set(range(64))
    assert owners(svgs["mma_B"]) == expected(128, 4, tiled_b) and len(owners(svgs["mma_B"])) == 16 * 16
    assert {t for t, _ in owners(svgs["mma_B"]).values()} == set(range(32)) | set(range(64, 96))
    # ldmatrix.x4 for A: each lane reads 8 contiguous K of row lane%16 (K half lane//16) ...
    assert owners(svgs["ldsm_src"]) == expected(
        128, 8, lambda t, v: (16 * (t // 32 % 2) + t % 16, 8 * (t % 32 // 16) + v))
    # ... and lands them in the MMA's A fragment
    assert owners(svgs["ldsm_dst"]) == owners(svgs["mma_A"])
    # sm90 wgmma 64x64x16: warp w holds rows 16w + lane//4 (+8), cols 2*(lane%4) + v%2 + 8*(v//4)
    assert owners(svgs["wg_C"]) == expected(128, 32, lambda t, v: (
        16 * (t // 32) + t % 32 // 4 + 8 * (v // 2 % 2), 2 * (t % 4) + v % 2 + 8 * (v // 4)))
    # shared-memory A: every thread "holds" the whole 64x16 tile (descriptor operand), shown as T0
    assert owners(svgs["wg_A"]) == {(m, k): (0, m + 64 * k) for m in range(64) for k in range(16)}
    assert "TiledMma C (MxN 64x64)" in svgs["wg_C"] and "TiledCopy dst (32x16)" in svgs["ldsm_dst"]


def _png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    return int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")


def test_png_of_a_large_layout_fits_about_2000_px(tmp_path: Path) -> None:
    from cuteforge.viz import PNG_MAX_PX
    from cuteforge.viz.dsl import render_mma_preset

    w, h = _png_size(save(render_mma_preset("sm90_64x64x16"), tmp_path / "mma.png"))
    assert max(w, h) <= PNG_MAX_PX and max(w, h) >= PNG_MAX_PX - 2
    w, h = _png_size(save(render_tv(*reversed(make_layout_tv("(4,32):(32,1)", "(4,4):(4,1)"))), tmp_path / "tv.png"))
    assert max(w, h) <= PNG_MAX_PX


def test_colours_follow_warps_and_warp_edges_are_drawn() -> None:
    from cuteforge.viz.svg import _thread_color

    assert len({_thread_color(32 * w) for w in range(4)}) == 4  # each warp its own hue
    assert _thread_color(0)[:3] == _thread_color(31)[:3] or _thread_color(0) != _thread_color(32)
    thr, val = parse_layout("(64,1):(1,0)"), parse_layout("(1,1):(1,0)")
    tiler, tv = make_layout_tv(thr, val)
    svg = render_tv(tv, tiler)
    assert svg.count('class="warp-edge"') == 1  # threads 0-31 | 32-63 in one column: one boundary


def test_crop_draws_part_of_the_grid() -> None:
    from cuteforge.viz import crop, parse_crop

    full = render("(16,16):(16,1)")
    with crop(*parse_crop("0:4,2:6")):
        part = render("(16,16):(16,1)")
    assert part.count('class="cell"') == 16 < full.count('class="cell"') == 256
    assert "rows 0:4, cols 2:6 of 16x16" in part
    with pytest.raises(ValueError, match="crop"):
        parse_crop("nonsense")
