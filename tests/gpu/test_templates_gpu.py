"""Templates on the GPU: autotuned add, fused epilogues/prologues vs the unfused torch
expression, odd sizes and every float dtype."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest
import torch

from cuteforge.fusion import (
    Epilogue,
    Prologue,
    abs,
    clamp,
    exp,
    gelu,
    maximum,
    minimum,
    neg,
    relu,
    sigmoid,
    silu,
    tanh,
    where,
)

pytestmark = pytest.mark.gpu
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples" / "templates"))

import elementwise  # noqa: E402
import row_reduce  # noqa: E402

DTYPES = (torch.float32, torch.bfloat16, torch.float16)
SIZES = (1, 7, 1000, 65537)


def tol(dt):
    return dict(rtol=1.3e-6, atol=1e-5) if dt == torch.float32 else dict(rtol=1e-2, atol=1e-2)


def test_add_autotuned_three_threads_per_block_choices():
    a = torch.randn(1000, 4096, device="cuda")
    b = torch.randn_like(a)
    out = torch.empty_like(a)
    t = elementwise.template()
    res = t.tune({"a": a, "b": b}, out, THREADS_PER_BLOCK=[128, 256, 512], VEC=4, reference=lambda x, y: x + y,
                 tune_options={"store": False, "force": True})
    assert len(res.times_ms) == 3 and all(math.isfinite(v) and v > 0 for v in res.times_ms.values()), res.errors
    assert res.errors == {}
    assert res.best_config.get("THREADS_PER_BLOCK") in (128, 256, 512)
    out.zero_()
    t.run({"a": a, "b": b}, out, THREADS_PER_BLOCK=[128, 256, 512], VEC=4)  # a list: tuned, then launched
    torch.testing.assert_close(out, a + b)
    for c in t.choices({"a": a, "b": b}, out, THREADS_PER_BLOCK=[128, 256, 512]):
        assert "THREADS_PER_BLOCK: cutlass.Constexpr = " in c.rendered.text and "@cute.kernel" in c.rendered.text


@pytest.mark.parametrize("dt", DTYPES)
@pytest.mark.parametrize("n", SIZES)
def test_add_odd_sizes(dt, n):
    a = torch.randn(n, device="cuda", dtype=dt)
    b = torch.randn(n, device="cuda", dtype=dt)
    torch.testing.assert_close(elementwise.add(a, b), a + b, rtol=0, atol=0)
    a2, b2 = torch.randn(3, n, device="cuda", dtype=dt), torch.randn(3, n, device="cuda", dtype=dt)
    torch.testing.assert_close(elementwise.add(a2, b2, THREADS_PER_BLOCK=128, VEC=16 // a2.element_size()), a2 + b2, rtol=0, atol=0)


def test_add_misaligned_views():
    base = torch.randn(5, 1001, device="cuda")
    a, b = base[:, 1:], base[:, :-1]  # pointer off by 4 bytes, row stride 1001
    torch.testing.assert_close(elementwise.add(a, b), a + b, rtol=0, atol=0)


@pytest.mark.parametrize("dt", DTYPES)
@pytest.mark.parametrize("n", SIZES)
def test_epilogue_relu_bias_residual_matches_unfused(dt, n):
    a, b = torch.randn(4, n, device="cuda", dtype=dt), torch.randn(4, n, device="cuda", dtype=dt)
    bias = torch.randn(n, device="cuda", dtype=dt)
    res = torch.randn(4, n, device="cuda", dtype=dt)
    rowv = torch.randn(4, device="cuda", dtype=dt)
    ep = Epilogue.from_fn(lambda acc, bias, res, r, s: relu(acc + bias) * s + res - r, bias="col", res="full", r="row", s="scalar")
    got = elementwise.add(a, b, epilogue=ep, epilogue_args={"bias": bias, "res": res, "r": rowv, "s": 1.5})
    f = [t.float() for t in (a, b, bias, res, rowv)]
    want = (torch.relu(f[0] + f[1] + f[2]) * 1.5 + f[3] - f[4][:, None]).to(dt)
    torch.testing.assert_close(got, want, **tol(dt))


def test_every_epilogue_op_matches_torch():
    a = torch.randn(3, 1000, device="cuda") * 3
    b = torch.randn_like(a)
    r = torch.randn_like(a)

    def fn(acc, r):
        return (gelu(acc) + silu(r) + sigmoid(acc) * tanh(r) + exp(-abs(acc)) + neg(r) + gelu(r, approximate="tanh")
                + where(acc > r, acc, r * 0.5) + maximum(acc, r) - minimum(acc, 0.25) + clamp(r, -0.5, 0.5) + acc ** 2 / (1.0 + r * r))

    ep = Epilogue.from_fn(fn, r="full")
    got = elementwise.add(a, b, epilogue=ep, epilogue_args={"r": r})
    acc = a + b
    F = torch.nn.functional
    want = (F.gelu(acc) + F.silu(r) + torch.sigmoid(acc) * torch.tanh(r) + torch.exp(-acc.abs()) - r + F.gelu(r, approximate="tanh")
            + torch.where(acc > r, acc, r * 0.5) + torch.maximum(acc, r) - torch.minimum(acc, torch.tensor(0.25, device="cuda"))
            + r.clamp(-0.5, 0.5) + acc ** 2 / (1.0 + r * r))
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-4)
    assert torch.equal(ep.reference(acc, r).isfinite(), want.isfinite())


def test_relu_and_max_propagate_nan():
    a = torch.tensor([[float("nan"), -1.0, 2.0, float("inf")]], device="cuda")
    b = torch.zeros_like(a)
    ep = Epilogue.from_fn(lambda acc: relu(acc) + maximum(acc, 0.0))
    got = elementwise.add(a, b, epilogue=ep)
    want = torch.relu(a) + torch.maximum(a, torch.zeros_like(a))
    torch.testing.assert_close(got, want, equal_nan=True)


@pytest.mark.parametrize("dt", DTYPES)
def test_prologues_on_both_inputs(dt):
    a, b = torch.randn(7, 65537, device="cuda", dtype=dt), torch.randn(7, 65537, device="cuda", dtype=dt)
    s = torch.randn(7, 65537, device="cuda", dtype=dt)
    pa = Prologue.from_fn(lambda x, k: x * k, k="scalar")
    pb = Prologue.from_fn(lambda x, s: sigmoid(x) * s, s="full")
    got = elementwise.add(a, b, prologues={"a": pa, "b": pb}, prologue_args={"a": {"k": -2.0}, "b": {"s": s}})
    want = (a.float() * -2.0 + torch.sigmoid(b.float()) * s.float()).to(dt)
    torch.testing.assert_close(got, want, **tol(dt))


@pytest.mark.parametrize("dt", DTYPES)
@pytest.mark.parametrize("m,n", [(1, 1), (7, 7), (1000, 1000), (3, 65537), (65537, 7)])
def test_row_sum_fused_epilogue_and_prologue(dt, m, n):
    x = torch.randn(m, n, device="cuda", dtype=dt)
    bias = torch.randn(m, device="cuda", dtype=dt)
    ep = Epilogue.from_fn(lambda acc, scale, bias: acc * scale + bias, scale="scalar", bias="row")
    pro = Prologue.from_fn(lambda v: abs(v))
    t = dict(rtol=1e-5, atol=1e-4 * max(1.0, n ** 0.5)) if dt == torch.float32 else dict(rtol=1e-2, atol=1e-2 * max(1.0, n ** 0.5 / 4))
    torch.testing.assert_close(row_reduce.row_sum(x).float(), x.float().sum(-1), **t)
    got = row_reduce.row_sum(x, epilogue=ep, epilogue_args={"scale": 0.5, "bias": bias}, prologue=pro)
    torch.testing.assert_close(got.float(), x.float().abs().sum(-1) * 0.5 + bias.float(), **t)
    got32 = row_reduce.row_sum(x, epilogue=Epilogue.from_fn(lambda acc: gelu(acc)), out_dtype=torch.float32)
    torch.testing.assert_close(got32, torch.nn.functional.gelu(x.float().sum(-1)), **t)
