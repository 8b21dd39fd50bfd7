"""CPU-only checks of the norm kernels: config validation and sm_90a compiles of a few
representative specializations (numerics are checked on the GPU, tests/gpu/test_norm_gpu.py)."""

from __future__ import annotations

import os
import re
from dataclasses import replace

import pytest
from ptxas_check import loop_loads, ptxas_no_spill, sass_or_skip

from cuteforge.kernels.norm import NormConfig, candidate_configs, default_config

_NS = [1, 7, 32, 256, 1000, 2048, 4096, 8192, 16384, 65536, 65537, 131072, 262144]


@pytest.mark.parametrize(
    "cfg, match",
    [
        (NormConfig(48, 16), "multiple of 32"),
        (NormConfig(256, 4), "power of 2 in \\[8"),
        (NormConfig(256, 512), "power of 2 in \\[8"),
        (NormConfig(256, 96), "power of 2"),
        (NormConfig(256, 128, cluster_n=3), "cluster_n"),
        (NormConfig(256, 128, cluster_n=2), "one row per CTA"),
        (NormConfig(256, 256, ctas_per_sm=0), "ctas_per_sm"),
        (NormConfig(256, 8), "register file"),  # 4096 elements over 8 threads
    ],
)
def test_validate_rejects(cfg, match):
    with pytest.raises(ValueError, match=match):
        cfg.validate(4096, 32)


def test_validate_rejects_bad_problem():
    with pytest.raises(ValueError, match="n must be"):
        NormConfig().validate(0, 16)
    with pytest.raises(ValueError, match="dtype_bits"):
        NormConfig().validate(4096, 8)
    with pytest.raises(ValueError, match="backward-only"):
        NormConfig(reload=True).validate(4096, 16)
    with pytest.raises(ValueError, match="needs n >="):
        NormConfig(256, 256, cluster_n=4).validate(1024, 16)


@pytest.mark.parametrize("backward", [False, True])
@pytest.mark.parametrize("bits", [16, 32])
@pytest.mark.parametrize("n", _NS)
def test_default_and_candidates_valid(n, bits, backward):
    d = default_config(n, bits, backward)
    cands = candidate_configs(n, bits, backward)
    assert cands[0] == d and 1 <= len(cands) <= 8 and len(set(cands)) == len(cands)
    for c in cands:
        c.validate(n, bits, backward=backward)


def test_large_rows_use_clusters_and_reload():
    assert default_config(65536, 16).cluster_n > 1
    b = default_config(262144, 32, backward=True)  # cluster-staged
    assert b.cluster_n == 16 and b.stages == 2 and b.parts == 8  # the part ring
    from cuteforge.kernels.norm.config import default_register_config

    r = default_register_config(262144, 32)  # the register path (misaligned rows) still reloads
    assert r.cluster_n == 16 and r.reload


# --------------------------------------------------------------------------- compiles


def _compile(kernel, dtypes, n, vecs, params, cfg=None, cubin=False):
    """(spec, PTX) of one specialization for sm_90a; with ``cubin`` (spec, PTX, the cubin the
    DSL built)."""
    import torch  # noqa: F401

    from cuteforge import compiler
    from cuteforge.signature import BoundKey

    key = BoundKey(dtypes, (("N", n),), vecs)
    spec = kernel.spec(key, tuple(sorted(params.items())), cfg, arch="sm_90a")
    res = compiler.compile_jit(kernel.builder(spec), kernel.signature.fake_args(key), "sm_90a", keep_artifacts=True)
    ptx = res.ptx
    assert isinstance(ptx, str) and ".entry" in ptx
    return (spec, ptx, res.cubin) if cubin else (spec, ptx)


@pytest.fixture(scope="module")
def kernels():
    mp = pytest.MonkeyPatch()
    mp.setenv("CUTE_DSL_ARCH", "sm_90a")
    from cuteforge.kernels.norm.spec import norm_bwd, norm_fwd

    yield norm_fwd, norm_bwd
    mp.undo()


# (kind, x dtype, weight dtype, n, has_bias, has_residual): odd N, cluster rows, mixed weight
_FWD = [
    ("rms", "bfloat16", "bfloat16", 4096, False, False),
    ("rms", "float16", "float32", 1000, False, True),
    ("layer", "float32", "float32", 7, True, True),
    ("layer", "bfloat16", "bfloat16", 65536, True, False),
]


@pytest.mark.parametrize("kind, xd, wd, n, bias, res", _FWD)
def test_compile_fwd(kernels, kind, xd, wd, n, bias, res):
    fwd, _ = kernels
    vx = 16 // (4 if xd == "float32" else 2)
    vw = 16 // (4 if wd == "float32" else 2)
    dts = (xd, wd, wd, xd, xd, xd, "float32", "float32")
    spec, ptx = _compile(fwd, dts, n, (vx, vw, vw, vx, vx, vx, 4, 4),
                         {"kind": kind, "eps": 1e-5, "has_bias": bias, "has_residual": res})
    if spec.config.stages:  # long rows: the staged default, rows by bulk copies
        assert "cp.async.bulk.shared::cluster.global" in ptx and "st.async" in ptx
    elif n % 8 == 0:
        assert re.search(r"ld\.global[.a-zA-Z0-9:_]*\.v[24]\.", ptx)
    if spec.config.cluster_n > 1:
        assert "mapa" in ptx and "barrier.cluster" in ptx


_BWD = [
    ("rms", "bfloat16", "bfloat16", 4096, False, False),
    ("layer", "float32", "float32", 1000, True, True),
    ("layer", "bfloat16", "float32", 262144, True, False),
]


@pytest.mark.parametrize("kind, xd, wd, n, bias, dsum", _BWD)
def test_compile_bwd(kernels, kind, xd, wd, n, bias, dsum):
    _, bwd = kernels
    vx = 16 // (4 if xd == "float32" else 2)
    vw = 16 // (4 if wd == "float32" else 2)
    dts = (xd, wd, xd, xd, "float32", "float32", xd, "float32", "float32")
    spec, ptx = _compile(bwd, dts, n, (vx, vw, vx, vx, 4, 4, vx, 4, 4),
                         {"kind": kind, "has_bias": bias, "has_dsum": dsum})
    if spec.config.cluster_n > 1:  # barrier exchange, or (staged default) mbar's st.async
        assert "st.shared::cluster" in ptx or "st.async" in ptx


# (kind, x dtype, weight dtype, n, has_bias, config): the register path with several rows
# per CTA (partials folded in shared memory), one row per CTA, the row-staged default, the
# cluster-staged default and the part ring (fp32 262144's default)
_BWD_NO_DW = [
    ("layer", "float32", "float32", 1000, True, NormConfig(128, 32, 1, 2)),
    ("rms", "bfloat16", "bfloat16", 1024, False, None),
    ("layer", "float32", "float32", 1024, True, None),  # the row grid's one row per CTA (no fold)
    ("rms", "bfloat16", "bfloat16", 512, False, None),  # ... and 4 rows per CTA
    ("rms", "bfloat16", "bfloat16", 16384, False, None),
    ("layer", "bfloat16", "bfloat16", 65536, True, None),
    ("rms", "float32", "float32", 262144, False, None),
    ("layer", "bfloat16", "bfloat16", 262144, True, None),  # the frozen long-row ring (FROZEN_BWD_SHAPES)
    ("rms", "float32", "float32", 8192, False, None),  # the frozen 2-CTA staged shape (FROZEN_BWD_SHAPES)
]


