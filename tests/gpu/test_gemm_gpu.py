"""sm_90a GEMM against torch (fp32 reference of the same 16-bit inputs) on the GPU: odd
shapes, every dtype pair, all four operand majors, batches, misaligned views, fused
epilogues, every candidate config, gradients, torch.compile, errors."""

from __future__ import annotations

import importlib
from typing import Any

import pytest
import torch
import torch.nn.functional as F

from cuteforge.ops.gemm import gemm

pytestmark = pytest.mark.gpu

if not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0):
    pytest.skip("needs an sm_90 GPU", allow_module_level=True)


def _work() -> torch.Tensor:
    """A zeroed workspace big enough for any config's stream-K split (flags, then one fp32
    128x256 partial tile per SM; kernels leave the flags zero)."""
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    return torch.zeros(sms * (128 * 256 + 1), dtype=torch.int32, device="cuda")


def _ref(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return torch.matmul(a.float(), b.float())


def _close(got: torch.Tensor, ref: torch.Tensor, k: int) -> None:
    assert got.shape == ref.shape, (got.shape, ref.shape)
    if got.dtype == torch.float32:
        rtol, atol = 1e-4, 1e-4 * max(k, 1) ** 0.5
    else:
        rtol, atol = 1.6e-2, 1e-2 * max(k, 1) ** 0.5
    torch.testing.assert_close(got.float(), ref, rtol=rtol, atol=atol)


SHAPES = [(1, 1, 1), (7, 13, 7), (1000, 1000, 1000), (65537, 72, 40), (257, 383, 129), (16, 4096, 4096), (2048, 2048, 2048)]


@pytest.mark.parametrize("out_dtype", [None, torch.float32])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("mnk", SHAPES)
def test_matches_torch(mnk: tuple[int, int, int], dtype: torch.dtype, out_dtype: torch.dtype | None) -> None:
    m, n, k = mnk
    a = torch.randn(m, k, device="cuda", dtype=dtype)
    b = torch.randn(k, n, device="cuda", dtype=dtype)
    got = gemm(a, b, out_dtype=out_dtype)
    assert got.dtype == (out_dtype or dtype) and got.is_contiguous()
    _close(got, _ref(a, b), k)


def test_fp16_out_from_bf16() -> None:
    a = torch.randn(300, 264, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(264, 520, device="cuda", dtype=torch.bfloat16)
    _close(gemm(a, b, out_dtype=torch.float16), _ref(a, b), 264)


@pytest.mark.parametrize("a_t", [False, True])
@pytest.mark.parametrize("b_t", [False, True])
def test_operand_majors(a_t: bool, b_t: bool) -> None:
    m, n, k = 300, 520, 264
    a = torch.randn(k, m, device="cuda", dtype=torch.bfloat16).t() if a_t else torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, k, device="cuda", dtype=torch.bfloat16).t() if b_t else torch.randn(k, n, device="cuda", dtype=torch.bfloat16)
    _close(gemm(a, b), _ref(a, b), k)


def test_batched_and_broadcast_b() -> None:
    a = torch.randn(3, 100, 200, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(3, 200, 136, device="cuda", dtype=torch.bfloat16)
    _close(gemm(a, b), _ref(a, b), 200)
    b2 = torch.randn(200, 136, device="cuda", dtype=torch.bfloat16)
    _close(gemm(a, b2), _ref(a, b2), 200)
    bt = torch.randn(3, 136, 200, device="cuda", dtype=torch.bfloat16).transpose(1, 2)
    _close(gemm(a, bt), _ref(a, bt), 200)


def test_misaligned_and_strided_views() -> None:
    big = torch.randn(512, 1030, device="cuda", dtype=torch.bfloat16)
    a = big[:300, 3:259]  # pointer 6 bytes off, row stride 1030 elements: copied once
    b = torch.randn(256, 1000, device="cuda", dtype=torch.bfloat16)[:, 8:392]  # aligned view: no copy
    _close(gemm(a, b), _ref(a, b), 256)
    wide = torch.randn(256, 600, device="cuda", dtype=torch.bfloat16)[:, :300]  # row stride 600: no copy
    _close(gemm(a, wide), _ref(a, wide), 256)


@pytest.mark.parametrize("act", ["relu", "gelu", "silu"])
@pytest.mark.parametrize("bias_kind", [None, "col", "row"])
def test_fused_presets(act: str, bias_kind: str | None) -> None:
    m, n, k = 1000, 1000, 520
    a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(k, n, device="cuda", dtype=torch.bfloat16)
    bias = None if bias_kind is None else torch.randn(n if bias_kind == "col" else m, device="cuda", dtype=torch.bfloat16)
    if bias_kind == "row":
        bias = bias[:, None]
    z = _ref(a, b) + (0 if bias is None else bias.float())
    ref = {"relu": F.relu, "gelu": lambda x: F.gelu(x, approximate="tanh"), "silu": F.silu}[act](z)
    _close(gemm(a, b, bias=bias, epilogue=act), ref, k)


def test_alpha_beta_c_and_residual() -> None:
    m, n, k = 777, 999, 300
    a = torch.randn(2, m, k, device="cuda", dtype=torch.float16)
    b = torch.randn(2, k, n, device="cuda", dtype=torch.float16)
    c = torch.randn(2, m, n, device="cuda", dtype=torch.float32)
    r = torch.randn(m, n, device="cuda", dtype=torch.bfloat16)  # broadcast over the batch
    got = gemm(a, b, c=c, alpha=0.5, beta=-2.0, residual=r, epilogue="silu", out_dtype=torch.float32)
    ref = F.silu(0.5 * _ref(a, b) - 2.0 * c) + r.float()
    _close(got, ref, k)


def test_fusion_epilogue() -> None:
    from cuteforge.fusion import Epilogue, relu

    ep = Epilogue.from_fn(lambda acc, s, bias, t: relu(acc * s + bias) * t, s="row", bias="col", t="scalar")
    m, n, k = 513, 700, 264
    a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(k, n, device="cuda", dtype=torch.bfloat16)
    s = torch.rand(m, device="cuda")
    bias = torch.randn(n, device="cuda")
    got = gemm(a, b, epilogue=ep, epilogue_args={"s": s, "bias": bias, "t": 3.0})
    _close(got, F.relu(_ref(a, b) * s[:, None] + bias) * 3.0, k)


def test_every_candidate_config() -> None:
    """Every config the tuner may pick is correct on ragged M, N, K."""
    from cuteforge.kernels.gemm.spec import _configs, gemm_kernel

    m, n, k = 777, 1000, 1000
    a = torch.randn(1, m, k, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(1, n, k, device="cuda", dtype=torch.bfloat16).transpose(1, 2)
    kern = gemm_kernel(True, True)
    out = torch.empty(1, m, n, device="cuda", dtype=torch.bfloat16)
    work = _work()
    key = kern.signature.bind((a, b, out, work))
    params = (("sms", torch.cuda.get_device_properties(0).multi_processor_count),)
    ref = _ref(a, b)
    from cuteforge.kernels.gemm.sm90.config import candidate_configs, default_config

    # ... and every config the untuned heuristic picks (64x128 c2x1 / c1x2 are in no
    # candidate list), each run on this ragged shape.
    defaults = [default_config(m_, n_, k_, params[0][1], fused=f) for m_ in (1, 65, 129, 4096) for n_ in (1, 8192, 14336, 65537)
                for k_ in (64, 4096) for f in (False, True)]
    cfgs = list(dict.fromkeys(_configs(kern.spec(key, params)) + candidate_configs(64, n) + defaults))
    assert len(cfgs) >= 6
    for cfg in cfgs:
        out.fill_(float("nan"))
        kern.get(key, params, cfg)(a, b, out, work)
        torch.cuda.synchronize()
        try:
            _close(out, ref, k)
        except AssertionError as e:
            raise AssertionError(f"config {cfg}: {e}") from None


@pytest.mark.parametrize("tm,tn,bufs", [(128, 128, 0), (64, 256, 0), (128, 192, 2), (128, 192, 1), (128, 160, 2)])
def test_pingpong_batched_fused(tm: int, tn: int, bufs: int) -> None:
    """Pingpong warpgroups (alternate tiles, own epilogue buffers) on ragged batched
    shapes with a fused epilogue; small N-tiles make each CTA run several tiles. 128x192
    holds 192 accumulators a thread, with 2 staging buffers (5 stages) or 1."""
    from cuteforge.kernels.gemm.sm90.config import GemmConfig

    cfg = GemmConfig(tile_m=tm, tile_n=tn, pingpong=True, epi_bufs=bufs)
    a = torch.randn(3, 1000, 520, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(3, 520, 1500, device="cuda", dtype=torch.bfloat16)
    bias = torch.randn(1500, device="cuda", dtype=torch.bfloat16)
    got = gemm(a, b, bias=bias, epilogue="gelu", config=cfg)
    _close(got, F.gelu(_ref(a, b) + bias.float(), approximate="tanh"), 520)
    a = torch.randn(4096, 2048, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(2048, 4096, device="cuda", dtype=torch.bfloat16)
    _close(gemm(a, b, config=cfg, out_dtype=torch.float32), _ref(a, b), 2048)


@pytest.mark.parametrize("mnk", [(1536, 1536, 12288), (1531, 1529, 4097), (1, 1536, 4096), (1536, 7, 4096)])
def test_long_k_weight_gradient_layout(mnk: tuple[int, int, int]) -> None:
    """The weight gradient's layout (A M-major, B N-major, read in place): the default
    (at 1536^2 the long-K rule's pingpong 128x160) and the 128x160 tile forced, also at
    odd extents where M, N and K are not multiples of the tile."""
    from cuteforge.kernels.gemm.sm90.config import GemmConfig
    from cuteforge.ops.gemm_launch import _operand_for

    m, n, k = mnk
    # views into rows of 1536 elements: odd extents whose strides TMA still reads in place,
    # so the kernel sees A M-major and B N-major (a copy would turn them K-major)
    a = torch.randn(k, 1536, device="cuda", dtype=torch.bfloat16)[:, :m].t()
    b = torch.randn(k, 1536, device="cuda", dtype=torch.bfloat16)[:, :n]
    for t, prefer in ((a, (2, 1)), (b, (1, 2))):  # read in place, not K-major
        got, k_major = _operand_for(t.unsqueeze(0), prefer)
        assert got.data_ptr() == t.data_ptr() and not k_major
    _close(gemm(a, b), _ref(a, b), k)
    _close(gemm(a, b, config=GemmConfig(tile_n=160, pingpong=True, epi_bufs=2)), _ref(a, b), k)


@pytest.mark.parametrize("bias_dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("kind", ["col", "row"])
def test_early_operands_match_late(kind: str, bias_dtype: torch.dtype) -> None:
    """A bias loaded while the mainloop runs (early_operands, the default) gives the bits
    of one loaded in the epilogue, and torch's answer: every CTA runs several ragged
    tiles; K of 1, 4 and 16 k-blocks (shorter than the 4 subtiles whose stores the first
    k-blocks carry, and longer); bias per column (N odd: the last tile is cut mid-pair)
    and per row, in bf16, fp16 and fp32. On the large shapes' fused default (cooperative
    128x256) and on this shape's own default (pingpong, where early_operands is a no-op)."""
    from dataclasses import replace

    from cuteforge.kernels.gemm.sm90.config import GemmConfig, default_config

    m, n = 2049, 4103
    bias = torch.randn(n if kind == "col" else m, device="cuda", dtype=bias_dtype)
    bias2 = bias if kind == "col" else bias[:, None]
    for k in (64, 200, 1000):
        a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        b = torch.randn(k, n, device="cuda", dtype=torch.bfloat16)
        ref = F.gelu(_ref(a, b) + (bias.float() if kind == "col" else bias.float()[:, None]), approximate="tanh")
        large = GemmConfig(epi_n=64, raster="n")
        assert large.loads_operands_early
        own = default_config(m, n, k, torch.cuda.get_device_properties(0).multi_processor_count, fused=True)
        for cfg in (large, own):
            early = gemm(a, b, bias=bias2, epilogue="gelu", config=cfg)
            late = gemm(a, b, bias=bias2, epilogue="gelu", config=replace(cfg, early_operands=False))
            assert torch.equal(early, late), (k, cfg, (early.float() - late.float()).abs().max().item())
            _close(early, ref, k)


@pytest.mark.parametrize("k", [64, 200, 1000])
@pytest.mark.parametrize("overlap", [True, False])
def test_store_overlap_many_tiles(k: int, overlap: bool) -> None:
    """store_overlap holds each tile's converted output and stores it under the next
    tile's first k-blocks: every CTA runs several ragged tiles, K of 1 and 4 k-blocks
    (fewer than the 8 / 4 subtiles a held tile stores, so stores outlast the mainloop)
    and 16; plain, fused, 64-wide subtiles, 128x128 tiles, fp16 out, batched, stream-K."""
    from dataclasses import replace

    from cuteforge.kernels.gemm.sm90.config import GemmConfig

    a = torch.randn(2, 2049, k, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(2, k, 4103, device="cuda", dtype=torch.bfloat16)
    bias = torch.randn(4103, device="cuda", dtype=torch.bfloat16)
    ref = _ref(a, b)
    gelu = F.gelu(ref + bias.float(), approximate="tanh")
    for cfg in (GemmConfig(), GemmConfig(epi_n=64, raster="n"), GemmConfig(tile_n=128, cluster_m=1, cluster_n=2),
                GemmConfig(stream_k=True)):
        cfg = replace(cfg, store_overlap=overlap)
        try:
            _close(gemm(a, b, config=cfg), ref, k)
            _close(gemm(a, b, bias=bias, epilogue="gelu", config=cfg, out_dtype=torch.float16), gelu, k)
            _close(gemm(a[0], b[0], bias=bias, epilogue="gelu", config=cfg), gelu[0], k)
        except AssertionError as e:
            raise AssertionError(f"config {cfg}: {e}") from None


@pytest.mark.parametrize("a_shape,b_shape", [((0, 64), (64, 24)), ((16, 64), (64, 0)), ((16, 0), (0, 24)), ((0, 16, 64), (0, 64, 24))])
def test_empty_dims(a_shape: tuple[int, ...], b_shape: tuple[int, ...]) -> None:
    """M, N, K or L == 0: torch's answer (K == 0: the epilogue of a zero accumulator)."""
    a = torch.randn(a_shape, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(b_shape, device="cuda", dtype=torch.bfloat16)
    bias = torch.randn(b_shape[-1], device="cuda", dtype=torch.bfloat16)
    got = gemm(a, b, bias=bias, epilogue="gelu")
    ref = F.gelu(_ref(a, b) + bias.float(), approximate="tanh")
    assert got.shape == ref.shape and got.dtype == torch.bfloat16
    torch.testing.assert_close(got.float(), ref.bfloat16().float())


def test_gradients() -> None:
    a = torch.randn(96, 136, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    b = torch.randn(136, 80, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    bias = torch.randn(80, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    g = torch.randn(96, 80, device="cuda", dtype=torch.bfloat16)
    gemm(a, b, bias=bias, epilogue="gelu").backward(g)
    a2, b2, bias2 = (t.detach().float().requires_grad_() for t in (a, b, bias))
    F.gelu(a2 @ b2 + bias2, approximate="tanh").backward(g.float())
    for got, want in ((a.grad, a2.grad), (b.grad, b2.grad), (bias.grad, bias2.grad)):
        torch.testing.assert_close(got.float(), want, rtol=2e-2, atol=5e-2)


def _rel_err(got: torch.Tensor, want: torch.Tensor) -> float:
    return ((got.float() - want.float()).norm() / want.float().norm().clamp_min(1e-6)).item()


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize(("m", "k", "n"), [(1, 64, 8), (7, 136, 1000), (1000, 520, 72), (4097, 264, 344)])
@pytest.mark.parametrize("epi", ["none", "bias", "gelu", "silu", "relu_row", "residual", "c_alpha_beta"])
def test_gradients_run_on_cuteforge_gemms(monkeypatch, dtype, m, k, n, epi) -> None:
    """The backward's dA and dB are cuteforge GEMMs (torch's recompute is never called), in
    each input's layout (an nn.Linear weight's gradient contiguous), matching torch."""
    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("the GEMM is sm_90a")
    launch = importlib.import_module("cuteforge.ops.gemm_launch")

    monkeypatch.setattr(launch, "_reference", lambda *a, **k: (_ for _ in ()).throw(AssertionError("torch recompute ran")))
    torch.manual_seed(0)
    x = torch.randn(m, k, device="cuda", dtype=dtype, requires_grad=True)
    w = (torch.randn(n, k, device="cuda", dtype=dtype) / k ** 0.5).requires_grad_()
    kw: dict[str, Any] = {}
    extra: list[torch.Tensor] = []
    if epi in ("bias", "gelu", "silu"):
        kw["bias"] = torch.randn(n, device="cuda", dtype=dtype, requires_grad=True)
        kw["epilogue"] = None if epi == "bias" else epi
    elif epi == "relu_row":
        if m == 1:
            pytest.skip("a (1, 1) bias reads as per column")
        kw.update(bias=torch.randn(m, 1, device="cuda", dtype=dtype, requires_grad=True), epilogue="relu")
    elif epi == "residual":
        kw["residual"] = torch.randn(m, n, device="cuda", dtype=dtype, requires_grad=True)
    else:
        kw.update(c=torch.randn(1, n, device="cuda", dtype=dtype, requires_grad=True), alpha=0.5, beta=2.0)
    extra = [t for t in kw.values() if isinstance(t, torch.Tensor)]
    g = torch.randn(m, n, device="cuda", dtype=dtype)
    gemm(x, w.t(), **kw).backward(g)
    assert w.grad.is_contiguous() and x.grad.is_contiguous()
    leaves = [t.detach().float().requires_grad_() for t in (x, w, *extra)]
    kf = dict(kw)
    for name, t in zip([n_ for n_, v in kw.items() if isinstance(v, torch.Tensor)], leaves[2:]):
        kf[name] = t
    acts = {None: lambda t: t, "relu": F.relu, "gelu": lambda t: F.gelu(t, approximate="tanh"), "silu": F.silu}
    z = kf.get("alpha", 1.0) * (leaves[0] @ leaves[1].t())
    if "c" in kf:
        z = z + kf["beta"] * kf["c"]
    if "bias" in kf:
        z = z + kf["bias"]
    y = acts[kf.get("epilogue")](z) + (kf["residual"] if "residual" in kf else 0)
    y.backward(g.float())
    for got, want in ((x.grad, leaves[0].grad), (w.grad, leaves[1].grad), *((t.grad, lf.grad) for t, lf in zip(extra, leaves[2:]))):
        assert got.shape == want.shape and got.dtype == dtype
        assert _rel_err(got, want) < 2e-2, (epi, got.shape)


def test_torch_compile_and_errors() -> None:
    a = torch.randn(128, 64, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(64, 96, device="cuda", dtype=torch.bfloat16)
    bias = torch.randn(96, device="cuda", dtype=torch.bfloat16)
    f = torch.compile(lambda a, b, bias: gemm(a, b, bias=bias, epilogue="relu") * 2, backend="aot_eager", fullgraph=True)
    _close(f(a, b, bias), F.relu(_ref(a, b) + bias.float()) * 2, 64)
    with pytest.raises(TypeError, match="a is bfloat16 but b is float16"):
        gemm(a, b.half())
    with pytest.raises(ValueError, match="a has K=64"):
        gemm(a, b[:32])
    with pytest.raises(ValueError, match=r"argument 'bias' must be a per-column operand of shape \(96,\)"):
        gemm(a, b, bias=bias[:50])
    with pytest.raises(ValueError, match="CUDA tensor"):
        gemm(a.cpu(), b.cpu())


@pytest.mark.parametrize("n", [64, 128, 192, 384])
def test_narrow_n_fitted_swizzle(n: int) -> None:
    """Narrow N with large M: the heuristic's swizzle group is fitted to the 1-2 cluster
    columns that exist (no padding clusters); swizzle 1 is the scheduler's FastDivmod path."""
    from cuteforge.kernels.gemm.sm90.config import cluster_grid, default_config, scheduled_clusters

    m, k = 20000, 1040
    cfg = default_config(m, n, k, torch.cuda.get_device_properties(0).multi_processor_count)
    cm, cn = cluster_grid(cfg, m, n)
    assert cfg.swizzle <= max(cn, 1) and scheduled_clusters(cfg, m, n) == cm * cn, cfg
    a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, k, device="cuda", dtype=torch.bfloat16).t()
    bias = torch.randn(n, device="cuda", dtype=torch.bfloat16)
    _close(gemm(a, b, bias=bias, epilogue="relu"), F.relu(_ref(a, b) + bias.float()), k)


@pytest.mark.parametrize("swizzle,raster", [(1, "m"), (2, "m"), (3, "m"), (1, "n"), (3, "n")])
def test_fitted_swizzle_values(swizzle: int, raster: str) -> None:
    """Swizzle sizes the fit can produce (1: FastDivmod decode; 2, 3: non-power-of-two
    groups), for both raster orders, on shapes where they leave no padding."""
    from cuteforge.kernels.gemm.sm90.config import GemmConfig

    cfg = GemmConfig(tile_n=128, swizzle=swizzle, raster=raster)
    for m, n in ((1000, 300), (777, 1000), (3 * 256, 3 * 128)):
        a = torch.randn(2, m, 264, device="cuda", dtype=torch.bfloat16)
        b = torch.randn(2, 264, n, device="cuda", dtype=torch.bfloat16)
        _close(gemm(a, b, config=cfg), _ref(a, b), 264)


# ---- fp8 (e4m3 / e5m2, per-tensor scales) ------------------------------------------------
FP8 = [torch.float8_e4m3fn, torch.float8_e5m2]


def _quant(x: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-tensor amax quantization: (q, s) with q * s ~ x; s is a one-element fp32 tensor."""
    s = (x.abs().amax().float() / torch.finfo(dtype).max).clamp_min(1e-12).reshape(1)
    return (x / s).to(dtype), s


def _fp8_inputs(m: int, n: int, k: int, da: torch.dtype, db: torch.dtype, batch: int = 0) -> tuple[torch.Tensor, ...]:
    """a row-major (M, K), b = the .t() of an (N, K) weight (K-major), as torch._scaled_mm."""
    lead = (batch,) if batch else ()
    a, sa = _quant(torch.randn(*lead, m, k, device="cuda"), da)
    w, sb = _quant(torch.randn(*lead, n, k, device="cuda"), db)
    return a, w.mT, sa, sb


def _fp8_ref(a: torch.Tensor, b: torch.Tensor, sa: Any, sb: Any) -> torch.Tensor:
    """Dequantized fp32 matmul of the same fp8 values: only accumulation error remains."""
    return torch.matmul(a.float() * sa, b.float() * sb)


def _close_fp8(got: torch.Tensor, ref: torch.Tensor, k: int) -> None:
    """The fp8 WGMMA adds its products into the fp32 accumulator with reduced precision
    (the DeepSeek-V3 report measured ~14 retained bits on H800; cuBLAS's
    use_fast_accum=True path has the same property), so the bound is the 16-bit one for
    every output dtype, plus a normwise bound that any layout/scale bug exceeds by 100x."""
    assert got.shape == ref.shape, (got.shape, ref.shape)
    torch.testing.assert_close(got.float(), ref, rtol=2e-2, atol=2e-2 * max(k, 1) ** 0.5)
    if ref.numel():
        rel = float((got.float() - ref).norm() / ref.norm().clamp_min(1e-12))
        assert rel < 1e-2, rel


FP8_SHAPES = [(1, 1, 16), (7, 13, 32), (1000, 1000, 1008), (257, 383, 144), (65537, 72, 48), (2048, 2048, 2048)]


@pytest.mark.parametrize("out_dtype", [None, torch.float32])
@pytest.mark.parametrize("dtype", FP8)
@pytest.mark.parametrize("mnk", FP8_SHAPES)
def test_fp8_matches_torch(mnk: tuple[int, int, int], dtype: torch.dtype, out_dtype: torch.dtype | None) -> None:
    m, n, k = mnk
    a, b, sa, sb = _fp8_inputs(m, n, k, dtype, dtype)
    got = gemm(a, b, scale_a=sa, scale_b=sb, out_dtype=out_dtype)
    assert got.dtype == (out_dtype or torch.bfloat16) and got.is_contiguous()
    _close_fp8(got, _fp8_ref(a, b, sa, sb), k)


def test_fp8_mixed_formats_scales_and_epilogues() -> None:
    m, n, k = 1000, 700, 1024
    a, b, sa, sb = _fp8_inputs(m, n, k, torch.float8_e5m2, torch.float8_e4m3fn)
    ref = _fp8_ref(a, b, sa, sb)
    _close_fp8(gemm(a, b, scale_a=sa, scale_b=sb), ref, k)
    _close_fp8(gemm(a, b, scale_a=float(sa), scale_b=sb.reshape(())), ref, k)  # Python float, 0-dim tensor
    # Scales are read at run time: new values reuse the kernel and change the result.
    _close_fp8(gemm(a, b, scale_a=sa * 4, scale_b=sb, out_dtype=torch.float32), ref * 4, k)
    _close_fp8(gemm(a, b, scale_a=sa, scale_b=sb * 0.5, out_dtype=torch.float32), ref * 0.5, k)
    bias = torch.randn(n, device="cuda", dtype=torch.bfloat16)
    r = torch.randn(m, n, device="cuda", dtype=torch.float16)
    got = gemm(a, b, scale_a=sa, scale_b=sb, bias=bias, epilogue="gelu", residual=r, out_dtype=torch.float16)
    _close_fp8(got, F.gelu(ref + bias.float(), approximate="tanh") + r.float(), k)
    rb = torch.randn(m, 1, device="cuda")
    got = gemm(a, b, scale_a=sa, scale_b=sb, bias=rb, epilogue="relu", alpha=2.0)
    _close_fp8(got, F.relu(2.0 * ref + rb), k)


def test_fp8_full_operand_default() -> None:
    """fp8 with a residual (and c) on the 128x256 default, which stores 32-wide subtiles
    with a full operand: ragged M, N and K, a residual alone, bias + gelu +
    residual and alpha / beta with c, against the dequantized product; the op compiles
    exactly the heuristic's config."""
    from cuteforge.kernels.gemm.sm90.config import default_config
    from cuteforge.kernels.gemm.spec import gemm_fp8_kernel

    m, n, k = 4001, 3000, 1104
    a, b, sa, sb = _fp8_inputs(m, n, k, torch.float8_e4m3fn, torch.float8_e4m3fn)
    ref = _fp8_ref(a, b, sa, sb)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    cfg = default_config(m, n, k, sms, 1, fused=True, vector_operands=1, full_operands=1)
    assert (cfg.tile_m, cfg.tile_n, cfg.tile_k, cfg.epi_n) == (128, 256, 128, 32) and not cfg.stream_k, cfg
    bias = torch.randn(n, device="cuda", dtype=torch.bfloat16)
    r = torch.randn(m, n, device="cuda", dtype=torch.bfloat16)
    kern = gemm_fp8_kernel(("col", "full"))
    before = set(kern._l1)
    got = gemm(a, b, scale_a=sa, scale_b=sb, bias=bias, epilogue="gelu", residual=r)
    assert [used for (_, _, used) in set(kern._l1) - before] == [cfg]
    _close_fp8(got, F.gelu(ref + bias.float(), approximate="tanh") + r.float(), k)
    _close_fp8(gemm(a, b, scale_a=sa, scale_b=sb, residual=r), ref + r.float(), k)
    c = torch.randn(m, n, device="cuda", dtype=torch.float32)
    _close_fp8(gemm(a, b, scale_a=sa, scale_b=sb, c=c, alpha=0.5, beta=2.0, out_dtype=torch.float32), 0.5 * ref + 2.0 * c, k)


@pytest.mark.parametrize("cm,cn", [(2, 2), (4, 1), (1, 4)])
def test_four_cta_clusters(cm: int, cn: int) -> None:
    """A pinned 4-CTA cluster config: the persistent grid holds only the clusters the device
    runs at once (30 of 4 on a 132-SM H200, not 33), so no cluster waits for a second
    round, and a stream-K split, whose owners wait on their peers' flags, finishes.
    Plain and fused, ragged edges, more clusters of tiles than fit (4096^2: 128 clusters)."""
    from cuteforge.arch import max_active_clusters
    from cuteforge.kernels.gemm.sm90.config import GemmConfig
    from cuteforge.kernels.gemm.spec import gemm_kernel

    cap = max_active_clusters(0, 4)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    assert cap is not None and 0 < cap <= sms // 4
    kern = gemm_kernel(True, False)
    before = set(kern._l1)
    for m, n, k in ((4096, 4096, 1024), (3001, 2999, 777)):
        a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        b = torch.randn(k, n, device="cuda", dtype=torch.bfloat16)
        bias = torch.randn(n, device="cuda", dtype=torch.bfloat16)
        ref = _ref(a, b)
        for sk in (False, True):
            cfg = GemmConfig(cluster_m=cm, cluster_n=cn, stream_k=sk)
            got = gemm(a, b, config=cfg)
            torch.cuda.synchronize()
            _close(got, ref, k)
            _close(gemm(a, b, bias=bias, epilogue="gelu", config=cfg), F.gelu(ref + bias.float(), approximate="tanh"), k)
    compiled = {(used, dict(params).get("clusters", sms // 4)) for _, params, used in set(kern._l1) - before}
    assert compiled == {(GemmConfig(cluster_m=cm, cluster_n=cn, stream_k=sk), min(cap, sms // 4)) for sk in (False, True)}


def test_stream_k_ends() -> None:
    """`stream_k_ends`: shapes whose last wave is
    more than half full, which the plan cuts into owners' first k-blocks and idle clusters'
    ends; plain, bf16 -> fp32 and fused bias + gelu, ragged edges, each launched twice
    (the owners clear the flags for the next launch)."""
    from cuteforge.kernels.gemm.sm90.config import GemmConfig, scheduled_clusters, stream_k_ends_len
    from cuteforge.ops.gemm_launch import _persistent_clusters

    sms = torch.cuda.get_device_properties(0).multi_processor_count
    cfg = GemmConfig(stream_k=True, stream_k_ends=True)
    workers = _persistent_clusters(0, cfg, sms)
    shapes = [(m, n, k) for m, n, k in ((2048, 8192, 4608), (2000, 8000, 4600), (8192, 8192, 1024))
              if stream_k_ends_len(scheduled_clusters(cfg, m, n), workers, -(-k // 64))]
    if not shapes:  # the shapes are chosen for 132 SMs
        pytest.skip(f"no test shape ends on a last wave the plan cuts with {workers} clusters")
    for m, n, k in shapes:
        a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        b = torch.randn(k, n, device="cuda", dtype=torch.bfloat16)
        bias = torch.randn(n, device="cuda", dtype=torch.bfloat16)
        ref = _ref(a, b)
        gelu = F.gelu(ref + bias.float(), approximate="tanh")
        for _ in range(2):
            _close(gemm(a, b, config=cfg), ref, k)
            _close(gemm(a, b, config=cfg, out_dtype=torch.float32), ref, k)
            fused = GemmConfig(stream_k=True, stream_k_ends=True, epi_n=32, early_operands=False)
            _close(gemm(a, b, bias=bias, epilogue="gelu", config=fused), gelu, k)
            torch.cuda.synchronize()
    # fp8 (128-deep k-blocks): twice the K gives the same k-block counts as above
    fp8 = GemmConfig(tile_k=128, stream_k=True, stream_k_ends=True)
    for m, n, k in [(m, n, 2 * k) for m, n, k in shapes[:2]]:
        a, b, sa, sb = _fp8_inputs(m, n, k, torch.float8_e4m3fn, torch.float8_e4m3fn)
        for _ in range(2):
            _close_fp8(gemm(a, b, scale_a=sa, scale_b=sb, config=fp8), _fp8_ref(a, b, sa, sb), k)


def test_stream_k_ends_batched() -> None:
    """`stream_k_ends` on batched problems : tiles are
    numbered across the batch, so the last wave's cut tiles span several batches (8 x
    1000x2000: 32 clusters a batch, the 58 cut ones in batches 6 and 7) or sit in the last
    one; plain and bias + gelu, ragged, a broadcast B, twice each."""
    from cuteforge.kernels.gemm.sm90.config import GemmConfig, scheduled_clusters, stream_k_ends_len
    from cuteforge.ops.gemm_launch import _persistent_clusters

    sms = torch.cuda.get_device_properties(0).multi_processor_count
    cfg = GemmConfig(stream_k=True, stream_k_ends=True)
    workers = _persistent_clusters(0, cfg, sms)
    cases = [(b, m, n, k) for b, m, n, k in ((8, 1000, 2000, 4600), (2, 2000, 4000, 4600), (4, 1000, 4096, 4608))
             if stream_k_ends_len(scheduled_clusters(cfg, m, n, b), workers, -(-k // 64))]
    if not cases:  # the shapes are chosen for 132 SMs
        pytest.skip(f"no test shape ends on a last wave the plan cuts with {workers} clusters")
    fused = GemmConfig(stream_k=True, stream_k_ends=True, epi_n=32, early_operands=False)
    for batch, m, n, k in cases:
        a = torch.randn(batch, m, k, device="cuda", dtype=torch.bfloat16)
        b = torch.randn(batch, k, n, device="cuda", dtype=torch.bfloat16)
        bias = torch.randn(n, device="cuda", dtype=torch.bfloat16)
        ref = _ref(a, b)
        for _ in range(2):
            _close(gemm(a, b, config=cfg), ref, k)
            _close(gemm(a, b, bias=bias, epilogue="gelu", config=fused),
                   F.gelu(ref + bias.float(), approximate="tanh"), k)
            _close(gemm(a, b[0], config=cfg), _ref(a, b[0]), k)
        torch.cuda.synchronize()


def test_batched_default_cuts_ends(monkeypatch: pytest.MonkeyPatch) -> None:
    """The op's own default on batched problems: a last wave over the whole
    batch more than half full with long ends is cut into ends, also where one batch alone
    is under a wave (2 x 1100x2500x8000: 50 clusters a batch, 100 in all); plain and
    bias + gelu, ragged, twice each, through the op with no `config=`."""
    import importlib

    from cuteforge.kernels.gemm.sm90.config import default_config

    launch = importlib.import_module("cuteforge.ops.gemm_launch")  # where the plan asks for the default

    sms = torch.cuda.get_device_properties(0).multi_processor_count
    cases = [(b, m, n, k) for b, m, n, k in ((3, 2000, 5000, 8000), (2, 1100, 2500, 8000))
             if default_config(m, n, k, sms, batch=b).stream_k_ends]
    if not cases:  # the shapes are chosen for 132 SMs
        pytest.skip(f"no test shape's batched default is cut into ends on {sms} SMs")
    picked = []

    def recording(*args: Any, **kwargs: Any) -> Any:
        cfg = default_config(*args, **kwargs)
        picked.append(cfg)
        return cfg

    monkeypatch.setattr(launch, "default_config", recording)
    for batch, m, n, k in cases:
        a = torch.randn(batch, m, k, device="cuda", dtype=torch.bfloat16)
        b = torch.randn(batch, k, n, device="cuda", dtype=torch.bfloat16)
        bias = torch.randn(n, device="cuda", dtype=torch.bfloat16)
        ref = _ref(a, b)
        picked.clear()
        for _ in range(2):
            _close(gemm(a, b), ref, k)
            _close(gemm(a, b, bias=bias, epilogue="gelu"), F.gelu(ref + bias.float(), approximate="tanh"), k)
        torch.cuda.synchronize()
        assert len(picked) == 2 and picked[0].stream_k_ends, (batch, m, n, k, picked)
        # the fused default (raster n: its swizzle pads M, so its waves differ) runs
        # whichever stream-K, ends or whole tiles its own plan gives; it ran above
        fused = picked[1]
        assert fused == default_config(m, n, k, sms, fused=True, vector_operands=1, batch=batch)


def test_stream_k_ends_four_cta_then_pairs() -> None:
    """Every config's launches on a stream share one workspace, so the flags must end at the
    same word for all of them: a 4-CTA ends launch (its grid capped below sms / 4 clusters,
    its tile-0 partial written right after the flags) and then 2-CTA stream-K launches,
    whose flags would have covered those words, all correct, twice over."""
    from cuteforge.kernels.gemm.sm90.config import GemmConfig, scheduled_clusters, stream_k_ends_len
    from cuteforge.ops.gemm_launch import _persistent_clusters

    sms = torch.cuda.get_device_properties(0).multi_processor_count
    c4 = GemmConfig(cluster_m=2, cluster_n=2, stream_k=True, stream_k_ends=True)
    cap = _persistent_clusters(0, c4, sms)
    shape = next(((m, n, 4096) for m in (2048, 4096) for n in range(4096, 16385, 512)
                  if stream_k_ends_len(scheduled_clusters(c4, m, n), cap, 64)), None)
    if shape is None:
        pytest.skip(f"no shape searched ends on a last wave the plan cuts with {cap} clusters of 4")
    m, n, k = shape
    a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(k, n, device="cuda", dtype=torch.bfloat16)
    ref = _ref(a, b)
    a2 = torch.randn(1024, 1024, device="cuda", dtype=torch.bfloat16)
    b2 = torch.randn(1024, 1024, device="cuda", dtype=torch.bfloat16)
    ref2 = _ref(a2, b2)
    pairs = GemmConfig(stream_k=True)  # 1024^3: 16 tiles cut 4 ways over 64 clusters of 2
    for _ in range(2):
        _close(gemm(a, b, config=c4), ref, k)
        _close(gemm(a2, b2, config=pairs), ref2, 1024)
        _close(gemm(a2, b2, config=pairs), ref2, 1024)
    torch.cuda.synchronize()


def test_fp8_batched_and_views() -> None:
    a, b, sa, sb = _fp8_inputs(300, 264, 528, torch.float8_e4m3fn, torch.float8_e4m3fn, batch=3)
    _close_fp8(gemm(a, b, scale_a=sa, scale_b=sb), _fp8_ref(a, b, sa, sb), 528)
    _close_fp8(gemm(a, b[0], scale_a=sa, scale_b=sb), _fp8_ref(a, b[0], sa, sb), 528)  # broadcast B
    big, s = _quant(torch.randn(300, 544, device="cuda"), torch.float8_e4m3fn)
    av = big[:, 8:536]  # K-major but 8 bytes off 16-byte alignment: copied once
    _close_fp8(gemm(av, b[1], scale_a=s, scale_b=sb), _fp8_ref(av, b[1], s, sb), 528)
    aw = big[:, 16:528]  # aligned K-major view with a wider row stride: no copy
    bw = b[2][:512]
    _close_fp8(gemm(aw, bw, scale_a=s, scale_b=sb), _fp8_ref(aw, bw, s, sb), 512)


def test_fp8_every_default_and_candidate_config() -> None:
    """Every config the fp8 heuristic picks over a grid of shapes, and every candidate,
    on one ragged shape (tile_k 128: K=1008 ends in a partial k-block)."""
    from cuteforge.kernels.gemm.sm90.config import candidate_configs, default_config
    from cuteforge.kernels.gemm.spec import gemm_fp8_kernel

    m, n, k = 777, 1000, 1008
    a, b, sa, sb = _fp8_inputs(m, n, k, torch.float8_e4m3fn, torch.float8_e5m2)
    a, b = a[None], b[None]
    kern = gemm_fp8_kernel()
    out = torch.empty(1, m, n, device="cuda", dtype=torch.bfloat16)
    work = _work()
    key = kern.signature.bind((a, b, out, work, sa, sb))
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    defaults = [default_config(m_, n_, k_, sms, in_bytes=1) for m_ in (1, 65, 129, 8192) for n_ in (1, 8192, 14336, 65537)
                for k_ in (64, 4096)]
    cfgs = list(dict.fromkeys(defaults + candidate_configs(64, n, in_bytes=1)))
    assert len(cfgs) >= 10 and all(c.tile_k == 128 for c in cfgs)
    ref = _fp8_ref(a, b, sa, sb)
    for cfg in cfgs:
        out.fill_(float("nan"))
        kern.get(key, (("sms", sms),), cfg)(a, b, out, work, sa, sb)
        torch.cuda.synchronize()
        try:
            _close_fp8(out, ref, k)
        except AssertionError as e:
            raise AssertionError(f"config {cfg}: {e}") from None


def _quant_rows(x: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-row amax quantization of x (..., R, K): (q, s) with q * s ~ x, s (..., R, 1) fp32."""
    s = (x.abs().amax(dim=-1, keepdim=True).float() / torch.finfo(dtype).max).clamp_min(1e-12)
    return (x / s).to(dtype), s


@pytest.mark.parametrize("mnk", [(1, 1, 16), (7, 13, 32), (1000, 1000, 1008), (2048, 2048, 2048)])
def test_fp8_rowwise_scales(mnk: tuple[int, int, int]) -> None:
    """Per-row scale_a (M, 1) and per-column scale_b (1, N), torch._scaled_mm's rowwise
    mode: rows of a spanning 1000x in magnitude, each scale alone or both, with bias + gelu
    and a residual, against the dequantized fp32 product (and _scaled_mm where it runs)."""
    m, n, k = mnk
    mag = torch.logspace(-1.5, 1.5, m, device="cuda")[:, None]  # row magnitudes
    a, sa = _quant_rows(torch.randn(m, k, device="cuda") * mag, torch.float8_e4m3fn)
    w, sw = _quant_rows(torch.randn(n, k, device="cuda"), torch.float8_e5m2)
    b, sb = w.t(), sw.t()
    ref = _fp8_ref(a, b, sa, sb)

    def close(got: torch.Tensor, want: torch.Tensor) -> None:
        # the accumulator's error grows with its row's magnitude: compare rows brought to 1
        _close_fp8(got.float() / mag, want / mag, k)

    close(gemm(a, b, scale_a=sa, scale_b=sb), ref)
    close(gemm(a, b, scale_a=sa.reshape(m), scale_b=sb.reshape(n), out_dtype=torch.float32), ref)
    # one scale per row or column, the other per tensor (of the same order, so that the
    # products keep the magnitudes the tolerance is for)
    sbt = float(sw.amax())
    close(gemm(a, b, scale_a=sa, scale_b=sbt, out_dtype=torch.float32), _fp8_ref(a, b, sa, sbt))
    at, sat = _quant(torch.randn(m, k, device="cuda") * mag, torch.float8_e4m3fn)
    close(gemm(at, b, scale_a=sat, scale_b=sb), _fp8_ref(at, b, sat, sb))
    bias = torch.randn(n, device="cuda", dtype=torch.bfloat16)
    got = gemm(a, b, scale_a=sa, scale_b=sb, bias=bias, epilogue="gelu", out_dtype=torch.float16)
    close(got, F.gelu(ref + bias.float(), approximate="tanh"))
    r = torch.randn(m, n, device="cuda")
    got = gemm(a, b, scale_a=sa, scale_b=sbt, residual=r, epilogue="relu", alpha=2.0)
    close(got, F.relu(2.0 * _fp8_ref(a, b, sa, sbt)) + r)
    if m % 16 == 0 and n % 16 == 0:  # _scaled_mm's rowwise mode wants e4m3 x e4m3, dims of 16
        w4, sw4 = _quant_rows(torch.randn(n, k, device="cuda"), torch.float8_e4m3fn)
        try:
            theirs = torch._scaled_mm(a, w4.t(), scale_a=sa, scale_b=sw4.t(), out_dtype=torch.bfloat16)
        except RuntimeError:  # this torch / cuBLASLt has no rowwise fp8
            theirs = None
        if theirs is not None:
            close(gemm(a, w4.t(), scale_a=sa, scale_b=sw4.t()), theirs.float())


def test_fp8_rowwise_batched_and_compiled() -> None:
    """A batched call applies the per-row scale to every batch; torch.compile(fullgraph=True)
    traces a call with both scales, a bias and silu, and its result matches."""
    a, sa = _quant_rows(torch.randn(3, 300, 528, device="cuda"), torch.float8_e4m3fn)
    w, sw = _quant_rows(torch.randn(264, 528, device="cuda"), torch.float8_e4m3fn)
    b, sb = w.t(), sw.t()
    sa0 = sa[1]  # (300, 1): one row scale shared by the batch
    _close_fp8(gemm(a, b, scale_a=sa0, scale_b=sb), torch.matmul(a.float() * sa0, b.float() * sb), 528)
    f = torch.compile(lambda a, b, sa, sb, bias: gemm(a, b, scale_a=sa, scale_b=sb, bias=bias, epilogue="silu") * 2,
                      backend="aot_eager", fullgraph=True)
    bias = torch.randn(264, device="cuda")
    _close_fp8(f(a[0], b, sa[0], sb, bias), F.silu(_fp8_ref(a[0], b, sa[0], sb) + bias) * 2, 528)


def test_fp8_warm_path_reads_each_calls_scales() -> None:
    """The eager warm path on the GPU: repeats with new scale values of the
    same layout, or other numbers, hit stored entries and still give each call's own
    product; a number's one-element tensor belongs to its entry, so two numbers
    alternating never see each other's value."""
    import importlib

    mod = importlib.import_module("cuteforge.ops.gemm")
    mod._EAGER.clear()  # count this test's entries only (the dict is also cleared when full)
    m, n, k = 300, 264, 528
    a, b, sa, sb = _fp8_inputs(m, n, k, torch.float8_e4m3fn, torch.float8_e4m3fn)
    # every scale below is the quantization's (sa, sb) times O(1) factors, so that outputs
    # stay at the magnitudes _close_fp8's bounds are for
    s0, s1 = float(sa), float(sb)
    ref = _fp8_ref(a, b, s0, s1)
    bias = torch.randn(n, device="cuda", dtype=torch.bfloat16)
    rows = torch.rand(m, 1, device="cuda") + 0.5
    cols = torch.rand(1, n, device="cuda") + 0.5
    for rep in range(3):
        f = 1.0 + rep  # new values of the same layouts each repeat
        _close_fp8(gemm(a, b, scale_a=sa * f, scale_b=sb), ref * f, k)
        _close_fp8(gemm(a, b, scale_a=(sa * f).reshape(()), scale_b=sb), ref * f, k)  # 0-dim, as torch.tensor(s)
        for x, y in ((0.5, 2.0), (3.0, 0.25)):  # two number pairs alternating: two entries
            _close_fp8(gemm(a, b, scale_a=x * f * s0, scale_b=y * s1), ref * (x * f * y), k)
        _close_fp8(gemm(a, b, scale_a=rows * f * s0, scale_b=cols * s1), ref * (rows * f) * cols, k)
        got = gemm(a, b, scale_a=rows * f * s0, scale_b=2.0 * s1, bias=bias, epilogue="gelu")
        _close_fp8(got, F.gelu(ref * (rows * f) * 2.0 + bias.float(), approximate="tanh"), k)
        if rep == 0:
            entries = len(mod._EAGER)
    # one entry per call form in the first repeat; numbers are keyed by value, so repeats 1
    # and 2 added entries only for their new numbers
    assert entries == 6 and len(mod._EAGER) == entries + 2 * 2, (entries, len(mod._EAGER))


def test_fp8_torch_compile_and_errors() -> None:
    a, b, sa, sb = _fp8_inputs(128, 96, 64, torch.float8_e4m3fn, torch.float8_e4m3fn)
    bias = torch.randn(96, device="cuda", dtype=torch.bfloat16)
    f = torch.compile(lambda a, b, sa, sb, bias: gemm(a, b, scale_a=sa, scale_b=sb, bias=bias, epilogue="relu") * 2,
                      backend="aot_eager", fullgraph=True)
    _close_fp8(f(a, b, sa, sb, bias), F.relu(_fp8_ref(a, b, sa, sb) + bias.float()) * 2, 64)
    with pytest.raises(ValueError, match="fp8 GEMM needs 'b' column-major"):
        gemm(a, b.contiguous(), scale_a=sa, scale_b=sb)
    with pytest.raises(ValueError, match="K to be a multiple of 16"):
        gemm(a[:, :40], b[:40], scale_a=sa, scale_b=sb)
    with pytest.raises(TypeError, match="missing scale_b"):
        gemm(a, b, scale_a=sa)
    with pytest.raises(ValueError, match="'scale_a' is on cpu"):
        gemm(a, b, scale_a=sa.cpu(), scale_b=sb)


@pytest.mark.parametrize("act", ["none", "gelu", "silu"])
@pytest.mark.parametrize("mnk", [(4001, 3000, 1100), (2000, 3000, 1100)])
def test_fused_default_subtiles(act: str, mnk: tuple[int, int, int]) -> None:
    """With a fused epilogue the heuristic's cooperative 128x256 tile stores 64-wide
    subtiles (epi_n=64), and 32-wide ones with the bias loaded in the epilogue where it
    splits the last wave (stream-K, 2000x3000x1100 on 132 SMs): ragged M, N and K, a column
    bias, against torch."""
    from cuteforge.kernels.gemm.sm90.config import default_config

    m, n, k = mnk
    cfg = default_config(m, n, k, torch.cuda.get_device_properties(0).multi_processor_count, fused=True)
    want = (32, False) if cfg.stream_k else (64, True)
    assert (cfg.tile_m, cfg.tile_n, cfg.epi_n, cfg.loads_operands_early) == (128, 256, *want), cfg
    a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, k, device="cuda", dtype=torch.bfloat16).t()
    bias = torch.randn(n, device="cuda", dtype=torch.bfloat16)
    ref = _ref(a, b) + bias.float()
    ref = {"none": ref, "gelu": F.gelu(ref, approximate="tanh"), "silu": F.silu(ref)}[act]
    _close(gemm(a, b, bias=bias, epilogue=act), ref, k)


@pytest.mark.parametrize("act", ["gelu", "silu"])
def test_fused_default_many_waves(act: str) -> None:
    """gelu / silu on >= 4 waves of tiles with K <= 4096 (pingpong 128x128 earlier) take
    the cooperative default with overlapped stores, on 32-wide subtiles with a full operand
    ragged M, N and K, with a column bias and a residual; a residual alone;
    alpha and beta with an fp32 c."""
    from cuteforge.kernels.gemm.sm90.config import default_config
    from cuteforge.kernels.gemm.spec import gemm_kernel

    m, n, k = 4001, 3000, 1100
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    cfg = default_config(m, n, k, sms, fused=True, vector_operands=1, full_operands=1)
    assert not cfg.pingpong and cfg.store_overlap and (cfg.tile_m, cfg.tile_n, cfg.epi_n) == (128, 256, 32), cfg
    assert cfg.loads_operands_early and not cfg.stream_k, cfg
    a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, k, device="cuda", dtype=torch.bfloat16).t()
    bias = torch.randn(n, device="cuda", dtype=torch.bfloat16)
    res = torch.randn(m, n, device="cuda", dtype=torch.bfloat16)
    c = torch.randn(m, n, device="cuda", dtype=torch.float32)
    prod = _ref(a, b)
    ref = prod + bias.float()
    ref = {"gelu": F.gelu(ref, approximate="tanh"), "silu": F.silu(ref)}[act] + res.float()
    kern = gemm_kernel(True, True, ("col", "full"))
    before = set(kern._l1)
    _close(gemm(a, b, bias=bias, epilogue=act, residual=res), ref, k)
    # the op asked the heuristic with its operand counts: this config is what it compiled
    assert [used for (_, _, used) in set(kern._l1) - before] == [cfg]
    _close(gemm(a, b, residual=res), prod + res.float(), k)
    _close(gemm(a, b, c=c, alpha=0.5, beta=2.0, epilogue=act), {"gelu": lambda x: F.gelu(x, approximate="tanh"),
                                                                "silu": F.silu}[act](0.5 * prod + 2.0 * c), k)


@pytest.mark.parametrize("act", ["none", "gelu"])
def test_short_k_default_many_tiles(act: str) -> None:
    """Short K on many tiles takes pingpong 128x192 with a 5-stage ring: ragged M,
    N and K (the last k-block partial), each CTA running many tiles on both warpgroups;
    plain, and bias + gelu + residual into fp32."""
    from cuteforge.arch import limits_for
    from cuteforge.kernels.gemm.sm90.config import default_config

    m, n, k = 6001, 12001, 1000
    cfg = default_config(m, n, k, torch.cuda.get_device_properties(0).multi_processor_count, fused=act != "none")
    assert cfg.pingpong and cfg.tile_n == 192 and cfg.resolved_stages(2, 2, limits_for("sm_90a")) == 5, cfg
    a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, k, device="cuda", dtype=torch.bfloat16).t()
    if act == "none":
        _close(gemm(a, b), _ref(a, b), k)
        return
    bias = torch.randn(n, device="cuda", dtype=torch.bfloat16)
    res = torch.randn(m, n, device="cuda", dtype=torch.bfloat16)
    ref = F.gelu(_ref(a, b) + bias.float(), approximate="tanh") + res.float()
    _close(gemm(a, b, bias=bias, epilogue=act, residual=res, out_dtype=torch.float32), ref, k)


# ---- stream-K --------------------------------------------------------------------------

SK_SHAPES = [
    (1000, 1000, 1000),   # sub-wave: every tile split-K
    (4096, 4096, 4096),   # 58 tail clusters of 256 spread over the 66
    (2048, 8192, 3000),   # ragged K (47 k-blocks, the last partial)
    (128, 4096, 14336),   # small M: split-K over 224 k-blocks
    (7, 13, 7000),        # one tile cut 4 ways
    (65537, 72, 640),     # many M tiles, narrow N, short K
    (1, 1, 1),            # one k-block: no split
]


def _sk_configs() -> list[Any]:
    from dataclasses import replace

    from cuteforge.kernels.gemm.sm90.config import GemmConfig

    base = GemmConfig(stream_k=True)
    return [base, replace(base, cluster_m=1, cluster_n=2, tile_n=128), replace(base, cluster_m=1, epi_n=64)]


@pytest.mark.parametrize("mnk", SK_SHAPES)
def test_stream_k_matches_torch(mnk: tuple[int, int, int]) -> None:
    """Stream-K configs against fp32 torch, plain and fused (bias + gelu with a residual),
    bf16 and fp32 out; repeated calls are bitwise equal (the partials are added in a
    fixed order and the flags are reset by each launch)."""
    m, n, k = mnk
    torch.manual_seed(m + n + k)
    a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, k, device="cuda", dtype=torch.bfloat16).t()
    bias = torch.randn(n, device="cuda", dtype=torch.bfloat16)
    res = torch.randn(m, n, device="cuda", dtype=torch.bfloat16)
    ref = _ref(a, b)
    fused_ref = F.gelu(ref + bias.float(), approximate="tanh") + res.float()
    for cfg in _sk_configs():
        got = gemm(a, b, config=cfg)
        _close(got, ref, k)
        assert torch.equal(gemm(a, b, config=cfg), got), cfg
        got32 = gemm(a, b, out_dtype=torch.float32, config=cfg)
        _close(got32, ref, k)
        fused = gemm(a, b, bias=bias, epilogue="gelu", residual=res, config=cfg)
        _close(fused, fused_ref, k)


@pytest.mark.parametrize("mnk", [(16, 4096, 14336), (7, 1000, 9001), (32, 2048, 8192), (1, 4096, 8192)])
def test_decode_default_split_k(mnk: tuple[int, int, int]) -> None:
    """The heuristic for M <= 32 and K >= 8192 (single 64x64 CTAs with stream-K),
    through ops.gemm as a user calls it: plain, bf16 / fp32 out, fused bias + gelu +
    residual, batched; repeated calls bitwise equal."""
    from cuteforge.kernels.gemm.sm90.config import default_config

    m, n, k = mnk
    cfg = default_config(m, n, k, torch.cuda.get_device_properties(0).multi_processor_count)
    assert cfg.stream_k and (cfg.tile_m, cfg.tile_n, cfg.cluster_m, cfg.cluster_n) == (64, 64, 1, 1)
    torch.manual_seed(m + n + k)
    a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16)
    bias = torch.randn(n, device="cuda", dtype=torch.bfloat16)
    res = torch.randn(m, n, device="cuda", dtype=torch.bfloat16)
    ref = _ref(a, w.t())
    got = gemm(a, w.t())
    _close(got, ref, k)
    assert torch.equal(gemm(a, w.t()), got)
    _close(gemm(a, w.t(), out_dtype=torch.float32), ref, k)
    _close(gemm(a, w.t(), bias=bias, epilogue="gelu", residual=res),
           F.gelu(ref + bias.float(), approximate="tanh") + res.float(), k)
    a3 = torch.randn(3, m, k, device="cuda", dtype=torch.bfloat16)
    _close(gemm(a3, w.t()), _ref(a3, w.t()), k)


def test_stream_k_batched_and_fp8() -> None:
    """A batch of 3 (tiles numbered across the batch) and an fp8 GEMM with scales, split."""
    from cuteforge.kernels.gemm.sm90.config import GemmConfig

    cfg = GemmConfig(stream_k=True)
    a = torch.randn(3, 700, 3000, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(3, 3000, 900, device="cuda", dtype=torch.bfloat16)
    _close(gemm(a, b, config=cfg), _ref(a, b), 3000)
    m, n, k = 777, 1000, 4096
    a8, b8, sa, sb = _fp8_inputs(m, n, k, torch.float8_e4m3fn, torch.float8_e4m3fn)
    got = gemm(a8, b8, scale_a=sa, scale_b=sb, config=GemmConfig(stream_k=True, tile_k=128))
    _close_fp8(got, _fp8_ref(a8, b8, sa, sb), k)


def test_stream_k_graph_capture_and_streams() -> None:
    """Captured in a CUDA graph (its own workspace, flags zeroed at each replay) and run on
    two streams at once (one workspace per stream): every result equals the eager one."""
    from cuteforge.kernels.gemm.sm90.config import GemmConfig

    cfg = GemmConfig(stream_k=True)
    xs = [(torch.randn(1000, 2000, device="cuda", dtype=torch.bfloat16),
           torch.randn(2000, 1000, device="cuda", dtype=torch.bfloat16)) for _ in range(2)]
    want = [gemm(a, b, config=cfg) for a, b in xs]
    g = torch.cuda.CUDAGraph()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        gemm(*xs[0], config=cfg)  # warm: the plan and the kernel exist before capture
        torch.cuda.synchronize()
        with torch.cuda.graph(g):
            captured = gemm(*xs[0], config=cfg)
    for _ in range(3):
        captured.zero_()
        g.replay()
        torch.cuda.synchronize()
        assert torch.equal(captured, want[0])
    streams = [torch.cuda.Stream(), torch.cuda.Stream()]
    for st in streams:
        st.wait_stream(torch.cuda.current_stream())
    got: list[list[torch.Tensor]] = [[], []]
    for _ in range(20):
        for i, st in enumerate(streams):
            with torch.cuda.stream(st):
                got[i].append(gemm(*xs[i], config=cfg))
    torch.cuda.synchronize()
    for i in range(2):
        assert all(torch.equal(t, want[i]) for t in got[i])
