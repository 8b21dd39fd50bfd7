"""sm_90a GEMM on a machine without a GPU: configs, compiles of representative
specializations (PTX must hold wgmma, TMA and the fused math), argument errors."""

from __future__ import annotations

import math
import re
from dataclasses import replace
from typing import Any

import pytest
import torch

from cuteforge import compiler
from cuteforge.arch import limits_for
from cuteforge.kernels.gemm.epilogue import GemmEpilogue
from cuteforge.kernels.gemm.sm90.config import GemmConfig, candidate_configs, default_config
from cuteforge.kernels.gemm.spec import gemm_kernel, kernel_name
from cuteforge.signature import BoundKey

H100 = limits_for("sm_90a")


def _ptx(a_k: bool, b_k: bool, dtypes: tuple[str, ...], epi: GemmEpilogue | None = None, cfg: GemmConfig | None = None) -> str:
    kinds = epi.kinds if epi else ()
    k = gemm_kernel(a_k, b_k, kinds)
    vecs = tuple(4 if d == "float32" else 8 for d in dtypes)
    # a, b, out, the int32 stream-K workspace, then the epilogue operands
    key = BoundKey((*dtypes[:3], "int32", *dtypes[3:]), (), (*vecs[:3], 4, *vecs[3:]))
    params = (("sms", 132),) + ((("epilogue", epi.key),) if epi else ())
    spec = k.spec(key, tuple(sorted(params)), cfg, arch="sm_90a")
    res = compiler.compile_jit(k.builder(spec), k.signature.fake_args(key), "sm_90a", keep_artifacts=True)
    assert res.ptx
    return res.ptx


def test_plain_bf16_tn_default_config() -> None:
    ptx = _ptx(True, True, ("bfloat16",) * 3)
    assert "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16" in ptx
    assert "cp.async.bulk.tensor" in ptx and "multicast" in ptx  # 2x1 cluster: B multicast
    assert "stmatrix" in ptx and "setmaxnreg" in ptx


def test_bias_loaded_once_per_distinct_offset() -> None:
    """A column (row) bias is loaded once per distinct column (row) a thread's accumulator
    values sit in, not once per value: on the cooperative 128x256 tile a thread holds
    128 values per tile, in 64 columns, and per 64x32 subtile 2 rows (8 subtiles)."""
    cfg = GemmConfig()
    loads = {kind: len(re.findall(r"\bld\.global", _ptx(True, True, ("bfloat16",) * 4, GemmEpilogue.preset("none", bias=kind), cfg)))
             for kind in ("col", "row")}
    assert loads == {"col": 64, "row": 16}, loads


def test_epilogue_operands_load_into_32_bit_registers() -> None:
    """16-bit epilogue operands are loaded each zero-extended into a 32-bit register and
    converted where they are used: in 16-bit registers they were packed in pairs
    (PRMT) right after their loads, and the packing waits for the loads. With
    early_operands (the default where the tile has at most 128 accumulators) a tile's
    bias is loaded while its mainloop runs; without it, one subtile ahead in the epilogue."""
    from cuteforge.kernels.gemm.sm90.config import SHORT_K

    cfg = default_config(6144, 6144, 6144, 132, fused=True)
    assert cfg.loads_operands_early and not replace(cfg, early_operands=False).loads_operands_early
    assert not SHORT_K.loads_operands_early and not GemmConfig(tile_m=256, tile_n=192).loads_operands_early
    assert not GemmConfig(tile_n=128, pingpong=True).loads_operands_early  # its epilogue overlaps already
    assert not replace(cfg, stream_k=True).loads_operands_early  # held across the fixup, they spilled

    def loads(c: GemmConfig, epi: GemmEpilogue, dtypes: tuple[str, ...]) -> dict[str, int]:
        ptx = _ptx(True, True, dtypes, epi, c)
        if epi is bias_gelu:  # the fused bar's epilogue: no spill either way
            from ptxas_check import ptxas_no_spill

            ptxas_no_spill(ptx)
        return {reg: len(re.findall(r"ld\.global\.b16\s+%" + reg + r"\d", ptx)) for reg in ("r", "rs")}

    bias_gelu = GemmEpilogue.preset("gelu", bias="col")
    for c in (cfg, replace(cfg, early_operands=False)):
        assert loads(c, bias_gelu, ("bfloat16",) * 4) == {"r": 64, "rs": 0}
    # a residual (full): 32 values a thread per 128x64 subtile, 4 subtiles
    res = GemmEpilogue.preset("none", residual=True)
    assert loads(cfg, res, ("bfloat16",) * 4) == {"r": 128, "rs": 0}
    # Stream-K tiles (8192x28672x4096: a last wave split along K) load the bias in the
    # epilogue even where early_operands asks otherwise: held from the mainloop across the
    # partial-sum fixup, ptxas spilled 144 bytes. The stream-K fused default
    # takes 32-wide subtiles with late loads.
    sk = default_config(8192, 28672, 4096, 132, fused=True)
    assert sk.stream_k and (sk.epi_n, sk.early_operands) == (32, False)
    for c in (sk, replace(sk, epi_n=64, early_operands=True)):
        assert not c.loads_operands_early
        assert loads(c, bias_gelu, ("bfloat16",) * 4) == {"r": 64, "rs": 0}


def test_fused_bias_gelu_and_fusion_epilogue() -> None:
    ptx = _ptx(True, True, ("bfloat16",) * 4, GemmEpilogue.preset("gelu", bias="col"))
    assert "tanh.approx.f32" in ptx
    from cuteforge.fusion import Epilogue, silu

    ep = Epilogue.from_fn(lambda acc, s, r: silu(acc * s) + r, s="row", r="full")
    ptx = _ptx(False, False, ("float16", "float16", "float32", "float32", "bfloat16"), GemmEpilogue.from_fusion(ep))
    assert "wgmma.mma_async.sync.aligned.m64n256k16.f32.f16.f16" in ptx and ("ex2.approx" in ptx or "tanh.approx" in ptx)


def test_other_tiles_compile() -> None:
    ptx = _ptx(True, False, ("bfloat16", "bfloat16", "float32"), cfg=GemmConfig(tile_m=256, tile_n=128))
    assert "m64n128k16" in ptx
    ptx = _ptx(False, True, ("bfloat16",) * 3, cfg=GemmConfig(tile_m=64, tile_n=128, cluster_m=1, cluster_n=2))
    assert "m64n128k16" in ptx
    # Pingpong: the mainloop turn passes between warpgroups through named barriers 3/4.
    ptx = _ptx(True, True, ("bfloat16",) * 4, GemmEpilogue.preset("silu", bias="col"), GemmConfig(tile_n=128, pingpong=True))
    assert "m64n128k16" in ptx and "bar.arrive" in ptx


def test_192_accumulator_tiles_assemble_without_spill() -> None:
    """Tiles of 192 fp32 accumulators per consumer thread (pingpong 128x192, the short-K
    default, and the cooperative 256x192 candidate) fit the 232 registers
    setmaxnreg gives a consumer warpgroup: no spill, and no wgmma serialized by a
    warpgroup.arrive that ptxas injects (C7519), plain or with bias + gelu."""
    from ptxas_check import ptxas_no_spill

    from cuteforge.kernels.gemm.sm90.config import SHORT_K

    gelu = GemmEpilogue.preset("gelu", bias="col")
    for epi, cfg in ((None, SHORT_K), (gelu, SHORT_K), (None, GemmConfig(tile_m=256, tile_n=192, raster="n"))):
        dtypes = ("bfloat16",) * (4 if epi else 3)
        ptx = _ptx(True, True, dtypes, epi, cfg)
        assert "m64n192k16" in ptx
        info = ptxas_no_spill(ptx)
        assert "C7519" not in info, (cfg, info[-600:])


def test_wide_accumulators_and_staging_buffers() -> None:
    """192 accumulators a thread validate, 256 do not; such tiles never hold converted
    stores (store_overlap); epi_bufs sets the staging buffers and so the ring's depth."""
    from cuteforge.kernels.gemm.sm90.config import SHORT_K

    assert SHORT_K.acc_regs == 192 and GemmConfig(tile_m=256, tile_n=192).acc_regs == 192
    assert GemmConfig().acc_regs == 128 and GemmConfig(tile_n=128, pingpong=True).acc_regs == 128
    for cfg in (SHORT_K, GemmConfig(tile_m=256, tile_n=192)):
        for out_b in (2, 4):
            cfg.validate(2, out_b, H100)
        assert not cfg.holds_stores(2)
    assert GemmConfig().holds_stores(2) and not GemmConfig().holds_stores(4)
    assert not GemmConfig(store_overlap=False).holds_stores(2)
    with pytest.raises(ValueError, match="256 accumulator registers"):
        GemmConfig(tile_n=256, pingpong=True).validate(2, 2, H100)
    for bad in (-1, 5):
        with pytest.raises(ValueError, match="epi_bufs"):
            GemmConfig(epi_bufs=bad).validate(2, 2, H100)
    # 128x192 pingpong: 4 buffers of 64x32 per warpgroup leave 4 stages of 40 KiB, 2 leave 5
    assert replace(SHORT_K, epi_bufs=0).resolved_stages(2, 2, H100) == 4
    assert SHORT_K.resolved_stages(2, 2, H100) == 5 and SHORT_K.epi_stages(2) == SHORT_K.epi_stages(4) == 2
    assert GemmConfig().epi_stages(2) == 4 and GemmConfig().epi_stages(4) == 2


def test_short_k_default_tile() -> None:
    """Short K with many tiles: pingpong 128x192 (5 stages) where its tiles fit the problem
    about as well as 128x128's, 128x128 where 192-wide tiles waste a wave (4096^2);
    fp8 keeps 128x128."""
    from cuteforge.kernels.gemm.sm90.config import (
        SHORT_K,
        SHORT_K_NARROW,
        fit_swizzle,
        tile_efficiency,
    )

    for m, n, k in ((16384, 16384, 1024), (8192, 8192, 512), (4096, 16384, 512), (16384, 4096, 1024)):
        assert default_config(m, n, k) == fit_swizzle(SHORT_K, m, n), (m, n, k)
        assert default_config(m, n, k, fused=True) == fit_swizzle(SHORT_K, m, n)
        assert default_config(m, n, k, in_bytes=1) == replace(fit_swizzle(SHORT_K_NARROW, m, n), tile_k=128)
    assert default_config(4096, 4096, 1024) == fit_swizzle(SHORT_K_NARROW, 4096, 4096)
    assert not default_config(8192, 8192, 2048).pingpong
    # 8192 = 64 row tiles in 32 pairs x 43 column tiles (the last a third full): 1376
    # clusters on 66 -> 21 rounds; the 128-wide tiles take 2048 -> 32 rounds of 66
    eff = tile_efficiency(fit_swizzle(SHORT_K, 8192, 8192), 8192, 8192, 132)
    assert eff == pytest.approx(8192 * 8192 / (21 * 66 * 256 * 192))
    assert tile_efficiency(GemmConfig(), 8192, 8192, 132) == pytest.approx(1024 / 1056)


