"""cuteforge.ops.linear_cross_entropy against F.cross_entropy(x @ w.T, t) on the GPU: odd
token counts, vocabularies off the tile size, every dtype, mean and sum, ignored rows, one
chunk and many, gradients of x and weight; under torch.compile too."""

from __future__ import annotations

import importlib

import pytest
import torch
import torch.nn.functional as F

import cuteforge.ops as ops
from cuteforge.native import build, dispatch

lce = importlib.import_module("cuteforge.ops.linear_cross_entropy")

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.float() - b.float()).norm() / b.float().norm().clamp_min(1e-12)).item()


def _problem(tokens: int, h: int, v: int, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """x (tokens, h) and weight (v, h) wanting gradients, targets with every fifth ignored."""
    torch.manual_seed(tokens)
    x = (torch.randn(tokens, h, device="cuda") / 4).to(dtype).requires_grad_()
    w = (torch.randn(v, h, device="cuda") / 4).to(dtype).requires_grad_()
    t = torch.randint(0, v, (tokens,), device="cuda")
    if tokens > 1:
        t[::5] = -100
    return x, w, t


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("tokens", [1, 7, 1000, 4097])
@pytest.mark.parametrize("reduction", ["mean", "sum"])
@pytest.mark.parametrize("chunk_bytes", [None, 1 << 20])
def test_matches_torch(dtype, tokens, reduction, chunk_bytes, monkeypatch) -> None:
    if chunk_bytes is not None:
        monkeypatch.setattr(lce, "CHUNK_BYTES", chunk_bytes)  # many chunks
    x, w, t = _problem(tokens, 256, 32003, dtype)
    loss = ops.linear_cross_entropy(x, w, t, reduction=reduction)
    ref = F.cross_entropy(x.float() @ w.float().t(), t, reduction=reduction)
    assert loss.dtype == torch.float32
    assert abs(loss.item() - ref.item()) <= 1e-2 * max(1.0, abs(ref.item()))
    g = torch.autograd.grad(loss * 1.5, (x, w))
    g_ref = torch.autograd.grad(ref * 1.5, (x, w))
    for a, b in zip(g, g_ref):
        assert _rel(a, b) < 1e-2


def test_compiled_and_frozen_weight() -> None:
    h, v = 512, 50257
    x = torch.randn(2, 333, h, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    w = (torch.randn(v, h, device="cuda", dtype=torch.bfloat16) / 8)  # no grad wanted
    t = torch.randint(0, v, (2, 333), device="cuda")
    f = torch.compile(lambda x: ops.linear_cross_entropy(x, w, t), fullgraph=True)
    for _ in range(2):
        loss = f(x)
        (gx,) = torch.autograd.grad(loss, x)
    ref = F.cross_entropy((x.float() @ w.float().t()).view(-1, v), t.view(-1))
    (gx_ref,) = torch.autograd.grad(ref, x)
    assert abs(loss.item() - ref.item()) < 1e-2 and _rel(gx, gx_ref) < 1e-2
    if build.load() is not None:  # the compiled graph's warm calls ran the op's C launch plan
        assert dispatch.plans(lce._op) >= 1


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("tokens", [1, 7, 1000, 4097])
@pytest.mark.parametrize("chunk_bytes", [None, 1 << 20])
@pytest.mark.parametrize("compiled", [False, True])
def test_weight_and_input_gradients_eager_and_compiled(dtype, tokens, chunk_bytes, compiled, monkeypatch) -> None:
    """Both gradients with an incoming gradient of 1.5 (applied in the backward), eager and
    under torch.compile, one chunk and many."""
    if chunk_bytes is not None:
        monkeypatch.setattr(lce, "CHUNK_BYTES", chunk_bytes)  # many chunks
    x, w, t = _problem(tokens, 256, 32000, dtype)
    torch._dynamo.reset()  # every case compiles the same code object: past cases' graphs would hit the recompile limit

    def loss_of(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return ops.linear_cross_entropy(x, w, t) * 1.5

    f = torch.compile(loss_of, fullgraph=True) if compiled else loss_of
    for _ in range(2):  # the second call warm
        g = torch.autograd.grad(f(x, w), (x, w))
    ref = F.cross_entropy(x.float() @ w.float().t(), t) * 1.5
    g_ref = torch.autograd.grad(ref, (x, w))
    for a, b in zip(g, g_ref):
        assert a.dtype == dtype and _rel(a, b) < 1e-2


@pytest.mark.parametrize("compiled", [False, True])
def test_fp32_weights_under_bf16_autocast(compiled) -> None:
    """fp32 x and head under bf16 autocast (mixed-precision training with fp32 master
    weights): the op runs in bf16 as the stock head's F.linear would, and the gradients come
    back in fp32, against torch's autocast reference."""
    torch._dynamo.reset()
    x, w, t = _problem(1000, 256, 32000, torch.float32)

    def loss_of(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return ops.linear_cross_entropy(x, w, t)

    f = torch.compile(loss_of, fullgraph=True) if compiled else loss_of
    with torch.autocast("cuda", dtype=torch.bfloat16):
        loss = f(x, w)
        ref = F.cross_entropy(F.linear(x, w).float(), t)
    assert loss.dtype == torch.float32 and abs(loss.item() - ref.item()) < 1e-2
    g = torch.autograd.grad(loss, (x, w))
    g_ref = torch.autograd.grad(ref, (x, w))
    for a, b in zip(g, g_ref):
        assert a.dtype == torch.float32 and _rel(a, b) < 1e-2
