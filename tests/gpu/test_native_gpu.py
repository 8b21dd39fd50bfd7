"""Native dispatch on the GPU: the warm path of ops.sum allocates and launches in one C++
call; results, streams and CUDA-graph capture must be exactly those of the Python path."""

from __future__ import annotations

import pytest
import torch

import cuteforge.ops as ops
from cuteforge import native
from cuteforge.ops import reduce as reduce_ops

pytestmark = pytest.mark.gpu


def _plan(x: torch.Tensor, op: str = "sum"):
    return reduce_ops._PLANS[reduce_ops._memo_key(op, x, -1, False)]


@pytest.fixture(autouse=True)
def _needs_native():
    if native.launcher("new_rows") is None:
        pytest.fail("native dispatch unavailable on the GPU machine (compiler, ninja or DLPack exchange API missing)")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("op", ["sum", "amax", "argmax"])
def test_warm_path_is_native_and_correct(op: str, dtype: torch.dtype) -> None:
    x = torch.randn(37, 1000, device="cuda", dtype=dtype)
    first = getattr(ops, op)(x)
    assert _plan(x, op)[3] is not None  # the plain 2-D case took the native route
    again = getattr(ops, op)(x)
    ref = getattr(torch, op)(x, dim=-1) if op != "sum" else x.float().sum(-1).to(dtype)
    assert again.dtype == ref.dtype and again.shape == ref.shape and again.device == x.device
    torch.testing.assert_close(again, first, rtol=0, atol=0)
    torch.testing.assert_close(again.float(), ref.float(), rtol=2e-2, atol=2e-2)


def test_runs_on_the_current_stream() -> None:
    x = torch.randn(4096, 4096, device="cuda")
    ops.sum(x)
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        x2 = x * 2  # produced on s: the sum must be ordered after it on s
        out = ops.sum(x2)
    s.synchronize()
    torch.testing.assert_close(out, (x * 2).sum(-1), rtol=1e-4, atol=1e-2)


def test_cuda_graph_capture_and_replay() -> None:
    x = torch.randn(64, 2048, device="cuda")
    ops.sum(x)  # warm: plan and kernel exist before capture
    g = torch.cuda.CUDAGraph()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        ops.sum(x)
    torch.cuda.current_stream().wait_stream(s)
    with torch.cuda.graph(g):
        out = ops.sum(x)
    x.copy_(torch.randn_like(x))
    g.replay()
    torch.cuda.synchronize()
    torch.testing.assert_close(out, x.sum(-1), rtol=1e-4, atol=1e-3)


def test_python_path_when_disabled(monkeypatch) -> None:
    monkeypatch.setenv("CUTEFORGE_NATIVE", "0")
    x = torch.randn(5, 333, device="cuda")
    reduce_ops._PLANS.clear()
    out = ops.sum(x)
    assert _plan(x)[3] is None
    torch.testing.assert_close(out, x.sum(-1), rtol=1e-4, atol=1e-4)
    reduce_ops._PLANS.clear()