def test_config_validation() -> None:
    GemmConfig().validate(2, 2, H100)
    assert GemmConfig().resolved_stages(2, 2, H100) == 4
    for bad in (GemmConfig(tile_m=96), GemmConfig(tile_n=264), GemmConfig(tile_m=256, tile_n=256),
                GemmConfig(cluster_m=4, cluster_n=2), GemmConfig(stages=6), GemmConfig(raster="x"),
                GemmConfig(tile_m=256, tile_n=128, pingpong=True), GemmConfig(tile_n=256, pingpong=True)):
        with pytest.raises(ValueError):
            bad.validate(2, 2, H100)
    with pytest.raises(ValueError, match="sm_90"):
        GemmConfig().validate(2, 2, limits_for("sm_80"))
    for c in candidate_configs(128, 4096):
        c.validate(2, 2, H100)
    assert default_config(16, 4096, 4096).tile_m == 64
    # stream-K only where the plan splits a last wave; a last wave more than half
    # full only where its ends are long: 8192^3's 34 of 66 clusters with ends
    # of 42 k-blocks, not 6144^3's 48 of 66 with 23, nor 4096^3's 58 of 66 with 5
    assert default_config(8192, 8192, 8192) == GemmConfig(stream_k=True, stream_k_ends=True)
    assert default_config(2048, 8192, 28672) == GemmConfig(stream_k=True, stream_k_ends=True)
    assert default_config(6144, 6144, 6144) == GemmConfig() == default_config(4096, 4096, 4096)
    assert not default_config(8192, 8192, 8192, 132, 1).stream_k_ends  # fp8: measured on 16-bit only
    # batched problems: the ends rule looks at the whole batch's last wave.
    # 2 x 8192^3 leaves 2 of 66 clusters in it (a split, not ends; the stream_k rule looks at
    # one batch's 34): whole tiles. 2 x 2048x8192x28672 (50 of 66, ends of 88) and 8 x
    # 1024x4096x16384 (one batch is 64 clusters, under a wave; 8 are 512) are cut into ends,
    # the fused default in the stream-K fused form.
    assert default_config(8192, 8192, 8192, batch=2) == GemmConfig()
    assert default_config(2048, 8192, 28672, batch=2) == GemmConfig(stream_k=True, stream_k_ends=True)
    assert default_config(1024, 4096, 16384, batch=8) == GemmConfig(stream_k=True, stream_k_ends=True)
    # the tile is chosen by the whole batch's tile count: 8 x 1024x2048 and
    # 32 x 256x512 take 128x256 2x1, as one problem of their total size would; alone,
    # 1024x2048 takes 128x128 and 256x512 128x64 pingpong
    assert default_config(1024, 2048, 4096, batch=8) == GemmConfig()
    assert default_config(256, 512, 4096, batch=32) == GemmConfig(swizzle=2)
    assert default_config(1024, 2048, 4096).tile_n == 128 and default_config(256, 512, 4096).pingpong
    assert default_config(1024, 4096, 16384) == GemmConfig()  # one batch alone: under a wave
    assert default_config(2048, 8192, 28672, fused=True, vector_operands=1, batch=2) == GemmConfig(
        raster="n", epi_n=32, early_operands=False, stream_k=True, stream_k_ends=True)
    # nor problems with no full wave (sub-wave split-K measured slower; ends unmeasured there):
    # 1024x3584x16384 is 56 clusters, ends of 35 if it were cut
    assert default_config(1024, 3584, 16384) == GemmConfig(swizzle=7)
    # whole_tiles (the JAX path: no workspace) takes no stream-K of any kind, and the fused
    # default keeps its whole-tile form
    assert default_config(8192, 8192, 8192, whole_tiles=True) == GemmConfig()
    assert default_config(8192, 8192, 8192, fused=True, whole_tiles=True) == GemmConfig(epi_n=64, raster="n")
    for m, n, k in ((16384, 16384, 16384), (16, 4096, 14336), (8192, 28672, 4096)):
        assert not default_config(m, n, k, fused=True, whole_tiles=True).stream_k, (m, n, k)
    assert default_config(16384, 16384, 16384).stream_k and default_config(3072, 3072, 16384).stream_k
    assert default_config(16384, 16384, 1024).pingpong and default_config(1024, 1024, 1024).tile_n == 64
    assert default_config(1024, 1024, 1024).pingpong and not default_config(128, 4096, 4096).pingpong
    # sub-wave 128x64 tiles multicast A (the 128-row operand) across an N pair;
    # a single N tile leaves nothing to pair along N, so B is shared along M instead
    assert (default_config(1024, 1024, 1024).cluster_m, default_config(1024, 1024, 1024).cluster_n) == (1, 2)
    assert (default_config(2048, 64, 1024).cluster_m, default_config(2048, 64, 1024).cluster_n) == (2, 1)
    # decode-sized M with long K: single 64x64 CTAs with stream-K; K = 4096 keeps the 1x2 pair,
    # M = 64 keeps it too, and fp8 keeps the pair (the rule was measured on 16-bit inputs)
    assert default_config(16, 4096, 14336) == GemmConfig(tile_m=64, tile_n=64, cluster_m=1, cluster_n=1, stream_k=True)
    assert default_config(32, 2048, 8192).stream_k and not default_config(16, 4096, 4096).stream_k
    assert default_config(16, 4096, 4096).cluster_n == 2 and default_config(64, 4096, 14336).cluster_n == 2
    assert not default_config(16, 4096, 14336, in_bytes=1).stream_k
    assert kernel_name(True, False, ("col",)) == "gemm_sm90_tt_col"


def test_op_argument_errors() -> None:
    from cuteforge.ops.gemm import gemm

    a = torch.randn(64, 32, dtype=torch.bfloat16)
    with pytest.raises(TypeError, match="a is bfloat16 but b is float16"):
        gemm(a, torch.randn(32, 16, dtype=torch.float16))
    with pytest.raises(ValueError, match="a has K=32.*b has K=31"):
        gemm(a, torch.randn(31, 16, dtype=torch.bfloat16))
    with pytest.raises(ValueError, match="'a' must be a CUDA tensor"):
        gemm(a, torch.randn(32, 16, dtype=torch.bfloat16))
    with pytest.raises(TypeError, match="'a' has dtype float32"):
        gemm(a.float(), a.float().t())
    with pytest.raises(ValueError, match="epilogue must be one of"):
        gemm(a, torch.randn(32, 16, dtype=torch.bfloat16), epilogue="tanh")
    with pytest.raises(TypeError, match="'b' must be a torch.Tensor"):
        gemm(a, [1, 2])


