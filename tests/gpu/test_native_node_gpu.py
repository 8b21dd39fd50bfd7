"""The ops' eager backward through the C++ autograd node (cuteforge/native) on the GPU:
every op takes it (grad_fn names it), and its gradients are bitwise those of the Python
autograd.Function path (the same kernels and torch sums), for odd shapes, every dtype,
bias / residual / fp32 weight, every cross-entropy reduction, gradients in other layouts
(the fallback), a side stream, retain_graph and CUDA graph capture. The op-level
gradient checks against torch live in each op's GPU test file."""

from __future__ import annotations

import pytest
import torch

import cuteforge.ops as ops
from cuteforge.native import backward as native
from cuteforge.native import build

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(build.load() is None, reason="no C++ autograd node here")]

DTYPES = [torch.float32, torch.bfloat16, torch.float16]
SHAPES = [(1, 1), (7, 1000), (3, 65537), (37, 4096)]


def _cases(m: int, n: int, dtype: torch.dtype):
    """(name, expected grad_fn name, f(leaves) -> output tensor, leaves)."""
    g = torch.Generator(device="cuda").manual_seed(m * 7 + n)
    x = torch.randn(m, n, device="cuda", dtype=dtype, generator=g)
    w = (1 + 0.5 * torch.randn(n, device="cuda", generator=g)).to(dtype)
    b = (0.5 * torch.randn(n, device="cuda", generator=g)).to(dtype)
    r = torch.randn(m, n, device="cuda", dtype=dtype, generator=g)
    w32 = w.float()
    t = torch.randint(0, n, (m,), device="cuda", generator=g)
    if m > 1:
        t[0] = -100  # an ignored row (not the only one: an all-ignored mean is 0 / 0)
    return [
        ("softmax", "CuteforgeSoftmaxBackward", lambda x: ops.softmax(x), [x]),
        ("log_softmax", "CuteforgeLogSoftmaxBackward", lambda x: ops.log_softmax(x), [x]),
        ("softmax_3d", "CuteforgeSoftmaxBackward", lambda x: ops.softmax(x.view(m, 1, n)), [x]),
        ("rms", "CuteforgeRmsNormBackward", lambda x, w: ops.rms_norm(x, w, 1e-6), [x, w]),
        ("rms_fp32_w", "CuteforgeRmsNormBackward", lambda x, w: ops.rms_norm(x, w, 1e-6), [x, w32]),
        ("rms_res", "CuteforgeRmsNormBackward", lambda x, w, r: ops.rms_norm(x, w, 1e-6, residual=r), [x, w, r]),
        ("layer", "CuteforgeLayerNormBackward", lambda x, w: ops.layer_norm(x, w, None, 1e-5), [x, w]),
        ("layer_bias_res", "CuteforgeLayerNormBackward",
         lambda x, w, b, r: ops.layer_norm(x, w, b, 1e-5, residual=r), [x, w, b, r]),
        ("layer_3d", "CuteforgeLayerNormBackward", lambda x, w, b: ops.layer_norm(x.view(1, m, n), w, b), [x, w, b]),
        ("ce_none", "CuteforgeCrossEntropyBackward",
         lambda x: ops.cross_entropy(x, t, reduction="none"), [x]),
        ("ce_mean", "CuteforgeCrossEntropyBackward", lambda x: ops.cross_entropy(x, t), [x]),
        ("ce_sum", "CuteforgeCrossEntropyBackward", lambda x: ops.cross_entropy(x, t, reduction="sum"), [x]),
    ]


def _outputs(out):
    return list(out) if isinstance(out, tuple) else [out]


def _grads(f, leaves, how: str, seed: int = 3):
    leaves = [t.detach().clone().requires_grad_() for t in leaves]
    outs = _outputs(f(*leaves))
    g = torch.Generator(device="cuda").manual_seed(seed)
    if how == "contiguous":
        gs = [torch.randn(o.shape, device="cuda", generator=g).to(o.dtype) for o in outs]
    else:  # "expanded": what sum().backward() hands in (stride 0): the fallback
        gs = [torch.ones((), device="cuda", dtype=o.dtype).expand(o.shape) for o in outs]
    return outs, torch.autograd.grad(outs, leaves, gs)


