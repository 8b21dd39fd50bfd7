"""The C++ autograd node (cuteforge/native) on the CPU: built as a torch extension, driven
by Plans whose "kernel" is a Python function exposed through TVM-FFI (the same C ABI the
compiled CuTe kernels use), so every path but the CUDA stream runs here: the fast path,
the fallback for other gradient layouts, kernels called after the first (a norm's column
sum of its partials) and rows of a buffer as gradients, the scalar-to-rows gradient,
saved-tensor checks, errors and reference cycles. The ops' use of it on the GPU is in
tests/gpu/test_native_node_gpu.py."""

from __future__ import annotations

import ctypes
import gc
import os
import subprocess
import sys
import weakref
from pathlib import Path

import pytest
import torch

from cuteforge.native import backward as native
from cuteforge.native import build
from cuteforge.native.args import arg, contiguous_arg
from cuteforge.native.launch import kernel_step

pytestmark = pytest.mark.skipif(build.load() is None, reason="the C++ autograd node could not be built here")

CALLS: list[str] = []


def _torch_view(t: object) -> torch.Tensor:
    """A torch CPU tensor over a TVM-FFI tensor view's memory (fp32, any strides)."""
    shape, strides = tuple(t.shape), tuple(t.strides)
    span = 1 + sum((d - 1) * s for d, s in zip(shape, strides)) if all(shape) else 0
    ptr = t.data_ptr() if callable(t.data_ptr) else t.data_ptr
    flat = torch.frombuffer((ctypes.c_float * max(span, 1)).from_address(ptr), dtype=torch.float32)
    return flat.as_strided(shape, strides)


def _softmax_bwd_kernel(dy: object, y: object, dx: object) -> None:
    CALLS.append("kernel")
    dy, y, dx = (_torch_view(t) for t in (dy, y, dx))
    dx.copy_(y * (dy - (dy * y).sum(-1, keepdim=True)))


def _scale_kernel(x: object, w: object, dy: object, dx: object, dwp: object) -> None:
    """y = x * w over (M, N): dx = dy * w, dw partials (2, N) = per half of the rows."""
    CALLS.append("kernel")
    x, w, dy, dx, dwp = (_torch_view(t) for t in (x, w, dy, dx, dwp))
    dx.copy_(dy * w)
    h = x.shape[0] // 2
    dwp[0].copy_((dy[:h] * x[:h]).sum(0))
    dwp[1].copy_((dy[h:] * x[h:]).sum(0))


def _sum_rows_kernel(parts: object, out: object) -> None:
    """The second kernel of a plan: out (..., N) = parts (..., Q, N) summed over Q."""
    CALLS.append("sum")
    parts, out = _torch_view(parts), _torch_view(out)
    out.copy_(parts.sum(-2))


def _rows_kernel(x: object, dloss: object, dx: object) -> None:
    """loss = sum(x) (a scalar): dx = dloss[row] for every element of the row."""
    CALLS.append("kernel")
    x, dloss, dx = (_torch_view(t) for t in (x, dloss, dx))
    dx.copy_(dloss[:, None].expand_as(dx))


_FNS = {}


def _ffi(f):
    import tvm_ffi

    if f not in _FNS:
        _FNS[f] = tvm_ffi.convert(f)
    return _FNS[f]


def _softmax_plan(shape: tuple[int, int], fallback=None):
    def default_fallback(grads, saved):
        CALLS.append("fallback")
        (g,), (y,) = grads, saved
        return [y * (g - (g * y).sum(-1, keepdim=True))]

    rows = shape
    return native.make_plan(
        "TestSoftmaxBackward", _ffi(_softmax_bwd_kernel), torch.device("cpu"),
        [native.grad_as_is(torch.empty(shape))], [(shape, torch.float32)],
        [contiguous_arg(native.GRAD, 0, rows), contiguous_arg(native.SAVED, 0, rows),
         contiguous_arg(native.BUFFER, 0, rows)],
        [(native.BUFFER_OUT, 0)], fallback or default_fallback)


def _softmax(x: torch.Tensor, plan) -> torch.Tensor:
    with torch.no_grad():
        y = torch.softmax(x, -1)
    native.attach(plan, [x], [y], [y])
    return y


