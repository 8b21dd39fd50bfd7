"""cuteforge.ops.cross_entropy against torch on the GPU: shapes, dtypes, reductions,
ignore_index, gradients, out-of-range targets, torch.compile, errors."""

from __future__ import annotations

import importlib

import pytest
import torch
import torch.nn.functional as F

import cuteforge.ops as ops

pytestmark = pytest.mark.gpu

DTYPES = [torch.float32, torch.bfloat16, torch.float16]
NS = [1, 7, 1000, 4096, 65537]


def _tol(dtype: torch.dtype) -> dict:
    return {"rtol": 1e-4, "atol": 1e-4} if dtype == torch.float32 else {"rtol": 2e-2, "atol": 2e-2}


def _ref(x: torch.Tensor, t: torch.Tensor, reduction: str, ignore_index: int = -100) -> torch.Tensor:
    return F.cross_entropy(x.float(), t, reduction=reduction, ignore_index=ignore_index)


def _assert_off_target_grad(got: torch.Tensor, ref: torch.Tensor, t: torch.Tensor, dtype: torch.dtype) -> None:
    """dlogits away from the target column, softmax * g, element by element relative to
    itself: an atol scaled to the largest gradient (the target's p - 1) would pass any
    value in the bulk of a long row (~g/N each). No cancellation there: the error is
    fp32 math plus one rounding of g and one of the result (<= 2^-8 each in bf16)."""
    keep = torch.ones_like(ref, dtype=torch.bool)
    rows = (t != -100).nonzero().squeeze(1)
    keep[rows, t[rows]] = False
    rtol, atol = {torch.float32: (1e-4, 1e-30), torch.bfloat16: (1.6e-2, 1e-30), torch.float16: (1.6e-2, 1e-7)}[dtype]
    torch.testing.assert_close(got.float()[keep], ref[keep], rtol=rtol, atol=atol)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n", NS)
@pytest.mark.parametrize("m", [1, 37])
def test_forward_backward_match_torch(m: int, n: int, dtype: torch.dtype) -> None:
    x = (torch.randn(m, n, device="cuda") * 3).to(dtype)
    t = torch.randint(0, n, (m,), device="cuda")
    if m > 1:
        t[3] = -100  # ignored row
    for reduction in ("none", "mean", "sum"):
        xg = x.clone().requires_grad_(True)
        got = ops.cross_entropy(xg, t, reduction=reduction)
        ref_x = x.float().clone().requires_grad_(True)
        ref = _ref(ref_x, t, reduction)
        assert got.dtype == dtype and got.shape == ref.shape
        torch.testing.assert_close(got.float(), ref, **_tol(dtype))
        g = torch.randn_like(ref)
        (got.float() * g).sum().backward()
        (ref * g).sum().backward()
        assert xg.grad.dtype == dtype
        torch.testing.assert_close(xg.grad.float(), ref_x.grad, **_tol(dtype))
        _assert_off_target_grad(xg.grad, ref_x.grad, t, dtype)
    # no-grad eager path (skips the custom-op boundary) gives the same numbers
    torch.testing.assert_close(ops.cross_entropy(x, t).float(), _ref(x, t, "mean"), **_tol(dtype))


def test_large_rows_and_many_rows() -> None:
    for m, n, dtype in ((4, 262144, torch.bfloat16), (8192, 4096, torch.float32), (3000, 50257, torch.bfloat16)):
        x = torch.randn(m, n, device="cuda", dtype=dtype)
        t = torch.randint(0, n, (m,), device="cuda")
        xg = x.clone().requires_grad_(True)
        loss = ops.cross_entropy(xg, t)
        loss.backward()
        ref_x = x.float().clone().requires_grad_(True)
        ref = _ref(ref_x, t, "mean")
        ref.backward()
        torch.testing.assert_close(loss.float(), ref, **_tol(dtype))
        torch.testing.assert_close(xg.grad.float(), ref_x.grad, rtol=2e-2, atol=1e-6 if dtype == torch.float32 else 1e-4)
        _assert_off_target_grad(xg.grad, ref_x.grad, t, dtype)