@pytest.mark.parametrize("kind, xd, wd, n, bias, cfg", _BWD_NO_DW)
def test_compile_bwd_without_partials(kernels, kind, xd, wd, n, bias, cfg):
    """has_dw=False (frozen weights: ops/norm.py's node plan) writes dx and nothing else:
    fewer global stores than the kernel with partials, on every backward path."""
    _, bwd = kernels
    vx = 16 // (4 if xd == "float32" else 2)
    vw = min(vx, 16 // (4 if wd == "float32" else 2))
    dts = (xd, wd, xd, xd, "float32", "float32", xd, "float32", "float32")
    from cuteforge.kernels.norm.config import default_bwd_config

    stores, configs = {}, {}
    for has_dw in (False, True):  # with partials on the same config as without
        params = {"kind": kind, "has_bias": bias, "has_dsum": False} | ({} if has_dw else {"has_dw": False})
        same = replace(configs[False], row_grid=False) if False in configs else cfg  # the persistent grid's twin
        spec, ptx = _compile(bwd, dts, n, (vx, vw, vx, vx, 4, 4, vx, 4, 4), params, same)
        stores[has_dw], configs[has_dw] = len(re.findall(r"\bst\.global", ptx)), spec.config
    bits = 32 if xd == "float32" else 16
    if cfg is None:  # the kernel without partials takes its own defaults where they were measured
        assert configs[False] == default_bwd_config(n, bits, False)
    if cfg is None and n > 8192:
        assert spec.config.stages  # the staged / cluster / ring paths, as the comment says
    assert 0 < stores[False] < stores[True], stores


def _loop_loads(ptx: str) -> int:
    """16-byte global loads inside the kernel's first loop (from the label a backward
    branch jumps to, to that branch)."""
    lines = ptx.splitlines()
    labels = {ln.strip()[:-1]: i for i, ln in enumerate(lines) if re.match(r"^\$L__BB\d+_\d+:$", ln.strip())}
    for i, ln in enumerate(lines):
        m = re.search(r"bra(?:\.uni)?\s+(\$L__BB\d+_\d+);", ln)
        if m and labels.get(m.group(1), i + 1) < i:
            return sum("ld.global.v4" in x for x in lines[labels[m.group(1)]:i])
    raise AssertionError("no loop in the PTX")


def test_bwd_early_weight_loads_the_weight_once(kernels):
    """early_weight in the register backward: the weight is loaded before the row
    loop and held, so the loop loads only x and dy (the next row's, with prefetch); the
    default reads the weight again every row. Not with reload or stages."""
    _, bwd = kernels
    dts = ("float32",) * 4 + ("float32",) * 5
    params = {"kind": "rms", "has_bias": False, "has_dsum": False, "has_dw": False}
    base = NormConfig(256, 256, 1, 4, prefetch=True)
    loads = {}
    for cfg in (base, replace(base, early_weight=True)):
        cfg.validate(1024, 32, backward=True)
        _, ptx = _compile(bwd, dts, 1024, (4,) * 9, params, cfg)
        loads[cfg.early_weight] = _loop_loads(ptx)
        ptxas_no_spill(ptx)
    assert loads == {False: 3, True: 2}, loads
    with pytest.raises(ValueError, match="reload"):
        NormConfig(256, 256, 1, 2, reload=True, early_weight=True).validate(1024, 32, backward=True)
    with pytest.raises(ValueError, match="early_weight"):
        NormConfig(256, 256, 1, 2, stages=2, early_weight=True).validate(1024, 32, backward=True)


@pytest.mark.parametrize("kind", ["rms", "layer"])
def test_frozen_bwd_defaults(kernels, kind):
    """The kernel without partials has its own defaults: the row grid at N = 256..4096
    (fp32) / 256..4096 and 8192 (16-bit; 256..8192 earlier), each thread holding 32
    bytes of its row (fp32 from N = 2048: 64), CTAs of 128..512 threads under a 128-register
    budget; the earlier FROZEN_BWD_SHAPES at fp32 8192 and 16-bit 262144; elsewhere, and for
    the kernel with partials everywhere, the heuristic's. The measured row-grid shapes (H200 row-grid sweep)
    assemble without spilling under that budget."""
    from cuteforge.kernels.norm.config import (
        default_bwd_config,
        frozen_row_grid_config,
        row_grid_candidates,
    )

    measured = {(32, 256): (128, 32), (32, 512): (128, 64), (32, 1024): (128, 128), (32, 2048): (128, 128),
                (32, 4096): (256, 256), (16, 256): (128, 16), (16, 512): (128, 32), (16, 1024): (128, 64),
                (16, 2048): (128, 128), (16, 4096): (256, 256), (16, 8192): (512, 512)}
    for bits in (16, 32):
        for n in (7, 255, 256, 1000, 1024, 2048, 3000, 4096, 8192, 16384):
            heuristic = default_config(n, bits, backward=True)
            assert default_bwd_config(n, bits, True) == heuristic and not heuristic.row_grid
            frozen = default_bwd_config(n, bits, False)
            if (bits, n) in measured:
                assert (frozen.threads, frozen.threads_per_row) == measured[(bits, n)], (bits, n, frozen)
            if (bits, n) == (32, 8192):
                continue  # its own shape, below
            if frozen_row_grid_config(n, bits) is None:
                assert frozen == heuristic and (n < 256 or n > (4096 if bits == 32 else 8192))
            else:
                assert frozen.row_grid and frozen.ctas_per_sm * frozen.threads == 512
                frozen.validate(n, bits, backward=True)
                near = row_grid_candidates(frozen, n, bits)
                assert near and all(c.row_grid and c != frozen for c in near)
    # the longest 16-bit rows: the default's cluster as a 4-part ring of 2 stages on
    # 256 threads where the chunks divide (FROZEN_BWD_SHAPES), else the default
    long = default_bwd_config(262144, 16, False)
    heuristic = default_config(262144, 16, backward=True)
    assert long == replace(heuristic, threads=256, threads_per_row=256, ctas_per_sm=1, stages=2, parts=4)
    long.validate(262144, 16, backward=True)
    # fp32 8192: 2-CTA clusters of 128 threads, 2 stages, 2 CTAs per SM
    assert default_bwd_config(8192, 32, False) == NormConfig(128, 128, 2, 2, exchange="mbar", stages=2)
    for bits, n in ((16, 131072), (16, 147456), (32, 262144), (32, 6000), (32, 8193)):
        assert default_bwd_config(n, bits, False) == default_config(n, bits, backward=True), (bits, n)
    _, bwd = kernels
    params = {"kind": kind, "has_bias": kind == "layer", "has_dsum": False, "has_dw": False}
    for xd, n in (("float32", 1024), ("float32", 4096), ("bfloat16", 1024), ("bfloat16", 8192)):
        v = 4 if xd == "float32" else 8
        dts = (xd, xd, xd, xd, "float32", "float32", xd, "float32", "float32")
        spec, ptx = _compile(bwd, dts, n, (v, v, v, v, 4, 4, v, 4, 4), params)
        assert spec.config == default_bwd_config(n, 32 if xd == "float32" else 16, False)
        ptxas_no_spill(ptx)
    # the tuner's candidates for it: its own default first, then the row grid's neighbours
    key = _key(("float32",) * 4 + ("float32",) * 5, 1024, (4,) * 9)
    cands = bwd.configs(bwd.spec(key, tuple(sorted(params.items()))))
    assert cands[0] == default_bwd_config(1024, 32, False) and cands[1].row_grid


@pytest.mark.parametrize("kind", ["rms", "layer"])
def test_row_staged_defaults_below_8192(kernels, kind):
    """fp32 rows of 4097..8191 take the row-staged backward (256 threads,
    3 stages) with and without partials; 16-bit rows of 5633..8191 with partials (at most 2
    CTAs per SM) and 4097..8191 without take it on 2 stages. The power-of-two ends keep
    theirs (4096 and 16-bit 8192 without partials: the row grid; fp32 8192: the register
    kernel with partials, 2-CTA clusters without). They assemble without spilling."""
    from cuteforge.kernels.norm.config import default_bwd_config

    for n in (4104, 4608, 5000, 6144, 8184):
        for has_dw in (True, False):
            cfg = default_bwd_config(n, 32, has_dw)
            assert (cfg.threads, cfg.stages, cfg.cluster_n) == (256, 3, 1), (n, has_dw, cfg)
    for n in (4104, 5120, 5632):  # 3 stages on 2 CTAs per SM with partials
        cfg = default_bwd_config(n, 16)
        assert (cfg.threads, cfg.stages, cfg.ctas_per_sm) == (256, 3, 2), (n, cfg)
        assert default_bwd_config(n, 16, False).stages == 2
    for n in (5640, 7168, 8184):
        for has_dw in (True, False):
            cfg = default_bwd_config(n, 16, has_dw)
            assert (cfg.threads, cfg.stages) == (256, 2), (n, has_dw, cfg)
        assert default_bwd_config(n, 16).ctas_per_sm <= 2
    assert default_bwd_config(4096, 16, False).row_grid and default_bwd_config(8192, 16, False).row_grid
    assert default_bwd_config(4096, 32, False).row_grid and default_bwd_config(4097, 32).stages == 0  # unaligned
    assert default_bwd_config(8192, 32).stages == 0 and default_bwd_config(8192, 32, False).cluster_n == 2
    _, bwd = kernels
    # 16-bit 5640 / 6400 with partials: 3 CTAs per SM spilled LayerNorm (164 / 348 bytes)
    for xd, n, has_dw in (("float32", 5120, True), ("float32", 7168, False), ("bfloat16", 4608, False),
                          ("bfloat16", 4608, True), ("bfloat16", 5640, True), ("float16", 6400, True),
                          ("bfloat16", 7168, True)):
        bits = 32 if xd == "float32" else 16
        v = 16 * 8 // bits
        params = {"kind": kind, "has_bias": kind == "layer", "has_dsum": False} | ({} if has_dw else {"has_dw": False})
        dts = (xd,) * 4 + ("float32",) * 2 + (xd,) + ("float32",) * 2
        spec, ptx = _compile(bwd, dts, n, (v,) * 4 + (4, 4, v, 4, 4), params)
        assert spec.config == default_bwd_config(n, bits, has_dw, kind) and spec.config.stages
        ptxas_no_spill(ptx)


def test_backward_defaults_between_2048_and_4096():
    """16-bit rows of 2049..3584 with partials take the row-staged
    backward on 128 threads, 4 CTAs per SM (3 stages up to 3071, 2 from 3072), where
    16-byte aligned; LayerNorm's register backward with partials at 2049..3071 (fp32, and
    16-bit rows that are not aligned) runs at most 2 CTAs per SM, where 3 spilled it;
    RMSNorm's keeps 3. Both norms' at 1025..1408 run 2 with prefetch. The ends keep
    theirs: 2048 and 3585..4096 the register kernel."""
    from cuteforge.kernels.norm.config import default_bwd_config

    for n, stages in ((2056, 3), (2560, 3), (3064, 3), (3072, 2), (3584, 2)):
        for kind in ("rms", "layer"):
            cfg = default_bwd_config(n, 16, True, kind)
            assert (cfg.threads, cfg.stages, cfg.ctas_per_sm) == (128, stages, 4), (n, kind, cfg)
    for n in (2048, 3592, 4096):
        assert default_bwd_config(n, 16, True, "layer").stages == 0
    for n, bits in ((2304, 32), (2560, 32), (2816, 32), (2050, 16), (2815, 16)):
        rms, layer = default_bwd_config(n, bits, True, "rms"), default_bwd_config(n, bits, True, "layer")
        assert rms.stages == 0 and layer.stages == 0, (n, bits)
        assert rms.ctas_per_sm == 3 and layer.ctas_per_sm == 2, (n, bits, rms, layer)
        assert layer.prefetch  # the register room freed holds the next row
    # 1025..1408: both norms and dtypes (128 threads a row landed on 3 CTAs per SM)
    for n, bits in ((1152, 16), (1280, 16), (1280, 32), (1408, 32)):
        for kind in ("rms", "layer"):
            cfg = default_bwd_config(n, bits, True, kind)
            assert (cfg.threads_per_row, cfg.ctas_per_sm, cfg.prefetch, cfg.stages) == (128, 2, True, 0), (n, bits, cfg)
    assert default_bwd_config(1409, 16, True, "rms").ctas_per_sm == 2  # the heuristic's own choice there
    assert default_bwd_config(768, 16).prefetch and not default_bwd_config(768, 32).prefetch  # 16-bit 768 too
    assert default_bwd_config(2048, 32, True, "layer") == default_bwd_config(2048, 32, True, "rms")
    assert default_bwd_config(3072, 32, True, "layer") == default_bwd_config(3072, 32, True, "rms")
    # without partials the cap does not apply (the row grid there)
    assert default_bwd_config(2560, 32, False, "layer") == default_bwd_config(2560, 32, False, "rms")


def test_layer_forward_threads_per_row_between_powers_of_two():
    """LayerNorm's 16-bit register forward at 1025..8191 takes the power of two
    threads a row nearest N / 32 in log scale (2560 -> 64, 4608 / 5120 -> 128, 6144 -> 256);
    at the powers of two, and for RMSNorm and fp32, the next power of two up as before."""
    from cuteforge.kernels.norm.config import default_config, pow2_nearest

    assert [pow2_nearest(v) for v in (80, 90.4, 90.6, 96, 144, 160, 192, 224, 256)] == [
        64, 64, 128, 128, 128, 128, 256, 256, 256]
    for n, p in ((2560, 64), (3072, 128), (4608, 128), (5120, 128), (6144, 256), (7168, 256)):
        assert default_config(n, 16, kind="layer").threads_per_row == p, n
    assert default_config(1280, 16, kind="layer").threads_per_row == 32  # 64 earlier
    for n in (2048, 2560, 4096, 4608, 5120, 8192):
        assert default_config(n, 16, kind="rms").threads_per_row == max(8, 1 << (-(-n // 32) - 1).bit_length())
    for n in (2048, 4096, 8192):
        assert default_config(n, 16, kind="layer") == default_config(n, 16, kind="rms")
    assert default_config(4608, 32, kind="layer") == default_config(4608, 32, kind="rms")


def test_layer_register_backward_fits_at_2050(kernels):
    """LayerNorm's backward with partials on a 16-bit row that is not 16-byte aligned (no
    row-staged kernel): the register kernel on 2 CTAs per SM assembles without a spill."""
    _, bwd = kernels
    params = {"kind": "layer", "has_bias": True, "has_dsum": False}
    dts = ("bfloat16",) * 4 + ("float32",) * 2 + ("bfloat16",) + ("float32",) * 2
    spec, ptx = _compile(bwd, dts, 2050, (2,) * 4 + (4, 4, 2, 2, 2), params)
    assert spec.config.stages == 0 and spec.config.ctas_per_sm == 2, spec.config
    ptxas_no_spill(ptx)


@pytest.mark.parametrize("xd, n", [("bfloat16", 1280), ("float32", 1280), ("bfloat16", 2560), ("float32", 2560),
                                   ("bfloat16", 3584),
                                   ("float32", 5640), ("bfloat16", 6656), ("float32", 12288)])
def test_defaults_at_hidden_sizes_do_not_spill(kernels, xd, n):
    """The defaults at hidden sizes between powers of two (which the bar sweep never runs)
    assemble without spilling: the forward, and the backward with and without partials,
    for both norms. A spill in the row loop cost LayerNorm half its bandwidth at bf16 4608
    At 2560 LayerNorm's register backward with partials spilled on 3 CTAs
    per SM and read 33.5 % (bf16) / 69.7 % (fp32) of copy."""
    fwd, bwd = kernels
    bits = 32 if xd == "float32" else 16
    v = 16 * 8 // bits
    for kind in ("rms", "layer"):
        ptxas_no_spill(_compile_fwd_case(fwd, kind, xd, xd, n, kind == "layer", False, None)[2])
        for has_dw in (True, False):
            params = {"kind": kind, "has_bias": kind == "layer", "has_dsum": False} | ({} if has_dw else {"has_dw": False})
            dts = (xd,) * 4 + ("float32",) * 2 + (xd,) + ("float32",) * 2
            ptxas_no_spill(_compile(bwd, dts, n, (v,) * 4 + (4, 4, v, 4, 4), params)[1])


# (kind, dtype, N, config or None for the default, partials, measured % of copy or None):
# the register backward's row loop, where ptxas may issue part of a row's loads in a
# second batch after the row's first multiply. The readings are the H200's
# kernel-alone figures (fp32 8192 frozen weight; fp32 4608 / 5120 with
# partials, predicted from this count). The count
# does not explain every slow kernel: the same 512-thread kernel without partials read
# 85.7 % (RMSNorm) and 63.6 % (LayerNorm) at fp32 5120 with none late (a later default moved fp32
# 4097..8191 to the row-staged backward).
_LOAD_BATCHES = [
    ("rms", "float32", 8192, NormConfig(512, 512, 1, 1), False, 87.3),  # 5 of 12 late: the slow one
    ("rms", "float32", 8192, NormConfig(512, 512, 1, 1), True, 98.3),
    ("rms", "float32", 8192, NormConfig(512, 512, 1, 1, early_weight=True), False, 98.6),
    ("layer", "float32", 8192, NormConfig(512, 512, 1, 1), False, 98.2),
    ("layer", "float32", 8192, NormConfig(512, 512, 1, 1, early_weight=True), False, 77.0),  # 1 of 8 late
    ("rms", "float32", 4608, NormConfig(512, 512, 1, 1), True, 67.6),  # 3 of 9 late
    ("rms", "float32", 5120, NormConfig(512, 512, 1, 1), True, 71.1),
]


@pytest.mark.parametrize("kind, xd, n, cfg, partials, measured", _LOAD_BATCHES)
def test_register_backward_issues_a_rows_loads_together(kernels, kind, xd, n, cfg, partials, measured):
    """The row loop issues all of a row's global loads before the row's math where the kernel
    ran at the bandwidth limit, and not where it ran slow (the two slow kernels of the fp32
    8192 sweep and the fp32 4608 / 5120 training kernels it predicted): the SASS count
    that explained those readings."""
    _, bwd = kernels
    bits = 32 if xd == "float32" else 16
    v = 16 // (bits // 8)
    params = {"kind": kind, "has_bias": kind == "layer", "has_dsum": False} | ({} if partials else {"has_dw": False})
    dts = (xd,) * 4 + ("float32",) * 2 + (xd,) + ("float32",) * 2
    spec, _, cubin = _compile(bwd, dts, n, (v,) * 4 + (4, 4, v, 4, 4), params, cfg, cubin=True)
    assert not spec.config.stages and not spec.config.prefetch, spec.config  # the count is for this loop
    late, total = loop_loads(sass_or_skip(cubin))
    assert total >= 6
    if measured is not None and measured < 90:
        assert late > 0, (late, total)
    else:
        assert late == 0, (late, total, spec.config)


def test_kept_artifacts_are_each_compiles_own(kernels):
    """compiler.compile_jit(keep_artifacts=True) hands back the PTX and cubin of the config it
    compiled and leaves no files in the working directory. The DSL names these files after
    the kernel function and its argument types, not the config, and by default writes them
    into the directory the process started in: two configs compiled there by two processes
    read back each other's kernel (seen in a parallel SASS sweep). Each compile
    now has its own temporary directory."""
    import time
    from pathlib import Path

    _, bwd = kernels
    start = time.time() - 1  # file times may be coarser than time.time()
    dts = ("float32",) * 9
    params = {"kind": "rms", "has_bias": False, "has_dsum": False}
    for threads in (256, 512):
        spec, ptx, cubin = _compile(bwd, dts, 8192, (4,) * 9, params, NormConfig(threads, threads, 1, 1), cubin=True)
        assert f".maxntid {threads}, 1, 1" in ptx
        assert isinstance(cubin, bytes) and cubin[:4] == b"\x7fELF"
    left = [p.name for ext in ("*.ptx", "*.cubin") for p in Path.cwd().glob(ext) if p.stat().st_mtime >= start]
    assert left == []


def test_row_grid_only_for_the_backward_without_partials(kernels):
    """row_grid runs one CTA per row block: a knob of the register backward
    without a cluster, refused by the kernel with partials (its Q rows would be one per row
    block) and everywhere else; bwd_groups gives the row grid its M / rows-per-CTA CTAs, the
    persistent configs their groups as before."""
    import torch

    from cuteforge.ops.norm import bwd_groups

    row = NormConfig(128, 128, 1, 4, row_grid=True)
    row.validate(1024, 32, backward=True)
    for bad in (replace(row, stages=1), NormConfig(256, 256, 2, 1, row_grid=True)):
        with pytest.raises(ValueError, match="row_grid"):
            bad.validate(4096, 16, backward=True)
    with pytest.raises(ValueError, match="row_grid"):
        row.validate(1024, 32, backward=False)
    dev = torch.device("cuda", 0)  # not touched: the row grid needs no SM count
    assert bwd_groups(dev, row, 32768) == 32768 and bwd_groups(dev, row, 0) == 1
    assert bwd_groups(dev, NormConfig(256, 64, 1, 4, row_grid=True), 1001) == 251
    _, bwd = kernels
    dts = ("float32",) * 4 + ("float32", "float32", "float32", "float32", "float32")
    vecs = (4, 4, 4, 4, 4, 4, 4, 4, 4)
    with pytest.raises(ValueError, match="row_grid"):
        bwd.validate_config(bwd.spec(_key(dts, 1024, vecs), (("has_bias", False), ("has_dsum", False), ("kind", "rms"))),
                            row)
    params = {"kind": "rms", "has_bias": False, "has_dsum": False, "has_dw": False}
    _, ptx = _compile(bwd, dts, 1024, vecs, params, row)
    ptxas_no_spill(ptx)


def _key(dtypes, n, vecs):
    from cuteforge.signature import BoundKey

    return BoundKey(dtypes, (("N", n),), vecs)


def test_bad_builder_arguments():
    import cutlass

    from cuteforge.kernels.norm.bwd import make_norm_bwd
    from cuteforge.kernels.norm.fwd import make_norm_fwd

    cfg = NormConfig()
    with pytest.raises(ValueError, match="unknown norm kind"):
        make_norm_fwd("group", cutlass.Float32, cutlass.Float32, 128, 4, cfg, 1e-5, False, False)
    with pytest.raises(ValueError, match="too wide"):
        make_norm_bwd("rms", cutlass.BFloat16, cutlass.Float32, 4096, 8, cfg, False, False)


if os.environ.get("CUTEFORGE_SKIP_COMPILE_TESTS"):  # pragma: no cover
    pytestmark = pytest.mark.skip("compile tests disabled")


def test_autotune_candidates_validate(kernels):
    """The autotuner validates each candidate through the kernel's hook: every config the
    kernel offers passes, a bad one is dropped with its reason."""
    from cuteforge.autotune.candidates import candidates
    from cuteforge.signature import BoundKey

    fwd, bwd = kernels
    d, f = "bfloat16", "float32"
    cases = (
        (fwd, BoundKey((d,) * 6 + (f, f), (("N", 4096),), (8,) * 6 + (4, 4)),
         {"kind": "rms", "eps": 1e-6, "has_bias": False, "has_residual": False}),
        (bwd, BoundKey((d, d, d, d, f, f, d, f, f), (("N", 4096),), (8, 8, 8, 8, 4, 4, 8, 4, 4)),
         {"kind": "layer", "has_bias": True, "has_dsum": False}),
    )
    for k, key, params in cases:
        spec = k.spec(key, tuple(sorted(params.items())), None, arch="sm_90a")
        valid, invalid = candidates(k, spec)
        assert invalid == {} and valid == k.configs(spec) and len(valid) > 1
        valid, invalid = candidates(k, spec, [NormConfig(48, 16)])
        assert valid == [] and "multiple of 32" in invalid[NormConfig(48, 16)]


# --------------------------------------------------------------------------- v2: mbarrier exchange (forward)


def test_mbar_exchange_validate_and_candidates():
    from cuteforge.kernels.norm.config import (
        CLUSTER_FWD_MIN_N,
        cluster_fwd_config,
        longrow_candidates,
    )

    with pytest.raises(ValueError, match="exchange="):
        NormConfig(256, 256, 4, exchange="fast").validate(65536, 16)
    with pytest.raises(ValueError, match="cluster_n > 1"):
        NormConfig(256, 256, 1, exchange="mbar").validate(4096, 16)
    NormConfig(256, 256, 16, exchange="mbar").validate(65536, 16, backward=True)  # the backward takes it too
    with pytest.raises(ValueError, match="cluster_n > 1"):
        NormConfig(256, 256, 1, exchange="mbar").validate(4096, 16, backward=True)
    assert cluster_fwd_config(65536, 16) == NormConfig(256, 256, 8, 1, exchange="mbar")
    assert cluster_fwd_config(262144, 32).cluster_n == 16
    for bits in (16, 32):
        for n in (16384, 32768, 65536, 65537, 100000, 131072, 262144):
            cands = longrow_candidates(n, bits)
            assert len(cands) >= 3 and len(set(cands)) == len(cands)
            assert any(c.exchange == "mbar" for c in cands) and any(c.exchange == "barrier" for c in cands)
            for c in cands:
                c.validate(n, bits)
        assert default_config(262144, bits).exchange == ("barrier" if CLUSTER_FWD_MIN_N[bits] is None else "mbar")


def test_lag_validation():
    """lag is a knob of the staged forward over a cluster with two stages at least."""
    ok = NormConfig(256, 256, 16, 1, exchange="mbar", stages=3, lag=1)
    ok.validate(262144, 16)
    for bad, why in ((replace(ok, stages=1), "stages >= 2"), (replace(ok, lag=2), "0 or 1"),
                     (replace(ok, lag=True), "0 or 1")):
        with pytest.raises(ValueError, match=why):
            bad.validate(262144, 16)
    with pytest.raises(ValueError, match="lag"):
        ok.validate(262144, 16, backward=True)
    with pytest.raises(ValueError, match="lag"):
        NormConfig(256, 256, 1, 1, stages=3, lag=1).validate(8192, 16)
    # the four exchange slots are in the shared memory estimate
    assert ok.smem_bytes(262144, False, 16) > replace(ok, lag=0).smem_bytes(262144, False, 16)


def test_long_row_forward_defaults_follow_the_sweep():
    """The measured winners (h200-longrow-v2.json, h200-norm-staged-fwd-deep.json,
    h200-norm-async-fwd.json) per kind and dtype class: rows in registers over a cluster,
    staged in 32 KiB chunks, 4 stages, or (RMSNorm) in registers through
    cp_async; odd N keeps the plain register path; every forward default from N = 1 to 262144
    (odd N included) validates for sm_90a."""
    from cuteforge.arch import limits_for
    from cuteforge.kernels.norm.config import LAGGED_FWD_ALTERNATIVES, staged_table_config

    want = {("rms", 32, 32768): (256, 2),
            ("rms", 16, 65537): (256, 16), ("layer", 16, 65537): (512, 8), ("rms", 32, 65537): (256, 8)}
    for (kind, bits, n), (threads, cluster) in want.items():
        d = default_config(n, bits, kind=kind)
        assert (d.exchange, d.threads, d.cluster_n, d.stages, d.cp_async) == ("mbar", threads, cluster, 0, 0), (kind, bits, n, d)
    # RMSNorm's long rows in registers through cp_async
    asynced = {("rms", 16, 32768): 4, ("rms", 16, 65536): 8, ("rms", 16, 131072): 16, ("rms", 16, 262144): 16,
               ("rms", 32, 65536): 8, ("rms", 32, 131072): 16, ("layer", 32, 32768): 4}
    for (kind, bits, n), cluster in asynced.items():
        d = default_config(n, bits, kind=kind)
        assert (d.exchange, d.threads, d.cluster_n, d.stages, d.cp_async, d.ctas_per_sm) == ("mbar", 256, cluster, 0, 2, 1), d
        cands = candidate_configs(n, bits, kind=kind)
        assert cands[0] == d and any(c.stages for c in cands) and any(not (c.stages or c.cp_async) for c in cands)
    # (threads, cluster, stages, CTAs per SM, lag) without and with a fused residual
    staged = {("layer", 32, 262144): ((512, 16, 2, 1, 0),) * 2, ("layer", 32, 196608): ((512, 16, 2, 1, 0),) * 2,
              ("rms", 32, 262144): ((1024, 16, 2, 1, 0),) * 2,
              # 16-bit LayerNorm, with its own shapes where a residual is fused
              ("layer", 16, 32768): ((1024, 2, 3, 1, 0), (256, 4, 3, 1, 1)),
              # the H200's picks (32768 unlagged on 3 stages, 16 KiB chunks at 65536,
              # 131072 unlagged; with the residual 32768 lagged on 16 KiB chunks, 262144 on
              # 1024 threads unlagged)
              ("layer", 16, 65536): ((256, 8, 3, 2, 1), (256, 8, 4, 1, 0)),
              ("layer", 16, 131072): ((256, 8, 4, 1, 0), (256, 16, 4, 1, 0)),
              ("layer", 16, 262144): ((256, 16, 4, 1, 1), (1024, 16, 2, 1, 0)),
              ("layer", 16, 196608): ((256, 16, 4, 1, 1), (1024, 16, 2, 1, 0)),
              ("layer", 16, 40000): ((512, 4, 6, 1, 0), (256, 8, 4, 1, 0)),  # part rounds: unlagged
              ("layer", 32, 65536): ((256, 8, 4, 1, 0),) * 2,
              ("layer", 32, 131072): ((512, 16, 6, 1, 1), (256, 16, 4, 1, 0))}
    for (kind, bits, n), wants in staged.items():
        for residual, want in zip((False, True), wants):
            d = default_config(n, bits, kind=kind, residual=residual)
            assert (d.exchange, d.threads, d.cluster_n, d.stages, d.ctas_per_sm, d.lag) == ("mbar", *want), (kind, bits, n, d)
            d.validate(n, bits)
        d = default_config(n, bits, kind=kind)
        cands = candidate_configs(n, bits, kind=kind)
        assert cands[0] == d and any(c.stages == 0 for c in cands)  # the register path stays a candidate
        if d.lag:  # the unlagged shape it replaced is the tuner's second candidate
            assert not cands[1].lag and cands[1].stages and cands[1].cluster_n > 1, cands[1]
        rcands = candidate_configs(n, bits, kind=kind, residual=True)
        assert rcands[0] == default_config(n, bits, kind=kind, residual=True)
        h100 = staged_table_config(LAGGED_FWD_ALTERNATIVES.get((kind, bits), ()), n, bits)
        if h100 is not None and h100 != rcands[0]:  # measured without a residual: not offered with one
            assert h100 not in rcands, (n, bits, h100)
    # the H100's lagged picks (the earlier defaults) stay tuner candidates
    for n, bits, h100 in ((65536, 16, NormConfig(512, 512, 4, 3, exchange="mbar", stages=2, lag=1)),
                          (32768, 16, NormConfig(512, 512, 2, 3, exchange="mbar", stages=2, lag=1)),
                          (262144, 16, NormConfig(256, 256, 16, 1, exchange="mbar", stages=3, lag=1)),
                          (131072, 32, NormConfig(256, 256, 16, 1, exchange="mbar", stages=3, lag=1))):
        assert h100 in candidate_configs(n, bits, kind="layer"), (n, bits)
    assert default_config(16384, 16, kind="rms").exchange == "barrier"  # one CTA still holds the row
    limits = limits_for("sm_90a")
    for kind in ("rms", "layer"):
        for bits in (16, 32):
            for n in list(range(1, 300, 7)) + [4095, 16383, 16385, 24577, 32767, 65537, 100003, 131073, 262143, 262144]:
                default_config(n, bits, kind=kind).validate(n, bits, limits)


# (kind, x dtype, weight dtype, n, bias, residual, cluster_n): rms / layer (two
# exchanges), odd N (scalar accesses), fp32 weight with 16-bit x, cluster of 16
_FWD_MBAR = [
    ("rms", "bfloat16", "bfloat16", 65536, False, True, 8),
    ("layer", "float16", "float32", 65537, True, False, 16),
    ("layer", "float32", "float32", 131072, False, True, 16),
]


@pytest.mark.parametrize("kind, xd, wd, n, bias, res, c", _FWD_MBAR)
def test_compile_fwd_mbar(kernels, kind, xd, wd, n, bias, res, c):
    fwd, _ = kernels
    vx = 1 if n % 2 else 16 // (4 if xd == "float32" else 2)
    vw = min(vx, 16 // (4 if wd == "float32" else 2))
    dts = (xd, wd, wd, xd, xd, xd, "float32", "float32")
    cfg = NormConfig(256, 256, c, 1, exchange="mbar")
    _, ptx = _compile(fwd, dts, n, (vx, vw, vw, vx, vx, vx, 4, 4),
                      {"kind": kind, "eps": 1e-5, "has_bias": bias, "has_residual": res}, cfg)
    assert "st.async.shared::cluster.mbarrier::complete_tx::bytes" in ptx
    # one exchange per launch (rms; layer's moments), two for a padded layer row
    exchanges = 2 if kind == "layer" and n % 2 else 1
    assert len(re.findall(r"mbarrier\.init", ptx)) == exchanges and "mbarrier.try_wait" in ptx
    assert len(re.findall(r"st\.async", ptx)) == (2 if kind == "layer" else 1)
    assert not re.search(r"barrier\.cluster\.arrive(\.release)?;", ptx)  # no full cluster barrier


# --------------------------------------------------------------------------- mbarrier exchange (backward)


def test_bwd_mbar_candidates_valid():
    """Every backward long-row candidate validates for sm_90a; mbar and the barrier
    baseline both appear; the backward defaults are untouched (barrier exchange)."""
    from cuteforge.arch import limits_for
    from cuteforge.kernels.norm.config import cluster_bwd_config, longrow_bwd_candidates

    limits = limits_for("sm_90a")
    assert cluster_bwd_config(65536, 16) == NormConfig(256, 256, 16, 2, exchange="mbar")
    assert cluster_bwd_config(262144, 32).reload
    for bits in (16, 32):
        for n in (16384, 32768, 65536, 65537, 100000, 131072, 262144):
            cands = longrow_bwd_candidates(n, bits)
            assert len(cands) >= 3 and len(set(cands)) == len(cands)
            assert any(c.exchange == "mbar" for c in cands) and any(c.exchange == "barrier" for c in cands)
            for c in cands:
                assert c.cluster_n > 1
                c.validate(n, bits, limits, backward=True)
            d = default_config(n, bits, backward=True)  # mbar only with staged rows
            assert d.exchange == "barrier" or d.stages >= 1


# (kind, x dtype, weight dtype, n, bias, dsum, threads, cluster_n, reload): rms (one
# value per exchange), layer (two), odd N with fp32 weight, a reload config
_BWD_MBAR = [
    ("rms", "bfloat16", "bfloat16", 65536, False, False, 256, 16, False),
    ("layer", "float16", "float32", 65537, True, True, 256, 16, False),
    ("layer", "float32", "float32", 131072, True, False, 512, 16, True),
]


@pytest.mark.parametrize("kind, xd, wd, n, bias, dsum, t, c, reload", _BWD_MBAR)
def test_compile_bwd_mbar(kernels, kind, xd, wd, n, bias, dsum, t, c, reload):
    _, bwd = kernels
    vx = 1 if n % 2 else 16 // (4 if xd == "float32" else 2)
    vw = min(vx, 16 // (4 if wd == "float32" else 2))
    dts = (xd, wd, xd, xd, "float32", "float32", xd, "float32", "float32")
    cfg = NormConfig(t, t, c, 1, reload, exchange="mbar")
    _, ptx = _compile(bwd, dts, n, (vx, vw, vx, vx, 4, 4, vx, 4, 4),
                      {"kind": kind, "has_bias": bias, "has_dsum": dsum}, cfg)
    sends = re.findall(r"st\.async\.shared::cluster\.mbarrier::complete_tx::bytes", ptx)
    assert len(sends) == (2 if kind == "layer" else 1)
    assert len(re.findall(r"mbarrier\.init", ptx)) == 2 and "mbarrier.try_wait.parity" in ptx
    # the re-arm inside the row loop: two initial arms + one after the wait
    assert len(re.findall(r"mbarrier\.arrive\.expect_tx", ptx)) == 3
    # no full cluster barrier: one relaxed arrive and one wait, both before the row loop
    cl = [mt.start() for mt in re.finditer(r"barrier\.cluster\.(arrive|wait)[.a-z]*", ptx)]
    assert re.findall(r"barrier\.cluster\.(?:arrive|wait)[.a-z]*", ptx) == ["barrier.cluster.arrive.relaxed", "barrier.cluster.wait"]
    assert max(cl) < ptx.index("st.async")


def _norm_reference_plan(builds):
    """A CPU stand-in for `_fwd_plan`: records each build and returns a launcher with the
    kernel's outputs (y, x + residual, mean, rstd; fp32 math)."""
    import torch

    def plan(kind, x2, w, b, r2, eps, config=None):
        builds.append((kind, eps, x2.dtype, tuple(x2.shape), w.dtype, b is not None, r2 is not None))
        if x2.shape[0] == 0:
            return None

        def launch(x, w, b, r, y, ro, mean, rstd):
            s = x.float() + (r.float() if r is not x else 0)
            if r is not x:
                ro.copy_(s)
            mu = s.mean(1, keepdim=True) if kind == "layer" else torch.zeros_like(s[:, :1])
            var = ((s - mu) ** 2).mean(1, keepdim=True)
            rs = torch.rsqrt(var + eps)
            out = (s - mu) * rs * w.float() + (b.float() if kind == "layer" and b is not w else 0)
            y.copy_(out)
            rstd.copy_(rs[:, 0])
            mean.copy_(mu[:, 0])  # rms: mean aliases rstd in the plain path and is never read

        return launch

    return plan


def test_eager_warm_path_memo_key(monkeypatch):
    """The no-grad eager path: a repeated call reuses its plan (no second build) and gives
    the reference answer; every argument the plan depends on (eps and its type, x's dtype,
    shape, strides, alignment, weight's dtype, stride and alignment, bias and residual
    presence and layout) misses and builds again, so a changed argument never reuses a
    wrong plan. Layouts off the plain path (N-D, strided weight, residual) too."""
    import sys

    import torch
    import torch.nn.functional as F

    import cuteforge.ops as ops

    nm = sys.modules["cuteforge.ops.norm"]
    builds: list = []
    launch = sys.modules["cuteforge.ops.norm_launch"]  # the kernels' launchers
    monkeypatch.setattr(launch, "_check", lambda *a: None)  # CPU tensors: the CUDA check would refuse them
    monkeypatch.setattr(launch, "_fwd_plan", _norm_reference_plan(builds))
    monkeypatch.setattr(nm, "_EAGER", {})
    x = torch.randn(6, 32)
    w = torch.randn(32)
    b = torch.randn(32)
    r = torch.randn(6, 32)

    def rms_ref(x, w, eps, r=None):
        s = x if r is None else x + r
        return F.rms_norm(s.float(), (32,), w.float(), eps).to(x.dtype)

    def ln_ref(x, w, b, eps, r=None):
        s = x if r is None else x + r
        return F.layer_norm(s.float(), (32,), w.float(), None if b is None else b.float(), eps).to(x.dtype)

    cases = [
        (lambda: ops.rms_norm(x, w, 1e-6), lambda: rms_ref(x, w, 1e-6)),
        (lambda: ops.rms_norm(x, w, 1e-5), lambda: rms_ref(x, w, 1e-5)),
        (lambda: ops.rms_norm(x, w, 1), lambda: rms_ref(x, w, 1.0)),
        (lambda: ops.rms_norm(x, w, True), lambda: rms_ref(x, w, 1.0)),  # True == 1: its own entry (the check rejects it)
        (lambda: ops.rms_norm(x.half(), w.half(), 1e-6), lambda: rms_ref(x.half(), w.half(), 1e-6)),
        (lambda: ops.rms_norm(x.half(), w.float(), 1e-6), lambda: rms_ref(x.half(), w, 1e-6)),
        (lambda: ops.rms_norm(x[:3], w, 1e-6), lambda: rms_ref(x[:3], w, 1e-6)),
        (lambda: ops.rms_norm(x.view(2, 3, 32), w, 1e-6), lambda: rms_ref(x, w, 1e-6).view(2, 3, 32)),
        (lambda: ops.rms_norm(x.t().contiguous().t(), w, 1e-6), lambda: rms_ref(x, w, 1e-6)),
        (lambda: ops.rms_norm(x, torch.randn(64)[::2], 1e-6), None),
        (lambda: ops.rms_norm(torch.randn(6 * 32 + 1)[1:].view(6, 32), w, 1e-6), None),
        (lambda: ops.rms_norm(x, torch.randn(33)[1:], 1e-6), None),
        (lambda: ops.rms_norm(x, w, 1e-6, residual=r), lambda: (rms_ref(x, w, 1e-6, r), x + r)),
        (lambda: ops.rms_norm(x.view(2, 3, 32), w, 1e-6, residual=r.view(2, 3, 32)),
         lambda: (rms_ref(x, w, 1e-6, r).view(2, 3, 32), (x + r).view(2, 3, 32))),
        (lambda: ops.layer_norm(x, w, None, 1e-6), lambda: ln_ref(x, w, None, 1e-6)),
        (lambda: ops.layer_norm(x, w, b, 1e-6), lambda: ln_ref(x, w, b, 1e-6)),
        (lambda: ops.layer_norm(x, w, torch.randn(33)[1:], 1e-6), None),
        (lambda: ops.layer_norm(x, w, b, 1e-6, residual=r), lambda: (ln_ref(x, w, b, 1e-6, r), x + r)),
        (lambda: ops.rms_norm(x[:0], w, 1e-6), lambda: x[:0]),
    ]
    for i, (call, want) in enumerate(cases):
        assert len(builds) == i
        for _ in range(2):
            got = call()
            if want is not None:
                torch.testing.assert_close(got, want(), atol=2e-3, rtol=2e-3)
        assert len(builds) == i + 1, f"case {i}: built {len(builds) - i} times"


def test_compiled_no_grad_norm_traces_to_the_op_returning_y_alone(monkeypatch):
    """Under torch.compile with grad off and no residual, rms_norm / layer_norm trace to
    the registered ops that return y alone (cuteforge::rms_norm_infer, layer_norm_infer:
    no residual_out, mean or rstd allocated); with grad wanted or with a residual, to the
    ops that return those too. The answers are the reference's either way."""
    import sys

    import torch
    import torch.nn.functional as F

    import cuteforge.ops as ops

    launch = sys.modules["cuteforge.ops.norm_launch"]
    monkeypatch.setattr(launch, "_check", lambda *a, **k: None)  # CPU tensors: the CUDA check would refuse them
    monkeypatch.setattr(launch, "_fwd_plan", _norm_reference_plan([]))
    monkeypatch.setattr(launch, "_PLANS", {})
    traced: list[set[str]] = []

    def backend(gm, example_inputs):
        traced.append({str(n.target) for n in gm.graph.nodes if n.op == "call_function"})
        return gm.forward

    x, w, b, r = torch.randn(2, 3, 32), torch.randn(32), torch.randn(32), torch.randn(2, 3, 32)
    rms = F.rms_norm(x, (32,), w, 1e-6)
    ln = F.layer_norm(x, (32,), w, b, 1e-5)
    cases = [  # (fn, grad, the op its graph calls, reference)
        (lambda x, w: ops.rms_norm(x, w, 1e-6), False, "cuteforge.rms_norm_infer", rms),
        (lambda x, w: ops.layer_norm(x, w, b, 1e-5), False, "cuteforge.layer_norm_infer", ln),
        (lambda x, w: ops.layer_norm(x, w, None, 1e-5), False, "cuteforge.layer_norm_infer",
         F.layer_norm(x, (32,), w, None, 1e-5)),
        (lambda x, w: ops.rms_norm(x, w, 1e-6, residual=r)[0], False, "cuteforge.rms_norm.",
         F.rms_norm(x + r, (32,), w, 1e-6)),
        (lambda x, w: ops.rms_norm(x, w, 1e-6), True, "cuteforge.rms_norm.", rms),
        (lambda x, w: ops.layer_norm(x, w, b, 1e-5), True, "cuteforge.layer_norm.", ln),
    ]
    for fn, grad, op, want in cases:
        torch._dynamo.reset()
        with torch.set_grad_enabled(grad):
            got = torch.compile(fn, backend=backend, fullgraph=True)(x.requires_grad_(grad), w)
        torch.testing.assert_close(got.detach(), want.detach(), atol=2e-3, rtol=2e-3)
        assert any(op in t for t in traced[-1]), (op, traced[-1])
        assert not grad or not any("_infer" in t for t in traced[-1])
    torch._dynamo.reset()


def test_compiled_layer_norm_training_gets_dweight_and_dbias_from_one_tensor(monkeypatch):
    """Under torch.compile with grad, layer_norm with a bias: the registered backward returns
    dweight and dbias as the rows of one (2, N) tensor (a custom op's returns may not share
    memory) and the traced autograd formula splits them; the gradients are torch's (CPU
    stand-ins for the kernels: the forward's reference plan, a backward writing per-group
    partials, and their column sum)."""
    import sys

    import torch
    import torch.nn.functional as F

    import cuteforge.ops as ops

    launch = sys.modules["cuteforge.ops.norm_launch"]
    monkeypatch.setattr(launch, "_check", lambda *a, **k: None)  # CPU tensors: the CUDA check would refuse them
    monkeypatch.setattr(launch, "_fwd_plan", _norm_reference_plan([]))
    monkeypatch.setattr(launch, "_PLANS", {})
    q = 2

    def kernel(xs, w, dy, dsum, mean, rstd, dx, dwp, dbp):
        xhat = (xs.float() - mean[:, None]) * rstd[:, None]
        g = dy.float() * w.float()
        dx.copy_(rstd[:, None] * (g - xhat * (g * xhat).mean(1, keepdim=True) - g.mean(1, keepdim=True)))
        for part, rows in enumerate(torch.arange(xs.shape[0]).chunk(q)):
            dwp[part].copy_((dy.float()[rows] * xhat[rows]).sum(0))
            dbp[part].copy_(dy.float()[rows].sum(0))

    monkeypatch.setattr(launch, "_bwd_kernel", lambda *a, **k: (q, kernel, lambda parts, out: out.copy_(parts.sum(1))))
    x, w, b = (torch.randn(*shape, requires_grad=True) for shape in ((6, 32), (32,), (32,)))
    dy = torch.randn(6, 32)
    torch._dynamo.reset()
    y = torch.compile(lambda x, w, b: ops.layer_norm(x, w, b, 1e-5), backend="aot_eager", fullgraph=True)(x, w, b)
    got = torch.autograd.grad(y, (x, w, b), dy)
    ref = [t.detach().clone().requires_grad_() for t in (x, w, b)]
    want = torch.autograd.grad(F.layer_norm(ref[0], (32,), ref[1], ref[2], 1e-5), ref, dy)
    for name, g, r in zip(("x", "weight", "bias"), got, want):
        torch.testing.assert_close(g, r, atol=1e-4, rtol=1e-4, msg=name)
    torch._dynamo.reset()


# --------------------------------------------------------------------------- row-staged backward


def test_staged_validate_and_candidates():
    """NormConfig.stages: one row per CTA, rows of a multiple of 16 bytes, shared memory
    within the SM at ctas_per_sm; every candidate validates for sm_90a; with dsum the
    stages shrink to what the SM holds. (The forward takes stages too.)"""
    from cuteforge.arch import limits_for
    from cuteforge.kernels.norm.config import staged_candidates, staged_config, staged_stages

    limits = limits_for("sm_90a")
    NormConfig(512, 512, 1, 1, stages=2).validate(16384, 16)  # the staged forward
    with pytest.raises(ValueError, match="one row per CTA"):
        NormConfig(256, 128, 1, 1, stages=2).validate(4096, 16, backward=True)
    with pytest.raises(ValueError, match="multiple of 16 bytes"):
        NormConfig(512, 512, 1, 1, stages=2).validate(16383, 16, backward=True)
    with pytest.raises(ValueError, match="exceed"):  # 4 x 192 KiB
        NormConfig(512, 512, 1, 4, stages=3).validate(16384, 16, limits, backward=True)
    with pytest.raises(ValueError, match="stages="):
        NormConfig(512, 512, 1, 1, stages=-1).validate(16384, 16, backward=True)
    for bits in (16, 32):
        for n in (1024, 4096, 4104, 8192, 16384):
            for c in staged_candidates(n, bits):
                assert c.stages >= 1 and c.cluster_n == 1 and c.rows_per_cta == 1
                c.validate(n, bits, limits, backward=True)
                s = staged_stages(c, n, bits, True)
                assert 1 <= s <= c.stages
                assert c.smem_bytes(n, True, bits, True) <= limits.smem_per_block
    assert staged_config(16384, 16) == NormConfig(512, 512, 1, 1, stages=3)
    assert staged_stages(staged_config(16384, 16), 16384, 16, True) == 2  # 3 rows of 32 KiB a stage
    assert staged_config(65537, 16) is None


# (kind, x dtype, weight dtype, n, bias, dsum, threads, ctas_per_sm, stages): rms / layer,
# fused dsum, fp32 weight (held in registers), a partial round (N = 4104), one stage
_BWD_STAGED = [
    ("rms", "bfloat16", "bfloat16", 16384, False, False, 512, 1, 3),
    ("layer", "bfloat16", "bfloat16", 16384, True, True, 1024, 1, 3),
    ("layer", "float16", "float32", 8192, True, False, 512, 2, 2),
    ("rms", "bfloat16", "bfloat16", 4104, False, True, 256, 2, 3),
    ("layer", "float32", "float32", 4096, True, False, 128, 2, 1),
]


@pytest.mark.parametrize("kind, xd, wd, n, bias, dsum, t, occ, stages", _BWD_STAGED)
def test_compile_bwd_staged(kernels, kind, xd, wd, n, bias, dsum, t, occ, stages):
    """The PTX holds the bulk copies (x, dy, dsum per stage in the prologue, one set per
    refill), one mbarrier per stage (+ the weight's), parity waits, and no local memory
    (no spill)."""

    _, bwd = kernels
    vx = 16 // (4 if xd == "float32" else 2)
    vw = min(vx, 16 // (4 if wd == "float32" else 2))
    dts = (xd, wd, xd, xd, "float32", "float32", xd, "float32", "float32")
    cfg = NormConfig(t, t, 1, occ, stages=stages)
    spec, ptx = _compile(bwd, dts, n, (vx, vw, vx, vx, 4, 4, vx, 4, 4),
                         {"kind": kind, "has_bias": bias, "has_dsum": dsum}, cfg)
    from cuteforge.kernels.norm.config import staged_stages

    s = staged_stages(cfg, n, 16 if xd != "float32" else 32, dsum)
    rows = 3 if dsum else 2
    bulk = re.findall(r"cp\.async\.bulk\.shared::cluster\.global\.mbarrier::complete_tx::bytes", ptx)
    w_smem = len(bulk) == rows * (s + 1) + 1
    assert len(bulk) == rows * (s + 1) + (1 if w_smem else 0), len(bulk)
    assert len(re.findall(r"mbarrier\.init", ptx)) == s + 1
    assert "mbarrier.try_wait.parity" in ptx and "mbarrier.arrive.expect_tx" in ptx
    assert not re.search(r"barrier\.cluster|st\.shared::cluster", ptx)
    assert re.search(r"ld\.shared\.v[24]", ptx)
    ptxas_no_spill(ptx)


def test_staged_misaligned_rows_build_the_register_path(kernels):
    """A staged config on rows that are not 16-byte aligned builds the register path
    (no bulk copies) instead of faulting."""
    _, bwd = kernels
    cfg = NormConfig(256, 256, 1, 2, stages=3)
    d, f = "bfloat16", "float32"
    _, ptx = _compile(bwd, (d, d, d, d, f, f, d, f, f), 8192, (4, 4, 4, 4, 4, 4, 4, 4, 4),
                      {"kind": "rms", "has_bias": False, "has_dsum": False}, cfg)
    assert "cp.async.bulk" not in ptx


def test_staged_backward_defaults_follow_the_sweep():
    """The measured ranges (h200-norm-staged.json): staged for 16-bit N = 8192 (2 stages)
    and 8193..16384 (3), fp32 8193..16384; the register path elsewhere; every backward
    default from N = 1 to 262144 validates for sm_90a."""
    from cuteforge.arch import limits_for

    assert default_config(8192, 16, backward=True) == NormConfig(256, 256, 1, 2, stages=2)
    assert default_config(16384, 16, backward=True) == NormConfig(512, 512, 1, 1, stages=3)
    assert default_config(16384, 32, backward=True).stages == 1
    # even long rows take the cluster-staged backward (h200-norm-staged-longrow.json)
    assert default_config(32768, 16, backward=True) == NormConfig(512, 512, 2, 1, exchange="mbar", stages=3)
    assert default_config(65536, 16, backward=True) == NormConfig(256, 256, 8, 2, exchange="mbar", stages=3)
    # one whole-row stage fits there, so the part ring of 8 parts
    assert default_config(262144, 32, backward=True) == NormConfig(512, 512, 16, 1, exchange="mbar", stages=2, parts=8)
    for n, bits in ((4096, 16), (8190, 16), (8192, 32), (16385, 16), (65537, 32), (16383, 16)):
        assert default_config(n, bits, backward=True).stages == 0, (n, bits)
    limits = limits_for("sm_90a")
    for bits in (16, 32):
        for n in list(range(1, 300, 7)) + [4095, 8192, 8200, 12288, 16383, 16384, 16385, 65537, 262144]:
            default_config(n, bits, backward=True).validate(n, bits, limits, backward=True)


# --------------------------------------------------------------------------- cluster-staged backward


def test_cluster_staged_validate_and_candidates():
    """stages with a cluster: the mbar exchange only, N divisible into chunks of a multiple
    of 16 bytes, each CTA's chunk stages within the SM's shared memory; every long-row
    candidate validates for sm_90a and is offered by candidate_configs."""
    from cuteforge.arch import limits_for
    from cuteforge.kernels.norm.config import (
        cluster_staged_config,
        longrow_staged_candidates,
        staged_stages,
    )

    limits = limits_for("sm_90a")
    with pytest.raises(ValueError, match="mbar"):
        NormConfig(512, 512, 2, 1, stages=2).validate(32768, 16, backward=True)
    with pytest.raises(ValueError, match="multiple of 16 bytes"):
        NormConfig(512, 512, 4, 1, exchange="mbar", stages=2).validate(32772, 16, backward=True)
    with pytest.raises(ValueError, match="exceed"):  # 2 x 3 stages of 2 x 32 KiB
        NormConfig(512, 512, 2, 2, exchange="mbar", stages=3).validate(32768, 16, limits, backward=True)
    # each CTA stages only its chunk: 2 CTAs of 16384 elements hold 3 stages of 64 KiB
    assert NormConfig(512, 512, 2, 1, exchange="mbar", stages=3).smem_bytes(32768, True, 16) < 200 * 1024
    assert cluster_staged_config(32768, 16) == NormConfig(512, 512, 2, 1, exchange="mbar", stages=3)
    assert cluster_staged_config(65537, 16) is None
    for bits in (16, 32):
        for n in (32768, 65536, 131072, 262144):
            cands = longrow_staged_candidates(n, bits)
            assert cands
            for c in cands:
                assert c.stages >= 1 and c.cluster_n > 1 and c.exchange == "mbar" and c.rows_per_cta == 1
                c.validate(n, bits, limits, backward=True)
                assert 1 <= staged_stages(c, n, bits, True) <= c.stages
                assert c.smem_bytes(n, True, bits, True) <= limits.smem_per_block
            offered = candidate_configs(n, bits, backward=True)
            assert any(c.stages and c.cluster_n > 1 for c in offered), (n, bits)


# (kind, x dtype, weight dtype, n, bias, dsum, config): rms / layer, fused dsum (fewer
# stages), fp32 weight, fp32 x at one stage of 64 KiB rows (N = 262144 over 16 CTAs),
# 2 CTAs per SM on a 256-thread cluster
_BWD_CSTAGED = [
    ("rms", "bfloat16", "bfloat16", 32768, False, False, NormConfig(512, 512, 2, 1, exchange="mbar", stages=3)),
    ("layer", "bfloat16", "bfloat16", 65536, True, True, NormConfig(512, 512, 4, 1, exchange="mbar", stages=3)),
    ("layer", "float16", "float32", 131072, True, False, NormConfig(512, 512, 8, 1, exchange="mbar", stages=3)),
    ("layer", "float32", "float32", 262144, True, False, NormConfig(512, 512, 16, 1, exchange="mbar", stages=1)),
    ("rms", "bfloat16", "bfloat16", 32768, False, True, NormConfig(256, 256, 4, 2, exchange="mbar", stages=3)),
]


@pytest.mark.parametrize("kind, xd, wd, n, bias, dsum, cfg", _BWD_CSTAGED)
def test_compile_bwd_cluster_staged(kernels, kind, xd, wd, n, bias, dsum, cfg):
    """Per stage one bulk copy per operand chunk (N / cluster_n elements), the row sums
    through st.async on the exchange mbarriers (no cluster barrier in the row loop, only the
    one arrive / wait pair of the prologue), no local memory (no spill)."""

    from cuteforge.kernels.norm.config import staged_stages

    _, bwd = kernels
    bits = 32 if xd == "float32" else 16
    vx = 16 // (bits // 8)
    vw = min(vx, 16 // (4 if wd == "float32" else 2))
    dts = (xd, wd, xd, xd, "float32", "float32", xd, "float32", "float32")
    _, ptx = _compile(bwd, dts, n, (vx, vw, vx, vx, 4, 4, vx, 4, 4),
                      {"kind": kind, "has_bias": bias, "has_dsum": dsum}, cfg)
    s = staged_stages(cfg, n, bits, dsum)
    rows = 3 if dsum else 2
    bulk = re.findall(r"cp\.async\.bulk\.shared::cluster\.global\.mbarrier::complete_tx::bytes", ptx)
    assert len(bulk) in (rows * (s + 1), rows * (s + 1) + 1), len(bulk)  # (+ the weight's)
    assert len(re.findall(r"mbarrier\.init", ptx)) == s + 1 + 2
    assert len(re.findall(r"st\.async", ptx)) == (2 if kind == "layer" else 1)
    assert len(re.findall(r"barrier\.cluster\.arrive", ptx)) == 1
    assert len(re.findall(r"barrier\.cluster\.wait", ptx)) == 1
    assert "%cluster_ctarank" in ptx
    ptxas_no_spill(ptx)


# --------------------------------------------------------------------------- staged forward (not a default)


def test_staged_fwd_validate_and_candidates():
    """stages on the forward: one row per CTA, the mbar exchange with a cluster, chunks of a
    multiple of 16 bytes, shared memory per CTA and per SM, no early_weight; the candidates
    validate for sm_90a; until they have run on a GPU the autotuner's list and the
    defaults do not include them."""
    from cuteforge.arch import limits_for
    from cuteforge.kernels.norm.config import (
        longrow_staged_fwd_candidates,
        staged_fwd_groups,
        staged_rows,
        staged_stages,
    )

    limits = limits_for("sm_90a")
    ok = NormConfig(512, 512, 4, 1, exchange="mbar", stages=3)
    ok.validate(65536, 16, limits)
    with pytest.raises(ValueError, match="one row per CTA"):
        NormConfig(256, 128, 1, 1, stages=2).validate(4096, 16)
    with pytest.raises(ValueError, match="mbar"):
        NormConfig(512, 512, 4, 1, stages=2).validate(65536, 16)
    with pytest.raises(ValueError, match="multiple of 16 bytes"):
        NormConfig(512, 512, 4, 1, exchange="mbar", stages=2).validate(65540, 16)
    with pytest.raises(ValueError, match="multiple of 16 bytes"):
        NormConfig(512, 512, 1, 1, stages=2).validate(16383, 16)
    with pytest.raises(ValueError, match="exceed"):  # 2 CTAs x 3 stages of 64 KiB chunks
        NormConfig(512, 512, 4, 2, exchange="mbar", stages=3).validate(131072, 16, limits)
    with pytest.raises(ValueError, match="KiB|exceed"):  # one CTA: 4 stages of 128 KiB
        NormConfig(1024, 1024, 2, 1, exchange="mbar", stages=4).validate(131072, 16, limits)
    with pytest.raises(ValueError, match="early_weight"):
        NormConfig(512, 512, 4, 1, exchange="mbar", stages=2, early_weight=True).validate(65536, 16)
    assert staged_rows(False, False) == 1 and staged_rows(False, True) == 2 and staged_rows(True, True) == 3
    # the residual doubles a stage: fewer stages where three would not fit the SM
    c = NormConfig(512, 512, 2, 1, exchange="mbar", stages=3)
    assert staged_stages(c, 32768, 16, False, backward=False) == 3
    assert staged_stages(c, 32768, 16, True, backward=False) == 3  # 3 x 2 x 32 KiB
    assert staged_stages(NormConfig(512, 512, 16, 1, exchange="mbar", stages=3), 262144, 32, True, backward=False) == 1
    assert staged_fwd_groups(ok, 132) == 33 and staged_fwd_groups(ok, 132, 30) == 30
    assert staged_fwd_groups(NormConfig(256, 256, 1, 2, stages=2), 132) == 264
    for bits in (16, 32):
        for n in (4096, 8192, 16384, 32768, 65536, 131072, 262144):
            cands = longrow_staged_fwd_candidates(n, bits)
            assert cands, (n, bits)
            for c in cands:
                assert c.stages >= 1 and c.rows_per_cta == 1 and (c.cluster_n == 1 or c.exchange == "mbar")
                c.validate(n, bits, limits)
                assert 1 <= staged_stages(c, n, bits, True, backward=False) <= c.stages
                assert c.smem_bytes(n, False, bits, True) <= limits.smem_per_block
            # measured: from N = 32768 the autotuner also times a staged forward
            assert any(c.stages for c in candidate_configs(n, bits)) == (n >= 32768), (n, bits)
    assert longrow_staged_fwd_candidates(65537, 16) == []


def _compile_fwd_case(fwd, kind, xd, wd, n, bias, res, cfg):
    """(x dtype bits, the kernel's vector width, PTX) of the forward for one case: 16-byte
    vectors per operand (x's width for every operand when the weight is wider)."""
    bits = 32 if xd == "float32" else 16
    vx = 16 // (bits // 8)
    vw = min(vx, 16 // (4 if wd == "float32" else 2))
    dts = (xd, wd, wd, xd, xd, xd, "float32", "float32")
    _, ptx = _compile(fwd, dts, n, (vx, vw, vw, vx, vx, vx, 4, 4),
                      {"kind": kind, "eps": 1e-5, "has_bias": bias, "has_residual": res}, cfg)
    return bits, min(vx, vw), ptx


# (kind, x dtype, weight dtype, n, bias, residual, config): rms / layer with and without bias
# and residual, bf16 / fp32 (and an fp32 weight on 16-bit x) at N = 32768 and 262144 on a
# cluster, one one-CTA row (N = 8192)
_FWD_STAGED = [
    ("rms", "bfloat16", "bfloat16", 32768, False, False, NormConfig(256, 256, 4, 2, exchange="mbar", stages=3)),
    ("rms", "bfloat16", "bfloat16", 32768, False, True, NormConfig(512, 512, 2, 1, exchange="mbar", stages=3)),
    ("layer", "bfloat16", "bfloat16", 32768, True, True, NormConfig(256, 256, 4, 2, exchange="mbar", stages=3)),
    ("layer", "bfloat16", "float32", 32768, False, False, NormConfig(512, 512, 2, 1, exchange="mbar", stages=2)),
    ("rms", "float32", "float32", 32768, False, True, NormConfig(512, 512, 2, 1, exchange="mbar", stages=3)),
    ("layer", "float32", "float32", 32768, True, False, NormConfig(256, 256, 4, 2, exchange="mbar", stages=3)),
    ("rms", "bfloat16", "bfloat16", 262144, False, False, NormConfig(512, 512, 16, 1, exchange="mbar", stages=3)),
    ("layer", "bfloat16", "bfloat16", 262144, True, True, NormConfig(1024, 1024, 16, 1, exchange="mbar", stages=3)),
    ("rms", "float32", "float32", 262144, False, True, NormConfig(512, 512, 16, 1, exchange="mbar", stages=3)),
    ("layer", "float32", "float32", 262144, True, True, NormConfig(512, 512, 16, 1, exchange="mbar", stages=2)),
    # an fp32 weight and bias that do not fit beside the stages, held in registers
    ("layer", "float32", "float32", 262144, True, False, NormConfig(512, 512, 16, 1, exchange="mbar", stages=3)),
    ("layer", "float16", "float16", 8192, True, True, NormConfig(256, 256, 1, 2, stages=2)),
    # the LayerNorm 16-bit defaults: weight and bias held in registers across rows
    ("layer", "bfloat16", "bfloat16", 262144, True, False, NormConfig(256, 256, 16, 1, exchange="mbar", stages=4)),
    ("layer", "float16", "float16", 65536, True, True, NormConfig(512, 512, 4, 1, exchange="mbar", stages=4)),
    ("layer", "bfloat16", "bfloat16", 32768, True, False, NormConfig(1024, 1024, 2, 1, exchange="mbar", stages=4)),
    # the lagged LayerNorm defaults, with and without the residual
    ("layer", "bfloat16", "bfloat16", 262144, True, False, NormConfig(256, 256, 16, 1, exchange="mbar", stages=3, lag=1)),
    ("layer", "float32", "float32", 131072, True, False, NormConfig(256, 256, 16, 1, exchange="mbar", stages=3, lag=1)),
    ("layer", "float16", "float16", 262144, True, True, NormConfig(256, 256, 16, 1, exchange="mbar", stages=3, lag=1)),
    ("layer", "bfloat16", "bfloat16", 65536, True, False, NormConfig(512, 512, 4, 3, exchange="mbar", stages=2, lag=1)),
    # the H200's lagged picks (two CTAs per SM on 16 KiB chunks; four stages)
    ("layer", "bfloat16", "bfloat16", 65536, True, False, NormConfig(256, 256, 8, 2, exchange="mbar", stages=3, lag=1)),
    ("layer", "float16", "float16", 262144, True, False, NormConfig(256, 256, 16, 1, exchange="mbar", stages=4, lag=1)),
    ("layer", "float32", "float32", 131072, True, False, NormConfig(512, 512, 16, 1, exchange="mbar", stages=6, lag=1)),
    # short_chains, the 16-bit 262144 default's, and unlagged / fp32 / a residual
    ("layer", "bfloat16", "bfloat16", 262144, True, False,
     NormConfig(256, 256, 16, 1, exchange="mbar", stages=4, lag=1, short_chains=True)),
    ("layer", "float16", "float16", 65536, True, True, NormConfig(256, 256, 4, 1, exchange="mbar", stages=2, short_chains=True)),
    ("layer", "float32", "float32", 131072, False, False,
     NormConfig(512, 512, 16, 1, exchange="mbar", stages=6, lag=1, short_chains=True)),
]


def test_short_chains_config(kernels):
    """`short_chains` is a knob of the staged forward over a cluster, set by the
    default only for 16-bit LayerNorm at N = 262144 without a residual (the bar cell, its
    largest gain), with the same config without it among the tuner's candidates. Its
    kernel divides once a CTA where the plain one divides once a row (the loop counts
    rows), and folds y's normalisation: one fewer FP32 subtract a 16-bit element, so fewer
    sub.f32 in the PTX."""
    ok = NormConfig(256, 256, 16, 1, exchange="mbar", stages=4, lag=1, short_chains=True)
    ok.validate(262144, 16)
    for bad, n in ((replace(ok, cluster_n=1, exchange="barrier", lag=0), 8192), (replace(ok, stages=0, lag=0), 65536)):
        with pytest.raises(ValueError, match="short_chains"):
            bad.validate(n, 16)
    with pytest.raises(ValueError, match="short_chains"):
        replace(ok, lag=0).validate(262144, 16, backward=True)
    for kind, bits, n, residual in (("layer", 16, 262144, False), ("layer", 16, 262144, True), ("layer", 32, 262144, False),
                                    ("layer", 16, 131072, False), ("layer", 16, 196608, False), ("rms", 16, 262144, False),
                                    ("layer", 16, 32768, False)):
        d = default_config(n, bits, kind=kind, residual=residual)
        assert d.short_chains == ((kind, bits, n, residual) == ("layer", 16, 262144, False)), (kind, bits, n, residual, d)
    d = default_config(262144, 16, kind="layer")
    assert replace(d, short_chains=False) in candidate_configs(262144, 16, kind="layer")[:3]
    _, _, short = _compile_fwd_case(kernels[0], "layer", "bfloat16", "bfloat16", 262144, True, False, ok)
    _, _, plain = _compile_fwd_case(kernels[0], "layer", "bfloat16", "bfloat16", 262144, True, False,
                                    replace(ok, short_chains=False))

    def count(p: str, ptx: str) -> int:
        return len(re.findall(p, ptx))

    assert count(r"\bdiv\.[su]32", short) < count(r"\bdiv\.[su]32", plain), (
        count(r"\bdiv\.[su]32", short), count(r"\bdiv\.[su]32", plain))
    assert count(r"\bsub(\.rn)?\.f32", short) < count(r"\bsub(\.rn)?\.f32", plain)


@pytest.mark.parametrize("kind, xd, wd, n, bias, res, cfg", _FWD_STAGED)
def test_compile_fwd_staged(kernels, kind, xd, wd, n, bias, res, cfg):
    """Per stage one bulk copy per staged operand chunk (x, residual) in the prologue and one
    set per refill (+ one per weight / bias when they sit in shared memory), S + 1 stage
    mbarriers (+ the exchange's two, four when lagged), parity waits, with a cluster the row
    sums through st.async (one per reduction: 1 rms, 2 layer) and only the prologue's
    cluster barrier, no local memory (no spill)."""

    from cuteforge.kernels.norm.config import staged_rows, staged_stages

    bits, vec, ptx = _compile_fwd_case(kernels[0], kind, xd, wd, n, bias, res, cfg)
    s = staged_stages(cfg, n, bits, res, backward=False)
    rows = staged_rows(False, res)
    n_w = 2 if bias else 1
    bulk = re.findall(r"cp\.async\.bulk\.shared::cluster\.global\.mbarrier::complete_tx::bytes", ptx)
    assert len(bulk) in (rows * (s + 1), rows * (s + 1) + n_w), len(bulk)
    c = cfg.cluster_n
    lagged = bool(cfg.lag)  # four exchange mbarriers
    assert len(re.findall(r"mbarrier\.init", ptx)) == s + 1 + ((4 if lagged else 2) if c > 1 else 0)
    assert "mbarrier.try_wait.parity" in ptx and "mbarrier.arrive.expect_tx" in ptx
    assert re.search(r"ld\.shared\.v[24]", ptx)
    if c > 1:
        # rms: one value per row; layer: one exchange of the per-warp (sum, M2) pair
        assert len(re.findall(r"st\.async", ptx)) == (2 if kind == "layer" else 1)
        assert len(re.findall(r"barrier\.cluster\.arrive", ptx)) == 1
        assert len(re.findall(r"barrier\.cluster\.wait", ptx)) == 1
        assert "%cluster_ctarank" in ptx
    else:
        assert not re.search(r"barrier\.cluster|st\.shared::cluster|st\.async", ptx)
    info = ptxas_no_spill(ptx)
    regs = int(re.search(r"Used (\d+) registers", info).group(1))
    assert regs * cfg.threads * cfg.ctas_per_sm <= 65536, regs


@pytest.mark.parametrize("xd, res", [("float32", False), ("float32", True), ("bfloat16", False), ("bfloat16", True)])
def test_held_fp32_weight_never_spills(kernels, xd, res):
    """Every staged forward candidate of LayerNorm at N = 262144 with an fp32 weight and bias
    (fp32 x, or bf16 x: chunks the weight does not fit beside: the default holds it in registers
    within half the budget) assembles with no local memory, residual fused or not."""
    from cuteforge.kernels.norm.config import longrow_staged_fwd_candidates

    bits = 32 if xd == "float32" else 16
    cands = longrow_staged_fwd_candidates(262144, bits)
    assert cands
    for cfg in cands:
        _, _, ptx = _compile_fwd_case(kernels[0], "layer", xd, "float32", 262144, True, res, cfg)
        info = ptxas_no_spill(ptx)
        regs = int(re.search(r"Used (\d+) registers", info).group(1))
        assert regs * cfg.threads * cfg.ctas_per_sm <= 65536, (cfg, regs)


def test_staged_fwd_misaligned_rows_build_the_register_path(kernels):
    """A staged forward config on rows that are not 16-byte aligned builds the register
    forward's default instead (no bulk copies)."""
    fwd, _ = kernels
    cfg = NormConfig(512, 512, 4, 1, exchange="mbar", stages=3)
    d, f = "bfloat16", "float32"
    _, ptx = _compile(fwd, (d, d, d, d, d, d, f, f), 65536, (4, 4, 4, 4, 4, 4, 4, 4),
                      {"kind": "rms", "eps": 1e-6, "has_bias": False, "has_residual": False}, cfg)
    assert "cp.async.bulk" not in ptx


# --------------------------------------------------------------------------- cp_async register forward

# (kind, x dtype, weight dtype, n, bias, residual, config): rms / layer, bf16 / fp32, cluster
# rows, a one-CTA row with a partial round (N = 4104), levels 2 (weight and bias through
# shared memory too) and 1 (the row only), register budgets (ctas_per_sm), an fp32 weight on
# bf16 x (8-byte vectors: built without cp_async), shares too large for a CTA (likewise)
_FWD_ASYNC = [
    ("rms", "bfloat16", "bfloat16", 32768, False, False, NormConfig(256, 256, 4, 1, exchange="mbar", cp_async=2)),
    ("rms", "bfloat16", "bfloat16", 65536, False, True, NormConfig(256, 256, 8, 5, exchange="mbar", cp_async=2)),
    ("layer", "bfloat16", "bfloat16", 65536, True, False, NormConfig(256, 256, 8, 5, exchange="mbar", cp_async=2)),
    ("layer", "bfloat16", "bfloat16", 65536, True, True, NormConfig(256, 256, 8, 5, exchange="mbar", cp_async=1)),
    ("layer", "bfloat16", "bfloat16", 262144, True, True, NormConfig(256, 256, 16, 1, exchange="mbar", cp_async=2)),
    ("layer", "bfloat16", "bfloat16", 262144, True, False, NormConfig(256, 256, 16, 4, exchange="mbar", cp_async=1)),
    ("layer", "float32", "float32", 262144, True, False, NormConfig(256, 256, 16, 1, exchange="mbar", cp_async=2)),
    ("rms", "float32", "float32", 65536, False, True, NormConfig(256, 256, 8, 1, exchange="mbar", cp_async=2)),
    # x, residual, weight (and bias) shares of 512 threads x 32 fp32: 256 KiB, more than a CTA may have
    ("rms", "float32", "float32", 65536, False, True, NormConfig(512, 512, 4, 1, exchange="mbar", cp_async=2)),
    ("layer", "float16", "float16", 4104, True, True, NormConfig(256, 128, 1, 2, cp_async=2)),
    ("rms", "bfloat16", "float32", 32768, False, False, NormConfig(256, 256, 4, 1, exchange="mbar", cp_async=2)),
]


@pytest.mark.parametrize("kind, xd, wd, n, bias, res, cfg", _FWD_ASYNC)
def test_compile_fwd_cp_async(kernels, kind, xd, wd, n, bias, res, cfg):
    """cp_async: the row operands (x, residual; level 2: weight, bias) come in by 16-byte
    cp.async.cg (level 2: two commit groups, waited 1 then 0), read back from shared memory,
    never loaded straight into registers; with ctas_per_sm > 1 the registers fit that many
    CTAs; no spill. An 8-byte x vector, or shares that would not fit a CTA's shared memory,
    build the plain register path."""
    from cuteforge.kernels.norm.config import SMEM_PER_BLOCK

    bits, vec, ptx = _compile_fwd_case(kernels[0], kind, xd, wd, n, bias, res, cfg)
    if vec * bits != 128 or cfg.smem_bytes(n, False, bits, res) > SMEM_PER_BLOCK:
        assert "cp.async" not in ptx
        return
    copies = re.findall(r"cp\.async\.cg\.shared\.global(?:\.L2::128B)? \[", ptx)
    rounds = -(-n // (cfg.threads_per_row * cfg.cluster_n * vec))
    arrays = (2 if res else 1) + ((2 if bias else 1) if cfg.cp_async == 2 else 0)
    assert len(copies) == arrays * rounds, (len(copies), arrays, rounds)
    groups = 2 if cfg.cp_async == 2 else 1
    assert len(re.findall(r"cp\.async\.commit_group", ptx)) == groups
    assert re.search(r"cp\.async\.wait_group\s+0", ptx)
    assert bool(re.search(r"cp\.async\.wait_group\s+1", ptx)) == (groups == 2)
    loads = len(re.findall(r"ld\.global[.a-zA-Z0-9:_]*\.v4\.", ptx))
    assert loads == (0 if cfg.cp_async == 2 else (2 if bias else 1) * rounds), loads  # only weight / bias
    assert re.search(r"ld\.shared\.v4", ptx)
    if cfg.cluster_n > 1:
        assert len(re.findall(r"st\.async", ptx)) == (2 if kind == "layer" else 1)
    info = ptxas_no_spill(ptx)
    regs = int(re.search(r"Used (\d+) registers", info).group(1))
    assert regs * cfg.threads * max(1, cfg.ctas_per_sm - res) <= 65536, regs  # (one CTA fewer with the residual)


# --------------------------------------------------------------------------- part-ring backward


def test_ring_validate_slots_and_candidates():
    """NormConfig.parts: a knob of the staged backward only, chunks of whole rounds, at
    least parts + 1 slots; ring_slots fits the ring to the SM; the long-row candidates offer
    the ring only where whole-row stages leave one stage and the weight fits beside it."""
    from cuteforge.kernels.norm.config import longrow_staged_candidates, ring_config, ring_slots

    ok = NormConfig(512, 512, 16, 1, exchange="mbar", stages=2, parts=8)
    ok.validate(262144, 32, backward=True)
    # 2 x 64 KiB chunks of fp32 x / dy in 8 parts of 16 KiB: 13 slots fit, 9 beside the weight
    assert ring_slots(ok, 262144, 32, False) == 13
    assert ring_slots(ok, 262144, 32, False, reserve=64 * 1024 + 256) == 9
    assert ring_slots(ok, 262144, 32, True) == 9  # dsum: 24 KiB parts
    with pytest.raises(ValueError, match="parts=8"):
        NormConfig(512, 512, 16, 1, exchange="mbar", parts=8).validate(262144, 32, backward=True)  # no stages
    with pytest.raises(ValueError, match="parts=8"):
        NormConfig(512, 512, 16, 1, exchange="mbar", stages=2, parts=8).validate(262144, 32)  # forward
    with pytest.raises(ValueError, match="parts=3"):
        NormConfig(512, 512, 16, 1, exchange="mbar", stages=2, parts=3).validate(262144, 32, backward=True)
    with pytest.raises(ValueError, match="whole|multiple of threads"):
        NormConfig(512, 512, 16, 1, exchange="mbar", stages=2, parts=16).validate(262144, 32, backward=True)
    assert ring_config(NormConfig(512, 512, 16, 1, exchange="mbar", stages=1), 262144, 32, 4) is None  # 4 slots < 5
    cands = longrow_staged_candidates(262144, 32)
    assert [c.parts for c in cands if c.parts] == [8]
    assert not any(c.parts for n in (32768, 131072) for bits in (16, 32) for c in longrow_staged_candidates(n, bits))


# (kind, x dtype, weight dtype, n, bias, dsum, config, ring slots or 0 for the whole-row fallback)
_BWD_RING = [
    ("layer", "float32", "float32", 262144, True, False, NormConfig(512, 512, 16, 1, exchange="mbar", stages=2, parts=8), 9),
    ("rms", "float32", "float32", 262144, False, False, NormConfig(512, 512, 16, 1, exchange="mbar", stages=2, parts=8), 9),
    ("layer", "float32", "float32", 262144, True, True, NormConfig(512, 512, 16, 1, exchange="mbar", stages=2, parts=8), 0),
    ("rms", "bfloat16", "float32", 16384, False, True, NormConfig(512, 512, 1, 1, stages=2, parts=4), 6),
]


@pytest.mark.parametrize("kind, xd, wd, n, bias, dsum, cfg, slots", _BWD_RING)
def test_compile_bwd_ring(kernels, kind, xd, wd, n, bias, dsum, cfg, slots):
    """The PTX of the part ring: 2 L + 1 mbarriers (full and empty per slot, the weight's;
    + 2 exchange mbarriers with a cluster), the prologue's L parts of each operand and the
    weight bulk-copied, one refill site per part, per-warp arrives on the empty barriers, no
    spill; without room for parts + 1 slots beside the weight (dsum) the whole-row staged
    kernel is built instead."""
    _, bwd = kernels
    vx = 16 // (4 if xd == "float32" else 2)
    vw = min(vx, 16 // (4 if wd == "float32" else 2))
    dts = (xd, wd, xd, xd, "float32", "float32", xd, "float32", "float32")
    _, ptx = _compile(bwd, dts, n, (vx, vw, vx, vx, 4, 4, vx, 4, 4), {"kind": kind, "has_bias": bias, "has_dsum": dsum}, cfg)
    inits = len(re.findall(r"mbarrier\.init", ptx))
    bulk = len(re.findall(r"cp\.async\.bulk\.shared::cluster\.global\.mbarrier::complete_tx::bytes", ptx))
    arrives = len(re.findall(r"mbarrier\.arrive\.(?:shared|release|b64)", ptx))
    rows = 3 if dsum else 2
    xbars = 2 if cfg.cluster_n > 1 else 0
    if slots:
        assert inits == 2 * slots + 1 + xbars, inits
        assert bulk == rows * (slots + cfg.parts) + 1, bulk  # prologue, one refill site per part, weight
        assert arrives == cfg.parts, arrives  # one release per part of the row
    else:
        assert inits < 2 * cfg.parts + 1, inits  # the staged kernel: one full mbarrier per stage
    ptxas_no_spill(ptx)


def test_lagged_holds_16bit_weight_as_loaded(kernels):
    """LayerNorm bf16 at N = 262144 lagged on 2 CTAs per SM (128 registers: no room
    for fp32 copies of the 64 weight and bias values a thread owns, nor shared memory beside
    the stages) holds them as loaded: their global loads are the prologue's 8 + 8 16-byte
    vectors only, where the weight read per row puts them at both of the lagged loop's
    finish sites (32); within the 2-CTA register budget, at most a small spill."""
    cfg = NormConfig(256, 256, 16, 2, exchange="mbar", stages=3, lag=1)
    _, _, ptx = _compile_fwd_case(kernels[0], "layer", "bfloat16", "bfloat16", 262144, True, False, cfg)
    assert len(re.findall(r"ld\.global", ptx)) == 16
    from ptxas_check import ptxas_report

    info = ptxas_report(ptx)
    regs = int(re.search(r"Used (\d+) registers", info).group(1))
    spill = int(re.search(r"(\d+) bytes spill stores", info).group(1))
    assert regs <= 128 and spill <= 64, info[-400:]
    # the unlagged form holds x across the exchange: it keeps reading the weight per row
    unlagged = NormConfig(256, 256, 16, 2, exchange="mbar", stages=2)
    _, _, ptx = _compile_fwd_case(kernels[0], "layer", "bfloat16", "bfloat16", 262144, True, False, unlagged)
    assert "0 bytes spill stores" in ptxas_report(ptx)