def test_fast_path_matches_torch_and_names_the_node() -> None:
    x = torch.randn(6, 9, dtype=torch.float32, requires_grad=True)
    y = _softmax(x, _softmax_plan((6, 9)))
    assert y.requires_grad and y.grad_fn.name() == "TestSoftmaxBackward"
    g = torch.randn(6, 9)
    CALLS.clear()
    (dx,) = torch.autograd.grad(y, x, g)
    assert CALLS == ["kernel"]
    (ref,) = torch.autograd.grad(torch.softmax(x, -1), x, g)
    torch.testing.assert_close(dx, ref)


@pytest.mark.parametrize("grad", ["strided", "expanded", "wrong_dtype"])
def test_other_gradient_layouts_take_the_fallback(grad: str) -> None:
    x = torch.randn(4, 8, requires_grad=True)
    y = _softmax(x, _softmax_plan((4, 8)))
    g = torch.randn(8, 4)
    if grad == "strided":
        out, gy = y, g.t()
    elif grad == "expanded":
        out, gy = y, torch.randn(8).expand(4, 8)
    else:  # a float64 gradient reaches the node as float32 (autograd casts): the fast path
        out, gy = y, g.t().contiguous().double()
    CALLS.clear()
    (dx,) = torch.autograd.grad(out, x, gy)
    assert CALLS == (["kernel"] if grad == "wrong_dtype" else ["fallback"])
    (ref,) = torch.autograd.grad(torch.softmax(x, -1), x, gy)
    torch.testing.assert_close(dx, ref)


def test_retain_graph_then_backward_twice_errors() -> None:
    x = torch.randn(3, 5, requires_grad=True)
    y = _softmax(x, _softmax_plan((3, 5)))
    g = torch.randn(3, 5)
    a = torch.autograd.grad(y, x, g, retain_graph=True)[0]
    b = torch.autograd.grad(y, x, g)[0]
    torch.testing.assert_close(a, b)
    with pytest.raises(RuntimeError, match="backward through the graph a second time"):
        torch.autograd.grad(y, x, g)


def test_saved_output_modified_in_place_is_an_error() -> None:
    x = torch.randn(3, 5, requires_grad=True)
    y = _softmax(x, _softmax_plan((3, 5)))
    z = y * 1
    with torch.no_grad():
        y.mul_(2)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        torch.autograd.grad(z.sum(), x)


def test_fallback_errors_keep_their_python_type() -> None:
    def bad(grads, saved):
        raise ValueError("boom from the fallback")

    x = torch.randn(3, 5, requires_grad=True)
    y = _softmax(x, _softmax_plan((3, 5), fallback=bad))
    with pytest.raises(ValueError, match="boom from the fallback"):
        y.sum().backward()  # an expanded gradient: the fallback


def test_kernel_errors_name_the_node() -> None:
    def failing(*args):
        raise RuntimeError("kernel refused")

    plan = native.make_plan("FailingBackward", _ffi(failing), torch.device("cpu"),
                            [native.grad_as_is(torch.empty(2, 3))], [((2, 3), torch.float32)],
                            [contiguous_arg(native.BUFFER, 0, (2, 3))], [(native.BUFFER_OUT, 0)],
                            lambda g, s: [None])
    x = torch.randn(2, 3, requires_grad=True)
    y = x.detach() * 2
    native.attach(plan, [x], [y], [])
    with pytest.raises(RuntimeError, match="FailingBackward.*kernel refused"):
        torch.autograd.grad(y, x, torch.ones(2, 3))


def _scale_plan(m: int, n: int):
    return native.make_plan(
        "TestScaleBackward", _ffi(_scale_kernel), torch.device("cpu"),
        [native.grad_as_is(torch.empty(m, n))], [((m, n), torch.float32), ((2, n), torch.float32), ((n,), torch.float32)],
        [arg(native.SAVED, 0, torch.empty(m, n)), contiguous_arg(native.SAVED, 1, (n,)),
         contiguous_arg(native.GRAD, 0, (m, n)), contiguous_arg(native.BUFFER, 0, (m, n)),
         contiguous_arg(native.BUFFER, 1, (2, n))],
        [(native.BUFFER_OUT, 0), (native.BUFFER_OUT, 2)],
        lambda g, s: [g[0] * s[1], (g[0] * s[0]).sum(0)],
        then=[kernel_step(_ffi(_sum_rows_kernel), [contiguous_arg(native.BUFFER, 1, (2, n)),
                                                   contiguous_arg(native.BUFFER, 2, (n,))])])


