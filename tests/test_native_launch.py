"""The eager forward launch (cuteforge/native/ffi_launch.cpp) on the CPU: plans whose
"kernel" is a Python function exposed through TVM-FFI (the C ABI the compiled CuTe
kernels use) run every path but the CUDA stream here: allocation, argument views and
offsets, returns, and errors. The ops' use of it on the GPU is in tests/gpu."""

from __future__ import annotations

import ctypes

import pytest
import torch

from cuteforge.native import build
from cuteforge.native import launch as native_launch
from cuteforge.native.args import arg, contiguous_arg

pytestmark = pytest.mark.skipif(build.load() is None, reason="the C++ extension could not be built here")

IN, OUT, FIXED = native_launch.INPUT, native_launch.OUTPUT, native_launch.FIXED
CPU = torch.device("cpu")
SEEN: list[tuple[tuple[int, ...], tuple[int, ...]]] = []


def _view(t: object) -> torch.Tensor:
    """A torch CPU tensor over a TVM-FFI tensor view's memory (fp32, any strides)."""
    shape, strides = tuple(t.shape), tuple(t.strides)
    SEEN.append((shape, strides))
    span = 1 + sum((d - 1) * s for d, s in zip(shape, strides)) if all(shape) else 0
    ptr = t.data_ptr() if callable(t.data_ptr) else t.data_ptr
    flat = torch.frombuffer((ctypes.c_float * max(span, 1)).from_address(ptr), dtype=torch.float32)
    return flat.as_strided(shape, strides)


def _double_and_row_sums(x: object, y: object, s: object) -> None:
    x, y, s = (_view(t) for t in (x, y, s))
    y.copy_(2 * x)
    s.copy_(x.sum(-1))


def _fail(x: object, y: object) -> None:
    raise ValueError("the kernel refused this")


def _ffi(f):
    import tvm_ffi

    return tvm_ffi.convert(f)


def _run(m: int, n: int, returns=(0,), x_arg=None):
    return native_launch.runner(
        "TestLaunch", _ffi(_double_and_row_sums), CPU, 1, [((m, n), torch.float32), ((m,), torch.float32)],
        [x_arg or contiguous_arg(IN, 0, (m, n)), contiguous_arg(OUT, 0, (m, n)), contiguous_arg(OUT, 1, (m,))], returns)


def test_allocates_calls_and_returns_the_outputs_asked_for() -> None:
    x = torch.randn(3, 5)
    y = _run(3, 5)(x)
    assert y.shape == (3, 5) and y.dtype == torch.float32 and y.is_contiguous()
    torch.testing.assert_close(y, 2 * x)
    y2, s = _run(3, 5, returns=(0, 1))(x)
    torch.testing.assert_close(y2, 2 * x)
    torch.testing.assert_close(s, x.sum(-1))
    (s_only,) = (_run(3, 5, returns=(1,))(x),)
    torch.testing.assert_close(s_only, x.sum(-1))


def test_each_call_gets_fresh_outputs() -> None:
    run = _run(2, 4)
    a, b = torch.ones(2, 4), torch.full((2, 4), 3.0)
    ya, yb = run(a), run(b)
    assert ya.data_ptr() != yb.data_ptr()
    torch.testing.assert_close(ya, 2 * a)
    torch.testing.assert_close(yb, 2 * b)


def test_the_kernel_reads_the_planned_view() -> None:
    # x a (4, 6) view with row stride 10 of a larger buffer: the kernel sees those strides
    base = torch.randn(4, 10)
    x = base[:, 2:8]
    SEEN.clear()
    run = _run(4, 6, x_arg=(IN, 0, [4, 6], [10, 1], 0))
    torch.testing.assert_close(run(x), 2 * x)
    assert SEEN[0] == ((4, 6), (10, 1))


def test_element_offset_into_an_input() -> None:
    base = torch.randn(5, 3)
    run = native_launch.runner(
        "TestOffset", _ffi(_double_and_row_sums), CPU, 1, [((2, 3), torch.float32), ((2,), torch.float32)],
        [contiguous_arg(IN, 0, (2, 3), offset=6), contiguous_arg(OUT, 0, (2, 3)), contiguous_arg(OUT, 1, (2,))], [0])
    torch.testing.assert_close(run(base), 2 * base[2:4])


def test_one_input_as_several_arguments() -> None:
    # the norms pass x twice (x and "no residual"); arg() takes a tensor's own layout
    x = torch.randn(2, 3)

    def add(a: object, b: object, y: object) -> None:
        a, b, y = (_view(t) for t in (a, b, y))
        y.copy_(a + b)

    run = native_launch.runner("TestTwice", _ffi(add), CPU, 1, [((2, 3), torch.float32)],
                               [arg(IN, 0, x), arg(IN, 0, x), arg(OUT, 0, x)], [0])
    torch.testing.assert_close(run(x), 2 * x)