def _python_path(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(native, "module", lambda: None)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("m,n", SHAPES)
@pytest.mark.parametrize("how", ["contiguous", "expanded"])
def test_native_node_matches_python_node(m: int, n: int, dtype: torch.dtype, how: str,
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    cases = _cases(m, n, dtype)
    got = {name: _grads(f, leaves, how)[1] for name, _node, f, leaves in cases}
    _python_path(monkeypatch)
    for name, _node, f, leaves in cases:
        outs, ref = _grads(f, leaves, how)
        assert "Cuteforge" not in outs[0].grad_fn.name(), name
        for i, (a, b) in enumerate(zip(got[name], ref)):
            assert a.dtype == b.dtype and a.shape == b.shape, (name, i)
            assert torch.equal(a, b), (name, i, (a.float() - b.float()).abs().max().item())


def test_grad_fn_is_the_node_for_2d_inputs() -> None:
    for _name, node, f, leaves in _cases(5, 300, torch.bfloat16):
        leaves = [t.detach().requires_grad_() for t in leaves]
        out = _outputs(f(*leaves))[0]
        names = {out.grad_fn.name()} | {fn.name() for fn, _ in out.grad_fn.next_functions if fn is not None}
        assert node in names, (node, names)


def test_side_stream_and_retain_graph() -> None:
    x = torch.randn(64, 2048, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    w = torch.randn(2048, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    dy = torch.randn(64, 2048, device="cuda", dtype=torch.bfloat16)
    ref = torch.autograd.grad(ops.rms_norm(x, w), (x, w), dy)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        y = ops.rms_norm(x, w)
        a = torch.autograd.grad(y, (x, w), dy, retain_graph=True)
        b = torch.autograd.grad(y, (x, w), dy)
    torch.cuda.current_stream().wait_stream(s)
    for u, v, r in zip(a, b, ref):
        assert torch.equal(u, r) and torch.equal(v, r)
    with pytest.raises(RuntimeError, match="second time"):
        torch.autograd.grad(y, (x, w), dy)


def test_cuda_graph_capture_of_forward_and_backward() -> None:
    x0 = torch.randn(128, 1000, device="cuda")
    w0 = torch.randn(1000, device="cuda")
    t = torch.randint(0, 1000, (128,), device="cuda")

    def step():
        # fresh leaves each time: a leaf's AccumulateGrad node keeps the stream it was
        # made on, and one made outside the capture would join it from another stream
        x, w = x0.clone().requires_grad_(), w0.clone().requires_grad_()
        loss = ops.cross_entropy(ops.softmax(ops.layer_norm(x, w)), t)
        return torch.autograd.grad(loss, (x, w))

    eager = step()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        step()  # warm-up on a side stream
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = step()
    graph.replay()
    torch.cuda.synchronize()
    for a, b in zip(captured, eager):
        torch.testing.assert_close(a, b)


def test_in_place_change_of_saved_input_is_an_error() -> None:
    x = torch.randn(8, 256, device="cuda", requires_grad=True)
    w = torch.randn(256, device="cuda", requires_grad=True)
    y = ops.layer_norm(x, w)
    with torch.no_grad():
        w.add_(1)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        y.sum().backward()


def test_plans_do_not_keep_their_first_forward_alive() -> None:
    """A plan is built from its layout's first forward and lives in the ops' memo: it must
    not hold that forward's tensors (an activation per layout, for the process's life)."""
    import gc
    import weakref

    m, n = 11, 333  # a layout no other test builds first
    for _name, _node, f, leaves in _cases(m, n, torch.float32):
        leaves = [t.detach().clone().requires_grad_() for t in leaves]
        outs = _outputs(f(*leaves))
        refs = [weakref.ref(o) for o in outs]
        del outs, leaves
        gc.collect()
        assert all(r() is None for r in refs), _name


FROZEN_NS = [1, 7, 1000, 1024, 4096, 8192, 32768, 65536, 65537, 262144]  # register, staged, cluster and ring paths


@pytest.mark.parametrize("n", FROZEN_NS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("case", ["rms", "rms_res", "layer", "layer_bias_res"])
def test_frozen_weight_backward_has_no_partials(n: int, dtype: torch.dtype, case: str) -> None:
    """Weight (and bias) without requires_grad: the node runs the kernel that writes no
    dweight partials (its partial operands a stride-0 stand-in of the saved rstd), gives
    the weight no gradient, and dx (and the residual's gradient) bitwise as the kernel
    that writes partials, which the same call with a trainable weight runs, where both
    take the same config (else within a last-bit rounding: the frozen kernel's row-grid
    shape sums a row in another order)."""
    from cuteforge.kernels.norm.config import default_bwd_config
    from cuteforge.ops import norm as norm_ops

    m = 3 if n >= 65536 else 37
    g = torch.Generator(device="cuda").manual_seed(n)
    x = torch.randn(m, n, device="cuda", dtype=dtype, generator=g)
    w = (1 + 0.5 * torch.randn(n, device="cuda", generator=g)).to(dtype)
    b = (0.5 * torch.randn(n, device="cuda", generator=g)).to(dtype)
    r = torch.randn(m, n, device="cuda", dtype=dtype, generator=g)
    dy = torch.randn(m, n, device="cuda", dtype=dtype, generator=g)

    def run(train_w: bool):
        xl, rl = x.clone().requires_grad_(), r.clone().requires_grad_()
        wl, bl = w.clone().requires_grad_(train_w), b.clone().requires_grad_(train_w)
        if case == "rms":
            outs, leaves = [ops.rms_norm(xl, wl)], [xl]
        elif case == "rms_res":
            outs, leaves = list(ops.rms_norm(xl, wl, residual=rl)), [xl, rl]
        elif case == "layer":
            outs, leaves = [ops.layer_norm(xl, wl)], [xl]
        else:
            outs, leaves = list(ops.layer_norm(xl, wl, bl, residual=rl)), [xl, rl]
        node = outs[0].grad_fn
        assert "Cuteforge" in node.name()
        # the weight's edge (next_functions[1]) exists only when it is trained
        assert (node.next_functions[1][0] is not None) == train_w
        grads = torch.autograd.grad(outs[0], leaves + ([wl] if train_w else []), dy)
        return outs, grads

    outs, frozen = run(False)
    kind, has_bias, has_res = case.split("_")[0], "bias" in case, case.endswith("res")
    plans = [k for k in norm_ops._NODE_PLANS if k[:4] == (kind, has_bias, dtype, (m, n)) and k[9] == has_res]
    assert any(k[-1] is False for k in plans), plans  # the plan without partials was built
    _, trained = run(True)
    bits = x.element_size() * 8
    same_config = default_bwd_config(n, bits, False) == default_bwd_config(n, bits, True)
    for a, t in zip(frozen, trained):
        if same_config:
            assert torch.equal(a, t), (a.float() - t.float()).abs().max().item()
        else:  # one ulp of the output dtype (fp32 math in both)
            tol = 1e-5 if dtype == torch.float32 else 2.0**-7
            torch.testing.assert_close(a.float(), t.float(), rtol=tol, atol=tol * max(1.0, t.float().abs().max().item()))
    # and against torch
    xr = ((x + r) if has_res else x).float().requires_grad_()  # the forward normalises x + r in x's dtype
    if case.startswith("rms"):
        yr = torch.nn.functional.rms_norm(xr, (n,), w.float(), 1e-6)
    else:
        yr = torch.nn.functional.layer_norm(xr, (n,), w.float(), b.float() if has_bias else None, 1e-5)
    (dxr,) = torch.autograd.grad(yr, xr, dy.float())
    tol = 2e-2 if dtype == torch.bfloat16 else 1e-4
    torch.testing.assert_close(frozen[0].float(), dxr, atol=tol * max(1.0, dxr.abs().max().item()), rtol=tol)
