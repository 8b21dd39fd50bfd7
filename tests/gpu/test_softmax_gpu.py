"""Softmax / log_softmax against torch on the GPU: odd shapes, all dtypes, views, N-D,
gradients, torch.compile, CUDA graphs, errors, and a hypothesis property test."""

from __future__ import annotations

import importlib

import pytest
import torch

import cuteforge
import cuteforge.ops as ops

sm = importlib.import_module("cuteforge.ops.softmax")  # ops.softmax is the function

pytestmark = pytest.mark.gpu

NS = [1, 7, 32, 1000, 4096, 65537, 262144]
DTYPES = [torch.float32, torch.bfloat16, torch.float16]
MODES = ["softmax", "log_softmax"]


def _large_m(n: int) -> int:
    return max(4, min(32768, (1 << 24) // n))  # "large": up to 16M elements


MS = [0, 1, 3, "large"]


def _rows(m, n):
    return _large_m(n) if m == "large" else m


@pytest.fixture(scope="module", autouse=True)
def _warm_kernels(request):
    """Compile this module's kernels in parallel worker processes before the tests load them
    (not when only the backward mbar tests run: they warm their own)."""
    mine = [it for it in request.session.items if it.module is request.module]
    if mine and all("bwd_mbar" in it.name for it in mine):
        yield
        return
    _compile_missing(_problem_jobs(_module_problems()))  # a kernel that fails to build fails its own tests below
    yield


def _module_problems() -> list[tuple[str, torch.dtype, int, int]]:
    probs = []
    for mode in MODES:
        for dt in DTYPES:
            for n in NS:
                for m in (1, 3, 37, _large_m(n)):
                    probs.append((mode, dt, m, n))
                    probs.append((mode + "_bwd", dt, m, n))
    return probs


def _problem_jobs(problems: list[tuple[str, torch.dtype, int, int]]) -> list:
    """The compile jobs `sm.warm(problems)` would run (contiguous rows, the ops' configs),
    deduplicated, for `_compile_missing` (which skips what the disk cache holds, so
    pytest-xdist workers do not all recompile the module's kernels)."""
    from cuteforge.arch import target_arch
    from cuteforge.autotune.pool import CompileJob
    from cuteforge.kernels.softmax.spec import config_for, kernel_params, softmax_bwd, softmax_fwd
    from cuteforge.signature import BoundKey, dtype_name, vector_width

    arch = target_arch()
    jobs = {}
    for mode, dt, m, n in problems:
        bwd = mode.endswith("_bwd")
        vec = vector_width(0, (n,), dt.itemsize)
        key = BoundKey((dtype_name(dt),) * (3 if bwd else 2), (("N", n),), (vec,) * (3 if bwd else 2))
        cfg = config_for(arch, n, dt.itemsize * 8, bwd, m)
        for same in (True, False):  # contiguous rows; shifted views of odd N: the fallback kernel
            jobs[CompileJob.of(softmax_bwd if bwd else softmax_fwd, key, kernel_params(mode, key, same), cfg, arch)] = None
    return list(jobs)


def _ref(mode: str, x: torch.Tensor) -> torch.Tensor:
    return getattr(torch, mode)(x.float(), dim=-1)


def _assert_matches(got: torch.Tensor, x: torch.Tensor, mode: str) -> None:
    ref = _ref(mode, x)
    assert got.dtype == x.dtype and got.shape == x.shape and got.is_contiguous()
    # softmax: relative to every element (an atol like 1e-6 would wave through the bulk of
    # a long row, whose elements are ~1/N); the atol only covers flushed fp32 denormals
    # (ex2.approx.ftz) and, for fp16, one subnormal ulp (6e-8). log_softmax: log domain.
    if x.dtype == torch.float32:
        rtol, atol = (4e-5, 1e-30) if mode == "softmax" else (2e-5, 2e-5)
    else:  # one rounding of the result to 8 (bf16) / 11 (fp16) mantissa bits, plus ours
        rtol, atol = 1.6e-2, (1e-2 if mode == "log_softmax" else 1e-7 if x.dtype == torch.float16 else 1e-30)
        ref = ref.to(x.dtype).float()
    torch.testing.assert_close(got.float(), ref, rtol=rtol, atol=atol, equal_nan=True)


def _assert_rel_norm(got: torch.Tensor, ref: torch.Tensor, tol: float) -> None:
    """Error relative to the whole tensor: an elementwise atol scaled by the largest
    element passes almost anything in the many small elements of a long row."""
    ref = ref.double()
    err = ((got.double() - ref).norm() / ref.norm().clamp_min(1e-30)).item()
    assert err < tol, f"relative error {err:.3g} >= {tol}"


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n", NS)
@pytest.mark.parametrize("m", MS)
@pytest.mark.parametrize("mode", MODES)
def test_forward_matches_torch(mode: str, m, n: int, dtype: torch.dtype) -> None:
    m = _rows(m, n)
    x = 3 * torch.randn(m, n, device="cuda", dtype=dtype)
    got = getattr(ops, mode)(x)
    _assert_matches(got, x, mode)
    if mode == "softmax" and m > 0:
        # each element is off by at most half an ulp (<= 2^-8 of itself in bf16, 2^-11 in fp16)
        torch.testing.assert_close(got.float().sum(-1), torch.ones(m, device="cuda"), rtol=0, atol=1e-4 if dtype == torch.float32 else 1e-2)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n", NS)
@pytest.mark.parametrize("m", [1, 3, "large"])
@pytest.mark.parametrize("mode", MODES)
def test_backward_kernel_matches_formula(mode: str, m, n: int, dtype: torch.dtype) -> None:
    m = _rows(m, n)
    x = 2 * torch.randn(m, n, device="cuda", dtype=torch.float32)
    y = _ref(mode, x).to(dtype)
    dy = torch.randn(m, n, device="cuda", dtype=dtype)
    yd, dyd = y.double(), dy.double()
    if mode == "softmax":
        ref = yd * (dyd - (dyd * yd).sum(-1, keepdim=True))
        got = sm.softmax_backward(dy, y)
    else:
        ref = dyd - yd.exp() * dyd.sum(-1, keepdim=True)
        got = sm.log_softmax_backward(dy, y)
    assert got.dtype == dtype and got.shape == (m, n)
    scale = ref.abs().amax().item()
    tol = 1e-5 if dtype == torch.float32 else 1.6e-2
    torch.testing.assert_close(got.double(), ref, rtol=tol, atol=tol * scale)
    if n > 1:  # same rounded inputs: only fp32 math and the output's rounding differ (n = 1: dx = 0)
        _assert_rel_norm(got, ref, 1e-4 if dtype == torch.float32 else 1e-2)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n", [7, 1000, 4096, 65537])
@pytest.mark.parametrize("mode", MODES)
def test_autograd_matches_torch(mode: str, n: int, dtype: torch.dtype) -> None:
    x = torch.randn(37, n, device="cuda", dtype=dtype, requires_grad=True)
    g = torch.randn(37, n, device="cuda", dtype=dtype)
    y = getattr(ops, mode)(x)
    (y.float() * g.float()).sum().backward()
    xr = x.detach().float().requires_grad_(True)
    yr = getattr(torch, mode)(xr, dim=-1)
    (yr * g.float()).sum().backward()
    ref = xr.grad
    scale = ref.abs().amax().item()
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(x.grad.float(), ref, rtol=tol, atol=tol * scale)
    _assert_rel_norm(x.grad, ref, 1e-4 if dtype == torch.float32 else 2e-2)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("mode", MODES)
def test_custom_op_autograd_matches_eager_function(mode: str, dtype: torch.dtype) -> None:
    # eager grads go through a plain autograd.Function; torch.compile through the custom
    # op's register_autograd: both must give torch's gradient
    x = torch.randn(2, 19, 1000, device="cuda", dtype=dtype)
    g = torch.randn_like(x)
    custom = getattr(torch.ops.cuteforge, mode)
    grads = []
    for f in (getattr(ops, mode), lambda v: custom(v, -1)):
        xg = x.clone().requires_grad_(True)
        grads.append(torch.autograd.grad(f(xg), xg, g)[0])
    xr = x.double().requires_grad_(True)
    ref = torch.autograd.grad(getattr(torch, mode)(xr, -1), xr, g.double())[0]
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    for got in grads:
        torch.testing.assert_close(got.double(), ref, rtol=tol, atol=tol * ref.abs().amax().item())


def test_grad_through_sum_expanded_dy() -> None:
    # y.sum().backward() hands the backward an expanded (stride 0) gradient
    x = torch.randn(5, 300, device="cuda", requires_grad=True)
    ops.log_softmax(x).sum().backward()
    xr = x.detach().clone().requires_grad_(True)
    torch.log_softmax(xr, -1).sum().backward()
    torch.testing.assert_close(x.grad, xr.grad, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("mode", MODES)
def test_row_strided_views_nd_and_transposed(mode: str) -> None:
    f = getattr(ops, mode)
    big = torch.randn(64, 1030, device="cuda", dtype=torch.bfloat16)
    for view in (big[:, :1000], big[:, 3:1003], big[::2, :512], big[5:6, :7], big[:, :1024]):
        _assert_matches(f(view), view, mode)
    x3 = torch.randn(4, 6, 1000, device="cuda")
    _assert_matches(f(x3), x3, mode)
    _assert_matches(f(x3, dim=2), x3, mode)
    perm = x3.permute(1, 0, 2)  # leading dims not collapsible: reshaped (copied)
    _assert_matches(f(perm), perm, mode)
    t = torch.randn(300, 50, device="cuda").t()  # last dim not unit stride: copied
    _assert_matches(f(t), t, mode)
    rows = torch.randn(1, 777, device="cuda").expand(9, 777)  # row stride 0
    _assert_matches(f(rows), rows, mode)
    col = torch.randn(1, 50, device="cuda").t()  # (50, 1), last stride 50
    _assert_matches(f(col), col, mode)
    v1 = torch.randn(333, device="cuda", dtype=torch.float16)  # 1-D
    _assert_matches(f(v1), v1, mode)
    e = torch.randn(3, 0, device="cuda")
    assert f(e).shape == (3, 0)


@pytest.mark.parametrize("mode", MODES)
def test_inf_nan_rows(mode: str) -> None:
    x = torch.randn(6, 3000, device="cuda")
    x[0] = float("-inf")  # all -inf: NaN like torch
    x[1, 100] = float("nan")
    x[2, :2999] = float("-inf")  # one finite element
    x[3, 5] = float("inf")
    x[4, 10:] = -1e30
    got = getattr(ops, mode)(x)
    torch.testing.assert_close(got, getattr(torch, mode)(x, -1), rtol=1e-5, atol=1e-6, equal_nan=True)


def test_every_element_written() -> None:
    # Freeing a NaN block of the output's exact size right before the call restores the
    # allocator's state, so the output (same size, same best fit) lands on the NaN bytes.
    x = torch.randn(4099, 129, device="cuda")
    for mode in MODES:
        junk = torch.full_like(x, float("nan"))
        del junk
        assert not getattr(ops, mode)(x).isnan().any(), mode


# rows that do not start on 16 bytes (row_split): the op's defaults at small and odd N,
# and the long-row paths at vocabulary sizes, explicitly
_UNALIGNED_NS = [15, 33, 1001, 50257]
_UNALIGNED_CHUNKED = [(path, n, dt) for path in ("async", "smem", "mbar") for n in (50257, 65537)
                      for dt in (torch.bfloat16, torch.float32)]


def _unaligned_jobs() -> list:
    from cuteforge.arch import target_arch
    from cuteforge.autotune.pool import CompileJob
    from cuteforge.kernels.softmax import SoftmaxConfig
    from cuteforge.kernels.softmax.spec import softmax_bwd, softmax_fwd
    from cuteforge.signature import BoundKey, dtype_name

    jobs = _problem_jobs([(mode + sfx, dt, m, n) for mode in MODES for sfx in ("", "_bwd") for dt in DTYPES
                          for n in _UNALIGNED_NS for m in (5, 300)])
    for path, n, dt in _UNALIGNED_CHUNKED:
        bwd = path == "mbar"
        key = BoundKey((dtype_name(dt),) * (3 if bwd else 2), (("N", n),), (1,) * (3 if bwd else 2))
        for mode in MODES:
            jobs.append(CompileJob.of(softmax_bwd if bwd else softmax_fwd, key, (("mode", mode + ("_bwd" if bwd else "")),),
                                      SoftmaxConfig(256, 256, 8, path), target_arch()))
    return jobs


@pytest.fixture(scope="module")
def _warm_unaligned():
    _compile_missing(_unaligned_jobs())
    yield


def _unaligned_rows(m: int, n: int, dtype: torch.dtype, off: int, scale: float = 3.0) -> torch.Tensor:
    """(m, n) contiguous rows starting `off` elements into a fresh buffer: with an odd n
    the rows' heads (elements before their first 16-byte boundary) differ from row to
    row, and from those of a fresh output of the same shape when off != 0."""
    flat = scale * torch.randn(m * n + off, device="cuda", dtype=dtype)
    return flat[off:].view(m, n)


def _unaligned_bwd_inputs(mode: str, m: int, n: int, dtype: torch.dtype, off_dy: int, off_y: int):
    y0 = _ref(mode, 2 * torch.randn(m, n, device="cuda")).to(dtype)
    y = torch.empty(m * n + off_y, device="cuda", dtype=dtype)[off_y:].view(m, n)
    y.copy_(y0)
    return _unaligned_rows(m, n, dtype, off_dy, 1.0), y


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n", _UNALIGNED_NS)
def test_rows_not_on_16_bytes(_warm_unaligned, n: int, dtype: torch.dtype) -> None:
    """Through the ops: rows read as 16-byte vectors from each row's first boundary, the
    head and tail element by element; an operand whose rows start elsewhere relative to
    16 bytes than the reference's (x against y, dy / dx against y) goes element by
    element through the same split."""
    for mode in MODES:
        for m in (5, 300):
            for off in (0, 1, 3):
                x = _unaligned_rows(m, n, dtype, off)
                _assert_matches(getattr(ops, mode)(x), x, mode)
            for off_dy, off_y in ((0, 0), (1, 0), (0, 3)):
                dy, y = _unaligned_bwd_inputs(mode, m, n, dtype, off_dy, off_y)
                got = (sm.softmax_backward if mode == "softmax" else sm.log_softmax_backward)(dy, y)
                _check_bwd_mbar(got, _bwd_mbar_ref(mode, dy, y), dtype)


@pytest.mark.parametrize("n, dtype", [(131073, torch.float32), (262143, torch.float32), (131073, torch.bfloat16),
                                      (262143, torch.float16), (32001, torch.bfloat16), (50257, torch.float32),
                                      (65537, torch.float32)])
def test_realigned_forward_defaults_through_op(n: int, dtype: torch.dtype) -> None:
    """The long-row forward defaults on rows not on 16 bytes (config.realigned_forward:
    `mbar`, under the 3-CTA register budget at 64 elements a thread, or `async` for 16-bit
    log_softmax at <= 32; fp32 from 32769), through the ops: contiguous rows (the
    same_heads kernel) and x shifted by one element against a fresh y (the fallback). M =
    300 runs the many-row clusters the probes timed, M = 1 the few-row ones (m-doubling).
    The budget on aligned `async` rows runs in the v2 tests above (262144)."""
    from cuteforge.kernels.softmax.config import default_config

    bits = dtype.itemsize * 8
    for mode in MODES:
        held = not (mode == "log_softmax" and bits == 16 and n == 32001)
        assert default_config(n, bits, m=300, mode=mode, realigned=True).path == ("mbar" if held else "async")
        for m in (1, 300):
            for off in (0, 1):
                x = _unaligned_rows(m, n, dtype, off)
                _assert_matches(getattr(ops, mode)(x), x, mode)


@pytest.mark.parametrize("path, n, dtype", _UNALIGNED_CHUNKED)
def test_chunked_rows_not_on_16_bytes(_warm_unaligned, path: str, n: int, dtype: torch.dtype) -> None:
    """The long-row paths (chunked.py) on realigned rows, the leftovers on the last CTA,
    every element written (outputs start as NaN)."""
    from cuteforge.kernels.softmax import SoftmaxConfig

    cfg = SoftmaxConfig(256, 256, 8, path)
    for mode in MODES:
        for m in (1, 7):
            if path == "mbar":
                for off_dy, off_y in ((0, 0), (1, 0), (0, 3)):
                    dy, y = _unaligned_bwd_inputs(mode, m, n, dtype, off_dy, off_y)
                    _check_bwd_mbar(_run_bwd_mbar(mode, dy, y, cfg), _bwd_mbar_ref(mode, dy, y), dtype)
            else:
                for off in (0, 1, 3):
                    x = _unaligned_rows(m, n, dtype, off)
                    _assert_matches(_run_v2(x, mode, cfg), x, mode)


def test_under_torch_compile_and_cuda_graph() -> None:
    x = torch.randn(128, 4096, device="cuda", requires_grad=True)

    @torch.compile(fullgraph=True)
    def f(t):
        return ops.softmax(t * 2, dim=-1) + ops.log_softmax(t, -1)

    out = f(x)
    xr = x.detach().clone().requires_grad_(True)
    ref = torch.softmax(xr * 2, -1) + torch.log_softmax(xr, -1)
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
    g = torch.randn_like(out)
    out.backward(g)
    ref.backward(g)
    torch.testing.assert_close(x.grad, xr.grad, rtol=1e-4, atol=1e-5)

    xs = torch.randn(64, 2048, device="cuda", dtype=torch.bfloat16)
    ops.softmax(xs)  # warm (compile) outside capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        ys = ops.softmax(xs)
    xs.copy_(torch.randn_like(xs))
    graph.replay()
    _assert_matches(ys, xs, "softmax")


def test_new_batch_sizes_do_not_recompile() -> None:
    x = torch.randn(100, 777, device="cuda")
    ops.softmax(x)
    before = dict(cuteforge.STATS.as_dict())
    for m in (1, 5, 100, 3000):  # M is dynamic: new batch sizes reuse the kernel
        ops.softmax(torch.randn(m, 777, device="cuda"))
    after = cuteforge.STATS.as_dict()
    assert after["compiles"] == before["compiles"] and after["l2_loads"] == before["l2_loads"]


@pytest.mark.parametrize(
    ("call", "exc", "match"),
    [
        (lambda: ops.softmax(torch.randn(4, 4)), ValueError, "'x' must be a CUDA tensor"),
        (lambda: ops.softmax(torch.randn(4, 4, device="cuda", dtype=torch.float64)), TypeError, "'x' has dtype float64"),
        (lambda: ops.log_softmax(torch.randint(0, 5, (4, 4), device="cuda")), TypeError, "'x' has dtype int64"),
        (lambda: ops.softmax(torch.tensor(1.0, device="cuda")), ValueError, "'x' must have at least 1 dim"),
        (lambda: ops.softmax(torch.randn(4, 4, device="cuda"), dim=5), ValueError, "'dim' must be the last dim"),
        (lambda: ops.softmax(torch.randn(4, 4, device="cuda"), dim=1.0), TypeError, "'dim' must be an int"),
        (lambda: ops.softmax([[1.0]]), TypeError, "'x' must be a torch.Tensor"),
        (lambda: ops.softmax(torch.randn(2, 262145, device="cuda")), ValueError, "'x' has a last dim of 262145; at most 262144"),
        (lambda: sm.softmax_backward(torch.randn(4, 4, device="cuda"), torch.randn(4, 5, device="cuda")), ValueError, "'grad' has shape"),
        (
            lambda: sm.softmax_backward(torch.randn(4, 4, device="cuda"), torch.randn(4, 4, device="cuda", dtype=torch.bfloat16)),
            TypeError,
            "'grad' has dtype float32 but 'y' has bfloat16",
        ),
    ],
)
def test_bad_input_errors(call, exc, match) -> None:
    with pytest.raises(exc, match=match):
        call()
    torch.cuda.synchronize()


def test_property_random_shapes() -> None:
    hyp = pytest.importorskip("hypothesis")
    st = hyp.strategies

    @hyp.settings(max_examples=10, deadline=None, derandomize=True)
    @hyp.given(
        m=st.integers(0, 40),
        n=st.sampled_from([1, 2, 3, 5, 8, 31, 64, 100, 127, 256, 1000, 1024, 2048, 4096]),
        dtype=st.sampled_from(DTYPES),
        mode=st.sampled_from(MODES),
        scale=st.floats(0.01, 30.0),
        offset=st.integers(0, 7),
    )
    def check(m, n, dtype, mode, scale, offset):
        flat = scale * torch.randn(m * (n + 8) + 8, device="cuda", dtype=dtype)
        x = flat[offset : offset + m * (n + 8)].view(m, n + 8)[:, :n]  # misaligned, strided rows
        _assert_matches(getattr(ops, mode)(x), x, mode)
        if m > 0 and n > 1:
            xg = x.detach().clone().requires_grad_(True)
            gy = torch.randn(m, n, device="cuda", dtype=dtype)
            y = getattr(ops, mode)(xg)
            y.backward(gy)
            if dtype == torch.float32:
                xr = x.detach().float().requires_grad_(True)
                getattr(torch, mode)(xr, -1).backward(gy.float())
                ref, tol = xr.grad, 1e-5
            else:
                # 16-bit: the backward's exact math on the y it was handed (rounded to x's
                # dtype). Against torch's fp32 gradient the rounding of y alone is off by
                # more than 2e-2 x max|dx| where the row's terms cancel (seen: n = 2,
                # scale 2, softmax: 1.7e-4 vs 6.4e-5 allowed); the forward is checked above.
                yd, gd = y.detach().double(), gy.double()
                if mode == "softmax":
                    ref = yd * (gd - (gd * yd).sum(-1, keepdim=True))
                else:
                    ref = gd - yd.exp() * gd.sum(-1, keepdim=True)
                tol = 2e-2
            scale_g = ref.abs().amax().item()
            torch.testing.assert_close(xg.grad.double(), ref.double(), rtol=tol, atol=tol * scale_g + 1e-6)

    check()


# --------------------------------------------------------------------------- v2 forward paths
# SoftmaxConfig.path = mbar / async / smem (kernels/softmax/chunked.py): not a default yet,
# so launched explicitly through the registered kernel with every long-row candidate.

V2_NS = [32768, 65537, 100000, 262144]


def _v2_cases() -> list[tuple[str, int, torch.dtype, object]]:
    from cuteforge.kernels.softmax import longrow_candidates

    out = []
    for dt in DTYPES:
        for n in V2_NS if dt != torch.float16 else V2_NS[1::2]:  # fp16 moves like bf16
            for c in longrow_candidates(n, dt.itemsize * 8):
                out.append((c.path, n, dt, c))
    return out


@pytest.fixture(scope="module")
def _warm_v2():
    from cuteforge.arch import target_arch
    from cuteforge.autotune.pool import CompileJob, compile_all
    from cuteforge.kernels.softmax.spec import softmax_fwd
    from cuteforge.signature import BoundKey, dtype_name, vector_width

    jobs = []
    for _, n, dt, c in _v2_cases():
        vec = vector_width(0, (n,), dt.itemsize)
        key = BoundKey((dtype_name(dt),) * 2, (("N", n),), (vec, vec))
        for mode in MODES:
            jobs.append(CompileJob.of(softmax_fwd, key, (("mode", mode),), c, target_arch()))
    compile_all(jobs)  # a config that fails to build fails its own test, with its error
    yield


def _run_v2(x: torch.Tensor, mode: str, cfg) -> torch.Tensor:
    from cuteforge.kernels.softmax.spec import softmax_fwd

    y = torch.full_like(x, float("nan"))  # every element must be written
    softmax_fwd(x, y, config=cfg, mode=mode)
    return y


@pytest.mark.parametrize("path, n, dtype, cfg", _v2_cases(), ids=lambda v: repr(v).replace(" ", "") if not isinstance(v, str) else v)
def test_v2_forward_matches_torch(_warm_v2, path: str, n: int, dtype: torch.dtype, cfg) -> None:
    for mode in MODES:
        for m in (1, 7, 1000 if n <= 65537 else 130):
            x = 3 * torch.randn(m, n, device="cuda", dtype=dtype)
            got = _run_v2(x, mode, cfg)
            _assert_matches(got, x, mode)
            if mode == "softmax":
                torch.testing.assert_close(got.float().sum(-1), torch.ones(m, device="cuda"), rtol=0, atol=1e-4 if dtype == torch.float32 else 1e-2)


@pytest.mark.parametrize("path", ["mbar", "async", "smem"])
def test_v2_views_and_special_rows(path: str) -> None:
    """Row-strided and misaligned views (narrower vectors: the staged paths fall back to
    register loads), -inf / NaN / +inf rows, several rows per CTA (short rows)."""
    from cuteforge.kernels.softmax import SoftmaxConfig

    cfg = SoftmaxConfig(256, 256, 4, path)
    base = torch.randn(9, 65536 + 8, device="cuda", dtype=torch.bfloat16)
    for x in (base[:, :65536], base[:, 1:65537], base[::2, 3:65539]):
        for mode in MODES:
            _assert_matches(_run_v2(x, mode, cfg), x, mode)
    x = torch.randn(6, 65536, device="cuda")
    x[0] = float("-inf")
    x[1, 100] = float("nan")
    x[2, :65535] = float("-inf")
    x[3, 5] = float("inf")
    x[4, 10:] = -1e30
    for mode in MODES:
        got = _run_v2(x, mode, cfg)
        torch.testing.assert_close(got, getattr(torch, mode)(x, -1), rtol=1e-5, atol=1e-6, equal_nan=True)
    short = SoftmaxConfig(128, 32, 1, path)  # 4 rows per CTA, M not a multiple of 4
    x = torch.randn(37, 1000, device="cuda")
    for mode in MODES:
        _assert_matches(_run_v2(x, mode, short), x, mode)


@pytest.mark.parametrize(
    "n, dtype",
    [(16385, torch.bfloat16), (24577, torch.float16), (49152, torch.bfloat16), (131073, torch.bfloat16), (200000, torch.float32)],
)
def test_v2_defaults_between_measured_points(n: int, dtype: torch.dtype) -> None:
    """The ops' long-row forward default (config.long_forward: async path, cluster from the
    elements per thread) at N between and beside the benchmarked ones, odd N included,
    through the op (few rows: the cluster doubles; many rows: as the heuristic)."""
    from cuteforge.kernels.softmax.config import default_config

    assert default_config(n, dtype.itemsize * 8).path == "async"
    for mode in MODES:
        for m in (1, 300):
            x = 3 * torch.randn(m, n, device="cuda", dtype=dtype)
            _assert_matches(getattr(ops, mode)(x), x, mode)


# --------------------------------------------------------------------------- backward, path mbar
# SoftmaxConfig(path="mbar") for softmax_bwd / log_softmax_bwd (chunked.make_softmax_chunked_bwd):
# every long-row backward candidate, launched through the registered kernel.

BWD_MBAR_NS = [32768, 65537, 131072, 262144]


def _bwd_mbar_cases() -> list[tuple[int, torch.dtype, object]]:
    from cuteforge.kernels.softmax.config import longrow_bwd_candidates

    return [(n, dt, c) for dt in DTYPES for n in BWD_MBAR_NS for c in longrow_bwd_candidates(n, dt.itemsize * 8)]


_VIEW_CFGS = [(256, 8), (512, 4)]  # (threads, cluster_n) of the strided-view test, N = 65536


def _bwd_mbar_jobs() -> list:
    """Compile jobs of every kernel the bwd_mbar tests launch (contiguous rows and views)."""
    from cuteforge.arch import target_arch
    from cuteforge.autotune.pool import CompileJob
    from cuteforge.kernels.softmax import SoftmaxConfig
    from cuteforge.kernels.softmax.spec import softmax_bwd
    from cuteforge.signature import BoundKey, dtype_name, vector_width

    def key(dt, n, vec):
        return BoundKey((dtype_name(dt),) * 3, (("N", n),), (vec,) * 3)

    todo = [(key(dt, n, vector_width(0, (n,), dt.itemsize)), c) for n, dt, c in _bwd_mbar_cases()]
    todo += [(key(torch.bfloat16, 65536, v), SoftmaxConfig(t, t, c, "mbar")) for t, c in _VIEW_CFGS for v in (8, 1)]
    return [CompileJob.of(softmax_bwd, k, (("mode", mode + "_bwd"),), c, target_arch()) for k, c in todo for mode in MODES]


def _compile_missing(jobs: list) -> list:
    """Compile, in parallel workers, the jobs whose object is not in the disk cache yet;
    returns their outcomes."""
    from cuteforge.autotune.pool import cached_object, compile_all
    from cuteforge.kernel import REGISTRY

    missing = []
    for j in jobs:
        k = REGISTRY[j.kernel]
        if cached_object(k, k.spec(j.key, j.params, j.config, arch=j.arch)) is None:
            missing.append(j)
    return compile_all(missing)  # a config that fails to build fails its own test, with its error


# the ops' 16-bit backward defaults (config.long_backward) between and at the measured N
_BWD_DEFAULT_NS = [32768, 32769, 100000, 131073, 262144]
_BWD_DEFAULT_MS = (1, 300)


@pytest.fixture(scope="module")
def _warm_bwd_mbar():
    _compile_missing(_bwd_mbar_jobs() + _problem_jobs(_bwd_default_problems()))
    yield


def _bwd_default_problems() -> list[tuple[str, torch.dtype, int, int]]:
    return [(mode + "_bwd", dt, m, n) for mode in MODES for dt in DTYPES
            for n in _BWD_DEFAULT_NS for m in _BWD_DEFAULT_MS]


def _bwd_mbar_ref(mode: str, dy: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """torch's own softmax / log_softmax backward in fp64 on the (rounded) inputs."""
    if mode == "softmax":
        return torch._softmax_backward_data(dy.double(), y.double(), -1, torch.float64)
    return torch._log_softmax_backward_data(dy.double(), y.double(), -1, torch.float64)


def _run_bwd_mbar(mode: str, dy: torch.Tensor, y: torch.Tensor, cfg) -> torch.Tensor:
    from cuteforge.kernels.softmax.spec import softmax_bwd

    dx = torch.full(dy.shape, float("nan"), device=dy.device, dtype=dy.dtype)  # every element written
    softmax_bwd(dy, y, dx, config=cfg, mode=mode + "_bwd")
    return dx


def _check_bwd_mbar(got: torch.Tensor, ref: torch.Tensor, dtype: torch.dtype) -> None:
    assert not got.isnan().any()
    tol = 1e-5 if dtype == torch.float32 else 1.6e-2
    scale = ref.abs().amax().item()
    torch.testing.assert_close(got.double(), ref, rtol=tol, atol=tol * scale)
    _assert_rel_norm(got, ref, 1e-4 if dtype == torch.float32 else 1e-2)


@pytest.mark.parametrize("n, dtype, cfg", _bwd_mbar_cases(), ids=lambda v: repr(v).replace(" ", "") if not isinstance(v, int) else str(v))
def test_bwd_mbar_matches_torch(_warm_bwd_mbar, n: int, dtype: torch.dtype, cfg) -> None:
    for mode in MODES:
        for m in (1, 7, 300):
            x = 2 * torch.randn(m, n, device="cuda")
            y = _ref(mode, x).to(dtype)
            dy = torch.randn(m, n, device="cuda", dtype=dtype)
            _check_bwd_mbar(_run_bwd_mbar(mode, dy, y, cfg), _bwd_mbar_ref(mode, dy, y), dtype)


@pytest.mark.parametrize("threads, cluster_n", _VIEW_CFGS)
def test_bwd_mbar_strided_views(_warm_bwd_mbar, threads: int, cluster_n: int) -> None:
    """Row-strided 2-D views (16-byte rows) and misaligned ones (vector 1), dy and y from
    different parents, several rows."""
    from cuteforge.kernels.softmax import SoftmaxConfig

    cfg = SoftmaxConfig(threads, threads, cluster_n, "mbar")
    n = 65536
    for mode in MODES:
        xb = 2 * torch.randn(9, n + 8, device="cuda")
        yb = _ref(mode, xb[:, :n]).to(torch.bfloat16)
        ybig = torch.zeros(9, n + 8, device="cuda", dtype=torch.bfloat16)
        dyb = torch.randn(9, n + 8, device="cuda", dtype=torch.bfloat16)
        for off, rows in ((0, slice(None)), (1, slice(None)), (3, slice(None, None, 2))):
            ybig.zero_()
            ybig[:, off:off + n] = yb
            y, dy = ybig[rows, off:off + n], dyb[rows, off:off + n]
            assert not y.is_contiguous()
            _check_bwd_mbar(_run_bwd_mbar(mode, dy, y, cfg), _bwd_mbar_ref(mode, dy, y), torch.bfloat16)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n", _BWD_DEFAULT_NS)
def test_bwd_mbar_defaults_through_op(_warm_bwd_mbar, n: int, dtype: torch.dtype) -> None:
    """Rows of N >= 32768 take the mbar backward by default (fp32, on 512-thread
    CTAs past 204800): the op's result (the warm path, few rows: a larger cluster) against
    torch's backward."""
    from cuteforge.kernels.softmax.config import default_config

    for m in _BWD_DEFAULT_MS:
        assert default_config(n, dtype.itemsize * 8, True, m).path == "mbar"
    for mode in MODES:
        for m in _BWD_DEFAULT_MS:
            x = 2 * torch.randn(m, n, device="cuda")
            y = _ref(mode, x).to(dtype)
            dy = torch.randn(m, n, device="cuda", dtype=dtype)
            got = (sm.softmax_backward if mode == "softmax" else sm.log_softmax_backward)(dy, y)
            _check_bwd_mbar(got, _bwd_mbar_ref(mode, dy, y), dtype)


@pytest.mark.parametrize("mode", ["softmax", "log_softmax"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize(("shape", "dim"), [((7, 1000), 0), ((3, 1000, 5), 1), ((2, 3, 4097), -2), ((1, 65537, 1), 1)])
def test_any_dim_with_gradients(mode, dtype, shape, dim) -> None:
    x = torch.randn(*shape, device="cuda", dtype=dtype, requires_grad=True)
    y = getattr(ops, mode)(x, dim)
    ref = getattr(torch, mode)(x.float(), dim)
    tol = {"atol": 1e-4, "rtol": 1e-4} if dtype == torch.float32 else {"atol": 2e-2, "rtol": 2e-2}
    torch.testing.assert_close(y.float(), ref, **tol)
    dy = torch.randn_like(y)
    (g,) = torch.autograd.grad(y, x, dy)
    (g_ref,) = torch.autograd.grad(ref, x, dy.float())
    assert ((g.float() - g_ref).norm() / g_ref.norm()).item() < 1e-2
