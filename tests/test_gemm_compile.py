"""sm_90a GEMM on a machine without a GPU: configs, compiles of representative
specializations (PTX must hold wgmma, TMA and the fused math), argument errors."""

from __future__ import annotations

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
    key = BoundKey(dtypes, (), tuple(4 if d == "float32" else 8 for d in dtypes))
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
    assert default_config(8192, 8192, 8192) == GemmConfig()
    assert default_config(16384, 16384, 1024).pingpong and default_config(1024, 1024, 1024).tile_n == 64
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
