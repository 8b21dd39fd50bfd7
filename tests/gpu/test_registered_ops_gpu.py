"""The registered ops (torch.ops.cuteforge.*) through their C++ dispatcher kernels on the
GPU: after a layout's first calls its plan is in the op's table and later calls launch it
without Python, with results equal to torch's; forward and backward ops alike; inside a
torch.compile graph, forward and backward, with gradients equal to torch's."""

from __future__ import annotations

import importlib

import pytest
import torch
import torch.nn.functional as F

from cuteforge.native import build, dispatch

norm_ops = importlib.import_module("cuteforge.ops.norm")
softmax_ops = importlib.import_module("cuteforge.ops.softmax")
reduce_ops = importlib.import_module("cuteforge.ops.reduce")
ce_ops = importlib.import_module("cuteforge.ops.cross_entropy")

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
              pytest.mark.skipif(build.load() is None, reason="no C++ extension here")]

DTYPES = [torch.float32, torch.bfloat16, torch.float16]
ROWS = [1, 7, 1000, 4097]


def _tol(dtype: torch.dtype) -> dict[str, float]:
    return {"atol": 1e-4, "rtol": 1e-4} if dtype == torch.float32 else {"atol": 2e-2, "rtol": 2e-2}


def _warm(op, *args):
    """Three calls: the first registers the kernels, the second makes the plan, the third
    runs it; every result returned."""
    return [op(*args) for _ in range(3)]


def _rms_ref(x, w, eps):
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps) * w.float()).to(x.dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("m", ROWS)
def test_rms_norm_op_runs_its_plan(dtype, m) -> None:
    n = 1000
    x = torch.randn(m, n, device="cuda", dtype=dtype)
    w = torch.randn(n, device="cuda", dtype=dtype)
    r = torch.randn(m, n, device="cuda", dtype=dtype)
    for residual in (None, r):
        outs = _warm(torch.ops.cuteforge.rms_norm, x, w, residual, 1e-6)
        s = x if residual is None else x + residual
        for y, ro, rstd in outs:
            torch.testing.assert_close(y, _rms_ref(s, w, 1e-6), **_tol(dtype))
            assert ro.shape == ((m, n) if residual is not None else (0,))
            assert rstd.shape == (m,) and rstd.dtype == torch.float32
        assert torch.equal(outs[1][0], outs[2][0])
    assert dispatch.plans(norm_ops._rms_op) >= 2


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("m", ROWS)
def test_no_grad_norm_ops_run_their_plans(dtype, m) -> None:
    """rms_norm_infer / layer_norm_infer (what a compiled no-grad graph calls): y alone,
    equal to torch's, from the plan after the first calls; under torch.compile with grad
    off, ops.rms_norm on a 3-D input gives the same."""
    n = 1000
    x = torch.randn(m, n, device="cuda", dtype=dtype)
    w = torch.randn(n, device="cuda", dtype=dtype)
    b = torch.randn(n, device="cuda", dtype=dtype)
    for y in _warm(torch.ops.cuteforge.rms_norm_infer, x, w, 1e-6):
        torch.testing.assert_close(y, _rms_ref(x, w, 1e-6), **_tol(dtype))
    for bias in (b, None):
        want = F.layer_norm(x.float(), (n,), w.float(), None if bias is None else bias.float(), 1e-5).to(dtype)
        for y in _warm(torch.ops.cuteforge.layer_norm_infer, x, w, bias, 1e-5):
            torch.testing.assert_close(y, want, **_tol(dtype))
    assert dispatch.plans(norm_ops._rms_infer_op) >= 1 and dispatch.plans(norm_ops._ln_infer_op) >= 2
    import cuteforge.ops as ops

    torch._dynamo.reset()
    with torch.no_grad():
        y3 = torch.compile(lambda x, w: ops.rms_norm(x, w, 1e-6), fullgraph=True)(x.view(1, m, n), w)
    torch.testing.assert_close(y3.view(m, n), _rms_ref(x, w, 1e-6), **_tol(dtype))


@pytest.mark.parametrize("dtype", DTYPES)
def test_norm_backward_ops_run_their_plans(dtype) -> None:
    m, n = 1000, 4097
    x = torch.randn(m, n, device="cuda", dtype=dtype, requires_grad=True)
    w = torch.randn(n, device="cuda", dtype=dtype, requires_grad=True)
    b = torch.randn(n, device="cuda", dtype=dtype, requires_grad=True)
    dy = torch.randn(m, n, device="cuda", dtype=dtype)
    y_ref = F.layer_norm(x.float(), (n,), w.float(), b.float(), 1e-5)
    gx, gw, gb = torch.autograd.grad(y_ref, (x, w, b), dy.float())
    with torch.no_grad():
        _, _, mean, rstd = torch.ops.cuteforge.layer_norm(x, w, b, None, 1e-5)
    for dx, sums in _warm(torch.ops.cuteforge.layer_norm_backward, dy, x.detach(), w.detach(), mean, rstd, None, True):
        dw, db = sums  # dweight and dbias: the rows of one (2, N) tensor (returns may not share memory)
        assert sums.shape == (2, n)
        torch.testing.assert_close(dx.float(), gx.float(), **_tol(dtype))
        torch.testing.assert_close(dw.float(), gw.float(), atol=0.5 if dtype != torch.float32 else 1e-2, rtol=2e-2)
        torch.testing.assert_close(db.float(), gb.float(), atol=0.5 if dtype != torch.float32 else 1e-2, rtol=2e-2)
    assert dispatch.plans(norm_ops._ln_bwd_op) >= 1


@pytest.mark.parametrize("mode", ["softmax", "log_softmax"])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(1, 7), (7, 1000), (3, 5, 4097), (2, 65537)])
def test_softmax_ops_run_their_plans(mode, dtype, shape) -> None:
    x = torch.randn(*shape, device="cuda", dtype=dtype)
    ref = getattr(torch, mode)(x.float(), -1).to(dtype)
    for y in _warm(getattr(torch.ops.cuteforge, mode), x, -1):
        torch.testing.assert_close(y, ref, **_tol(dtype))
    dy = torch.randn_like(x)
    for dx in _warm(getattr(torch.ops.cuteforge, f"{mode}_backward"), dy, ref, -1):
        assert dx.shape == x.shape and dx.dtype == dtype
    assert dispatch.plans(getattr(softmax_ops, f"_{mode}_op")) >= 1
    assert dispatch.plans(getattr(softmax_ops, f"_{mode}_bwd_op")) >= 1


