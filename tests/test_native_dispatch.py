"""The registered ops' C++ dispatcher kernels (cuteforge/native/ffi_dispatch.cpp) on the CPU:
an op defined through `cuteforge.ops.registered.define` with its C++ kernel on the CPU key,
whose "kernel" is a Python function exposed through TVM-FFI. After the first call of a
layout, calls of that layout run the launch plan without the Python implementation, also
inside a torch.compile graph; gradients keep the op's autograd formula; other layouts,
scalars and dtypes get plans of their own."""

from __future__ import annotations

import pytest
import torch
from test_native_launch import _view  # a TVM-FFI tensor view as a torch CPU tensor

from cuteforge.native import build, dispatch
from cuteforge.native import launch as native_launch
from cuteforge.native.args import arg, contiguous_arg
from cuteforge.ops.registered import define

pytestmark = pytest.mark.skipif(build.load(wait=True) is None, reason="the C++ extension could not be built here")

IN, OUT = native_launch.INPUT, native_launch.OUTPUT
CPU = torch.device("cpu")
CALLS = {"impl": 0, "kernel": 0}


def _kernel(factor: float):
    """A stand-in for a kernel compiled for ``factor``: y = x * factor, s = row sums of x."""
    import tvm_ffi

    def scale_rows(x: object, y: object, s: object) -> None:
        CALLS["kernel"] += 1
        x, y, s = (_view(t) for t in (x, y, s))
        y.copy_(x * factor)
        s.copy_(x.sum(-1))

    return tvm_ffi.convert(scale_rows)


def _impl(x: torch.Tensor, factor: float, mask: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    CALLS["impl"] += 1
    y = x * factor
    return (y if mask is None else y * mask), x.sum(-1)


def _fake(x, factor, mask):
    return x.new_empty(x.shape), x.new_empty(x.shape[0])


def _plan(x: torch.Tensor, factor: float, mask: torch.Tensor | None):
    """Plans for fp32 rows with a unit last stride and no mask; None otherwise."""
    if x.dtype != torch.float32 or x.dim() != 2 or x.stride(1) != 1 or mask is not None:
        return None
    m, n = x.shape
    return native_launch.runner("TestScale", _kernel(factor), CPU, 2, [((m, n), torch.float32), ((m,), torch.float32)],
                                [arg(IN, 0, x), contiguous_arg(OUT, 0, (m, n)), contiguous_arg(OUT, 1, (m,))], [0, 1])


def _setup(ctx, inputs, output):
    ctx.factor = inputs[1]


def _backward(ctx, dy, _ds):
    return dy * ctx.factor, None, None


OP = define("cuteforge_test::scale_rows", _impl, fake=_fake, plan=_plan, backward=_backward, setup_context=_setup,
            backend="CPU")


def test_a_warm_layout_runs_the_plan_without_python() -> None:
    x = torch.randn(4, 8)
    torch.ops.cuteforge_test.scale_rows(x, 1.0, None)  # first call: Python, registers the kernels
    before = dict(CALLS)
    y, s = torch.ops.cuteforge_test.scale_rows(x, 1.0, None)  # a miss: Python makes the plan
    y, s = torch.ops.cuteforge_test.scale_rows(x, 1.0, None)  # the plan
    torch.testing.assert_close(s, x.sum(-1))
    assert dispatch.plans(OP, "CPU") >= 1
    assert CALLS["kernel"] - before["kernel"] == 2
    assert CALLS["impl"] == before["impl"]  # never the Python implementation once a plan exists


def _call(x, factor=1.0, mask=None):
    return torch.ops.cuteforge_test.scale_rows(x, factor, mask)


def test_each_layout_and_scalar_gets_its_own_plan() -> None:
    base = torch.randn(6, 12)
    for x in (base, base[:, 2:9], base[1:4]):  # row-strided views are read in place
        for factor in (2.0, -0.5):
            for _ in range(3):
                y, s = _call(x, factor)
                torch.testing.assert_close(y, x * factor)
                torch.testing.assert_close(s, x.sum(-1))
                assert y.is_contiguous() and y.data_ptr() != x.data_ptr()


def test_a_layout_without_plan_stays_on_python() -> None:
    x, mask = torch.randn(3, 5), torch.zeros(3, 5)
    _call(x)
    before = CALLS["impl"]
    for _ in range(3):
        y, _ = _call(x, 3.0, mask)
        assert torch.count_nonzero(y) == 0
    x64 = torch.randn(3, 5, dtype=torch.float64)
    torch.testing.assert_close(_call(x64, 2.0)[0], 2 * x64)
    assert CALLS["impl"] == before + 4


def test_gradients_keep_the_autograd_formula() -> None:
    x = torch.randn(4, 8, requires_grad=True)
    for _ in range(3):
        y, _ = _call(x, 3.0)
        (g,) = torch.autograd.grad(y.sum(), x)
        torch.testing.assert_close(g, torch.full_like(x, 3.0))
    with torch.no_grad():  # no grad wanted: the plan, outputs without history
        y, _ = _call(x, 3.0)
    assert not y.requires_grad


def test_errors_of_the_python_implementation_reach_the_caller() -> None:
    with pytest.raises(RuntimeError):
        _call(torch.randn(3, 4), 1.0, torch.randn(5))  # the mask does not broadcast


def test_a_compiled_graph_calls_the_plan() -> None:
    def f(x: torch.Tensor) -> torch.Tensor:
        y, s = torch.ops.cuteforge_test.scale_rows(x * 2, 0.25, None)
        return y.sum(-1) + s

    x = torch.randn(5, 7)
    compiled = torch.compile(f, backend="inductor", fullgraph=True)
    want = f(x)
    for _ in range(2):
        torch.testing.assert_close(compiled(x), want)
    before = dict(CALLS)
    torch.testing.assert_close(compiled(x), want)
    assert CALLS["impl"] == before["impl"] and CALLS["kernel"] == before["kernel"] + 1