def test_fixed_tensor_is_held_by_the_plan_and_read_by_every_call() -> None:
    # a GEMM's workspace word: no input of the call, the same buffer each time
    w = torch.tensor([10.0, 20.0, 30.0])

    def add(a: object, b: object, y: object) -> None:
        a, b, y = (_view(t) for t in (a, b, y))
        y.copy_(a + b)

    run = native_launch.runner("TestFixed", _ffi(add), CPU, 1, [((2, 3), torch.float32)],
                               [contiguous_arg(IN, 0, (2, 3)), (FIXED, 0, [2, 3], [0, 1], 0), contiguous_arg(OUT, 0, (2, 3))],
                               [0], fixed=[w])
    del w  # the plan keeps it
    for x in (torch.randn(2, 3), torch.ones(2, 3)):
        torch.testing.assert_close(run(x), x + torch.tensor([10.0, 20.0, 30.0]))
    with pytest.raises(ValueError, match="names no input, output or fixed tensor"):
        native_launch.runner("TestBad", _ffi(add), CPU, 1, [((2, 3), torch.float32)],
                             [contiguous_arg(IN, 0, (2, 3)), (FIXED, 1, [3], [1], 0), contiguous_arg(OUT, 0, (2, 3))], [0],
                             fixed=[torch.zeros(3)])
    if torch.cuda.is_available():
        with pytest.raises(ValueError, match="fixed tensor is on another device"):
            native_launch.runner("TestBad", _ffi(add), CPU, 1, [((2, 3), torch.float32)],
                                 [contiguous_arg(IN, 0, (2, 3)), (FIXED, 0, [3], [1], 0), contiguous_arg(OUT, 0, (2, 3))],
                                 [0], fixed=[torch.zeros(3, device="cuda")])


def test_none_for_an_input_no_argument_reads() -> None:
    run = native_launch.runner(
        "TestOptional", _ffi(_double_and_row_sums), CPU, 2, [((2, 3), torch.float32), ((2,), torch.float32)],
        [contiguous_arg(IN, 0, (2, 3)), contiguous_arg(OUT, 0, (2, 3)), contiguous_arg(OUT, 1, (2,))], [0])
    x = torch.randn(2, 3)
    torch.testing.assert_close(run(x, None), 2 * x)
    with pytest.raises(TypeError, match="TestOptional: input 0 must be a torch.Tensor, got NoneType"):
        run(None, None)


def test_wrong_count_or_type_of_inputs_is_a_clear_error() -> None:
    run = _run(2, 2)
    with pytest.raises(TypeError, match="TestLaunch: expected 1 input tensors, got 2"):
        run(torch.zeros(2, 2), torch.zeros(2, 2))
    with pytest.raises(TypeError, match="TestLaunch: input 0 must be a torch.Tensor, got list"):
        run([1.0])
    with pytest.raises(TypeError, match="missing the plan"):
        build.load().launch()


def test_input_on_another_device_is_refused_before_anything_runs() -> None:
    SEEN.clear()
    run = native_launch.runner("TestDevice", _ffi(_double_and_row_sums), torch.device("cuda", 0), 1,
                               [((2, 2), torch.float32), ((2,), torch.float32)],
                               [contiguous_arg(IN, 0, (2, 2)), contiguous_arg(OUT, 0, (2, 2)), contiguous_arg(OUT, 1, (2,))], [0])
    with pytest.raises(ValueError, match="TestDevice: input 0 is on cpu, the plan on cuda:0"):
        run(torch.zeros(2, 2))
    assert SEEN == []


def test_kernel_errors_name_the_plan() -> None:
    run = native_launch.runner("TestFailing", _ffi(_fail), CPU, 1, [((2, 2), torch.float32)],
                               [contiguous_arg(IN, 0, (2, 2)), contiguous_arg(OUT, 0, (2, 2))], [0])
    with pytest.raises(RuntimeError, match="TestFailing: the kernel call failed.*the kernel refused this"):
        run(torch.zeros(2, 2))


