"""The gated GEMM (`ops.gated_gemm`: gate(a @ b_gate) * (a @ b_up) in one kernel) against
torch on the GPU: odd shapes, both gates and dtypes, every tile family, A in either
major, misaligned and N-major weights, gradients, `nn.SwiGLUMLP`, torch.compile."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from cuteforge.kernels.gemm.sm90.config import GemmConfig, gated_config
from cuteforge.ops import gated_gemm

pytestmark = pytest.mark.gpu

if not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0):
    pytest.skip("needs an sm_90 GPU", allow_module_level=True)


def _ref(a: torch.Tensor, bg: torch.Tensor, bu: torch.Tensor, gate: str = "silu") -> torch.Tensor:
    """fp32 reference of the same 16-bit inputs."""
    z = a.float() @ bg.float()
    act = F.silu(z) if gate == "silu" else F.gelu(z, approximate="tanh")
    return act * (a.float() @ bu.float())


def _weights(n: int, k: int, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """b_gate, b_up (K, N) as nn.Linear weights (N, K) transposed, scaled so the products are O(1)."""
    s = k ** -0.5
    return ((torch.randn(n, k, device="cuda", dtype=dtype) * s).t(),
            (torch.randn(n, k, device="cuda", dtype=dtype) * s).t())


def _close(got: torch.Tensor, ref: torch.Tensor) -> None:
    assert got.shape == ref.shape and got.dtype != torch.float32
    torch.testing.assert_close(got.float(), ref, rtol=2e-2, atol=2e-2)


SHAPES = [(1, 8, 64), (7, 24, 40), (1000, 1000, 1000), (4097, 2816, 1024), (65537, 72, 64), (257, 200, 136)]


@pytest.mark.parametrize("gate", ["silu", "gelu"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("mnk", SHAPES)
def test_matches_torch(mnk: tuple[int, int, int], dtype: torch.dtype, gate: str) -> None:
    m, n, k = mnk
    a = torch.randn(m, k, device="cuda", dtype=dtype)
    bg, bu = _weights(n, k, dtype)
    _close(gated_gemm(a, bg, bu, gate=gate), _ref(a, bg, bu, gate))


CONFIGS = [
    gated_config(GemmConfig()),  # cooperative 128x256, 2x1 cluster (B multicast)
    GemmConfig(tile_n=192, pingpong=True, epi_bufs=2),  # 96-wide output tiles, two warpgroups
    GemmConfig(tile_n=128, cluster_m=1, cluster_n=2),  # A multicast
    GemmConfig(tile_m=64, tile_n=128, cluster_m=1),
    GemmConfig(tile_n=128, stream_k=True),  # the last wave cut along K: partial sums of both halves
    GemmConfig(tile_n=128, stream_k=True, stream_k_ends=True),
    GemmConfig(tile_m=256, tile_n=128, epi_n=64),
    GemmConfig(tile_n=256, store_overlap=False),
]


@pytest.mark.parametrize("cfg", CONFIGS, ids=repr)
@pytest.mark.parametrize("mnk", [(1000, 1000, 1000), (2048, 2816, 4096), (300, 4096, 8192)])
def test_configs(cfg: GemmConfig, mnk: tuple[int, int, int]) -> None:
    m, n, k = mnk
    a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    bg, bu = _weights(n, k, torch.bfloat16)
    _close(gated_gemm(a, bg, bu, config=gated_config(cfg)), _ref(a, bg, bu))


def test_layouts() -> None:
    """A M-major, batched leading dims, a misaligned A view, N-major and misaligned weights
    (copied K-major): all give torch's answer."""
    m, n, k = 777, 520, 264
    bg, bu = _weights(n, k, torch.bfloat16)
    a = torch.randn(k, m, device="cuda", dtype=torch.bfloat16).t()  # M-major
    _close(gated_gemm(a, bg, bu), _ref(a, bg, bu))
    a3 = torch.randn(3, 5, k, device="cuda", dtype=torch.bfloat16)
    _close(gated_gemm(a3, bg, bu), _ref(a3, bg, bu))
    wide = torch.randn(m, k + 3, device="cuda", dtype=torch.bfloat16)[:, 1:k + 1]  # rows 2 bytes off alignment
    _close(gated_gemm(wide, bg, bu), _ref(wide, bg, bu))
    _close(gated_gemm(a, bg.contiguous(), bu.contiguous()), _ref(a, bg, bu))  # N-major weights


