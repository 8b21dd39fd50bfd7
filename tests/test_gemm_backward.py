"""The GEMM custom op's backward plumbing on the CPU: which products it asks the GEMM for,
in which layouts, and the gradients they add up to. The GEMM itself is stood in for by
torch (`_reference`) and the sm_90 check by True; the kernels' own numerics are tested on
the GPU (tests/gpu/test_gemm_gpu.py)."""

from __future__ import annotations

import importlib

import pytest
import torch
import torch.nn.functional as F

mod = importlib.import_module("cuteforge.ops.gemm")
launch = importlib.import_module("cuteforge.ops.gemm_launch")
from cuteforge.kernels.gemm.epilogue import GemmEpilogue  # noqa: E402

ACTS = {"none": lambda t: t, "relu": F.relu, "gelu": lambda t: F.gelu(t, approximate="tanh"), "silu": F.silu}


@pytest.fixture
def products(monkeypatch):
    """Each GEMM the backward asks for: (a's strides, b's strides, epilogue key)."""
    calls: list[tuple] = []

    def torch_gemm(a, b, ops, epi_key, kinds, out_dtype):
        calls.append((a.stride(), b.stride(), epi_key))
        epi = GemmEpilogue(epi_key, tuple(k for k in kinds.split(",") if k)) if epi_key else None
        return launch._reference(a, b, ops, epi, out_dtype or a.dtype)

    monkeypatch.setattr(mod, "_gemm_op", torch_gemm)
    monkeypatch.setattr(mod, "_on_sm90", lambda t: True)
    return calls


@pytest.mark.parametrize("weight_layout", ["linear", "row_major"])
@pytest.mark.parametrize("case", ["none", "bias", "gelu", "silu", "relu_row", "residual", "c_alpha_beta"])
def test_backward_products_and_layouts(products, case, weight_layout) -> None:
    torch.manual_seed(0)
    m, k, n = 37, 24, 40
    x = torch.randn(m, k, dtype=torch.bfloat16)
    # an nn.Linear weight (n, k) used as w.t() (K-major b), or a row-major (k, n) b
    b = torch.randn(n, k, dtype=torch.bfloat16).t() if weight_layout == "linear" else torch.randn(k, n, dtype=torch.bfloat16)
    kw: dict = {}
    if case in ("bias", "gelu", "silu"):
        kw.update(bias=torch.randn(n, dtype=torch.bfloat16), epilogue=None if case == "bias" else case)
    elif case == "relu_row":
        kw.update(bias=torch.randn(m, 1, dtype=torch.bfloat16), epilogue="relu")
    elif case == "residual":
        kw["residual"] = torch.randn(m, n, dtype=torch.bfloat16)
    elif case == "c_alpha_beta":
        kw.update(c=torch.randn(1, n, dtype=torch.bfloat16), alpha=0.5, beta=2.0)
    epi, ops, _ = mod._resolve(kw.get("bias"), kw.get("epilogue"), kw.get("residual"), kw.get("c"), kw.get("alpha", 1.0),
                               kw.get("beta", 1.0), None)
    g = torch.randn(m, n, dtype=torch.bfloat16)
    da, db, dops, *_ = mod._backward_on_gemm(x, b, list(ops), epi, g, (True, True, True))

    act = kw.get("epilogue") or "none"
    assert len(products) == (3 if act != "none" else 2)
    assert da.shape == x.shape and da.is_contiguous()
    assert db.shape == b.shape and db.stride() == b.stride(), "the weight's gradient in the weight's layout"
    leaves = [t.detach().float().requires_grad_() for t in (x, b, *ops)]
    named = dict(zip([n_ for n_ in ("bias", "c", "residual") if kw.get(n_) is not None], leaves[2:]))
    z = kw.get("alpha", 1.0) * (leaves[0] @ leaves[1])
    if "c" in named:
        z = z + kw["beta"] * named["c"]
    if "bias" in named:
        z = z + named["bias"]
    y = ACTS[act](z) + named.get("residual", 0)
    y.backward(g.float())
    for got, want in ((da, leaves[0].grad), (db, leaves[1].grad), *zip(dops, (lf.grad for lf in leaves[2:]))):
        assert got.dtype == torch.bfloat16 and got.shape == want.shape
        torch.testing.assert_close(got.float(), want, rtol=3e-2, atol=3e-2)