def test_bad_plans_are_refused_when_made() -> None:
    fn = _ffi(_double_and_row_sums)
    with pytest.raises(ValueError, match="names no input, output or fixed tensor"):
        native_launch.runner("TestBad", fn, CPU, 1, [((2, 2), torch.float32)], [contiguous_arg(OUT, 3, (2, 2))], [0])
    with pytest.raises(ValueError, match="returned output does not exist"):
        native_launch.runner("TestBad", fn, CPU, 1, [((2, 2), torch.float32)], [contiguous_arg(OUT, 0, (2, 2))], [1])
    with pytest.raises(ValueError, match="at least one output"):
        native_launch.runner("TestBad", fn, CPU, 1, [((2, 2), torch.float32)], [contiguous_arg(OUT, 0, (2, 2))], [])


def test_plan_keeps_its_kernel_alive() -> None:
    import gc

    run = _run(2, 3)
    gc.collect()  # the TVM-FFI function object of _run is gone from Python; the plan holds it
    x = torch.randn(2, 3)
    torch.testing.assert_close(run(x), 2 * x)


def test_disabled_extension_gives_no_runner(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(build, "load", lambda: None)
    assert _run(2, 2) is None


def test_launch_alone_can_be_turned_off(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CUTEFORGE_NATIVE_LAUNCH", "0")
    assert _run(2, 2) is None
    assert build.load() is not None  # the autograd node stays
    monkeypatch.setenv("CUTEFORGE_NATIVE_LAUNCH", "1")
    assert _run(2, 2) is not None


# --------------------------------------------------------------------------- launch tables


def test_table_launches_the_plan_keyed_by_the_call_layout() -> None:
    table = native_launch.Table(1)
    assert table.call is None and len(table) == 0
    x = torch.randn(3, 5)
    table.put((-1,), (x,), _run(3, 5))
    torch.testing.assert_close(table.call(-1, x), 2 * x)
    ones = torch.ones(3, 5)
    torch.testing.assert_close(table.call(-1, ones), 2 * ones)  # another tensor of that layout
    assert len(table) == 1


def test_table_misses_on_any_change_of_the_key() -> None:
    table = native_launch.Table(1)
    x = torch.randn(3, 5)
    table.put((-1,), (x,), _run(3, 5))
    big = torch.randn(3, 9)
    for scalar, t in ((1, x), (True, x), (-1.0, x), (None, x), (-1, x.double()), (-1, x[:2]), (-1, x.t()),
                      (-1, big[:, :5]), (-1, torch.randn(16)[1:].view(3, 5)), (-1, None), ("a", x), (-1, [1.0])):
        assert table.call(scalar, t) is None, (scalar, t)
    assert table.call(-1) is None and table.call() is None  # too few arguments: no key


def test_table_leaves_grad_to_python() -> None:
    table = native_launch.Table(1)
    x = torch.randn(3, 5)
    table.put((-1,), (x,), _run(3, 5))
    xg = x.clone().requires_grad_()
    assert table.call(-1, xg) is None
    with torch.no_grad():
        torch.testing.assert_close(table.call(-1, xg), 2 * x)


def test_table_keys_absent_inputs_and_several_scalars() -> None:
    table = native_launch.Table(2)
    x = torch.randn(2, 3)
    run = native_launch.runner(
        "TestOptional", _ffi(_double_and_row_sums), CPU, 2, [((2, 3), torch.float32), ((2,), torch.float32)],
        [contiguous_arg(IN, 0, (2, 3)), contiguous_arg(OUT, 0, (2, 3)), contiguous_arg(OUT, 1, (2,))], [0])
    table.put((1e-5, False), (x, None), run)
    torch.testing.assert_close(table.call(1e-5, False, x, None), 2 * x)
    assert table.call(1e-5, False, x, x) is None
    assert table.call(1e-5, 0, x, None) is None
    assert table.call(1e-6, False, x, None) is None


def test_table_put_ignores_python_runs_and_calls_it_cannot_key() -> None:
    import enum

    import numpy as np

    class Dim(enum.IntEnum):
        LAST = -1

    table = native_launch.Table(1)
    x = torch.randn(3, 5)
    assert not table.put((-1,), (x,), lambda t: 2 * t)  # a Python run stays in the op's Python memo
    # scalars that pass an op's isinstance checks but are no exact int / float: not keyed
    # (the op's Python memo serves them), and no error on the op's first call
    for scalar in (np.float64(1e-6), Dim.LAST, "dim"):
        assert not table.put((scalar,), (x,), _run(3, 5))
    assert table.call is None and len(table) == 0
    assert table.put((-1,), (x,), _run(3, 5))
    assert table.call(Dim.LAST, x) is None and table.call(np.float64(-1.0), x) is None
    with pytest.raises(ValueError, match="wrong number of scalars"):
        table.put((-1, 0), (x,), _run(3, 5))
    with pytest.raises(ValueError, match="wrong number of inputs"):
        table.put((-1,), (x, x), _run(3, 5))


def test_table_clear_and_plans_outliving_their_runner() -> None:
    import gc

    table = native_launch.Table(1)
    x = torch.randn(3, 5)
    table.put((-1,), (x,), _run(3, 5))
    gc.collect()  # the runner (and its capsule) is gone; the table shares the plan
    torch.testing.assert_close(table.call(-1, x), 2 * x)
    table.clear()
    assert table.call is None and len(table) == 0


def test_table_misses_for_anything_but_plain_tensors() -> None:
    """Sparse, Python-dispatch, functionalized, lazily negated and __torch_function__
    tensors, and calls under a dispatch mode, are no key: the op's Python path and its
    checks answer them (not a launch on a null pointer, not a result of the wrong type)."""
    from torch.testing._internal.two_tensor import TwoTensor
    from torch.utils._python_dispatch import TorchDispatchMode

    class Sub(torch.Tensor):
        pass

    class Seen(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            return func(*args, **(kwargs or {}))

    table = native_launch.Table(1)
    x = torch.randn(3, 5)
    table.put((-1,), (x,), _run(3, 5))
    functional = torch._to_functional_tensor(x)
    assert functional.data_ptr() == 0  # what a launch would have read
    for t in (x.to_sparse(), TwoTensor(x.clone(), x.clone()), functional, torch._neg_view(x), x.as_subclass(Sub)):
        assert table.call(-1, t) is None, type(t)
    with Seen():
        assert table.call(-1, x) is None

    class Mode(torch.overrides.TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            return func(*args, **(kwargs or {}))

    with Mode():
        assert table.call(-1, x) is None
    w = torch.nn.Parameter(torch.randn(3, 5))  # a Parameter is a plain tensor here
    table.put((-1,), (w.detach(),), _run(3, 5))
    with torch.no_grad():
        torch.testing.assert_close(table.call(-1, w), 2 * w)
    torch.testing.assert_close(table.call(-1, x), 2 * x)


def test_plans_and_tables_own_their_kernel_until_released() -> None:
    import gc
    import weakref

    def make_kernel():
        def kernel(x: object, y: object, s: object) -> None:
            _double_and_row_sums(x, y, s)

        return kernel

    kernel = make_kernel()
    alive = weakref.ref(kernel)
    run = native_launch.runner("TestLife", _ffi(kernel), CPU, 1, [((2, 3), torch.float32), ((2,), torch.float32)],
                               [contiguous_arg(IN, 0, (2, 3)), contiguous_arg(OUT, 0, (2, 3)), contiguous_arg(OUT, 1, (2,))],
                               [0])
    del kernel
    gc.collect()
    assert alive() is not None  # the plan holds the TVM-FFI function, which holds the kernel
    table = native_launch.Table(1)
    x = torch.randn(2, 3)
    table.put((-1,), (x,), run)
    del run
    gc.collect()
    assert alive() is not None
    torch.testing.assert_close(table.call(-1, x), 2 * x)
    table.clear()
    gc.collect()
    assert alive() is None  # released with the last plan: no leak


def test_plans_run_on_cuda_or_cpu_only() -> None:
    with pytest.raises(ValueError, match="runs on cuda or cpu, not meta"):
        native_launch.runner("TestMeta", _ffi(_double_and_row_sums), torch.device("meta"), 1,
                             [((2, 2), torch.float32)], [contiguous_arg(IN, 0, (2, 2)), contiguous_arg(OUT, 0, (2, 2))], [0])


def _fill_partials(y: object, p: object) -> None:
    # y = 1; p (2, 3, 4): p[r, q, n] = r * 100 + q * 10 + n
    y, p = _view(y), _view(p)
    y.fill_(1.0)
    r, q, n = torch.meshgrid(torch.arange(2.0), torch.arange(3.0), torch.arange(4.0), indexing="ij")
    p.copy_(r * 100 + q * 10 + n)


def _sum_partials(p: object, s: object) -> None:
    # the second kernel: s (2, 4) = p (2, 3, 4) summed over its middle dim
    _view(s).copy_(_view(p).sum(1))


def test_then_kernels_run_in_order_and_rows_are_returned() -> None:
    """A plan's second kernel reads what the first wrote (a norm backward's partials and
    their column sum); (output, row) returns one row of an output, as a view of it."""
    run = native_launch.runner(
        "TestThen", _ffi(_fill_partials), CPU, 1,
        [((2, 4), torch.float32), ((2, 3, 4), torch.float32), ((2, 4), torch.float32)],
        [contiguous_arg(OUT, 0, (2, 4)), contiguous_arg(OUT, 1, (2, 3, 4))], [0, (2, 0), (2, 1)],
        then=[native_launch.kernel_step(_ffi(_sum_partials), [contiguous_arg(OUT, 1, (2, 3, 4)), contiguous_arg(OUT, 2, (2, 4))])])
    y, d0, d1 = run(torch.empty(2, 4))
    n = torch.arange(4.0)
    torch.testing.assert_close(y, torch.ones(2, 4))
    torch.testing.assert_close(d0, 3 * n + 30)  # rows q = 0..2 of r = 0 summed
    torch.testing.assert_close(d1, 300 + 3 * n + 30)
    assert d0.shape == (4,) and d1.data_ptr() == d0.data_ptr() + 4 * 4  # rows of one output
    for bad, match in (((2, "float32", 0), "a returned row is"), ((2, -1), "must be >= 0")):
        with pytest.raises(ValueError, match=match):
            native_launch.runner("TestBadRow", _ffi(_fill_partials), CPU, 1,
                                 [((2, 4), torch.float32), ((2, 3, 4), torch.float32), ((2, 4), torch.float32)],
                                 [contiguous_arg(OUT, 0, (2, 4)), contiguous_arg(OUT, 1, (2, 3, 4))], [bad])
    with pytest.raises(ValueError, match="names no input, output or fixed tensor"):
        native_launch.runner("TestBadThen", _ffi(_fill_partials), CPU, 1,
                             [((2, 4), torch.float32), ((2, 3, 4), torch.float32)],
                             [contiguous_arg(OUT, 0, (2, 4)), contiguous_arg(OUT, 1, (2, 3, 4))], [0],
                             then=[native_launch.kernel_step(_ffi(_sum_partials),
                                                             [contiguous_arg(OUT, 1, (2, 3, 4)), contiguous_arg(OUT, 2, (2, 4))])])
    # a stand-in that is no TVM-FFI function anywhere in the plan: no runner (the op's Python launch)
    assert native_launch.runner("TestPlainThen", _ffi(_fill_partials), CPU, 1, [((2, 4), torch.float32)],
                                [contiguous_arg(OUT, 0, (2, 4))], [0], then=[native_launch.kernel_step(_sum_partials, [])]) is None


def test_matmul_steps_read_what_kernels_wrote() -> None:
    """Products through ATen between and after kernels (a fused linear loss's chunks): views
    with swapped strides are transposes, offsets pick rows, accumulate adds into out."""
    m, k, n = 4, 3, 5
    x, w = torch.randn(m, k), torch.randn(n, k)
    y, logits, dw = contiguous_arg(OUT, 0, (m, k)), contiguous_arg(OUT, 2, (m, n)), contiguous_arg(OUT, 3, (n, k))
    w_t = (IN, 1, [k, n], [1, k], 0)  # weight (N, K) read as its (K, N) transpose
    logits_t = (OUT, 2, [n, m], [1, n], 0)
    half = (IN, 0, [m // 2, k], [k, 1], (m // 2) * k)  # x's second half of the rows
    run = native_launch.runner(
        "TestMatmul", _ffi(_double_and_row_sums), CPU, 2,
        [((m, k), torch.float32), ((m,), torch.float32), ((m, n), torch.float32), ((n, k), torch.float32)],
        [contiguous_arg(IN, 0, (m, k)), y, contiguous_arg(OUT, 1, (m,))], [2, 3],
        then=[native_launch.matmul_step(logits, y, w_t),
              native_launch.matmul_step(dw, logits_t, contiguous_arg(IN, 0, (m, k))),
              native_launch.matmul_step(dw, (OUT, 2, [n, m // 2], [1, n], (m // 2) * n), half, accumulate=True)])
    got_logits, got_dw = run(x, w)
    ref = (2 * x) @ w.t()
    torch.testing.assert_close(got_logits, ref)
    torch.testing.assert_close(got_dw, ref.t() @ x + ref[m // 2:].t() @ x[m // 2:])
    with pytest.raises(ValueError, match="takes \\(out, a, b\\)"):
        native_launch.runner("TestBadMatmul", _ffi(_double_and_row_sums), CPU, 2, [((m, k), torch.float32)],
                             [contiguous_arg(IN, 0, (m, k)), y, y], [0], then=[(1, None, [y, y])])
    with pytest.raises(ValueError, match="2-D views"):
        native_launch.runner("TestBadMatmul", _ffi(_double_and_row_sums), CPU, 2, [((m, k), torch.float32)],
                             [contiguous_arg(IN, 0, (m, k)), y, y], [0],
                             then=[native_launch.matmul_step(contiguous_arg(OUT, 0, (m * k,)), y, y)])