def test_ignore_index_custom_and_all_ignored() -> None:
    x = torch.randn(64, 1000, device="cuda")
    t = torch.randint(0, 1000, (64,), device="cuda")
    t[::3] = 5
    for reduction in ("none", "mean", "sum"):
        torch.testing.assert_close(ops.cross_entropy(x, t, reduction=reduction, ignore_index=5),
                                   _ref(x, t, reduction, ignore_index=5), rtol=1e-5, atol=1e-5)
    xg = x.clone().requires_grad_(True)
    ops.cross_entropy(xg, t, ignore_index=5).backward()
    assert torch.all(xg.grad[::3] == 0)
    t_all = torch.full((64,), -100, device="cuda")
    assert ops.cross_entropy(x, t_all).isnan() and F.cross_entropy(x, t_all).isnan()  # 0 / 0 like torch
    assert ops.cross_entropy(x, t_all, reduction="sum") == 0


def test_out_of_range_targets_give_nan_not_garbage() -> None:
    x = torch.randn(8, 100, device="cuda", requires_grad=True)
    t = torch.randint(0, 100, (8,), device="cuda")
    t[2], t[5] = 100, -7
    loss = ops.cross_entropy(x, t, reduction="none")
    assert loss[2].isnan() and loss[5].isnan() and loss[[0, 1, 3, 4, 6, 7]].isfinite().all()
    assert ops.cross_entropy(x, t).isnan()
    loss.sum().backward()
    assert x.grad[2].isnan().all() and x.grad[5].isnan().all() and x.grad[0].isfinite().all()
    mod = importlib.import_module("cuteforge.ops.cross_entropy")
    old = mod.CHECK_TARGETS
    mod.CHECK_TARGETS = True
    try:
        with pytest.raises(ValueError, match=r"'target' has target\[2\] = 100, outside \[0, 100\)"):
            ops.cross_entropy(x.detach(), t)
    finally:
        mod.CHECK_TARGETS = old


def test_special_values_and_views() -> None:
    x = torch.randn(6, 300, device="cuda")
    x[1, 7] = float("nan")
    x[2] = float("-inf")
    x[2, 9] = 0.0
    x[3, :] = 1e4  # large logits: no overflow in the online logsumexp
    t = torch.tensor([0, 1, 9, 299, 5, 6], device="cuda")
    torch.testing.assert_close(ops.cross_entropy(x, t, reduction="none"), _ref(x, t, "none"), equal_nan=True, rtol=1e-5, atol=1e-4)
    big = torch.randn(50, 1030, device="cuda")
    view = big[:, 3:1003]  # row stride 1030, misaligned start: no copy
    tv = torch.randint(0, 1000, (50,), device="cuda")
    torch.testing.assert_close(ops.cross_entropy(view, tv), _ref(view, tv, "mean"), rtol=1e-5, atol=1e-5)
    tt = torch.randint(0, 1000, (100,), device="cuda")[::2]  # strided target
    torch.testing.assert_close(ops.cross_entropy(view, tt), _ref(view, tt, "mean"), rtol=1e-5, atol=1e-5)
    e = ops.cross_entropy(torch.randn(0, 10, device="cuda"), torch.zeros(0, dtype=torch.long, device="cuda"), reduction="none")
    assert e.shape == (0,)