def test_then_kernels_sum_the_partials_after_the_kernel() -> None:
    m, n = 6, 5
    plan = _scale_plan(m, n)
    x = torch.randn(m, n, requires_grad=True)
    w = torch.randn(n, requires_grad=True)
    y = x.detach() * w.detach()
    native.attach(plan, [x, w], [y], [x, w.detach()])
    g = torch.randn(m, n)
    CALLS.clear()
    dx, dw = torch.autograd.grad(y, (x, w), g, retain_graph=True)
    assert CALLS == ["kernel", "sum"]
    torch.testing.assert_close(dx, g * w.detach())
    torch.testing.assert_close(dw, (g * x.detach()).sum(0))
    CALLS.clear()
    (dx_only,) = torch.autograd.grad(y, x, g)  # dweight not asked for: no column sum
    assert CALLS == ["kernel"]
    torch.testing.assert_close(dx_only, dx)


def _affine_kernel(x: object, w: object, dy: object, dx: object, dwp: object, dbp: object) -> None:
    """y = x * w + b over (M, N): dx, and dweight / dbias partials per half of the rows."""
    CALLS.append("kernel")
    x, w, dy, dx, dwp, dbp = (_torch_view(t) for t in (x, w, dy, dx, dwp, dbp))
    dx.copy_(dy * w)
    h = x.shape[0] // 2
    for part, rows in ((0, slice(0, h)), (1, slice(h, None))):
        dwp[part].copy_((dy[rows] * x[rows]).sum(0))
        dbp[part].copy_(dy[rows].sum(0))


def test_weight_and_bias_are_rows_of_one_buffer() -> None:
    """(2, Q, N) partials, the bias half at an element offset; one column sum gives the
    two rows of a (2, N) buffer, returned as the weight's and the bias's gradients."""
    m, n, q = 6, 5, 2
    plan = native.make_plan(
        "TestAffineBackward", _ffi(_affine_kernel), torch.device("cpu"),
        [native.grad_as_is(torch.empty(m, n))],
        [((m, n), torch.float32), ((2, q, n), torch.float32), ((2, n), torch.float32)],
        [arg(native.SAVED, 0, torch.empty(m, n)), contiguous_arg(native.SAVED, 1, (n,)),
         contiguous_arg(native.GRAD, 0, (m, n)), contiguous_arg(native.BUFFER, 0, (m, n)),
         contiguous_arg(native.BUFFER, 1, (q, n)), contiguous_arg(native.BUFFER, 1, (q, n), q * n)],
        [(native.BUFFER_OUT, 0), (native.BUFFER_OUT, 2, 0), (native.BUFFER_OUT, 2, 1)],
        lambda g, s: [None, None, None],
        then=[kernel_step(_ffi(_sum_rows_kernel), [contiguous_arg(native.BUFFER, 1, (2, q, n)),
                                        contiguous_arg(native.BUFFER, 2, (2, n))])])
    x = torch.randn(m, n, requires_grad=True)
    w = torch.randn(n, requires_grad=True)
    b = torch.randn(n, requires_grad=True)
    y = x.detach() * w.detach() + b.detach()
    native.attach(plan, [x, w, b], [y], [x, w])
    g = torch.randn(m, n)
    dx, dw, db = torch.autograd.grad(y, (x, w, b), g)
    torch.testing.assert_close(dx, g * w.detach())
    torch.testing.assert_close(dw, (g * x.detach()).sum(0))
    torch.testing.assert_close(db, g.sum(0))
    assert db.data_ptr() == dw.data_ptr() + 4 * n  # rows of one buffer


