"""The ops' eager forward through the one-call C launch (cuteforge/native/launch.py) on the
GPU: the memo holds the C launch for every layout it can read in place (2-D, N-D, row-
strided views; bias and residual present or not), its outputs are bitwise those of the
Python launch (the same kernel), it launches on torch's current stream (a side stream,
a CUDA graph capture), and layouts it cannot read in place keep the Python launch."""

from __future__ import annotations

import functools
import importlib

import pytest
import torch

import cuteforge.ops as ops
from cuteforge.native import build

# the modules (cuteforge.ops re-exports the functions softmax, sum, ... under those names)
norm_ops = importlib.import_module("cuteforge.ops.norm")
reduce_ops = importlib.import_module("cuteforge.ops.reduce")
softmax_ops = importlib.import_module("cuteforge.ops.softmax")

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(build.load() is None, reason="no C++ extension here")]

DTYPES = [torch.float32, torch.bfloat16, torch.float16]


_C_LAUNCH = build.load().launch if build.load() is not None else None


def _is_c_launch(run) -> bool:
    return isinstance(run, functools.partial) and run.func is _C_LAUNCH


def _clear() -> None:
    reduce_ops._PLANS.clear()
    softmax_ops._FWD.clear()
    norm_ops._EAGER.clear()
    for mod in (reduce_ops, softmax_ops, norm_ops):
        for table in mod._TABLES.values():
            table.clear()


def _tables_hold() -> int:
    return sum(len(t) for mod in (reduce_ops, softmax_ops, norm_ops) for t in mod._TABLES.values())


def _layouts(m: int, n: int, dtype: torch.dtype):
    """(name, x): 2-D, 3-D and a 2-D view with a row stride (every one read in place)."""
    base = torch.randn(m, n + 8, device="cuda", dtype=dtype)
    return [("2d", torch.randn(m, n, device="cuda", dtype=dtype)),
            ("3d", torch.randn(1, m, n, device="cuda", dtype=dtype)),
            ("row_stride", base[:, :n])]


def _no_planning(*args, **kwargs):
    raise AssertionError("a warm call was planned again instead of taken from the C table")


def _both(f, args: tuple, memo: dict, monkeypatch: pytest.MonkeyPatch):
    """f(*args) through the C launch (checked to be in the memo) and through the Python
    launch (the extension hidden from the planner), from fresh memos."""
    from cuteforge.native import launch as native_launch

    _clear()
    got = f(*args)
    assert memo and all(_is_c_launch(r) for r in memo.values()), "the memo holds a Python launch"
    assert _tables_hold() == 1
    memo.clear()  # the second call can only be answered by the C table: no Python plan left,
    with monkeypatch.context() as mp:  # and planning again would raise
        for mod, planner in ((reduce_ops, "_plan"), (softmax_ops, "_plan_fwd"), (norm_ops, "_eager_plan")):
            mp.setattr(mod, planner, _no_planning)
        again = f(*args)
    assert not memo
    _same(again, got)
    _clear()
    with monkeypatch.context() as mp:
        mp.setattr(native_launch.build, "load", lambda: None)
        ref = f(*args)
        assert memo and not any(_is_c_launch(r) for r in memo.values()) and _tables_hold() == 0
    _clear()
    return got, ref


def _same(got, ref) -> None:
    got = got if isinstance(got, tuple) else (got,)
    ref = ref if isinstance(ref, tuple) else (ref,)
    assert len(got) == len(ref)
    for a, b in zip(got, ref):
        assert a.shape == b.shape and a.dtype == b.dtype and a.is_contiguous()
        assert torch.equal(a, b)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("m,n", [(1, 1), (7, 1000), (3, 65537), (128, 4096)])