def test_backward_serves_only_what_it_can(products, monkeypatch) -> None:
    """Batched, fusion-Epilogue and off-sm_90 calls fall back to torch's recompute (None)."""
    from cuteforge.fusion import Epilogue

    a, b, g = torch.randn(2, 8, 16, dtype=torch.bfloat16), torch.randn(16, 8, dtype=torch.bfloat16), torch.randn(2, 8, 8)
    assert mod._backward_on_gemm(a, b, [], None, g, (True, True, True)) is None
    fused = GemmEpilogue.from_fusion(Epilogue.from_fn(lambda acc: acc * 2))
    assert mod._backward_on_gemm(a[0], b, [], fused, g[0], (True, True, True)) is None
    monkeypatch.setattr(mod, "_on_sm90", lambda t: False)
    assert mod._backward_on_gemm(a[0], b, [], None, g[0], (True, True, True)) is None
    monkeypatch.setattr(mod, "_on_sm90", lambda t: True)
    assert mod._backward_on_gemm(a[0], b, [], None, g[0].bfloat16(), (True, True, True)) is not None
    assert len(products) == 2


@pytest.mark.parametrize("epilogue", [None, "silu"])
def test_eager_calls_with_grad_run_on_plans_not_the_custom_op(monkeypatch, epilogue) -> None:
    """An eager call with grad runs the forward and the backward's GEMMs through `_run`'s
    plans (`_GemmFunction`), never the custom op, and its gradients match torch's."""
    runs: list[str] = []

    def torch_run(a, b, ops, epi_key, kinds, out_dtype, config=None, names=None, scales=()):
        runs.append(epi_key)
        epi = GemmEpilogue(epi_key, tuple(k for k in kinds.split(",") if k)) if epi_key else None
        return launch._reference(a, b, ops, epi, out_dtype or a.dtype)

    monkeypatch.setattr(mod, "_run", torch_run)
    monkeypatch.setattr(mod, "_on_sm90", lambda t: True)
    monkeypatch.setattr(mod, "_gemm_op", lambda *a: (_ for _ in ()).throw(AssertionError("the custom op ran")))
    torch.manual_seed(0)
    x = torch.randn(33, 40, dtype=torch.bfloat16, requires_grad=True)
    w = torch.randn(24, 40, dtype=torch.bfloat16, requires_grad=True)
    bias = torch.randn(24, dtype=torch.bfloat16, requires_grad=True)
    g = torch.randn(33, 24, dtype=torch.bfloat16)
    mod.gemm(x, w.t(), bias=bias, epilogue=epilogue).backward(g)
    assert len(runs) == (4 if epilogue else 3)  # forward, [z,] dX, dW
    leaves = [t.detach().float().requires_grad_() for t in (x, w, bias)]
    ACTS[epilogue or "none"](leaves[0] @ leaves[1].t() + leaves[2]).backward(g.float())
    assert w.grad.is_contiguous()
    for got, want in zip((x.grad, w.grad, bias.grad), (lf.grad for lf in leaves)):
        torch.testing.assert_close(got.float(), want, rtol=3e-2, atol=3e-2)


def test_double_backward_takes_the_differentiable_custom_op(monkeypatch) -> None:
    """With create_graph=True the eager backward's GEMMs go through the custom op (whose own
    autograd makes the gradients differentiable), not the plans."""
    used: list[str] = []

    def tagged(tag):
        def run(a, b, ops, epi_key, kinds, out_dtype, *rest, **kw):
            used.append(tag)
            epi = GemmEpilogue(epi_key, tuple(k for k in kinds.split(",") if k)) if epi_key else None
            return launch._reference(a, b, ops, epi, out_dtype or a.dtype)
        return run

    monkeypatch.setattr(mod, "_run", tagged("plan"))
    monkeypatch.setattr(mod, "_gemm_op", tagged("custom op"))
    monkeypatch.setattr(mod, "_on_sm90", lambda t: True)
    x = torch.randn(8, 16, dtype=torch.bfloat16, requires_grad=True)
    w = torch.randn(16, 8, dtype=torch.bfloat16, requires_grad=True)
    y = mod.gemm(x, w)
    torch.autograd.grad(y, (x, w), torch.ones_like(y), create_graph=True)
    assert used == ["plan", "custom op", "custom op"]