@pytest.mark.parametrize("op", ["sum", "mean", "amax", "argmax"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_reduction_ops_run_their_plans(op, dtype) -> None:
    x = torch.randn(1000, 4097, device="cuda", dtype=dtype)
    for dim in (-1, 0):
        ref = getattr(torch, op)(x.float() if op != "argmax" else x, dim)
        for out in _warm(getattr(torch.ops.cuteforge, op), x, dim, False):
            if op == "argmax":
                assert torch.equal(out, ref)
            else:
                torch.testing.assert_close(out.float(), ref.float(), atol=0.5 if op in ("sum",) else 2e-2, rtol=2e-2)
    assert dispatch.plans(reduce_ops._CUSTOM[op]) >= 1


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("m", ROWS)
def test_cross_entropy_ops_run_their_plans(dtype, m) -> None:
    n = 32000
    logits = torch.randn(m, n, device="cuda", dtype=dtype)
    target = torch.randint(0, n, (m,), device="cuda")
    target[0] = -100
    ref = F.cross_entropy(logits.float(), target, reduction="none")
    for loss, lse in _warm(torch.ops.cuteforge.cross_entropy_fwd, logits, target, -100):
        torch.testing.assert_close(loss, ref, atol=2e-3, rtol=2e-3)
        torch.testing.assert_close(lse, torch.logsumexp(logits.float(), -1), atol=2e-3, rtol=2e-3)
    dloss = torch.rand(m, device="cuda")
    lf = logits.float().requires_grad_()
    (g,) = torch.autograd.grad(F.cross_entropy(lf, target, reduction="none"), lf, dloss)
    for dl in _warm(torch.ops.cuteforge.cross_entropy_bwd, logits, target, lse, dloss, -100):
        torch.testing.assert_close(dl.float(), g, **_tol(dtype))
    assert dispatch.plans(ce_ops._fwd_op) >= 1 and dispatch.plans(ce_ops._bwd_op) >= 1


def test_compiled_training_step_matches_torch_and_runs_the_plans() -> None:
    import cuteforge.ops as ops

    torch._dynamo.reset()
    m, n, v = 1000, 1024, 32000
    dtype = torch.bfloat16
    x = torch.randn(m, n, device="cuda", dtype=dtype, requires_grad=True)
    w = torch.randn(n, device="cuda", dtype=dtype, requires_grad=True)
    head = (torch.randn(v, n, device="cuda", dtype=dtype) / n**0.5).requires_grad_()
    t = torch.randint(0, v, (m,), device="cuda")

    def step(x, w, head, norm, ce):
        h = norm(x, w)
        return ce(h @ head.t(), t)

    ref = step(x, w, head, lambda x, w: _rms_ref(x, w, 1e-6), F.cross_entropy)
    gref = torch.autograd.grad(ref, (x, w, head))
    compiled = torch.compile(lambda x, w, head: step(x, w, head, lambda x, w: ops.rms_norm(x, w, 1e-6),
                                                     ops.cross_entropy), fullgraph=True)
    for _ in range(3):
        loss = compiled(x, w, head)
        grads = torch.autograd.grad(loss, (x, w, head))
    torch.testing.assert_close(loss.float(), ref.float(), atol=2e-2, rtol=2e-2)
    for g, r in zip(grads, gref):
        err = (g.float() - r.float()).norm() / r.float().norm()
        assert err < 1e-2, err
    for op in (norm_ops._rms_op, norm_ops._rms_bwd_op, ce_ops._fwd_op, ce_ops._bwd_op):
        assert dispatch.plans(op) >= 1, op