def test_reductions_softmax_norms_match_the_python_launch(m: int, n: int, dtype: torch.dtype,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    w = (1 + 0.5 * torch.randn(n, device="cuda")).to(dtype)
    b = (0.5 * torch.randn(n, device="cuda")).to(dtype)
    for name, x in _layouts(m, n, dtype):
        r = torch.randn(x.shape, device="cuda", dtype=dtype)
        for op in ("sum", "amax", "argmax"):
            got, ref = _both(getattr(ops, op), (x, -1), reduce_ops._PLANS, monkeypatch)
            _same(got, ref)
            if op != "argmax":  # (argmax against torch, ties included, is in test_reduce_gpu.py)
                torch.testing.assert_close(got.float(), getattr(torch, op)(x.float(), dim=-1).to(x.dtype).float(),
                                           rtol=2e-2, atol=2e-2 * n**0.5 if op == "sum" else 0)
        for op in ("softmax", "log_softmax"):
            got, ref = _both(getattr(ops, op), (x,), softmax_ops._FWD, monkeypatch)
            _same(got, ref)
            torch.testing.assert_close(got.float(), getattr(torch, op)(x.float(), -1), rtol=2e-2, atol=2e-2)
        for label, f, args in (
            ("rms", ops.rms_norm, (x, w, 1e-6)),
            ("rms_res", functools.partial(ops.rms_norm, residual=r), (x, w, 1e-6)),
            ("layer", ops.layer_norm, (x, w, None, 1e-5)),
            ("layer_bias", ops.layer_norm, (x, w, b, 1e-5)),
            ("layer_bias_res", functools.partial(ops.layer_norm, residual=r), (x, w, b, 1e-5)),
        ):
            got, ref = _both(f, args, norm_ops._EAGER, monkeypatch)
            _same(got, ref)
            s = x.float() if "res" not in label else x.float() + r.float()
            want = (torch.nn.functional.rms_norm(s, (n,), w.float(), 1e-6) if label.startswith("rms") else
                    torch.nn.functional.layer_norm(s, (n,), w.float(), b.float() if "bias" in label else None, 1e-5))
            y = got[0] if isinstance(got, tuple) else got
            torch.testing.assert_close(y.float(), want, rtol=2e-2, atol=2e-2, msg=f"{label} {name}")
            if "res" in label:
                torch.testing.assert_close(got[1], x + r, msg=f"{label} {name}")


@pytest.mark.parametrize("dtype", DTYPES)
def test_row_reduction_output_shapes(dtype: torch.dtype, monkeypatch: pytest.MonkeyPatch) -> None:
    """keepdim, trailing size-1 dims and 1-D x: the C launch allocates the output in the
    op's shape (the kernel writes its M values contiguously)."""
    cases = [
        (torch.randn(7, 1000, device="cuda", dtype=dtype), -1, True),
        (torch.randn(3, 1000, 1, device="cuda", dtype=dtype), 1, False),
        (torch.randn(3, 1000, 1, device="cuda", dtype=dtype), 1, True),
        (torch.randn(1000, device="cuda", dtype=dtype), 0, False),
        (torch.randn(1000, device="cuda", dtype=dtype), 0, True),
        (torch.randn(2, 5, 1, device="cuda", dtype=dtype)[:, :, :1].transpose(1, 2), 2, False),
    ]
    for x, dim, keepdim in cases:
        for op in ("sum", "amax", "argmax"):
            got, ref = _both(getattr(ops, op), (x, dim, keepdim), reduce_ops._PLANS, monkeypatch)
            _same(got, ref)
            want = getattr(torch, op)(x, dim=dim, keepdim=keepdim)
            assert got.shape == want.shape and got.dtype == want.dtype, (op, tuple(x.shape), dim, keepdim)


def test_the_c_table_leaves_autograd_to_python() -> None:
    _clear()
    x = torch.randn(8, 512, device="cuda")
    w = torch.randn(512, device="cuda")
    ops.softmax(x), ops.rms_norm(x, w), ops.sum(x, -1)  # plans in the C tables
    assert _tables_hold() == 3
    xg, wg = x.clone().requires_grad_(), w.clone().requires_grad_()
    for out, leaves in ((ops.softmax(xg), (xg,)), (ops.rms_norm(xg, wg), (xg, wg)), (ops.sum(xg, -1), (xg,))):
        assert out.grad_fn is not None
        grads = torch.autograd.grad(out, leaves, torch.ones_like(out))
        assert all(g is not None and g.shape == t.shape for g, t in zip(grads, leaves))
    with torch.no_grad():
        assert ops.softmax(xg).grad_fn is None
    _clear()


def test_layouts_it_cannot_read_in_place_keep_the_python_launch() -> None:
    _clear()
    x = torch.randn(64, 32, device="cuda").t()  # last stride 64: as_rows copies
    torch.testing.assert_close(ops.softmax(x), torch.softmax(x, -1))
    assert not any(_is_c_launch(r) for r in softmax_ops._FWD.values())
    w = torch.randn(128, device="cuda")[::2]  # a strided weight: copied per call
    y = ops.rms_norm(torch.randn(4, 64, device="cuda"), w)
    assert y.shape == (4, 64) and not any(_is_c_launch(r) for r in norm_ops._EAGER.values())
    _clear()


def test_side_stream_orders_after_the_producer() -> None:
    """The launch goes to torch's current stream: behind a long sleep and a copy on a side
    stream it reads the copied values (on another stream it would read zeros)."""
    _clear()
    src = torch.randn(256, 1024, device="cuda")
    w = torch.randn(1024, device="cuda")
    for f in (lambda x: ops.softmax(x), lambda x: ops.rms_norm(x, w), lambda x: ops.sum(x, -1)):
        f(src)  # plan outside the stream
        x = torch.zeros_like(src)
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            torch.cuda._sleep(20_000_000)
            x.copy_(src)
            y = f(x)
        s.synchronize()
        torch.testing.assert_close(y, f(src))
    _clear()


def test_cuda_graph_capture_and_replay() -> None:
    _clear()
    x = torch.randn(32, 2048, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(2048, device="cuda", dtype=torch.bfloat16)

    def step():
        return ops.sum(ops.layer_norm(ops.softmax(x), w), -1)

    step()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        step()
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = step()
    x.copy_(torch.randn_like(x))
    graph.replay()
    torch.cuda.synchronize()
    torch.testing.assert_close(out, step())
    _clear()