def test_plans_refuse_what_names_nothing() -> None:
    """Outs, rows and kernel operands that name no buffer, row, gradient or kernel are
    refused when the plan is made (not read out of range on the autograd thread); a plan
    attached with fewer saved tensors than its kernels read is refused at attach."""
    grads, bufs = [native.grad_as_is(torch.empty(2, 3))], [((2, 3), torch.float32)]
    dx = contiguous_arg(native.BUFFER, 0, (2, 3))
    cases = [([dx], [(native.BUFFER_OUT, 1)], [], "an out names no buffer"),
             ([dx], [(2, 0)], [], "no gradient .0. or a buffer"),
             ([dx], [(native.BUFFER_OUT, 0, 2)], [], "row is not in its buffer"),
             ([contiguous_arg(native.GRAD, 1, (2, 3)), dx], [(native.BUFFER_OUT, 0)], [], "names no saved tensor, gradient"),
             ([dx], [(native.BUFFER_OUT, 0)], [(0, 0, [])], "needs a kernel"),
             ([dx], [(native.BUFFER_OUT, 0)], [(1, _ffi(_rows_kernel), [])], "later steps are kernels")]
    handle = int(_ffi(_rows_kernel).__chandle__())
    for args, outs, then, match in cases:  # the extension's own entry: `then` as raw (kind, handle, args)
        with pytest.raises(ValueError, match=match):
            build.load().make_plan("TestBad", handle, "cpu", 0, grads, [(list(s), "float32") for s, _ in bufs], args,
                                   [(o[0], o[1], o[2] if len(o) > 2 else -1) for o in outs], lambda g, s: [None],
                                   [(k, f if isinstance(f, int) else int(f.__chandle__()), a) for k, f, a in then])
    plan = native.make_plan("TestSaved", _ffi(_rows_kernel), torch.device("cpu"), grads, bufs,
                            [arg(native.SAVED, 1, torch.empty(2, 3)), contiguous_arg(native.GRAD, 0, (2,)), dx],
                            [(native.BUFFER_OUT, 0)], lambda g, s: [None])
    x = torch.randn(2, 3, requires_grad=True)
    with pytest.raises(ValueError, match="reads 2 saved tensors, 1 were given"):
        native.attach(plan, [x], [x.detach() * 2], [x])


def test_input_without_grad_gets_no_edge() -> None:
    m, n = 4, 3
    x = torch.randn(m, n, requires_grad=True)
    w = torch.randn(n)  # no grad
    y = x.detach() * w
    native.attach(_scale_plan(m, n), [x, w], [y], [x, w])
    y.backward(torch.ones(m, n))
    torch.testing.assert_close(x.grad, w.expand(m, n))
    assert w.grad is None


@pytest.mark.parametrize("divide", [False, True])
def test_scalar_gradient_spread_over_rows(divide: bool) -> None:
    m, n = 5, 4
    count = torch.tensor([0.0] * m + [4.0])  # a mean's count stored after M values
    plan = native.make_plan(
        "TestRowsBackward", _ffi(_rows_kernel), torch.device("cpu"),
        [native.grad_scalar_rows(m, 1 if divide else -1)], [((m, n), torch.float32)],
        [arg(native.SAVED, 0, torch.empty(m, n)), contiguous_arg(native.GRAD, 0, (m,)),
         contiguous_arg(native.BUFFER, 0, (m, n))],
        [(native.BUFFER_OUT, 0)], lambda g, s: [None])
    x = torch.randn(m, n, requires_grad=True)
    loss = x.detach().sum() / (4.0 if divide else 1.0)
    native.attach(plan, [x], [loss], [x, count])
    (loss * 3).backward()
    torch.testing.assert_close(x.grad, torch.full((m, n), 3.0 / (4.0 if divide else 1.0)))


def test_saved_output_is_no_reference_cycle() -> None:
    x = torch.randn(3, 5, requires_grad=True)
    y = _softmax(x, _softmax_plan((3, 5)))
    ref = weakref.ref(y)
    del y
    gc.collect()
    assert ref() is None