def test_under_torch_compile_and_torch_ops() -> None:
    x = torch.randn(512, 4096, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    t = torch.randint(0, 4096, (512,), device="cuda")
    t[::7] = -100

    @torch.compile(fullgraph=True)
    def f(a, b):
        return ops.cross_entropy(a * 2, b)

    loss = f(x, t)
    loss.backward()
    ref_x = x.detach().float().clone().requires_grad_(True)
    ref = F.cross_entropy(ref_x * 2, t)
    ref.backward()
    torch.testing.assert_close(loss.float(), ref, rtol=2e-2, atol=2e-2)
    torch.testing.assert_close(x.grad.float(), ref_x.grad, rtol=2e-2, atol=1e-4)
    _assert_off_target_grad(x.grad, ref_x.grad, t, torch.bfloat16)
    got = torch.ops.cuteforge.cross_entropy(x.detach(), t, "sum")
    torch.testing.assert_close(got.float(), F.cross_entropy(x.detach().float(), t, reduction="sum"), rtol=2e-2, atol=0.5)


def test_cuda_graph_capture() -> None:
    x = torch.randn(256, 4096, device="cuda")
    t = torch.randint(0, 4096, (256,), device="cuda")
    ops.cross_entropy(x, t)  # compile outside capture
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out = ops.cross_entropy(x, t, reduction="none")
    x.copy_(torch.randn_like(x))
    g.replay()
    torch.testing.assert_close(out, _ref(x, t, "none"), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(
    ("call", "exc", "match"),
    [
        (lambda: ops.cross_entropy(torch.randn(4, 5), torch.zeros(4, dtype=torch.long)), ValueError, "'logits' must be a CUDA tensor"),
        (lambda: ops.cross_entropy(torch.randn(4, 5, device="cuda"), torch.zeros(4, dtype=torch.long)), ValueError, "'target' is on cpu"),
        (lambda: ops.cross_entropy(torch.randn(4, 5, device="cuda"), torch.zeros(4, device="cuda", dtype=torch.int32)), TypeError, "'target' must be int64"),
        (lambda: ops.cross_entropy(torch.randn(4, 5, device="cuda"), torch.zeros(3, device="cuda", dtype=torch.long)), ValueError, "'target' must have shape"),
        (lambda: ops.cross_entropy(torch.randn(4, 5, 2, device="cuda"), torch.zeros(4, device="cuda", dtype=torch.long)), ValueError, "'logits' must be 2-D"),
        (lambda: ops.cross_entropy(torch.randn(4, 5, device="cuda", dtype=torch.float64), torch.zeros(4, device="cuda", dtype=torch.long)), TypeError, "'logits' has dtype"),
        (lambda: ops.cross_entropy(torch.randn(4, 0, device="cuda"), torch.zeros(4, device="cuda", dtype=torch.long)), ValueError, "N >= 1"),
        (lambda: ops.cross_entropy(torch.randn(4, 5, device="cuda"), torch.zeros(4, device="cuda", dtype=torch.long), reduction="avg"), ValueError, "'reduction'"),
        (lambda: ops.cross_entropy(torch.randn(4, 5, device="cuda"), torch.zeros(4, device="cuda", dtype=torch.long), ignore_index=1.5), TypeError, "'ignore_index'"),
        (lambda: ops.cross_entropy([1.0], torch.zeros(4, dtype=torch.long)), TypeError, "'logits' must be a torch.Tensor"),
    ],
)
def test_bad_input_errors(call, exc, match) -> None:
    with pytest.raises(exc, match=match):
        call()
    torch.cuda.synchronize()


# --- mean / sum in one launch (cross_entropy_fwd_reduce) ---------------------------------

# (M, N): one CTA (M = 1, 7: no workspace), one group of CTAs, and two levels of groups
# (M = 65537 at N = 1000: 65537 CTAs in 33 groups for fp32, 8193 in 5 for 16-bit logits);
# M x N <= 2^27 keeps it cheap.
RED_SHAPES = [(m, n) for m in (1, 7, 1000, 65537) for n in (1, 7, 1000, 65537) if m * n <= 2**27]


def _red_tol(dtype: torch.dtype) -> dict:
    # fp32: a different summation order than torch's; bf16/fp16: one rounding of the result
    return {"rtol": 1e-4, "atol": 1e-5} if dtype == torch.float32 else {"rtol": 1e-2, "atol": 1e-3}


def _inputs(m: int, n: int, dtype: torch.dtype, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator(device="cuda").manual_seed(seed)
    x = (torch.randn(m, n, device="cuda", generator=g) * 3).to(dtype)
    t = torch.randint(0, n, (m,), device="cuda", generator=g)
    if m > 1:
        t[::5] = -100  # ignored rows, the first among them
    return x, t


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("m", "n"), RED_SHAPES)
def test_reduced_matches_torch(m: int, n: int, dtype: torch.dtype) -> None:
    x, t = _inputs(m, n, dtype)
    for reduction in ("mean", "sum"):
        # a copy even for fp32 (x.float() would be x itself, and x must stay a no-grad leaf)
        ref_x = x.float().clone().requires_grad_(True)
        ref = _ref(ref_x, t, reduction)
        got = ops.cross_entropy(x, t, reduction=reduction)  # no grad: the kernel without lse
        assert got.dtype == dtype and got.shape == () and got.device == x.device
        # torch's fp32 result rounded to dtype (fp16 sums past 65504 are inf in both)
        torch.testing.assert_close(got.float(), ref.detach().to(dtype).float(), **_red_tol(dtype))
        # with grad: the variant with lse; the same bits as without, and torch's gradient
        xg = x.clone().requires_grad_(True)
        got_g = ops.cross_entropy(xg, t, reduction=reduction)
        assert torch.equal(got_g.detach(), got) or (got.isnan() and got_g.isnan())
        w = torch.randn((), device="cuda")
        (got_g.float() * w).backward()
        (ref * w).backward()
        assert xg.grad.dtype == dtype
        torch.testing.assert_close(xg.grad.float(), ref_x.grad, **_tol(dtype))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize(("m", "n"), [(1, 7), (1000, 1000), (4097, 32000), (65537, 7)])
def test_fp32_result_matches_torch_fp32(m: int, n: int, dtype: torch.dtype) -> None:
    """out_dtype=torch.float32: the fp32 loss of torch on upcast logits (what transformers
    reports), not its rounding to dtype, eager with and without grad and compiled; the
    gradient is the one without out_dtype."""
    x, t = _inputs(m, n, dtype)
    for reduction in ("mean", "sum", "none"):
        ref = _ref(x, t, reduction)
        got = ops.cross_entropy(x, t, reduction=reduction, out_dtype=torch.float32)
        assert got.dtype == torch.float32
        torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-5)  # fp32 summation order only
        xg = x.clone().requires_grad_(True)
        got_g = ops.cross_entropy(xg, t, reduction=reduction, out_dtype=torch.float32)
        assert got_g.dtype == torch.float32
        torch.testing.assert_close(got_g.detach(), ref, rtol=1e-5, atol=1e-5)
        w = torch.randn(got_g.shape, device="cuda").to(dtype).float()  # the same gradient either way
        (got_g * w).sum().backward()
        xr = x.clone().requires_grad_(True)
        (ops.cross_entropy(xr, t, reduction=reduction).float() * w).sum().backward()
        assert torch.equal(xg.grad, xr.grad)
    compiled = torch.compile(lambda a, b: ops.cross_entropy(a, b, out_dtype=torch.float32), fullgraph=True)
    got_c = compiled(x, t)
    assert got_c.dtype == torch.float32
    torch.testing.assert_close(got_c, _ref(x, t, "mean"), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n", [33, 1001, 50257])
def test_rows_not_on_16_bytes(dtype: torch.dtype, n: int) -> None:
    """rows that do not start on 16 bytes (odd N, and a view shifted by one element)
    read from their first 16-byte boundary in vectors, the head and tail as scalars:
    the per-row loss and lse, the reduced mean, and the gradient against torch."""
    g = torch.Generator(device="cuda").manual_seed(5)
    big = (torch.randn(301, n + 3, device="cuda", generator=g) * 3).to(dtype)
    t = torch.randint(0, n, (301,), device="cuda", generator=g)
    t[::7] = -100
    def shifted(b: torch.Tensor) -> torch.Tensor:  # rows one element past 16 bytes; dlogits' heads differ
        return b[:, 1 : n + 1]

    def flat(b: torch.Tensor) -> torch.Tensor:  # contiguous odd N: dlogits' heads match
        return b.reshape(-1)[: 301 * n].view(301, n)

    for view in (shifted, flat):
        for reduction in ("none", "mean"):
            base = big.clone().requires_grad_(True)
            got = ops.cross_entropy(view(base), t, reduction=reduction)
            ref_x = view(big).float().requires_grad_(True)
            ref = _ref(ref_x, t, reduction)
            torch.testing.assert_close(got.float(), ref.detach(), **_tol(dtype))
            w = torch.randn(got.shape, device="cuda")
            (got.float() * w).sum().backward()
            (ref * w).sum().backward()
            _assert_off_target_grad(view(base.grad), ref_x.grad, t, dtype)
            torch.testing.assert_close(view(base.grad).float(), ref_x.grad, **_tol(dtype))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n", [3, 7, 15, 31])
def test_tiny_rows_of_a_padded_view(dtype: torch.dtype, n: int) -> None:
    """Rows of a few elements in a view whose rows start on 16 bytes (a padded row stride):
    the vectors cover N // vec * vec elements and the rest are scalars, which rows of one
    or two threads (tiny N) take several of each. Before, each thread took one: a wrong loss
    and an unwritten gradient, silently."""
    big = (torch.randn(300, 32, device="cuda") * 3).to(dtype)
    t = torch.randint(0, n, (300,), device="cuda")
    for reduction in ("none", "mean"):
        base = big.clone().requires_grad_(True)
        x = base[:, :n]  # row stride 32: rows start on 16 bytes
        got = ops.cross_entropy(x, t, reduction=reduction)
        ref_x = big[:, :n].float().requires_grad_(True)
        ref = _ref(ref_x, t, reduction)
        torch.testing.assert_close(got.float(), ref.detach(), **_tol(dtype))
        w = torch.randn(got.shape, device="cuda")
        (got.float() * w).sum().backward()
        (ref * w).sum().backward()
        torch.testing.assert_close(base.grad[:, :n].float(), ref_x.grad, **_tol(dtype))
        assert torch.all(base.grad[:, n:] == 0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_reduced_two_levels_long_rows(dtype: torch.dtype) -> None:
    """Long rows: 10000 CTAs in two groups (8192 and 1808), so both levels run; mean and
    sum, forward and backward. bf16 too: 16-bit rows past 16384 in problems
    past 128 MiB take the reduced kernel as well (before, the per-row kernel + torch)."""
    x, t = _inputs(10000, 32768, dtype)
    for reduction in ("mean", "sum"):
        xg = x.clone().requires_grad_(True)
        got = ops.cross_entropy(xg, t, reduction=reduction)
        ref_x = x.float().clone().requires_grad_(True)  # a copy: x.float() is x for fp32
        ref = _ref(ref_x, t, reduction)
        torch.testing.assert_close(got.float(), ref.detach(), rtol=1e-2, atol=1e-3)
        got.backward()
        ref.backward()
        torch.testing.assert_close(xg.grad.float(), ref_x.grad, rtol=2e-2, atol=1e-6)
        del xg, ref_x


@pytest.mark.parametrize("m", [1, 7, 1000, 65537])
def test_reduced_all_ignored_and_empty(m: int) -> None:
    x = torch.randn(m, 100, device="cuda", dtype=torch.bfloat16)
    t = torch.full((m,), -100, device="cuda")
    assert ops.cross_entropy(x, t).isnan() and F.cross_entropy(x.float(), t).isnan()  # 0 / 0, like torch
    assert ops.cross_entropy(x, t, reduction="sum") == 0
    xg = x.clone().requires_grad_(True)
    out = ops.cross_entropy(xg, t, reduction="sum")
    out.backward()
    assert out == 0 and torch.all(xg.grad == 0)
    e = torch.randn(0, 100, device="cuda")
    te = torch.zeros(0, dtype=torch.long, device="cuda")
    assert ops.cross_entropy(e, te).isnan() and ops.cross_entropy(e, te, reduction="sum") == 0
    eg = e.clone().requires_grad_(True)
    ops.cross_entropy(eg, te, reduction="sum").backward()
    assert eg.grad.shape == (0, 100)


def _workspaces_idle() -> bool:
    """Every kept workspace's ticket counters are back at 0 (each launch's last CTAs reset
    the counters they drew from)."""
    mod = importlib.import_module("cuteforge.ops.cross_entropy")
    ws = importlib.import_module("cuteforge.workspace")
    torch.cuda.synchronize()
    return all(bool(w[: mod.WORK_ZERO].eq(0).all()) for k, w in ws._WORK.items() if k[0] == mod.WORKSPACE_OWNER)


@pytest.mark.parametrize(("m", "n", "dtype"), [(65537, 1000, torch.float32), (1000, 65537, torch.float32),
                                               (1000, 16384, torch.bfloat16), (65537, 7, torch.float16),
                                               (7, 1000, torch.float32)])
def test_reduced_bitwise_reproducible(m: int, n: int, dtype: torch.dtype) -> None:
    """The same input gives the same bits on every call (no float atomics), also with other
    shapes launched in between (the ticket counter is reset after each launch) and with grad."""
    x, t = _inputs(m, n, dtype, seed=1)
    other_x, other_t = _inputs(300, 50, dtype, seed=2)
    for reduction in ("mean", "sum"):
        first = ops.cross_entropy(x, t, reduction=reduction)
        for i in range(20):
            if i % 3 == 0:
                ops.cross_entropy(other_x, other_t, reduction=reduction)
            again = ops.cross_entropy(x, t, reduction=reduction)
            assert torch.equal(again, first), (i, again.item(), first.item())
        with torch.enable_grad():
            xg = x.clone().requires_grad_(True)
            for _ in range(3):
                assert torch.equal(ops.cross_entropy(xg, t, reduction=reduction).detach(), first)
    assert _workspaces_idle()


def test_reduced_on_concurrent_streams() -> None:
    """Launches on two streams at once each use their stream's workspace: no mixed tickets."""
    mod = importlib.import_module("cuteforge.ops.cross_entropy")
    xs = [_inputs(65537, 1000, torch.bfloat16, seed=s) for s in (3, 4)]
    want = [ops.cross_entropy(x, t) for x, t in xs]
    streams = [torch.cuda.Stream(), torch.cuda.Stream()]
    for s in streams:
        s.wait_stream(torch.cuda.current_stream())
    got: list[list[torch.Tensor]] = [[], []]
    for _ in range(30):
        for k, s in enumerate(streams):
            with torch.cuda.stream(s):
                got[k].append(ops.cross_entropy(*xs[k]))
    torch.cuda.synchronize()
    for k in range(2):
        assert all(torch.equal(g, want[k]) for g in got[k])
    dev = xs[0][0].get_device()
    ws = importlib.import_module("cuteforge.workspace")
    assert all((mod.WORKSPACE_OWNER, dev, s.cuda_stream) in ws._WORK for s in streams)
    assert _workspaces_idle()


def test_reduced_one_kernel_launch() -> None:
    """A warm no-grad mean is one kernel on the GPU (it was four: loss, sum, count, div)."""
    x, t = _inputs(4, 1024, torch.bfloat16)
    ops.cross_entropy(x, t)
    torch.cuda.synchronize()
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        ops.cross_entropy(x, t)
        torch.cuda.synchronize()
    names = [e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    if not names:
        pytest.skip("the profiler recorded no CUDA activity (CUPTI unavailable)")
    assert len(names) == 1, names


def test_reduced_cuda_graph_capture() -> None:
    """Under capture each call gets a workspace zeroed inside the graph: replays give
    torch's numbers and eager's bits, and two graphs may be replayed concurrently on
    different streams."""
    x, t = _inputs(65537, 1000, torch.float32, seed=5)
    y, u = _inputs(3000, 4096, torch.bfloat16, seed=6)
    ops.cross_entropy(x, t)  # compile outside capture
    ops.cross_entropy(y, u, reduction="sum")
    g1, g2 = torch.cuda.CUDAGraph(), torch.cuda.CUDAGraph()
    with torch.cuda.graph(g1):
        out1 = ops.cross_entropy(x, t)
    with torch.cuda.graph(g2):
        out2 = ops.cross_entropy(y, u, reduction="sum")
    x.copy_(torch.randn_like(x))
    want1, want2 = ops.cross_entropy(x, t), ops.cross_entropy(y, u, reduction="sum")
    torch.testing.assert_close(want1, _ref(x, t, "mean"), rtol=1e-4, atol=1e-5)
    s1, s2 = torch.cuda.Stream(), torch.cuda.Stream()
    for s in (s1, s2):
        s.wait_stream(torch.cuda.current_stream())
    for _ in range(10):
        with torch.cuda.stream(s1):
            g1.replay()
        with torch.cuda.stream(s2):
            g2.replay()
        torch.cuda.synchronize()
        assert torch.equal(out1, want1) and torch.equal(out2, want2)
    assert _workspaces_idle()


def test_reduced_strided_target_and_views() -> None:
    """A row-strided, misaligned logits view and a strided target on the reduced path."""
    big = torch.randn(5000, 1030, device="cuda")
    view = big[:, 3:1003]
    tt = torch.randint(0, 1000, (10000,), device="cuda")[::2]
    for reduction in ("mean", "sum"):
        torch.testing.assert_close(ops.cross_entropy(view, tt, reduction=reduction), _ref(view, tt, reduction),
                                   rtol=1e-4, atol=1e-5)


# The forward's cp.async ring (v3) for configs the heuristic may not pick: several chunks
# (two buffers), one chunk (one buffer), a partial round (REM), leftover vectors (K_LEFT),
# several rows per CTA, 16-bit and fp32 vectors, and a row of narrower vectors (v2's loop).
RING_CASES = [
    (torch.bfloat16, 32768, (256, 256, 8)),
    (torch.bfloat16, 32808, (256, 256, 8)),
    (torch.bfloat16, 65536, (256, 256, 4)),
    (torch.bfloat16, 50257, (512, 512, 4)),
    (torch.float32, 16384, (256, 256, 4)),
    (torch.float16, 24576, (512, 512, 4)),
    (torch.bfloat16, 4096, (256, 64, 4)),
    (torch.float32, 262144, (1024, 1024, 4)),
]


@pytest.mark.parametrize("dtype, n, cfg", RING_CASES)
@pytest.mark.parametrize("m", [7, 1000])
def test_forward_configs_match_torch(m: int, dtype: torch.dtype, n: int, cfg: tuple[int, int, int]) -> None:
    """Each config's per-row forward (loss and lse) against torch in fp32, with an ignored
    row and the target at the row's last element."""
    from cuteforge.kernels.cross_entropy.spec import cross_entropy_fwd
    from cuteforge.kernels.reduce.row import RowReduceConfig

    x = (torch.randn(m, n, device="cuda") * 3).to(dtype)
    t = torch.randint(0, n, (m,), device="cuda")
    t[1] = -100
    t[2] = n - 1
    loss = torch.full((m,), float("nan"), device="cuda")
    lse = torch.full((m,), float("nan"), device="cuda")
    args = (x, t, loss, lse)
    params = (("ignore_index", -100),)
    cross_entropy_fwd.get(cross_entropy_fwd.signature.bind(args), params, RowReduceConfig(*cfg))(*args)
    torch.testing.assert_close(lse, torch.logsumexp(x.float(), -1), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(loss, _ref(x, t, "none"), rtol=1e-5, atol=1e-5)


def test_check_targets_raises_before_launch() -> None:
    import cuteforge.ops as cf_ops

    logits = torch.randn(5, 100, device="cuda")
    target = torch.tensor([1, 2, 100, -100, 3], device="cuda")
    with pytest.raises(ValueError, match=r"target\[2\] = 100, outside \[0, 100\)"):
        cf_ops.cross_entropy(logits, target, check_targets=True)
    loss = cf_ops.cross_entropy(logits, target, reduction="none")  # unchecked: that row is NaN
    assert torch.isnan(loss[2]) and torch.isfinite(loss[[0, 1, 4]]).all() and loss[3] == 0