def _cpu(*shape: int, dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
    return torch.randn(*shape, dtype=dtype)


def test_op_operand_shapes_checked_before_devices() -> None:
    """Every operand's shape is checked (naming it) before the CUDA check, so these run
    on CPU tensors; a shape the op accepts reaches the device check."""
    from cuteforge.ops.gemm import gemm

    a, b = _cpu(6, 32), _cpu(32, 8)
    for ok in (_cpu(8), _cpu(1, 8), _cpu(6, 1)):  # per column, per column, per row
        with pytest.raises(ValueError, match="'a' must be a CUDA tensor"):
            gemm(a, b, bias=ok)
    # numel == N but not a per-column shape: reshaping it would be a silent wrong answer
    for bad in (_cpu(2, 4), _cpu(6), _cpu(3, 6, 1), _cpu(1, 1, 8)):
        with pytest.raises(ValueError, match="argument 'bias' must be a per-(column|row) operand"):
            gemm(a, b, bias=bad)
    # the error names the argument that is wrong (not the first preset slot)
    with pytest.raises(ValueError, match="argument 'residual' must be an operand that broadcasts to the output shape \\(6, 8\\)"):
        gemm(a, b, residual=_cpu(6, 7))
    with pytest.raises(ValueError, match="argument 'c' must be an operand that broadcasts"):
        gemm(a, b, c=_cpu(2, 6, 8))  # would make torch's result 3-D
    with pytest.raises(TypeError, match="argument 'c' must be a torch.Tensor"):
        gemm(a, b, c=1.0)
    with pytest.raises(TypeError, match="argument 'residual' has dtype float64"):
        gemm(a, b, residual=_cpu(6, 8, dtype=torch.float64))
    a3 = _cpu(3, 6, 32)
    with pytest.raises(ValueError, match="'a' must be a CUDA tensor"):
        gemm(a3, b, bias=_cpu(6, 1), residual=_cpu(3, 1, 8))
    with pytest.raises(ValueError, match="argument 'bias' must be a per-row operand"):
        gemm(a3, b, bias=_cpu(3, 6, 1))  # a per-batch row bias is not supported
    with pytest.raises(ValueError, match="batch sizes differ"):
        gemm(a3, _cpu(2, 32, 8))
    with pytest.raises(TypeError, match="out_dtype must be"):
        gemm(a, b, out_dtype=torch.float64)


def test_op_epilogue_and_config_errors() -> None:
    from cuteforge.fusion import Epilogue, Prologue, relu
    from cuteforge.ops.gemm import gemm

    a, b = _cpu(6, 32), _cpu(32, 8)
    ep = Epilogue.from_fn(lambda acc, s, t: relu(acc * s) * t, s="row", t="scalar")
    with pytest.raises(TypeError, match="alpha/beta belong to the preset"):
        gemm(a, b, epilogue=ep, epilogue_args={"s": _cpu(6), "t": 2.0}, alpha=2.0)  # was silently ignored
    with pytest.raises(ValueError, match="argument \"epilogue_args\\['s'\\]\" must be a per-row operand of shape \\(6,\\)"):
        gemm(a, b, epilogue=ep, epilogue_args={"s": _cpu(8), "t": 2.0})
    with pytest.raises(ValueError, match="'a' must be a CUDA tensor"):
        gemm(a, b, epilogue=ep, epilogue_args={"s": _cpu(6, 1), "t": 2.0})
    with pytest.raises(TypeError, match="missing \\['t'\\]"):
        gemm(a, b, epilogue=ep, epilogue_args={"s": _cpu(6)})
    with pytest.raises(TypeError, match="epilogue must be None, 'relu', 'gelu', 'silu' or a cuteforge.fusion.Epilogue, got Prologue"):
        gemm(a, b, epilogue=Prologue.from_fn(lambda x: relu(x)))
    four = Epilogue.from_fn(lambda acc, p, q, r, s: acc + p + q + r + s, p="col", q="col", r="col", s="col")
    with pytest.raises(ValueError, match="at most 3 tensor operands"):
        gemm(a, b, epilogue=four, epilogue_args={n: _cpu(8) for n in "pqrs"})
    with pytest.raises(TypeError, match="'alpha' must be a Python number"):
        gemm(a, b, alpha=torch.tensor(2.0))
    with pytest.raises(TypeError, match="config must be a GemmConfig"):
        gemm(a, b, config={"tile_m": 128})
    with pytest.raises(ValueError, match="config .* cannot run: tile_m must be 64, 128 or 256"):
        gemm(a, b, config=GemmConfig(tile_m=96))
    with pytest.raises(ValueError, match="cannot run: .*shared memory"):
        gemm(a, b, out_dtype=torch.float32, config=GemmConfig(stages=5))


def test_op_empty_dims_give_torchs_answer(monkeypatch: pytest.MonkeyPatch) -> None:
    """M, N, K or L == 0 never launches: the torch reference of the same epilogue. Run on
    CPU tensors by skipping the device check (and with a private plan memo, so no CPU
    plan outlives the test)."""
    import importlib

    import torch.nn.functional as F

    mod = importlib.import_module("cuteforge.ops.gemm")  # the package attribute is the function
    monkeypatch.setattr(importlib.import_module("cuteforge.ops.gemm_launch"), "_check_devices", lambda *args: None)
    monkeypatch.setattr(mod, "_PLANS", {})
    monkeypatch.setattr(mod, "_EAGER", {})
    bias, c = _cpu(7), _cpu(5, 7, dtype=torch.float32)
    got = mod.gemm(_cpu(5, 0), _cpu(0, 7), bias=bias, c=c, beta=2.0, epilogue="relu")
    assert got.shape == (5, 7) and got.dtype == torch.bfloat16
    torch.testing.assert_close(got, F.relu(2.0 * c + bias.float()).bfloat16())
    got = mod.gemm(_cpu(5, 0), _cpu(0, 7), out_dtype=torch.float32)
    assert got.dtype == torch.float32 and torch.equal(got, torch.zeros(5, 7))
    for a, b, shape in (((0, 4), (4, 7), (0, 7)), ((5, 4), (4, 0), (5, 0)), ((0, 5, 4), (0, 4, 7), (0, 5, 7)), ((5, 4), (0, 4, 7), (0, 5, 7))):
        assert mod.gemm(_cpu(*a), _cpu(*b)).shape == shape
    # beta=0 ignores c as torch.addmm does (an uninitialized c must not leak NaN into the result)
    got = mod.gemm(_cpu(5, 0), _cpu(0, 7), c=torch.full((5, 7), float("nan")), beta=0.0)
    assert torch.equal(got, torch.zeros(5, 7, dtype=torch.bfloat16))
    # with grad: through the custom op (operand names from the epilogue key) and its backward
    a, b, bias = (t.requires_grad_() for t in (_cpu(5, 0), _cpu(0, 7), _cpu(7)))
    mod.gemm(a, b, bias=bias, epilogue="relu").sum().backward()
    assert torch.equal(bias.grad, (bias.detach() > 0).to(torch.bfloat16) * 5) and a.grad.shape == (5, 0)
    with pytest.raises(ValueError, match="argument 'bias' must be a per-column operand"):
        mod.gemm(a, b, bias=_cpu(2, 7))
    # torch.compile(fullgraph): the argument handling traces without a graph break
    f = torch.compile(lambda a, b, bias: mod.gemm(a, b, bias=bias, epilogue="relu") * 2, backend="aot_eager", fullgraph=True)
    bias = _cpu(7)
    torch.testing.assert_close(f(_cpu(5, 0), _cpu(0, 7), bias), F.relu(bias.float()).bfloat16().expand(5, 7) * 2)
    # the memo keys on every operand's layout: a bad bias after a good one is still caught
    mod.gemm(_cpu(0, 4), _cpu(4, 7), bias=_cpu(7))
    with pytest.raises(ValueError, match="argument 'bias'"):
        mod.gemm(_cpu(0, 4), _cpu(4, 7), bias=_cpu(8))


def test_arch_and_builder_checks() -> None:
    """Another SM is refused naming sm_90a; a builder refuses an impossible config
    before tracing (precompile/show/direct Kernel.get take no other check)."""
    from cuteforge.arch import ArchError

    k = gemm_kernel(True, True)
    key = BoundKey(("bfloat16",) * 3 + ("int32",), (), (8, 8, 8, 4))
    for arch in ("sm_80", "sm_100a"):
        with pytest.raises(ArchError, match="requires sm_90a"):
            k.spec(key, (("sms", 132),), arch=arch)
    spec = k.spec(key, (("sms", 132),), GemmConfig(tile_m=96), arch="sm_90a")
    with pytest.raises(ValueError, match="tile_m must be"):
        k.builder(spec)


def test_default_configs_valid_and_operand_names() -> None:
    dims = (1, 7, 64, 65, 128, 129, 1000, 8192, 65537)
    for m in dims:
        for n in dims:
            for kk in (1, 1024, 4096):
                for out_b in (2, 4):
                    default_config(m, n, kk).validate(2, out_b, H100)
    assert GemmEpilogue.preset("relu", bias="row", residual=True).operand_names() == ("bias", "residual")
    assert GemmEpilogue.preset("none", c=True, alpha=2.0).operand_names() == ("c",)


def test_stale_tuned_config_falls_back() -> None:
    """A stored tuning result that this code cannot run (another version's store) gives
    way to the heuristic instead of failing the build."""
    from cuteforge.kernels.gemm.sm90.config import usable_tuned

    assert usable_tuned(GemmConfig(), 2, 2) == GemmConfig()
    assert usable_tuned(GemmConfig(tile_m=96), 2, 2) is None
    assert usable_tuned(GemmConfig(stages=5), 2, 4) is None
    assert usable_tuned({"tile_m": 128}, 2, 2) is None and usable_tuned(None, 2, 2) is None


def _dsl_cluster_counts(cases: list[tuple[GemmConfig, int, int, int]]) -> list[int]:
    """The work count of the DSL's own scheduler params for each (config, M, N, L): traced
    (no GPU needed) with static tile counts, so `cute.size` is a Python int."""
    import cutlass.cute as cute
    import cutlass.utils as utils

    got: list[int] = []

    @cute.jit
    def trace() -> None:
        for cfg, m, n, batch in cases:
            tiles = (-(-m // cfg.tile_m), -(-n // cfg.tile_n), batch)
            p = utils.PersistentTileSchedulerParams(tiles, (cfg.cluster_m, cfg.cluster_n, 1), cfg.swizzle, cfg.raster == "m")
            got.append(int(cute.size(p.problem_layout_ncluster_mnl)))

    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        cute.compile(trace)
    return got


def test_narrow_problems_schedule_no_padding_clusters() -> None:
    """Narrow N (raster m) / narrow M (raster n): the swizzle group is fitted to the
    clusters that exist, so the schedule's work count is the real cluster grid (the only
    rounding left is a cluster's partly-outside CTA), not up to `swizzle` x that."""
    from cuteforge.kernels.gemm.sm90.config import cluster_grid, fit_swizzle, scheduled_clusters

    narrow = [(65537, 72, 40), (65536, 64, 4096), (32768, 128, 4096), (32768, 192, 4096), (8192, 256, 8192), (8192, 384, 8192),
              (8192, 1000, 8192), (16384, 16384, 1024), (64, 65536, 1024), (200, 50000, 512)]
    cases = []
    for m, n, k in narrow:
        cfg = default_config(m, n, k)
        cm, cn = cluster_grid(cfg, m, n)
        real = cm * cn
        assert scheduled_clusters(cfg, m, n) == real, (m, n, cfg)
        raw = replace(cfg, swizzle=8)  # what the heuristic returned before the fit
        cases += [(cfg, m, n, 3), (raw, m, n, 3)]
    # The fit for a tuned / wide config: fewer than `groups` padding clusters.
    for count in range(1, 70):
        for raster in ("m", "n"):
            base = GemmConfig(tile_m=128, tile_n=128, cluster_m=1, cluster_n=1, raster=raster)
            m, n = (count * 128, 4096) if raster == "n" else (4096, count * 128)
            fit = fit_swizzle(base, m, n)
            groups = -(-count // 8)
            assert 1 <= fit.swizzle <= 8 and scheduled_clusters(fit, m, n) < (count + groups) * 32, (count, raster, fit)
            if count <= 8:
                assert fit.swizzle == count and scheduled_clusters(fit, m, n) == count * 32
    cases += [(fit_swizzle(GemmConfig(tile_n=128, raster=r), 4096, 13 * 128), 4096, 13 * 128, 1) for r in ("m", "n")]
    # The Python model of the schedule is the DSL's arithmetic (before and after the fit).
    assert _dsl_cluster_counts(cases) == [scheduled_clusters(c, m, n, b) for c, m, n, b in cases]
    # The padding it removes: 65537x72 on 128x256 c2x1 tiles was 8x the real work.
    raw = replace(default_config(65537, 72, 40), swizzle=8)
    assert scheduled_clusters(raw, 65537, 72) == 8 * scheduled_clusters(default_config(65537, 72, 40), 65537, 72)


def test_fitted_swizzle_compiles() -> None:
    """Swizzle 1 (the scheduler's FastDivmod decode, what narrow N now gets) and an odd
    group size trace and compile."""
    cfg = default_config(65537, 72, 40)
    assert cfg.swizzle == 1
    assert "m64n256k16" in _ptx(True, True, ("bfloat16",) * 3, cfg=cfg)
    assert "m64n128k16" in _ptx(True, True, ("bfloat16",) * 3, cfg=GemmConfig(tile_n=128, swizzle=3, raster="n"))


def _ptx_fp8(dtypes: tuple[str, ...], epi: GemmEpilogue | None = None, cfg: GemmConfig | None = None) -> str:
    """dtypes: a, b, out, then the epilogue operands (the two fp32 scales are added)."""
    from cuteforge.kernels.gemm.spec import gemm_fp8_kernel

    k = gemm_fp8_kernel(epi.kinds if epi else ())
    full = (*dtypes[:3], "int32", "float32", "float32", *dtypes[3:])
    vec = tuple(16 if d.startswith("float8") else 1 if i in (4, 5) else 4 if d in ("float32", "int32") else 8
                for i, d in enumerate(full))
    params = (("sms", 132),) + ((("epilogue", epi.key),) if epi else ())
    key = BoundKey(full, (), vec)
    spec = k.spec(key, tuple(sorted(params)), cfg, arch="sm_90a")
    res = compiler.compile_jit(k.builder(spec), k.signature.fake_args(key), "sm_90a", keep_artifacts=True)
    assert res.ptx
    return res.ptx


def test_fp8_compiles() -> None:
    """fp8 WGMMA (k32, both operands K-major) for e4m3, e5m2 and a mix, with and without a
    fused bias epilogue; the per-tensor scales multiply the accumulator (one fp32 multiply
    per accumulator register, which the 16-bit kernel does not have)."""
    ptx = _ptx_fp8(("float8_e4m3fn", "float8_e4m3fn", "bfloat16"))
    assert "wgmma.mma_async.sync.aligned.m64n256k32.f32.e4m3.e4m3" in ptx and "multicast" in ptx
    assert len(re.findall(r"\bmul(\.rn)?\.f32", ptx)) >= 128
    ptx = _ptx_fp8(("float8_e5m2", "float8_e4m3fn", "float16", "bfloat16"), GemmEpilogue.preset("gelu", bias="col"))
    assert "m64n256k32.f32.e5m2.e4m3" in ptx and "tanh.approx.f32" in ptx
    cfg = default_config(8192, 8192, 1024, in_bytes=1)
    assert cfg.pingpong and cfg.tile_k == 128
    ptx = _ptx_fp8(("float8_e5m2", "float8_e5m2", "float32", "float32"), GemmEpilogue.preset("relu", bias="row"), cfg)
    assert "m64n128k32.f32.e5m2.e5m2" in ptx and "bar.arrive" in ptx


def test_fp8_configs() -> None:
    """fp8 k-blocks are 128 deep (one 128-byte swizzle row): the heuristic and the tuner's
    candidates give tile_k 128, and a 64-deep config is refused for fp8 (and vice versa)."""
    dims = (1, 7, 128, 129, 1000, 8192, 65537)
    for m in dims:
        for n in dims:
            for out_b in (2, 4):
                c = default_config(m, n, 4096, in_bytes=1)
                assert c.tile_k == 128 and c == replace(default_config(m, n, 4096), tile_k=128)
                c.validate(1, out_b, H100)
    for c in candidate_configs(128, 4096, in_bytes=1):
        c.validate(1, 2, H100)
    assert GemmConfig(tile_k=128).resolved_stages(1, 2, H100) == GemmConfig().resolved_stages(2, 2, H100)
    with pytest.raises(ValueError, match="tile_k must be 128 for fp8"):
        GemmConfig().validate(1, 2, H100)
    with pytest.raises(ValueError, match="tile_k must be 64 for 16-bit"):
        GemmConfig(tile_k=128).validate(2, 2, H100)
    # The kernel's own hooks (tuner list, default) give fp8 configs for an fp8 spec.
    from cuteforge.autotune.candidates import candidates
    from cuteforge.kernels.gemm.spec import gemm_fp8_kernel

    k = gemm_fp8_kernel(("col",))
    key = BoundKey(("float8_e4m3fn", "float8_e5m2", "bfloat16", "int32", "float32", "float32", "bfloat16"), (),
                   (16, 16, 8, 4, 1, 1, 8))
    spec = k.spec(key, (("sms", 132),), arch="sm_90a")
    valid, invalid = candidates(k, spec)
    assert len(valid) >= 10 and not invalid and all(c.tile_k == 128 for c in valid)
    assert spec.config.tile_k == 128  # the kernel's default for an fp8 spec


E4M3, E5M2 = torch.float8_e4m3fn, torch.float8_e5m2


def _fp8(*shape: int, dtype: torch.dtype = E4M3) -> torch.Tensor:
    return torch.randn(*shape).to(dtype)


def test_fp8_argument_errors() -> None:
    """Layout, K, scale and dtype errors name the argument and what is needed; all raised
    before the device check (CPU tensors)."""
    from cuteforge.ops.gemm import gemm

    a, b = _fp8(64, 32), _fp8(16, 32).t()  # a row-major (M, K); b = (N, K) weight .t()
    one = torch.ones(())
    for sa, sb in ((1.0, 2.0), (one, torch.ones(1)), (torch.ones(1, 1), 0.5)):
        with pytest.raises(ValueError, match="'a' must be a CUDA tensor"):
            gemm(a, b, scale_a=sa, scale_b=sb)
    with pytest.raises(ValueError, match="'a' must be a CUDA tensor"):
        gemm(a, _fp8(16, 32, dtype=E5M2).t(), scale_a=1.0, scale_b=1.0, bias=_cpu(16), epilogue="gelu")
    with pytest.raises(TypeError, match="fp8 inputs need scale_a and scale_b .*missing scale_b"):
        gemm(a, b, scale_a=one)
    with pytest.raises(TypeError, match="missing scale_a, scale_b"):
        gemm(a, b)
    with pytest.raises(TypeError, match="scale_a applies to float8 inputs only"):
        gemm(_cpu(64, 32), _cpu(32, 16), scale_a=one, scale_b=one)
    with pytest.raises(TypeError, match="a is float8_e4m3fn but b is bfloat16; an fp8 GEMM needs both operands fp8"):
        gemm(a, _cpu(32, 16), scale_a=one, scale_b=one)
    with pytest.raises(TypeError, match="a is bfloat16 but b is float8_e5m2; an fp8 GEMM needs both"):
        gemm(_cpu(64, 32), _fp8(16, 32, dtype=E5M2).t())
    with pytest.raises(ValueError, match="fp8 GEMM needs 'a' row-major .*Pass a.contiguous"):
        gemm(_fp8(32, 64).t(), b, scale_a=one, scale_b=one)
    with pytest.raises(ValueError, match="fp8 GEMM needs 'b' column-major in its \\(K, N\\) view"):
        gemm(a, _fp8(32, 16), scale_a=one, scale_b=one)
    with pytest.raises(ValueError, match="K to be a multiple of 16 .* got K=40"):
        gemm(_fp8(64, 40), _fp8(16, 40).t(), scale_a=one, scale_b=one)
    with pytest.raises(ValueError, match="argument 'scale_b' must be a per-tensor scale \\(one element\\) or a "
                                         "per-column one of shape \\(1, 16\\) or \\(16,\\), got shape \\(15,\\)"):
        gemm(a, b, scale_a=one, scale_b=torch.ones(15))
    with pytest.raises(TypeError, match="argument 'scale_a' must be float32"):
        gemm(a, b, scale_a=one.bfloat16(), scale_b=one)
    with pytest.raises(TypeError, match="argument 'scale_a' must be a float or a one-element float32 tensor"):
        gemm(a, b, scale_a="1", scale_b=one)
    with pytest.raises(TypeError, match="out_dtype must be"):
        gemm(a, b, scale_a=one, scale_b=one, out_dtype=E4M3)
    with pytest.raises(TypeError, match="fp8 GEMM has no backward"):
        gemm(a, b, scale_a=one, scale_b=one, bias=_cpu(16).requires_grad_())
    with pytest.raises(ValueError, match="cannot run: tile_k must be 128 for fp8"):
        gemm(a, b, scale_a=one, scale_b=one, config=GemmConfig())


def test_fp8_rowwise_scale_errors() -> None:
    """Per-row scale_a / per-column scale_b (torch._scaled_mm's rowwise mode): shapes,
    dtype and the operand budget are checked before the device, naming the argument."""
    from cuteforge.ops.gemm import gemm

    a, b = _fp8(64, 32), _fp8(16, 32).t()  # M = 64, N = 16
    sa, sb = torch.ones(64, 1), torch.ones(1, 16)
    for ra, rb in ((sa, sb), (sa.reshape(64), 1.0), (1.0, sb.reshape(16)), (torch.ones(1, 1), sb)):
        with pytest.raises(ValueError, match="'a' must be a CUDA tensor"):  # accepted up to the device check
            gemm(a, b, scale_a=ra, scale_b=rb, bias=_cpu(16), epilogue="gelu")
    with pytest.raises(ValueError, match="'scale_a' must be a per-tensor scale \\(one element\\) or a per-row one of "
                                         "shape \\(64, 1\\) or \\(64,\\), got shape \\(1, 64\\)"):
        gemm(a, b, scale_a=torch.ones(1, 64), scale_b=sb)
    with pytest.raises(ValueError, match="'scale_b' must be .* per-column one of shape \\(1, 16\\) or \\(16,\\), got shape \\(16, 1\\)"):
        gemm(a, b, scale_a=sa, scale_b=torch.ones(16, 1))
    with pytest.raises(TypeError, match="argument 'scale_b' must be float32"):
        gemm(a, b, scale_a=sa, scale_b=sb.bfloat16())
    with pytest.raises(ValueError, match="at most 3 tensor operands; per-row / per-column scales take 2 of them, which "
                                         "leaves 1 for \\['bias', 'residual'\\]"):
        gemm(a, b, scale_a=sa, scale_b=sb, bias=_cpu(16), residual=_cpu(64, 16))
    with pytest.raises(TypeError, match="fp8 GEMM has no backward"):
        gemm(a, b, scale_a=sa.requires_grad_(), scale_b=sb)
    # the custom op itself takes per-tensor scales only; ops.gemm moves the others
    with pytest.raises(ValueError, match="gemm_fp8 takes per-tensor scales .* call cuteforge.ops.gemm"):
        torch.ops.cuteforge.gemm_fp8(a, b, torch.ones(64, 1), torch.ones(1), [], "", "", None)


def test_fp8_rowwise_epilogue_composition() -> None:
    """`GemmEpilogue.with_scales`: acc * scale_a[m] * scale_b[n], then the inner epilogue;
    operand order and names, and the key rebuilds the same epilogue (what a builder in
    another process gets)."""
    import torch.nn.functional as F

    inner = GemmEpilogue.preset("gelu", bias="col")
    e = GemmEpilogue.with_scales(inner, row=True, col=True)
    assert e.kinds == ("row", "col", "col") and e.operand_names() == ("scale_a", "scale_b", "bias")
    assert GemmEpilogue(e.key, e.kinds).operand_names() == e.operand_names()
    acc, sa, sb, bias = torch.randn(5, 7), torch.rand(5, 1), torch.rand(7), torch.randn(7)
    torch.testing.assert_close(e.reference(acc, sa, sb, bias), F.gelu(acc * sa * sb + bias, approximate="tanh"))
    only_b = GemmEpilogue.with_scales(None, row=False, col=True)
    assert only_b.kinds == ("col",) and only_b.operand_names() == ("scale_b",)
    torch.testing.assert_close(only_b.reference(acc, sb), acc * sb)
    only_a = GemmEpilogue.with_scales(GemmEpilogue.preset("relu", residual=True), row=True, col=False)
    assert only_a.kinds == ("row", "full") and only_a.operand_names() == ("scale_a", "residual")
    r = torch.randn(5, 7)
    torch.testing.assert_close(only_a.reference(acc, sa, r), F.relu(acc * sa) + r)
    assert GemmEpilogue.with_scales(None, row=False, col=False) is None
    assert GemmEpilogue.with_scales(inner, row=False, col=False) is inner


def test_fp8_rowwise_compiles() -> None:
    """The fp8 kernel with a per-row and a per-column scale in front of bias + gelu (the
    registered gemm_sm90_fp8_tn_row_col_col, on the kernel's default config) against the
    same kernel with bias + gelu alone: the fp32 scale operands add their 32-bit loads
    (beside the per-tensor scales' two, which every fp8 kernel has), the bias keeps its
    16-bit loads, and each accumulator register takes two more multiplies."""
    from cuteforge.kernel import REGISTRY

    def counts(ptx: str) -> tuple[int, int, int]:
        return (len(re.findall(r"ld\.global[^;]*\.b32", ptx)), len(re.findall(r"ld\.global[^;]*\.(?:b16|u16)", ptx)),
                len(re.findall(r"\bmul(\.rn)?\.f32", ptx)))

    inner = GemmEpilogue.preset("gelu", bias="col")
    epi = GemmEpilogue.with_scales(inner, row=True, col=True)
    assert "gemm_sm90_fp8_tn_row_col_col" in REGISTRY
    ptx = _ptx_fp8(("float8_e4m3fn", "float8_e4m3fn", "bfloat16", "float32", "float32", "bfloat16"), epi)
    assert "wgmma.mma_async.sync.aligned.m64n256k32.f32.e4m3.e4m3" in ptx and "tanh.approx.f32" in ptx
    bias_only = _ptx_fp8(("float8_e4m3fn", "float8_e4m3fn", "bfloat16", "bfloat16"), inner)
    (w32, w16, wmul), (b32, b16, bmul) = counts(ptx), counts(bias_only)
    assert b32 == 2 and w32 >= b32 + 64, (w32, b32)  # 128x256 tile: 64 distinct columns a thread, plus its rows
    assert w16 == b16 > 0, (w16, b16)
    assert wmul >= bmul + 2 * 128, (wmul, bmul)  # 128 accumulator registers a thread


def test_three_vector_operands_take_narrow_late_subtiles() -> None:
    """Three row / col epilogue operands (per-row and per-column fp8 scales with a bias) on
    the fused 128x256 default: 32-wide subtiles with the operands loaded in the epilogue,
    which assembles without spilling (64-wide subtiles with the operands held from the
    mainloop spilled 328 bytes); fewer operands keep the 64-wide default unless fp8 scales
    are among them (the narrow late form measured faster there)."""
    from ptxas_check import ptxas_no_spill

    cfg = default_config(8192, 8192, 8192, 132, 1, fused=True, vector_operands=3)
    assert (cfg.tile_m, cfg.tile_n, cfg.epi_n, cfg.early_operands) == (128, 256, 32, False)
    two = default_config(8192, 8192, 8192, 132, 1, fused=True, vector_operands=2)
    assert (two.epi_n, two.early_operands) == (64, True)
    scales = GemmEpilogue.with_scales(None, row=True, col=True)
    assert scales is not None and scales.scale_operands == 2
    assert GemmEpilogue.with_scales(GemmEpilogue.preset("gelu", bias="col"), row=False, col=True).scale_operands == 1
    assert GemmEpilogue.preset("gelu", bias="col").scale_operands == 0
    rowwise = default_config(8192, 8192, 8192, 132, 1, fused=True, vector_operands=2, scale_operands=2)
    assert (rowwise.tile_n, rowwise.epi_n, rowwise.early_operands, rowwise.raster) == (256, 32, False, "n")
    small = default_config(1024, 1024, 1024, 132, 1, fused=True, vector_operands=2, scale_operands=2)
    assert small.tile_n != 256 and small.epi_n == 32 and small.early_operands  # other tiles keep their form
    assert default_config(4096, 4096, 4096, fused=True, vector_operands=3).epi_n == 32
    epi = GemmEpilogue.with_scales(GemmEpilogue.preset("gelu", bias="col"), row=True, col=True)
    ptxas_no_spill(_ptx_fp8(("float8_e4m3fn", "float8_e4m3fn", "bfloat16", "float32", "float32", "bfloat16"), epi, cfg))


def test_full_operands_take_32_wide_subtiles() -> None:
    """A full epilogue operand (residual, c) on the 16-bit fused 128x256 default: 32-wide
    subtiles with the operands still held from the mainloop, which assembles
    bias + gelu + residual without the 56 bytes of spill the 64-wide form has; a bias alone
    keeps 64-wide subtiles, stream-K tiles keep theirs; fp8 takes the same rule, and its
    bias + gelu + residual kernel assembles without the 64 bytes of spill as well."""
    from ptxas_check import ptxas_no_spill

    res = default_config(6144, 6144, 6144, 132, fused=True, vector_operands=1, full_operands=1)
    assert (res.tile_m, res.tile_n, res.epi_n, res.early_operands, res.stream_k) == (128, 256, 32, True, False)
    assert default_config(6144, 6144, 6144, 132, fused=True, full_operands=2).epi_n == 32
    assert default_config(6144, 6144, 6144, 132, fused=True, vector_operands=1).epi_n == 64
    sk = default_config(8192, 28672, 4096, 132, fused=True, vector_operands=1, full_operands=1)
    assert sk.stream_k and (sk.epi_n, sk.early_operands) == (32, False)
    fp8 = default_config(8192, 8192, 8192, 132, 1, fused=True, vector_operands=1, full_operands=1)
    assert (fp8.tile_k, fp8.epi_n, fp8.early_operands) == (128, 32, True)
    assert default_config(8192, 8192, 8192, 132, 1, fused=True, vector_operands=1).epi_n == 64
    epi = GemmEpilogue.preset("gelu", bias="col", residual=True)
    ptxas_no_spill(_ptx(True, True, ("bfloat16",) * 5, epi, res))
    ptxas_no_spill(_ptx_fp8(("float8_e4m3fn", "float8_e4m3fn", "bfloat16", "bfloat16", "bfloat16"), epi, fp8))


def test_fp8_empty_dims_and_custom_op(monkeypatch: pytest.MonkeyPatch) -> None:
    """Empty problems give torch's answer with the scales applied; torch.compile goes
    through the fp8 custom op (fake impl: bf16 output by default)."""
    import importlib

    import torch.nn.functional as F

    mod = importlib.import_module("cuteforge.ops.gemm")
    monkeypatch.setattr(importlib.import_module("cuteforge.ops.gemm_launch"), "_check_devices", lambda *args: None)
    monkeypatch.setattr(mod, "_PLANS", {})
    monkeypatch.setattr(mod, "_EAGER", {})
    bias = _cpu(7)
    got = mod.gemm(_fp8(5, 0), _fp8(7, 0).t(), scale_a=2.0, scale_b=torch.ones(1), bias=bias, epilogue="relu")
    assert got.shape == (5, 7) and got.dtype == torch.bfloat16
    torch.testing.assert_close(got, F.relu(bias.float()).bfloat16().expand(5, 7))
    assert mod.gemm(_fp8(0, 16), _fp8(7, 16).t(), scale_a=1.0, scale_b=1.0, out_dtype=torch.float32).dtype == torch.float32
    f = torch.compile(lambda a, b, s: mod.gemm(a, b, scale_a=s, scale_b=3.0, c=torch.ones(5, 7), epilogue="relu"),
                      backend="aot_eager", fullgraph=True)
    torch.testing.assert_close(f(_fp8(5, 0), _fp8(7, 0).t(), torch.ones(1)), torch.ones(5, 7, dtype=torch.bfloat16))
    # per-row / per-column scales: eager and through the custom op
    sa, sb = torch.rand(5, 1), torch.rand(1, 7)
    got = mod.gemm(_fp8(5, 0), _fp8(7, 0).t(), scale_a=sa, scale_b=sb, bias=bias, epilogue="relu")
    torch.testing.assert_close(got, F.relu(bias.float()).bfloat16().expand(5, 7))
    g = torch.compile(lambda a, b, sa, sb: mod.gemm(a, b, scale_a=sa, scale_b=sb, residual=torch.ones(5, 7)),
                      backend="aot_eager", fullgraph=True)
    torch.testing.assert_close(g(_fp8(5, 0), _fp8(7, 0).t(), sa, sb), torch.ones(5, 7, dtype=torch.bfloat16))


def test_eager_warm_path_memo_key(monkeypatch: pytest.MonkeyPatch) -> None:
    """The eager warm path (one lookup keyed by every argument) on CPU tensors with K == 0
    (plans give torch's answer, no launch): a repeated call hits (no second trip through
    the checks) and gives the same answer for new data of the same layout; any changed
    argument (alpha or beta or their types, epilogue, out_dtype, a's or an operand's layout,
    c's presence) misses, so a changed argument never reuses a wrong plan."""
    import importlib

    import torch.nn.functional as F

    mod = importlib.import_module("cuteforge.ops.gemm")
    monkeypatch.setattr(importlib.import_module("cuteforge.ops.gemm_launch"), "_check_devices", lambda *args: None)
    monkeypatch.setattr(mod, "_PLANS", {})
    monkeypatch.setattr(mod, "_EAGER", {})
    slow = mod._gemm_slow
    calls: list[int] = []

    def counted(*args: object) -> torch.Tensor:
        calls.append(1)
        return slow(*args)

    monkeypatch.setattr(mod, "_gemm_slow", counted)
    a, b = _cpu(5, 0), _cpu(0, 7)
    c = torch.randn(5, 7)
    bias = torch.randn(7).bfloat16()
    cases = [
        (dict(c=c, beta=2.0), lambda c, bias: (2.0 * c).bfloat16()),
        (dict(c=c, beta=2), lambda c, bias: (2.0 * c).bfloat16()),
        (dict(c=c, beta=3.0), lambda c, bias: (3.0 * c).bfloat16()),
        (dict(c=c, beta=2.0, epilogue="relu"), lambda c, bias: F.relu(2.0 * c).bfloat16()),
        (dict(c=c, beta=2.0, out_dtype=torch.float32), lambda c, bias: 2.0 * c),
        (dict(c=c[:, :1], beta=2.0), lambda c, bias: (2.0 * c[:, :1]).expand(5, 7).bfloat16()),
        (dict(bias=bias), lambda c, bias: bias.float().expand(5, 7).bfloat16()),
        (dict(bias=bias, alpha=2.0), lambda c, bias: bias.float().expand(5, 7).bfloat16()),
        (dict(bias=bias, residual=c), lambda c, bias: (bias.float() + c).bfloat16()),
        (dict(), lambda c, bias: torch.zeros(5, 7, dtype=torch.bfloat16)),
    ]
    for i, (kw, want) in enumerate(cases):
        assert len(calls) == i
        for _ in range(2):
            kw2 = {k: (torch.randn_like(v) if isinstance(v, torch.Tensor) and v.dtype == torch.float32 else v) for k, v in kw.items()}
            got = mod.gemm(a, b, **kw2)
            torch.testing.assert_close(got, want(kw2.get("c", kw2.get("residual")), kw2.get("bias")))
        assert len(calls) == i + 1, f"case {i}: {kw}"
    mod.gemm(_cpu(5, 0)[:4], b)  # a's shape
    mod.gemm(a, _cpu(0, 8)[:, 1:])  # b's alignment
    assert len(calls) == len(cases) + 2
    for _ in range(2):  # a zero beta (either sign) never takes the warm path: -0.0 == 0.0 in the key
        torch.testing.assert_close(mod.gemm(a, b, c=c, beta=0.0), torch.zeros(5, 7, dtype=torch.bfloat16))
    assert len(calls) == len(cases) + 4
    with pytest.raises(TypeError, match="'alpha' must be a Python number"):
        mod.gemm(a, b, bias=bias, alpha=True)  # True == 1 == 1.0, but never that plan


def test_fp8_eager_warm_path(monkeypatch: pytest.MonkeyPatch) -> None:
    """fp8 calls take the eager warm path too: a repeat with new scale tensors of
    the same layout (or the same number) skips `_gemm_slow` and hands the plan exactly what
    the slow path does: per-row / per-column scales in front of bias / c / residual, the
    call's own per-tensor tensors, and a number's or a rowwise scale's fixed one-element
    tensor. A changed number or scale shape misses; a scale that requires grad never stores
    a warm entry. The plan is a recording stand-in (nothing launches)."""
    import importlib

    mod = importlib.import_module("cuteforge.ops.gemm")
    monkeypatch.setattr(mod, "_EAGER", {})
    seen: list[tuple[list[torch.Tensor], tuple[torch.Tensor, ...]]] = []

    def plan(a: torch.Tensor, b: torch.Tensor, ops: Any, scales: Any = ()) -> torch.Tensor:
        seen.append((list(ops), tuple(scales)))
        return torch.zeros(())

    monkeypatch.setattr(mod, "_lookup", lambda *args: plan)
    slow = mod._gemm_slow
    calls: list[int] = []
    monkeypatch.setattr(mod, "_gemm_slow", lambda *args: (calls.append(1), slow(*args))[1])
    a, b = _fp8(5, 16), _fp8(7, 16).t()
    bias, res = _cpu(7), torch.randn(5, 7)

    def scale(form: Any, n: int) -> Any:  # a fresh scale of the form each call
        if form == "row":
            return torch.rand(n, 1)
        if form == "col":
            return torch.rand(1, n)
        return torch.rand(1) if form == "tensor" else form

    cases = [("tensor", "tensor", {}), (2.0, 0.5, {}), ("row", "col", {}), ("row", 3.0, {"bias": bias}),
             ("tensor", "col", {"residual": res}), ("row", "col", {"bias": bias, "epilogue": "relu"}),
             ("tensor", 2.0, {"c": res, "beta": 0.5, "bias": bias, "residual": res})]
    for i, (fa, fb, kw) in enumerate(cases):
        for rep in range(2):
            sa, sb = scale(fa, 5), scale(fb, 7)
            mod.gemm(a, b, scale_a=sa, scale_b=sb, **kw)
            assert len(calls) == i + 1, (i, rep, fa, fb)  # the repeat is warm
            ops, scales = seen[-1]
            want_ops = [sa] * (fa == "row") + [sb] * (fb == "col") + [
                t for t in (kw.get("bias"), kw.get("c"), kw.get("residual")) if t is not None]
            assert len(ops) == len(want_ops) and all(x is y for x, y in zip(ops, want_ops)), (i, rep)
            for s, form, got in ((sa, fa, scales[0]), (sb, fb, scales[1])):
                if form == "tensor":
                    assert got is s
                else:
                    assert got.shape == (1,) and got.dtype == torch.float32
                    assert got.item() == (1.0 if form in ("row", "col") else form)
    n = len(calls)
    mod.gemm(a, b, scale_a=4.0, scale_b=0.5)  # another number: its own entry
    assert len(calls) == n + 1 and seen[-1][1][0].item() == 4.0
    mod.gemm(a, b, scale_a=torch.rand(5), scale_b=torch.rand(7))  # 1-D rowwise: another layout
    assert len(calls) == n + 2
    for _ in range(2):  # a zero number scale (either sign) is never warm: -0.0 == 0.0 in the key
        mod.gemm(a, b, scale_a=0.0, scale_b=1.0)
        mod.gemm(a, b, scale_a=-0.0, scale_b=1.0)
        assert math.copysign(1.0, seen[-1][1][0].item()) == -1.0
    assert len(calls) == n + 6
    n += 4
    with torch.no_grad():
        for _ in range(2):
            mod.gemm(a, b, scale_a=torch.rand(1, requires_grad=True), scale_b=1.0)
    assert len(calls) == n + 4  # never warm
    with pytest.raises(TypeError, match="no backward"):
        mod.gemm(a, b, scale_a=torch.rand(1, requires_grad=True), scale_b=1.0)


def test_eager_warm_path_keeps_the_sign_of_a_zero_alpha(monkeypatch: pytest.MonkeyPatch) -> None:
    """alpha = -0.0 hashes like 0.0 in the warm-path key, but the epilogue multiplies by it
    (K == 0: every output is alpha * 0): a plan stored for 0.0 must not answer -0.0."""
    import importlib

    mod = importlib.import_module("cuteforge.ops.gemm")
    monkeypatch.setattr(importlib.import_module("cuteforge.ops.gemm_launch"), "_check_devices", lambda *args: None)
    monkeypatch.setattr(mod, "_PLANS", {})
    monkeypatch.setattr(mod, "_EAGER", {})
    a, b = _cpu(5, 0), _cpu(0, 7)
    pos = mod.gemm(a, b, alpha=0.0, out_dtype=torch.float32)
    neg = mod.gemm(a, b, alpha=-0.0, out_dtype=torch.float32)
    assert not torch.signbit(pos).any()
    assert torch.signbit(neg).all()  # what a fresh cache gives for -0.0


def test_fused_default_config() -> None:
    """A fused epilogue gives the cooperative 128x256 default 64-wide store subtiles; the
    other tiles and the unfused default keep 32; every one fits sm_90 for 16-bit and fp32
    outputs and fp8 inputs."""
    # fused cooperative tiles walk N first (raster "n")
    assert default_config(6144, 6144, 6144, fused=True) == GemmConfig(epi_n=64, raster="n")
    # a cut last wave (stream_k_ends) takes the fused stream-K form: 32-wide, operands late
    assert default_config(8192, 8192, 8192, fused=True) == GemmConfig(
        epi_n=32, raster="n", stream_k=True, stream_k_ends=True, early_operands=False)
    # every fused epilogue, gelu / silu included, keeps the cooperative tile (its
    # stores overlap the next mainloop; the earlier pingpong rule for them is gone)
    coop = GemmConfig(epi_n=64, raster="n")
    assert default_config(4096, 4096, 4096, fused=True) == coop
    assert default_config(2048, 14336, 4096, fused=True) == coop
    assert default_config(4096, 4096, 4096, 132, 1, fused=True) == replace(coop, tile_k=128)
    assert coop.store_overlap and default_config(8192, 8192, 8192).store_overlap
    assert default_config(8192, 8192, 8192).epi_n == 32
    assert default_config(16384, 16384, 1024, fused=True).epi_n == 32  # pingpong 128x128
    assert default_config(1024, 1024, 1024, fused=True).epi_n == 32  # 128x64
    for m, n, k in ((8192, 8192, 8192), (4096, 16384, 4096), (2048, 8192, 28672), (16, 4096, 4096)):
        for in_b in (2, 1):
            for out_b in (2, 4):
                default_config(m, n, k, in_bytes=in_b, fused=True).validate(in_b, out_b, H100)


def _sk_segments(tiles: int, workers: int, k_tiles: int) -> list[list[tuple[int, int, int]]]:
    """Each worker's segments (tile, first k-block, end k-block) as the kernel walks them
    (`Sm90Gemm.sk_plan` / `segment`, restated): whole tiles worker, worker + workers, ...
    below `tiles - sk`, then this worker's run of the stream-K tiles' k-blocks."""
    from cuteforge.kernels.gemm.sm90.config import stream_k_split

    sk, w = stream_k_split(tiles, workers, k_tiles)
    w = w or 1
    dp = tiles - sk
    base, extra = divmod(sk * k_tiles, w)
    out = []
    for worker in range(workers):
        segs = [(t, 0, k_tiles) for t in range(worker, dp, workers)]
        begin = worker * base + min(worker, extra)
        g, end = begin, begin + (base + (worker < extra) if worker < w and sk else 0)
        while g < end:
            t, kb = divmod(g, k_tiles)
            ke = min(k_tiles, kb + end - g)
            segs.append((dp + t, kb, ke))
            g += ke - kb
        out.append(segs)
    return out


@pytest.mark.parametrize(("tiles", "workers", "k_tiles"), [
    (1024, 66, 128),   # 8192^3, 128x256 c2x1: 34 tail clusters (> half a wave): whole tiles
    (16, 66, 16),      # 1024^3 (sub-wave): 4-way split-K
    (8, 66, 224),      # M = 128, N = 4096, K = 14336 on c1x2: 8-way
    (16, 66, 18),      # K not a multiple of the split: runs straddle tiles by a k-block
    (67, 66, 128), (1, 132, 1000), (3, 7, 5), (66, 66, 64), (65, 66, 2), (5, 132, 3), (140, 66, 9),
])
def test_stream_k_schedule_covers_every_k_block_once(tiles: int, workers: int, k_tiles: int) -> None:
    """The split runs every (tile, k-block) exactly once; a cut tile's owner (the run with
    its first k-block) is its worker's last segment and every other run of it is its
    worker's first, so an owner only waits on runs that were started first; the owner's
    walk over workers + 1, + 2, ... covers exactly the rest of the tile."""
    from cuteforge.kernels.gemm.sm90.config import SK_MAX_SPLIT, SK_MIN_ITERS, stream_k_split

    segs = _sk_segments(tiles, workers, k_tiles)
    sk, w = stream_k_split(tiles, workers, k_tiles)
    seen: dict[int, list[tuple[int, int, int]]] = {}
    for worker, ss in enumerate(segs):
        n_whole = len(range(worker, tiles - sk, workers))  # whole tiles come first, never wait
        assert all((kb, ke) == (0, k_tiles) for _, kb, ke in ss[:n_whole])
        for i, (t, kb, ke) in enumerate(ss):
            assert 0 <= kb < ke <= k_tiles and 0 <= t < tiles
            seen.setdefault(t, []).append((kb, ke, worker))
            if kb > 0:
                assert i == n_whole, "a run starting inside a tile must be its worker's first stream-K segment"
            if kb == 0 and ke < k_tiles:
                assert i == len(ss) - 1, "an owner with peers must be its worker's last segment"
    assert sorted(seen) == list(range(tiles))
    base, extra = divmod(sk * k_tiles, w) if w else (0, 0)
    for runs in seen.values():
        runs.sort()
        assert runs[0][0] == 0 and all(a[1] == b[0] for a, b in zip(runs, runs[1:])) and runs[-1][1] == k_tiles
        assert len(runs) <= SK_MAX_SPLIT + 1
        owner_end, owner = runs[0][1], runs[0][2]
        covered, peer = owner_end, owner + 1  # the kernel's fixup walk
        while covered < k_tiles:
            covered += min(k_tiles - covered, base + (peer < extra))
            peer += 1
        assert covered == k_tiles and peer - owner == len(runs)
    if sk:
        assert sk == tiles % workers and w % sk == 0 and 2 <= w // sk <= SK_MAX_SPLIT
        runs_per_worker = [sum(ke - kb for t, kb, ke in s if t >= tiles - sk) for s in segs]
        assert min(r for r in runs_per_worker if r) >= SK_MIN_ITERS


def test_stream_k_split_policy() -> None:
    from cuteforge.kernels.gemm.sm90.config import stream_k_split, stream_k_workspace_words

    assert stream_k_split(1024, 66, 128) == (0, 0)  # 34 of 66 busy: more than half a wave
    assert stream_k_split(1023, 66, 128) == (33, 66)  # half a wave: 2-way
    assert stream_k_split(16, 66, 16) == (16, 64)  # sub-wave: 4-way split-K (4 k-blocks each)
    assert stream_k_split(8, 66, 224) == (8, 64)  # small M: 8-way
    assert stream_k_split(132, 66, 128) == (0, 0)  # whole waves: nothing to split
    assert stream_k_split(2, 66, 7) == (0, 0)  # too few k-blocks for two runs of 4
    sk = GemmConfig(stream_k=True, swizzle=1)
    assert stream_k_workspace_words(GemmConfig(swizzle=1), 66, 1024, 1024, 1024, sms=132) == 0  # no stream_k
    # 1024^3 on 128x256 c2x1: 16 clusters, each tile 4-way: 64 clusters of 2 CTAs hold a partial
    assert stream_k_workspace_words(sk, 66, 1024, 1024, 1024, sms=132) == 132 + 64 * 2 * 128 * 256
    assert stream_k_workspace_words(sk, 66, 8192, 8192, 8192, sms=132) == 0  # 34 of 66 in the last wave: no split
    assert stream_k_workspace_words(sk, 66, 1024, 1024, 64, sms=132) == 0  # one k-block
    with pytest.raises(ValueError, match="stream_k needs the cooperative"):
        GemmConfig(tile_n=128, pingpong=True, stream_k=True).validate(2, 2, H100)


def _sk_ends_segments(tiles: int, workers: int, k_tiles: int) -> list[list[tuple[int, int, int]]]:
    """Each worker's segments with `stream_k_ends`, walked as the kernel walks them
    (`Sm90Gemm.sk_plan`'s n_dp and v_end, then `segment` per k-block v, restated line by
    line): whole tiles, then owner t < sk its tile's first k_tiles - e k-blocks, idle
    cluster i = worker - sk the ends of tiles i, i + idle, ... of the last wave."""
    from cuteforge.kernels.gemm.sm90.config import stream_k_ends_len

    ends = stream_k_ends_len(tiles, workers, k_tiles)
    sk = tiles % workers if ends else 0
    dp_tiles = tiles - sk
    out = []
    for worker in range(workers):
        n_dp = (dp_tiles - worker + workers - 1) // workers if worker < dp_tiles else 0
        sk_len = 0
        if ends:
            idle = workers - sk
            sk_len = k_tiles - ends if worker < sk else ((sk - (worker - sk) + idle - 1) // idle) * ends
        v_end, v, segs = n_dp * k_tiles + sk_len, 0, []
        while v < v_end:
            dp_iters = n_dp * k_tiles
            if v < dp_iters:
                tile, kb, ke = worker + (v // k_tiles) * workers, 0, k_tiles
            elif worker < sk:
                tile, kb, ke = dp_tiles + worker, 0, k_tiles - ends
            else:
                tile = dp_tiles + (worker - sk) + ((v - dp_iters) // ends) * (workers - sk)
                kb, ke = k_tiles - ends, k_tiles
            segs.append((tile, kb, ke))
            v += ke - kb
        out.append(segs)
    return out


@pytest.mark.parametrize(("tiles", "workers", "k_tiles"), [
    (1024, 66, 128),  # 8192^3, 128x256 c2x1: 34 of 66 in the last wave, 32 idle
    (256, 66, 448),   # 2048x8192x28672: 58 of 66, 8 idle take 7-8 ends each
    (256, 66, 36), (1024, 66, 12), (40, 66, 64), (65, 66, 400), (67, 33, 90), (130, 66, 100),
])
def test_stream_k_ends_schedule(tiles: int, workers: int, k_tiles: int) -> None:
    """`stream_k_ends`: every (tile, k-block) runs exactly once; each cut tile's owner runs
    its first k-blocks as its last segment, and its end is one run on an idle cluster,
    which only publishes (waits on nothing), so no wait can cycle; the busiest cluster
    runs fewer k-blocks than a whole last wave would."""
    from cuteforge.kernels.gemm.sm90.config import SK_MIN_ITERS, stream_k_ends_len, stream_k_split

    e = stream_k_ends_len(tiles, workers, k_tiles)
    rem = tiles % workers
    if stream_k_split(tiles, workers, k_tiles)[0] or rem == 0:
        assert e == 0
    segs = _sk_ends_segments(tiles, workers, k_tiles)
    runs: dict[int, list[tuple[int, int]]] = {}
    for ss in segs:
        for i, (t, kb, ke) in enumerate(ss):
            runs.setdefault(t, []).append((kb, ke))
            if kb == 0 and ke < k_tiles:
                assert i == len(ss) - 1  # an owner that waits does so last
    assert sorted(runs) == list(range(tiles))
    for t, rs in runs.items():
        rs.sort()
        assert rs[0][0] == 0 and rs[-1][1] == k_tiles and all(a[1] == b[0] for a, b in zip(rs, rs[1:]))
        assert len(rs) == (2 if e and t >= tiles - rem else 1)
    if e:
        assert e >= SK_MIN_ITERS
        busiest = max(sum(ke - kb for _, kb, ke in ss) for ss in segs)
        assert busiest < (tiles // workers + 1) * k_tiles


def test_stream_k_ends_policy() -> None:
    from cuteforge.kernels.gemm.sm90.config import stream_k_ends_len, stream_k_workspace_words

    assert stream_k_ends_len(256, 66, 448) == 48  # 58 owners, 8 idle with at most 8 ends: (448 - 7 * 2) // 9
    assert stream_k_ends_len(1024, 66, 128) == 42  # 34 owners, 32 idle with at most 2: (128 - 2) // 3
    assert stream_k_ends_len(65, 66, 400) == 0  # one idle cluster for 65 ends: more than SK_MAX_SPLIT
    assert stream_k_ends_len(1023, 66, 128) == 0  # half a wave: stream_k_split cuts it
    assert stream_k_ends_len(132, 66, 128) == 0  # whole waves
    assert stream_k_ends_len(256, 66, 16) == 0  # ends of 16 // 9 = 1 k-block: not worth a fixup
    ends = GemmConfig(stream_k=True, stream_k_ends=True, swizzle=8)
    # 2048x8192x28672: 58 cut tiles, a partial tile per CTA of each; without ends, no split
    assert stream_k_workspace_words(ends, 66, 2048, 8192, 28672, sms=132) == 132 + 58 * 2 * 128 * 256
    assert stream_k_workspace_words(GemmConfig(stream_k=True), 66, 2048, 8192, 28672, sms=132) == 0
    # where stream_k_split applies, ends changes nothing
    assert stream_k_workspace_words(ends, 66, 1024, 1024, 1024, sms=132) == stream_k_workspace_words(
        GemmConfig(stream_k=True), 66, 1024, 1024, 1024, sms=132) > 0
    with pytest.raises(ValueError, match="stream_k_ends .* needs stream_k=True"):
        GemmConfig(stream_k_ends=True).validate(2, 2, H100)


def test_stream_k_ends_compiles_without_spill() -> None:
    """The ends plan (plain and with a fused bias + gelu on the stream-K fused tile)
    assembles without a spill, and a config without it keeps its PTX (the branch is
    compiled out)."""
    from ptxas_check import ptxas_no_spill

    for epi, cfg in ((None, GemmConfig(stream_k=True, stream_k_ends=True)),
                     (GemmEpilogue.preset("gelu", bias="col"),
                      GemmConfig(stream_k=True, stream_k_ends=True, epi_n=32, early_operands=False))):
        ptx = _ptx(True, True, ("bfloat16",) * (4 if epi else 3), epi, cfg)
        assert "fence.acq_rel.gpu" in ptx
        ptxas_no_spill(ptx)
    plain = _ptx(True, True, ("bfloat16",) * 3, None, GemmConfig(stream_k=True))
    assert plain != _ptx(True, True, ("bfloat16",) * 3, None, GemmConfig(stream_k=True, stream_k_ends=True))


def test_long_k_one_wave_default() -> None:
    """Weight-gradient shapes (long K, one wave of pingpong 128x192 tiles) take LONG_K,
    160 wide where those tiles still fit one wave; a second wave, short K, a fused
    epilogue or a tile count under LONG_K_FILL of the SMs keep the other rules."""
    from cuteforge.kernels.gemm.sm90.config import fit_swizzle
    from cuteforge.kernels.gemm.sm90.config.defaults import LONG_K

    for m, n, k in ((1024, 2816, 16384), (2816, 1024, 16384), (1024, 2816, 4096), (2048, 1536, 8192)):
        assert default_config(m, n, k, 132) == fit_swizzle(LONG_K, m, n), (m, n, k)
    for m, n, k in ((1536, 1536, 12288), (1536, 1536, 4096)):  # 12 x 10 tiles of 128x160: one wave
        assert default_config(m, n, k, 132) == fit_swizzle(replace(LONG_K, tile_n=160), m, n), (m, n, k)
    assert default_config(1536, 1536, 12288, 132).swizzle == 5  # 10 column tiles in groups of 5
    # batched: the tiles of every batch share the wave (4 x 36 tiles of 128x160 fit, 5 x do not)
    assert default_config(768, 768, 8192, 132, batch=4).tile_n == 160
    assert default_config(768, 768, 8192, 132, batch=5) == fit_swizzle(LONG_K, 768, 768)
    # M or N of at most 64 rows / columns keeps the narrow rules
    assert default_config(1, 1536, 8192, 132, batch=12).tile_m == 64
    assert default_config(1536, 1, 8192, 132, batch=8).tile_n < 160
    for m, n, k in ((1024, 4096, 16384), (2048, 2048, 8192), (1024, 2816, 2048), (1024, 1024, 16384)):
        assert default_config(m, n, k, 132) != fit_swizzle(LONG_K, m, n), (m, n, k)
    assert not default_config(1024, 2816, 16384, 132, fused=True).pingpong


def test_long_k_narrow_tile_assembles_without_spill() -> None:
    """The long-K rule's 128x160 tile, pingpong: 16-bit in the weight gradient's layout
    (A M-major, B N-major) and fp8 (K-major, 128-deep k-blocks), no spill."""
    from ptxas_check import ptxas_no_spill

    cfg = default_config(1536, 1536, 12288, 132)
    assert (cfg.tile_n, cfg.pingpong) == (160, True)
    ptx = _ptx(False, False, ("bfloat16",) * 3, cfg=cfg)
    assert "m64n160k16" in ptx
    ptxas_no_spill(ptx)
    ptx = _ptx_fp8(("float8_e4m3fn", "float8_e4m3fn", "bfloat16"), cfg=default_config(1536, 1536, 12288, 132, in_bytes=1))
    assert "m64n160k32" in ptx
    ptxas_no_spill(ptx)


def test_stream_k_compiles() -> None:
    """stream_k kernels: the flag protocol (gpu-scope fence + acquire loads) is in the PTX
    and nowhere else; plain and fused compile without spills."""
    plain = _ptx(True, True, ("bfloat16",) * 3)
    assert "acquire.gpu" not in plain and "fence.acq_rel.gpu" not in plain
    sk = _ptx(True, True, ("bfloat16",) * 3, cfg=GemmConfig(stream_k=True))
    assert "ld.acquire.gpu" in sk and "fence.acq_rel.gpu" in sk and "m64n256k16" in sk
    fused = _ptx(False, True, ("bfloat16", "bfloat16", "float32", "bfloat16"), GemmEpilogue.preset("gelu", bias="col"),
                 GemmConfig(tile_n=128, cluster_m=1, cluster_n=2, stream_k=True))
    assert "ld.acquire.gpu" in fused and "tanh.approx.f32" in fused


def test_tune_problem_factory_keys_like_ops_gemm() -> None:
    """`cuteforge tune gemm_sm90_*`: the problem is keyed as ops.gemm keys the call (so the
    stored winner is what the op looks up), candidates start with the heuristic's config,
    are fitted to the shape and include the 64-row tiles for small M."""
    from cuteforge.kernels.gemm import tune as gemm_tune
    from cuteforge.kernels.gemm.sm90.config import fit_swizzle
    from cuteforge.tune_cli import problem_factory

    p = problem_factory("gemm_sm90_tn_col")((1000, 1000, 1000), "bfloat16", {"act": "gelu", "sms": 132})
    epi = GemmEpilogue.preset("gelu", bias="col")
    assert p.key == BoundKey(("bfloat16",) * 3 + ("int32", "bfloat16"), (), (8, 8, 8, 4, 8))
    assert p.params == {"sms": 132, "epilogue": epi.key} and p.dims == {"M": 1000, "N": 1000, "K": 1000}
    assert p.configs[0] == default_config(1000, 1000, 1000, 132, fused=True) and p.outputs == ("out",)
    assert all(fit_swizzle(c, 1000, 1000) == c for c in p.configs) and len(set(p.configs)) == len(p.configs)
    # odd K / N: ops.gemm copies into (and writes through) 16-byte aligned rows, so the key is aligned
    odd = problem_factory("gemm_sm90_nt")((777, 1001, 7), "float16", {"sms": 132})
    assert odd.key == BoundKey(("float16",) * 3 + ("int32",), (), (8, 8, 8, 4)) and "epilogue" not in odd.params
    small = problem_factory("gemm_sm90_tn")((2, 16, 4096, 14336), "bfloat16", {"sms": 132})
    assert GemmConfig(tile_m=64, tile_n=64, cluster_m=1, cluster_n=2) in small.configs and small.dims["M"] == 16
    for shape, params, msg in (((8, 8), {}, "MxNxK"), ((8, 8, 8), {"act": "tanh"}, "act must be"),
                               ((8, 8, 8), {"tile": 3}, "unknown parameter")):
        with pytest.raises(ValueError, match=msg):
            problem_factory("gemm_sm90_tn")(shape, "bfloat16", dict(params))
    with pytest.raises(ValueError, match="bfloat16 or float16"):
        problem_factory("gemm_sm90_tn")((8, 8, 8), "float32", {})
    with pytest.raises(ValueError, match="no problem factory.*gemm_sm90_tn_col"):
        problem_factory("gemm_sm90_tn_row")
    assert gemm_tune.tune_configs(16384, 16384, 16384, 132, 2, False)[0].stream_k  # the heuristic's own first
    # the factory passes the batch to the heuristic: unbatched 8192^3 is cut into ends, 2 x 8192^3
    # (whose last wave over both batches is 2 clusters) not
    assert problem_factory("gemm_sm90_tn")((8192, 8192, 8192), "bfloat16", {"sms": 132}).configs[0].stream_k_ends
    assert not problem_factory("gemm_sm90_tn")((2, 8192, 8192, 8192), "bfloat16", {"sms": 132}).configs[0].stream_k_ends


def test_cli_param_parsing() -> None:
    from cuteforge.cli import _params

    assert _params(["act=gelu", "sms=114", "op = amax"]) == {"act": "gelu", "sms": 114, "op": "amax"}
    with pytest.raises(ValueError, match="NAME=VALUE"):
        _params(["gelu"])


def _bench_gemm():
    import benchmark_scripts

    return benchmark_scripts.load("bench_gemm")


@pytest.mark.parametrize("n", [1, 2, 3, 4, 6, 7, 13])
def test_bench_measure_rotates_the_order(n: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """bench_gemm.measure times every contender once per round and starts each round at a
    different contender; up to BALANCED_UP_TO contenders each takes each position equally
    often (docs/kernels/gemm.md: a fixed order favoured one position by up to 3 %)."""
    from collections import Counter

    bench = _bench_gemm()
    calls: list[int] = []
    monkeypatch.setattr(bench.timing, "bench", lambda fn, **kw: calls.append(fn()) or 1.0)
    ms = bench.measure({i: (lambda i=i: i) for i in range(n)})
    assert ms == {i: 1.0 for i in range(n)}
    rounds = len(calls) // n
    assert len(calls) == rounds * n and rounds >= bench.ROUNDS
    orders = [calls[r * n:(r + 1) * n] for r in range(rounds)]
    assert all(sorted(o) == list(range(n)) for o in orders)  # each round: everyone once
    positions = Counter((pos, c) for o in orders for pos, c in enumerate(o))
    if n <= bench.BALANCED_UP_TO:
        assert set(positions.values()) == {rounds // n}, positions
    else:
        assert len({o[0] for o in orders}) == rounds  # every round starts elsewhere


def test_bench_flags_wrong_results() -> None:
    """bench_gemm.py lists every contender whose error against the reference is above
    ERR_TOL (or NaN) under "flagged" and exits 1; rounding-level errors pass."""
    bench = _bench_gemm()
    result = {"command": "x", "plain": [{"set": "bar", "M": 8, "N": 8, "K": 8, "cuteforge_rel_err": 0.004, "quack_rel_err": 0.5}],
              "epilogue": [{"M": 8, "N": 8, "K": 8, "epilogue": "bias+gelu", "cuteforge_rel_err": float("nan")}],
              "config_sweep": [{"M": 8, "N": 8, "K": 8, "config": "c", "rel_err": 0.03}, {"config": "d", "error": "boom"}]}
    flagged = bench.flag_errors(result)
    assert [(f["section"], f["contender"]) for f in flagged] == [("plain", "quack"), ("epilogue", "cuteforge"), ("config_sweep", "cuteforge")]
    assert flagged[0]["set"] == "bar" and flagged[2]["config"] == "c"


def test_persistent_grid_capped_by_resident_clusters(monkeypatch: pytest.MonkeyPatch) -> None:
    """4-CTA clusters: the persistent grid is the clusters the device runs at once when that
    is below sms / 4 (a 132-SM H200 holds 30, not 33), and the builder takes that count from
    the `clusters` compile parameter; pairs are never asked (sms / 2 always fit)."""
    import importlib

    mod = importlib.import_module("cuteforge.ops.gemm_launch")
    asked: list[int] = []

    def fake_cap(device: int, size: int) -> int | None:
        asked.append(size)
        return {4: 30}.get(size)

    monkeypatch.setattr(mod, "max_active_clusters", fake_cap)
    assert mod._persistent_clusters(0, GemmConfig(cluster_m=2, cluster_n=2), 132) == 30
    assert mod._persistent_clusters(0, GemmConfig(cluster_m=4, cluster_n=1), 132) == 30
    assert mod._persistent_clusters(0, GemmConfig(cluster_m=2, cluster_n=2), 100) == 25  # below the cap
    assert asked == [4, 4, 4]
    assert mod._persistent_clusters(0, GemmConfig(), 132) == 66
    assert mod._persistent_clusters(0, GemmConfig(cluster_m=1, cluster_n=1), 132) == 132
    assert asked == [4, 4, 4]
    monkeypatch.setattr(mod, "max_active_clusters", lambda device, size: None)  # cannot be asked
    assert mod._persistent_clusters(0, GemmConfig(cluster_m=2, cluster_n=2), 132) == 33

    import cuteforge.kernels.gemm.sm90.host as host

    seen: list[int] = []
    monkeypatch.setattr(host, "make_gemm", lambda cfg, stages, a_k, b_k, kinds, epi, clusters, scaled=False, sms=0: seen.append(clusters))
    k = gemm_kernel(True, True)
    key = BoundKey(("bfloat16",) * 3 + ("int32",), (), (8, 8, 8, 4))
    cfg = GemmConfig(cluster_m=2, cluster_n=2)
    k.builder(k.spec(key, (("clusters", 30), ("sms", 132)), cfg, arch="sm_90a"))
    k.builder(k.spec(key, (("sms", 132),), cfg, arch="sm_90a"))
    assert seen == [30, 33]


def test_op_traced_with_fake_tensors_outside_dynamo_takes_the_registered_op() -> None:
    """AOTAutograd traces a custom op's backward that calls gemm (linear_cross_entropy's)
    with fake tensors while torch.compiler.is_compiling() is False: the call must become
    torch.ops.cuteforge.gemm (its fake implementation), never plan on a data pointer."""
    import importlib

    from torch._subclasses.fake_tensor import FakeTensorMode, is_fake

    from cuteforge.fusion import Epilogue

    gemm_ops = importlib.import_module("cuteforge.ops.gemm")
    ep = Epilogue.from_fn(lambda acc, c, s: (acc + c) * s, c="full", s="col")
    with FakeTensorMode():
        a = torch.empty(64, 32, dtype=torch.bfloat16, device="cuda")
        b = torch.empty(32, 48, dtype=torch.bfloat16, device="cuda")
        c = torch.empty(64, 48, dtype=torch.bfloat16, device="cuda")
        s = torch.empty(48, dtype=torch.float32, device="cuda")
        out = gemm_ops.gemm(a, b, epilogue=ep, epilogue_args={"c": c, "s": s})
    assert is_fake(out) and out.shape == (64, 48) and out.dtype == torch.bfloat16


def _ptx_gated(cfg: GemmConfig, a_k: bool = True, gate: str = "silu", dtype: str = "bfloat16") -> str:
    from cuteforge.kernels.gemm.spec import gemm_gated_kernel

    k = gemm_gated_kernel(a_k, gate)
    key = BoundKey((dtype,) * 4 + ("int32",), (), (8, 8, 8, 8, 4))  # a, b_gate, b_up, out, work
    spec = k.spec(key, (("sms", 132),), cfg, arch="sm_90a")
    res = compiler.compile_jit(k.builder(spec), k.signature.fake_args(key), "sm_90a", keep_artifacts=True)
    assert res.ptx
    return res.ptx


@pytest.mark.parametrize("cfg", [GemmConfig(), GemmConfig(tile_n=192, pingpong=True, epi_bufs=2),
                                 GemmConfig(tile_n=128, stream_k=True)], ids=repr)
def test_gated_gemm_compiles_without_spill(cfg: GemmConfig) -> None:
    """The gated GEMM (SwiGLU's gate and up in one kernel): the MMA spans both halves
    (m64n<tile_n>), B arrives as two TMA loads a stage where the plain kernel issues one,
    the epilogue computes silu (tanh.approx) once per output value, and ptxas spills nothing."""
    from ptxas_check import ptxas_no_spill

    from cuteforge.kernels.gemm.sm90.config import gated_config

    cfg = gated_config(cfg)
    gated = _ptx_gated(cfg)
    plain = _ptx(True, True, ("bfloat16",) * 3, cfg=cfg)
    assert f"m64n{cfg.tile_n}k16" in gated
    loads = r"cp\.async\.bulk\.tensor\.\dd\.shared::cluster\.global"
    assert len(re.findall(loads, gated)) == len(re.findall(loads, plain)) + 1
    assert "tanh.approx.f32" in gated and "tanh.approx.f32" not in plain
    ptxas_no_spill(gated)


def test_gated_gemm_gelu_and_m_major_a_compile() -> None:
    ptx = _ptx_gated(GemmConfig(tile_n=128), a_k=False, gate="gelu", dtype="float16")
    assert "m64n128k16" in ptx and "tanh.approx.f32" in ptx


def test_gated_config() -> None:
    """The gated GEMM's output tile is tile_n / 2 wide: its subtiles must divide that."""
    from cuteforge.kernels.gemm.sm90.config import gated_config

    assert gated_config(GemmConfig()) == GemmConfig()  # 128 / 32
    assert gated_config(GemmConfig(tile_n=192, epi_n=64)).epi_n == 32  # 96 / 32
    assert gated_config(GemmConfig(tile_n=160, epi_n=32)).epi_n == 16  # 80 / 16
    assert gated_config(GemmConfig(tile_n=144)).tile_n == 128
    for tile_n in (64, 96, 128, 160, 192, 224, 256):
        gated_config(GemmConfig(tile_n=tile_n)).validate_gated()
    with pytest.raises(ValueError, match="tile_n a multiple of 32"):
        GemmConfig(tile_n=144, epi_n=16).validate_gated()
    with pytest.raises(ValueError, match="epi_n"):
        GemmConfig(tile_n=192, epi_n=64).validate_gated()
    # a 16-row half-tile multicast over 4 CTAs would split 8-row swizzle atoms
    with pytest.raises(ValueError, match="cluster_m 4"):
        GemmConfig(tile_n=32, cluster_m=4).validate_gated()
    assert gated_config(GemmConfig(tile_n=32, cluster_m=4)).cluster_m == 2
    assert gated_config(GemmConfig(tile_n=96, cluster_m=4)).cluster_m == 2


def test_gated_tune_problem() -> None:
    """`cuteforge tune gemm_sm90_tn_silu_mul --shapes MxNxK`: keyed as ops.gated_gemm keys
    the call (a, both weights, out, work; dims of the output's N), the heuristic's config
    for the (M, 2N) product first, every candidate one the gated kernel can run."""
    from cuteforge.kernels.gemm.sm90.config import fit_swizzle, gated_config
    from cuteforge.tune_cli import problem_factory

    p = problem_factory("gemm_sm90_tn_silu_mul")((4096, 14336, 4096), "bfloat16", {"sms": 132})
    assert p.key == BoundKey(("bfloat16",) * 4 + ("int32",), (), (8, 8, 8, 8, 4))
    assert p.dims == {"M": 4096, "N": 14336, "K": 4096} and p.params == {"sms": 132}
    assert p.configs[0] == fit_swizzle(gated_config(default_config(4096, 2 * 14336, 4096, 132)), 4096, 2 * 14336)
    assert all(c.gated_ok for c in p.configs) and len(set(p.configs)) == len(p.configs) > 4
    with pytest.raises(ValueError, match="MxNxK"):
        problem_factory("gemm_sm90_nn_gelu_mul")((2, 8, 8, 8), "bfloat16", {})
    with pytest.raises(ValueError, match="unknown parameter"):
        problem_factory("gemm_sm90_tn_silu_mul")((8, 8, 8), "bfloat16", {"act": "gelu"})