def test_double_backward_takes_the_python_fallback() -> None:
    seen = []

    def fallback(grads, saved):
        seen.append(torch.is_grad_enabled())
        (g,), (y,) = grads, saved
        return [y * (g - (g * y).sum(-1, keepdim=True))]

    x = torch.randn(3, 5, requires_grad=True)
    y = _softmax(x, _softmax_plan((3, 5), fallback=fallback))
    torch.autograd.grad(y, x, torch.randn(3, 5), create_graph=True)
    assert seen == [True]


def test_disabled_by_environment() -> None:
    code = "from cuteforge.native import build; print(build.load())"
    env = dict(os.environ, CUTEFORGE_NATIVE_AUTOGRAD="0")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "None"


def test_build_failure_warns_and_returns_none(monkeypatch: pytest.MonkeyPatch) -> None:
    def fail() -> None:
        raise RuntimeError("no compiler\nc++: not found")

    monkeypatch.setattr(build, "_state", {})
    monkeypatch.setattr(build, "_build_and_load", fail)
    with pytest.warns(RuntimeWarning, match="could not be built.*c\\+\\+: not found"):
        assert build.load() is None


def test_build_clears_a_killed_builds_lock(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    """A build killed mid-way (a timeout, Ctrl-C) leaves torch's `lock` baton in the build
    directory, on which torch's next build waits forever. Under cuteforge's own file lock
    (no other build of that directory is running) the stale baton is removed first."""
    from torch.utils import cpp_extension

    directory = tmp_path / "ffi"
    directory.mkdir()
    (directory / "lock").write_text("")  # left by the killed build
    seen = []

    def fake_load(**kwargs):  # what torch's baton would wait on
        seen.append((Path(kwargs["build_directory"]) / "lock").exists())
        return "module"

    monkeypatch.setattr(build, "build_dir", lambda: directory)
    monkeypatch.setattr(cpp_extension, "load", fake_load)
    assert build._build_and_load() == "module"
    assert seen == [False]


@pytest.mark.parametrize("need_dw", [True, False])
def test_norm_plan_without_partials(monkeypatch: pytest.MonkeyPatch, need_dw: bool) -> None:
    """ops/norm.py's node plan (`_node_plan`, a stand-in kernel): for frozen weight and
    bias (need_dw=False) the node allocates dx alone, hands the kernel the saved rstd viewed
    as (Q, N) with row stride 0 for both partial operands, and gives the weight no
    gradient; with need_dw, a (Q, N) partials buffer and the column sum of it into
    dweight, a second kernel the same node calls."""
    from torch.utils._python_dispatch import TorchDispatchMode

    from cuteforge.ops import norm as norm_ops

    class Empties(TorchDispatchMode):
        def __init__(self) -> None:
            super().__init__()
            self.count = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.count += str(func).startswith("aten.empty")
            return func(*args, **(kwargs or {}))

    m, n, q = 6, 5, 2
    x = torch.randn(m, n)
    w = torch.randn(n)
    rstd = torch.rand(m) + 0.5
    seen: dict[str, object] = {}

    def kernel(x: object, w: object, dy: object, dsum: object, mean: object, rstd_in: object, dx: object,
               dwp: object, dbp: object) -> None:
        seen["part"] = (tuple(dwp.shape), tuple(dwp.strides), _ptr(dwp), _ptr(dbp))
        xv, wv, dyv, rv, dxv = (_torch_view(t) for t in (x, w, dy, rstd_in, dx))
        dxv.copy_(dyv * wv * rv[:, None])  # a stand-in formula: the node's plumbing is under test
        if need_dw:
            dw_part = _torch_view(dwp)
            for part, rows in enumerate(torch.arange(m).chunk(q)):
                dw_part[part].copy_((dyv[rows] * xv[rows] * rv[rows, None]).sum(0))

    monkeypatch.setattr(norm_ops.norm_launch, "_bwd_kernel",
                        lambda *a, need_dw=True, **k: (q, _ffi(kernel), _ffi(_sum_rows_kernel) if need_dw else None))
    y = x * rstd[:, None] * w
    plan = norm_ops._node_plan("rms", x, w, y, None, rstd, False, False, need_dw)
    xl, wl = x.clone().requires_grad_(), w.clone().requires_grad_(need_dw)
    native.attach(plan, [xl, wl, None], [y], [x, w, rstd])
    g = torch.randn(m, n)
    counter = Empties()
    with counter:
        grads = torch.autograd.grad(y, [xl, wl] if need_dw else [xl], g)
    torch.testing.assert_close(grads[0], g * w * rstd[:, None])
    if need_dw:
        assert seen["part"][:2] == ((q, n), (n, 1)) and counter.count == 3  # dx, the partials, dweight
        torch.testing.assert_close(grads[1], (g * x * rstd[:, None]).sum(0))
    else:
        assert seen["part"] == ((q, n), (0, 1), rstd.data_ptr(), rstd.data_ptr())
        assert counter.count == 1
        assert y.grad_fn.next_functions[1][0] is None  # no edge: the weight gets no gradient


def _ptr(t: object) -> int:
    return t.data_ptr() if callable(t.data_ptr) else t.data_ptr


def test_layer_norm_backward_op_returns_no_shared_memory(monkeypatch: pytest.MonkeyPatch) -> None:
    """The registered LayerNorm backward with a bias (its Python body, a stand-in kernel):
    dweight and dbias come back as the rows of one (2, N) tensor, since a custom op's
    returns may not share memory (two row views of one buffer are refused)."""
    from cuteforge.ops import norm as norm_ops

    m, n, q = 6, 5, 2
    x, dy = torch.randn(m, n), torch.randn(m, n)
    w = torch.randn(n)

    def kernel(xs, w, dy, dsum, mean, rstd, dx, dwp, dbp) -> None:
        dx.copy_(dy * w)
        for part, rows in enumerate(torch.arange(m).chunk(q)):
            dwp[part].copy_((dy[rows] * xs[rows]).sum(0))
            dbp[part].copy_(dy[rows].sum(0))

    def column_sum(parts, out) -> None:
        out.copy_(parts.sum(1))

    monkeypatch.setattr(norm_ops.norm_launch, "_bwd_kernel", lambda *a, **k: (q, kernel, column_sum))
    monkeypatch.setattr(norm_ops.norm_launch, "_PLANS", {})
    mean, rstd = torch.zeros(m), torch.ones(m)
    dx, sums = torch.ops.cuteforge.layer_norm_backward(dy, x, w, mean, rstd, None, True)
    assert sums.shape == (2, n)
    torch.testing.assert_close(dx, dy * w)
    torch.testing.assert_close(sums[0], (dy * x).sum(0))
    torch.testing.assert_close(sums[1], dy.sum(0))
    dx, dw = torch.ops.cuteforge.layer_norm_backward(dy, x, w, mean, rstd, None, False)
    assert dw.shape == (n,)


def test_silu_mul_c_path_forward_launch_and_node(monkeypatch: pytest.MonkeyPatch) -> None:
    """ops/swiglu.py's eager C path (`_c_path`, stand-in kernels): the forward allocates the
    N-D output and launches in one C call over gate's and up's row views read in place (up
    strided here); the node reads a contiguous gradient and the saved gate and up, and
    returns both gradients in their shapes. A strided gradient takes the fallback, which
    under create_graph is differentiable (torch expressions), not the kernel's constants."""
    from cuteforge.ops import swiglu

    def fwd(g: object, u: object, out: object) -> None:
        g, u, out = (_torch_view(t) for t in (g, u, out))
        out.copy_(torch.nn.functional.silu(g) * u)

    def bwd(grad: object, g: object, u: object, dg: object, du: object) -> None:
        CALLS.append("kernel")
        grad, g, u, dg, du = (_torch_view(t) for t in (grad, g, u, dg, du))
        a, b = swiglu._torch_backward(grad, g, u)
        dg.copy_(a)
        du.copy_(b)

    monkeypatch.setattr(swiglu.forward_kernel, "launcher", lambda tensors, **tiling: _ffi(fwd))
    monkeypatch.setattr(swiglu.backward_kernel, "launcher", lambda tensors, **tiling: _ffi(bwd))
    # the Python path's kernel call, which the fallback takes without create_graph
    monkeypatch.setattr(swiglu, "silu_mul_backward",
                        lambda *a: CALLS.append("fallback") or swiglu._torch_backward(*a))
    gate = torch.randn(2, 3, 8, requires_grad=True)
    up_base = torch.randn(2, 3, 16)
    up = up_base[..., :8].requires_grad_()  # rows of stride 16: read in place
    assert up.grad_fn is None and not up.is_contiguous()
    c_path = swiglu._c_path(gate.detach(), up.detach())
    out = c_path.run(gate, up)
    native.attach(c_path.plan(gate, up), [gate, up], [out], [gate, up])
    assert out.shape == gate.shape and out.is_contiguous() and out.grad_fn.name() == "CuteforgeSiluMulBackward"
    ref_out = torch.nn.functional.silu(gate) * up
    torch.testing.assert_close(out, ref_out)
    g = torch.randn(2, 3, 8)
    CALLS.clear()
    dg, du = torch.autograd.grad(out, [gate, up], g, retain_graph=True)
    assert CALLS == ["kernel"]
    rg, ru = torch.autograd.grad(ref_out, [gate, up], g, retain_graph=True)
    torch.testing.assert_close(dg, rg)
    torch.testing.assert_close(du, ru)
    CALLS.clear()
    strided = torch.randn(2, 3, 16)[..., ::2]
    dg2, _ = torch.autograd.grad(out, [gate, up], strided, retain_graph=True)
    assert CALLS == ["fallback"]
    torch.testing.assert_close(dg2, torch.autograd.grad(ref_out, [gate], strided, retain_graph=True)[0])
    # double backward: the fallback's torch expressions carry the graph
    (dg3,) = torch.autograd.grad(out, [gate], g, create_graph=True)
    (hg,) = torch.autograd.grad(dg3.sum(), [gate])
    (rg3,) = torch.autograd.grad(ref_out, [gate], g, create_graph=True)
    torch.testing.assert_close(hg, torch.autograd.grad(rg3.sum(), [gate])[0])


@pytest.mark.parametrize("residual", [False, True])
def test_norm_forward_with_grad_is_one_c_launch(monkeypatch: pytest.MonkeyPatch, residual: bool) -> None:
    """ops/norm.py's eager forward with grad (`_grad_forward`, a stand-in kernel): the
    registered op's C launch allocates y, the residual sum and rstd and calls the kernel
    once, memoized per layout; the C++ node then attaches to those outputs."""
    from cuteforge.ops import norm as norm_ops

    calls = []

    def fwd(x: object, w: object, b: object, r: object, y: object, ro: object, mean: object, rstd: object) -> None:
        calls.append(1)
        x, w, r, y, ro, rstd = (_torch_view(t) for t in (x, w, r, y, ro, rstd))
        s = x + r if residual else x
        if residual:
            ro.copy_(s)
        rstd.copy_(torch.rsqrt(s.pow(2).mean(-1) + 1e-6))
        y.copy_(s * rstd[:, None] * w)

    monkeypatch.setattr(norm_ops.norm_launch, "_fwd_plan", lambda *a, **k: _ffi(fwd))
    monkeypatch.setattr(norm_ops, "_GRAD_FORWARD", {})
    x, w = torch.randn(6, 5), torch.randn(5)
    r = torch.randn(6, 5) if residual else None
    for _ in range(2):
        y, ro, mean, rstd = norm_ops._grad_forward("rms", x, w, None, r, 1e-6)
    assert len(calls) == 2 and len(norm_ops._GRAD_FORWARD) == 1 and mean is None
    s = x + r if residual else x
    torch.testing.assert_close(y, torch.nn.functional.rms_norm(s, (5,), w, 1e-6))
    assert (ro is None) == (not residual)
    if residual:
        torch.testing.assert_close(ro, s)
    torch.testing.assert_close(rstd, torch.rsqrt(s.pow(2).mean(-1) + 1e-6))


@pytest.mark.parametrize("launch", ["C", "Python"])
def test_rotary_c_path_keeps_the_attention_layout(monkeypatch: pytest.MonkeyPatch, launch: str) -> None:
    """ops/rotary.py's eager C path (`memo.EagerPath`, a stand-in kernel) for q and k transposed from
    contiguous (B, S, H, D), as attention layers hand them over, with the forward launched
    from C or (`CUTEFORGE_NATIVE_LAUNCH=0`) from Python before the same C++ node: the
    outputs, and the gradients the node writes, are laid out as q and k (no copy around
    the op); the answers and gradients match torch's expression, through the kernel and,
    for a gradient of another layout, the fallback; create_graph takes torch's
    differentiable transpose. A no-grad call builds no node plan."""
    from cuteforge.ops import rotary
    from cuteforge.ops.memo import remember

    def rotate(x: torch.Tensor, c: torch.Tensor, s: torch.Tensor, backward: bool) -> torch.Tensor:
        if backward:
            return rotary._torch_backward(x, x, c, s)[0]
        return x * c.unsqueeze(1) + rotary._rotate_half(x) * s.unsqueeze(1)

    class StandIn:
        """The rotary kernel: called from Python, or its TVM-FFI function for the plans."""

        def __call__(self, q, k, c, s, qo, ko, backward: bool) -> None:
            CALLS.append("bwd" if backward else "fwd")
            qo.copy_(rotate(q, c, s, backward))
            ko.copy_(rotate(k, c, s, backward))

        def launcher(self, tensors, backward: bool):
            def fn(*views: object) -> None:
                self(*(_torch_view(t) for t in views), backward=backward)
            return _ffi(fn)

    monkeypatch.setattr(rotary, "kernel", StandIn())
    monkeypatch.setenv("CUTEFORGE_NATIVE_LAUNCH", "1" if launch == "C" else "0")
    monkeypatch.setattr(rotary, "_C_PATHS", {})
    # a CPU layout has no C path (`_checked_c_path`): here it gets one, the checks made
    monkeypatch.setattr(rotary, "_checked_c_path", lambda q, k, c, s: remember(
        rotary._C_PATHS, tuple(rotary._layout(t) for t in (q, k, c, s)), rotary._c_path(q, k, c, s)))
    b, s, hq, hk, d = 2, 5, 4, 2, 8
    q_base = torch.randn(b, s, hq * d, requires_grad=True)
    k_base = torch.randn(b, s, hk * d, requires_grad=True)
    cos, sin = torch.randn(1, s, d), torch.randn(1, s, d)

    def views():
        return q_base.view(b, s, hq, d).transpose(1, 2), k_base.view(b, s, hk, d).transpose(1, 2)

    with torch.no_grad():
        rotary.rotary_embedding(*views(), cos, sin)
    (c_path,) = rotary._C_PATHS.values()
    assert (c_path.run is None) == (launch == "Python") and c_path._plan is None
    CALLS.clear()
    q_out, k_out = rotary.rotary_embedding(*views(), cos, sin)
    assert CALLS == ["fwd"] and q_out.grad_fn.name() == "TransposeBackward0"
    ref_q, ref_k = rotary._torch(*views(), cos, sin, 1)
    assert q_out.stride() == views()[0].stride() and k_out.stride() == views()[1].stride()
    torch.testing.assert_close(q_out, ref_q)
    torch.testing.assert_close(k_out, ref_k)
    gq = torch.randn(b, s, hq, d).transpose(1, 2)  # the gradient in the outputs' layout: the kernel
    gk = torch.randn(b, s, hk, d).transpose(1, 2)
    CALLS.clear()
    got = torch.autograd.grad((q_out, k_out), (q_base, k_base), (gq, gk), retain_graph=True)
    assert CALLS == ["bwd"]
    want = torch.autograd.grad((ref_q, ref_k), (q_base, k_base), (gq, gk), retain_graph=True)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w)
    CALLS.clear()
    gq2 = torch.randn(b, hq, s, d)  # another layout: the fallback (here torch's transpose, grad mode on)
    got = torch.autograd.grad((q_out, k_out), (q_base,), (gq2, gk), create_graph=True)
    assert CALLS == []
    want = torch.autograd.grad((ref_q, ref_k), (q_base,), (gq2, gk), create_graph=True)
    torch.testing.assert_close(got[0], want[0])