@pytest.mark.parametrize("gate", ["silu", "gelu"])
@pytest.mark.parametrize("mnk", [(1, 8, 64), (7, 24, 40), (1000, 1000, 1000), (4097, 520, 264)])
def test_gradients(mnk: tuple[int, int, int], gate: str) -> None:
    m, n, k = mnk
    a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    wg, wu = (torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * k ** -0.5 for _ in range(2))
    wg.requires_grad_(True)
    wu.requires_grad_(True)
    g = torch.randn(m, n, device="cuda", dtype=torch.bfloat16)
    out = gated_gemm(a, wg.t(), wu.t(), gate=gate)
    got = torch.autograd.grad(out, (a, wg, wu), g)
    leaves = [t.detach().float().requires_grad_(True) for t in (a, wg, wu)]
    ref = _ref(leaves[0], leaves[1].t(), leaves[2].t(), gate)
    want = torch.autograd.grad(ref, leaves, g.float())
    for name, x, y in zip(("a", "w_gate", "w_up"), got, want):
        assert x.shape == y.shape and x.stride() == (y.shape[1], 1), name  # W-shaped, contiguous
        scale = y.abs().max().clamp_min(1e-6)
        assert ((x.float() - y).abs().max() / scale) < 2e-2, name


@pytest.mark.parametrize("recompute", [False, True])
@pytest.mark.parametrize("gemm", [True, False])
def test_swiglu_mlp_paths(monkeypatch, gemm: bool, recompute: bool) -> None:
    """nn.SwiGLUMLP: the gated GEMM runs without grad, and with grad where `recompute`;
    forward and gradients match torch's MLP with the same weights either way."""
    import cuteforge.ops
    from cuteforge.nn import SwiGLUMLP

    calls = []
    real = cuteforge.ops.gated_gemm
    monkeypatch.setattr(cuteforge.ops, "gated_gemm", lambda *a, **k: calls.append(1) or real(*a, **k))
    torch.manual_seed(0)
    mlp = SwiGLUMLP(256, 704, device="cuda", dtype=torch.bfloat16, gemm=gemm, recompute=recompute)
    x = torch.randn(2, 300, 256, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    y = mlp(x)
    assert len(calls) == recompute
    g = torch.randn_like(y)
    y.backward(g)
    leaves = {n: p.detach().float().requires_grad_(True) for n, p in mlp.named_parameters()}
    xr = x.detach().float().requires_grad_(True)
    h = F.silu(xr @ leaves["gate_proj.weight"].t()) * (xr @ leaves["up_proj.weight"].t())
    ref = h @ leaves["down_proj.weight"].t()
    ref.backward(g.float())
    torch.testing.assert_close(y.float(), ref, rtol=3e-2, atol=3e-2)
    for n, p in mlp.named_parameters():
        err = (p.grad.float() - leaves[n].grad).abs().max() / leaves[n].grad.abs().max()
        assert err < 2e-2, n
    assert ((x.grad.float() - xr.grad).abs().max() / xr.grad.abs().max()) < 2e-2
    calls.clear()
    with torch.no_grad():
        torch.testing.assert_close(mlp(x).float(), ref, rtol=3e-2, atol=3e-2)
    assert len(calls) == 1
    hooked = []
    mlp.up_proj.register_forward_hook(lambda *_: hooked.append(1))
    with torch.no_grad():
        mlp(x)
    assert len(calls) == 1 and hooked  # a projection with a hook runs as a module


@pytest.mark.parametrize("gate", ["silu", "gelu"])
def test_compiles_as_one_op_with_gradients(gate: str) -> None:
    """Under torch.compile (Inductor) the call is the registered op, whose kernel writes
    the forward; its traced backward (recomputed products, Inductor's pointwise kernel)
    gives the gradients, each weight's in its layout."""
    seen: list[object] = []

    def backend(gm: torch.fx.GraphModule, example: list[torch.Tensor]):
        seen.extend(n.target for n in gm.graph.nodes if n.op == "call_function")
        return torch._dynamo.lookup_backend("inductor")(gm, example)

    m, n, k = 1000, 520, 264
    a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    wg, wu = (torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * k ** -0.5 for _ in range(2))
    wg.requires_grad_(True)
    wu.requires_grad_(True)
    torch._dynamo.reset()
    fn = torch.compile(lambda a, wg, wu: gated_gemm(a, wg.t(), wu.t(), gate=gate), backend=backend, fullgraph=True)
    with torch.no_grad():
        _close(fn(a, wg, wu), _ref(a, wg.t(), wu.t(), gate))
    assert torch.ops.cuteforge.gated_gemm.default in seen
    out = fn(a, wg, wu)
    g = torch.randn(m, n, device="cuda", dtype=torch.bfloat16)
    got = torch.autograd.grad(out, (a, wg, wu), g)
    leaves = [t.detach().float().requires_grad_(True) for t in (a, wg, wu)]
    want = torch.autograd.grad(_ref(leaves[0], leaves[1].t(), leaves[2].t(), gate), leaves, g.float())
    for name, x, y in zip(("a", "w_gate", "w_up"), got, want):
        assert x.shape == y.shape and x.stride() == (y.shape[1], 1), name
        assert ((x.float() - y).abs().max() / y.abs().max().clamp_min(1e-6)) < 2e-2, name
    torch._dynamo.reset()


def test_registered_op_launches_from_c_where_no_tile_is_split() -> None:
    """torch.ops.cuteforge.gated_gemm: a layout read in place whose config splits no tile
    gets a C launch plan (no Python on a warm call); a stream-K shape, whose workspace is
    the stream's, stays on the op's Python path. Both give the kernel's answer."""
    import importlib

    from cuteforge.native import build, dispatch

    gg = importlib.import_module("cuteforge.ops.gated_gemm")
    op = torch.ops.cuteforge.gated_gemm.default
    for m, n, k in ((4096, 2816, 1024), (1, 24, 64), (4096, 14336, 4096)):
        a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        bg, bu = _weights(n, k, torch.bfloat16)
        before = dispatch.plans(gg._op)
        for _ in range(3):  # the first registers the kernels, the second makes the plan, the third hits it
            got = op(a, bg, bu, "silu")
            assert got.shape == (m, n) and got.is_contiguous()
            _close(got, _ref(a, bg, bu))
        split = gg._run_for(a, bg, bu, "silu", None)
        in_c = isinstance(split, gg._InPlace) and split.c_run(a, bg, bu) is not None
        assert in_c is (n != 14336), (m, n, k)  # the default config of 4096 x 14336 x 4096 is stream-K
        if build.load() is not None:
            assert dispatch.plans(gg._op) == before + int(in_c)


def test_bad_input_names_the_argument() -> None:
    a = torch.randn(8, 64, device="cuda", dtype=torch.bfloat16)
    bg, bu = _weights(16, 64, torch.bfloat16)
    with pytest.raises(ValueError, match="b_up"):
        gated_gemm(a, bg, bu[:, :8])
    with pytest.raises(ValueError, match="b_gate"):
        gated_gemm(a, bg[:32], bu[:32])
    with pytest.raises(TypeError, match="b_gate"):
        gated_gemm(a, bg.half(), bu.half())
    with pytest.raises(ValueError, match="gate"):
        gated_gemm(a, bg, bu, gate="relu")
    with pytest.raises(ValueError, match="tile_n a multiple of 32"):
        gated_gemm(a, bg, bu, config=GemmConfig(tile_n=144, epi_n=16))
    w0 = torch.empty(0, 16, device="cuda", dtype=torch.bfloat16)
    out = gated_gemm(torch.empty(3, 0, device="cuda", dtype=torch.bfloat16), w0, w0)
    assert out.shape == (3, 16) and not out.any()  # K == 0: zeros, as torch
