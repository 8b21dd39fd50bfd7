"""Row reductions against torch on the GPU: odd shapes, all dtypes, views, gradients, errors."""

from __future__ import annotations

import pytest
import torch

import cuteforge
import cuteforge.ops as ops

pytestmark = pytest.mark.gpu

NS = [1, 7, 32, 1000, 4096, 65537, 262144]
MS = [0, 1, 3, 32768]
DTYPES = [torch.float32, torch.bfloat16, torch.float16]


def _tol(n: int, dtype: torch.dtype) -> tuple[float, float]:
    # Output is rounded to the input dtype; fp32 accumulation order differs from torch's.
    if dtype == torch.float32:
        return 1e-4, 1e-4 * n**0.5
    return 1.6e-2, 1e-2 * n**0.5


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n", NS)
@pytest.mark.parametrize("m", MS)
def test_sum_matches_torch(m: int, n: int, dtype: torch.dtype) -> None:
    if m * n > 2**31 // 4:
        m = max(1, 2**31 // 4 // n)
    x = torch.randn(m, n, device="cuda", dtype=dtype)
    got = ops.sum(x)
    ref = x.double().sum(-1)
    assert got.dtype == dtype and got.shape == (m,)
    rtol, atol = _tol(n, dtype)
    torch.testing.assert_close(got.double(), ref, rtol=rtol, atol=atol)


@pytest.mark.parametrize("op", ["mean", "amax", "amin", "argmax"])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n", [1, 7, 1000, 4096, 65537])
def test_other_reductions(op: str, n: int, dtype: torch.dtype) -> None:
    x = torch.randn(37, n, device="cuda", dtype=dtype)
    got = getattr(ops, op)(x)
    ref = getattr(torch, op)(x, dim=-1)
    if op == "argmax":
        assert got.dtype == torch.int64
        torch.testing.assert_close(got, ref)
    else:
        rtol, atol = _tol(n, dtype)
        torch.testing.assert_close(got.double(), getattr(torch, op)(x.double(), dim=-1), rtol=rtol, atol=atol if op == "mean" else 0)


def test_row_strided_view_without_copy() -> None:
    big = torch.randn(64, 1030, device="cuda")
    for view in (big[:, :1000], big[:, 3:1003], big[::2, :512], big[5:6, :7]):
        torch.testing.assert_close(ops.sum(view), view.sum(-1), rtol=1e-5, atol=1e-4)


def test_misaligned_pointer_and_odd_stride() -> None:
    flat = torch.randn(10_000, device="cuda", dtype=torch.bfloat16)
    x = flat[1 : 1 + 33 * 257].view(33, 257)  # 2-byte offset, odd row stride
    torch.testing.assert_close(ops.sum(x).float(), x.float().sum(-1), rtol=2e-2, atol=0.2)


def test_n1_with_foreign_last_stride() -> None:
    x = torch.randn(1, 50, device="cuda").t()  # shape (50, 1), strides (1, 50)
    torch.testing.assert_close(ops.sum(x), x.sum(-1))


def test_every_element_written() -> None:
    # The output comes from the caching allocator: freeing a NaN block of the output's
    # exact size (small pool, like the output; x is allocated first) right before the call
    # restores the allocator's state, so the output (same size, same best fit) lands on the
    # NaN bytes and an unwritten row stays NaN.
    x = torch.randn(4099, 129, device="cuda")
    for op in ("sum", "amax"):
        junk = torch.full((4099,), float("nan"), device="cuda")
        del junk
        assert not getattr(ops, op)(x).isnan().any(), op


def test_nan_and_inf_propagate() -> None:
    x = torch.randn(4, 300, device="cuda")
    x[1, 17] = float("nan")
    x[2, 5] = float("inf")
    got = ops.sum(x)
    assert got[1].isnan() and got[2] == float("inf") and got[0].isfinite()
    assert ops.amax(x)[1].isnan()
    assert ops.argmax(x)[1] == torch.argmax(x, -1)[1]


def test_sum_gradients() -> None:
    for op in ("sum", "mean", "amax", "amin"):
        x = torch.randn(9, 33, device="cuda", requires_grad=True)
        g = torch.randn(9, device="cuda")
        (getattr(ops, op)(x) * g).sum().backward()
        ref = x.detach().clone().requires_grad_(True)
        (getattr(torch, op)(ref, dim=-1) * g).sum().backward()
        torch.testing.assert_close(x.grad, ref.grad)
    x = torch.randn(9, 33, device="cuda", requires_grad=True)
    assert torch.equal(ops.argmax(x), torch.argmax(x, -1))  # no gradient, but no error either


def test_under_torch_compile_and_cuda_graph() -> None:
    x = torch.randn(128, 4096, device="cuda")

    @torch.compile(fullgraph=True)
    def f(t):
        return ops.sum(t * 2) + 1

    torch.testing.assert_close(f(x), (x * 2).sum(-1) + 1, rtol=1e-5, atol=1e-3)
    ops.sum(x)  # warm (compile) outside capture
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out = ops.sum(x)
    x.copy_(torch.randn_like(x))
    g.replay()
    torch.testing.assert_close(out, x.sum(-1), rtol=1e-5, atol=1e-3)


def test_cached_call_does_not_recompile() -> None:
    x = torch.randn(100, 777, device="cuda")
    ops.sum(x)
    before = dict(cuteforge.STATS.as_dict())
    for m in (1, 5, 100, 3000):  # M is dynamic: new batch sizes reuse the kernel
        ops.sum(torch.randn(m, 777, device="cuda"))
    after = cuteforge.STATS.as_dict()
    assert after["compiles"] == before["compiles"] and after["l2_loads"] == before["l2_loads"]


@pytest.mark.parametrize(
    ("call", "exc", "match"),
    [
        (lambda: ops.sum(torch.randn(4, 4)), ValueError, "'x' must be a CUDA tensor"),
        (lambda: ops.sum(torch.randn(4, 4, device="cuda", dtype=torch.float64)), TypeError, "'x' has dtype float64"),
        (lambda: ops.sum(torch.randint(0, 5, (4, 4), device="cuda")), TypeError, "'x' has dtype int64"),
        (lambda: ops.sum(torch.randint(0, 5, (4, 4), device="cuda"), dim=0), TypeError, "'x' has dtype int64"),
        (lambda: ops.sum(torch.tensor(1.0, device="cuda")), ValueError, "'x' must have at least one dim"),
        (lambda: ops.sum(torch.randn(4, 4, device="cuda"), dim=2), ValueError, "'dim'=2 is out of range"),
        (lambda: ops.sum(torch.randn(4, 4, device="cuda"), dim=-3), ValueError, "'dim'=-3 is out of range"),
        (lambda: ops.sum(torch.randn(4, 4, device="cuda"), dim=1.0), TypeError, "'dim' must be an int"),
        (lambda: ops.sum(torch.randn(4, 4, device="cuda"), dim=0, keepdim=1), TypeError, "'keepdim' must be a bool"),
        (lambda: ops.sum(torch.randn(4, 0, device="cuda")), ValueError, "size 0 in the reduced dim"),
        (lambda: ops.amax(torch.randn(0, 4, device="cuda"), dim=0), ValueError, "size 0 in the reduced dim"),
        (lambda: ops.sum([[1.0]]), TypeError, "'x' must be a torch.Tensor"),
    ],
)
def test_bad_input_errors(call, exc, match) -> None:
    with pytest.raises(exc, match=match):
        call()
    torch.cuda.synchronize()  # and no CUDA error was left behind


def test_arch_check_on_real_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    import kernels_for_tests as kt

    from cuteforge.arch import ArchError, gpu_info

    sm = gpu_info().sm
    x = torch.randn(8, device="cuda")
    if sm != 90:
        with pytest.raises(ArchError, match=f"SM {sm // 10}.{sm % 10}.*requires sm_90a"):
            kt.sm90_only(x)
    else:
        kt.sm90_only(x)  # supported here
        monkeypatch.setattr(kt.sm90_only, "archs", ("sm_100a",))
        kt.sm90_only._l1.clear()
        kt.sm90_only._memo.clear()
        with pytest.raises(ArchError, match=r"NVIDIA H\d+.*SM 9.0.*requires sm_100a"):
            kt.sm90_only(x)


def test_user_kernel_launch() -> None:
    import kernels_for_tests as kt

    x = torch.randn(1000, device="cuda", dtype=torch.bfloat16)
    y = torch.empty_like(x)
    kt.scale(x, y, factor=3.0)
    torch.testing.assert_close(y, x * 3)


@pytest.mark.parametrize("op", ["argmax", "amax", "amin"])
def test_ties_and_all_neg_inf_rows(op: str) -> None:
    x = torch.randint(0, 3, (64, 1000), device="cuda").float()  # many ties
    x[5] = float("-inf")
    x[6] = float("inf")
    x[7, 100:] = float("nan")
    got, ref = getattr(ops, op)(x), getattr(torch, op)(x, dim=-1)
    torch.testing.assert_close(got, ref, equal_nan=True)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n", [15, 33, 1001, 50257])
def test_unaligned_rows_ties_nan_and_views(dtype: torch.dtype, n: int) -> None:
    """Rows that do not start on 16 bytes (odd N, and views shifted by one element) are
    read from each row's first 16-byte boundary in vectors, the head and tail as scalars:
    every element counted once, argmax's ties resolved to the first index and its first
    NaN kept, whatever the row's head length."""
    g = torch.Generator(device="cuda").manual_seed(0)
    big = torch.randint(0, 3, (67, n + 9), device="cuda", generator=g).to(dtype)
    big[5, 1] = float("nan")  # in a head (row 5 of the shifted view starts 1 element in)
    big[9, n // 2] = float("nan")
    big[9, n - 1] = float("nan")
    big[11] = float("-inf")
    for x in (big[:, :n], big[:, 1 : n + 1], big[:, 7 : n + 7], big.reshape(-1)[: 67 * n].view(67, n)):
        for op in ("sum", "mean", "amax", "amin", "argmax"):
            got, ref = getattr(ops, op)(x), getattr(torch, op)(x.double() if op in ("sum", "mean") else x, dim=-1)
            if op == "argmax":
                torch.testing.assert_close(got, ref, msg=f"{op} n={n} strides {x.stride()}")
            elif op in ("amax", "amin"):
                torch.testing.assert_close(got, ref, equal_nan=True)
            else:
                rtol, atol = _tol(n, dtype)
                torch.testing.assert_close(got.double(), ref, rtol=rtol, atol=atol, equal_nan=True)


def test_offsets_beyond_32_bits() -> None:
    # M * N > 2**31 elements: row offsets must be computed in 64 bits.
    m, n = 2**31 // 4096 + 3, 4096
    x = torch.ones(m, n, device="cuda", dtype=torch.bfloat16)
    x[-1].fill_(2.0)
    got = ops.sum(x)
    assert got[0] == 4096 and got[-1] == 8192 and (got == 4096).sum() == m - 1


def test_user_kernel_column_major_input() -> None:
    import kernels_for_tests as kt

    x = torch.randn(37, 45, device="cuda").t().contiguous().t()  # column-major (37, 45)
    assert x.stride() == (1, 37)
    y = torch.empty(37, 45, device="cuda")
    kt.copy2d(x, y)
    torch.testing.assert_close(y, x)
    with pytest.raises(ValueError, match="'x' must have unit stride in dim 0"):
        kt.copy2d(torch.randn(37, 45, device="cuda"), y)


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 GPUs")
def test_tensor_on_another_gpu_than_the_current_one() -> None:
    x = torch.randn(100, 4096, device="cuda:1")
    with torch.cuda.device(0):
        torch.testing.assert_close(ops.sum(x), x.sum(-1), rtol=1e-5, atol=1e-3)
    with torch.cuda.device(1):  # plan made while device 1 is current ...
        y = torch.randn(50, 1000, device="cuda:1")
        ops.sum(y)
    with torch.cuda.device(0):  # ... reused while device 0 is
        torch.testing.assert_close(ops.sum(y), y.sum(-1), rtol=1e-5, atol=1e-3)
    z = torch.randn(30, 777, device="cuda:0")
    with torch.cuda.device(1):
        torch.testing.assert_close(ops.sum(z), z.sum(-1), rtol=1e-5, atol=1e-3)
    torch.cuda.synchronize(0)
    torch.cuda.synchronize(1)


# --------------------------------------------------------------------------- any dim


def _close(op: str, got: torch.Tensor, x: torch.Tensor, dim: int, keepdim: bool) -> None:
    ref = getattr(torch, op)(x.double() if op != "argmax" else x, dim=dim, keepdim=keepdim)
    assert got.shape == ref.shape, (got.shape, ref.shape)
    if op == "argmax":
        assert got.dtype == torch.int64
        torch.testing.assert_close(got, ref)
        return
    assert got.dtype == x.dtype
    n = x.shape[dim]
    rtol, atol = _tol(n, x.dtype)
    torch.testing.assert_close(got.double(), ref, rtol=rtol, atol=atol if op in ("sum", "mean") else 0, equal_nan=True)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("op", ["sum", "mean", "amax", "amin", "argmax"])
@pytest.mark.parametrize(
    "shape, dim",
    [((1000, 7), 0), ((7, 1000), 0), ((1, 65537), 0), ((65537, 1), 0), ((3, 1000, 7), 1), ((5, 7, 33, 8), 1),
     ((5, 7, 33, 8), 0), ((5, 7, 33, 8), 2), ((2, 3, 4, 1000), -1), ((1, 1, 1), 1), ((65537, 24), 0), ((7, 65537), -2)],
)
def test_any_dim_matches_torch(op: str, dtype: torch.dtype, shape: tuple, dim: int) -> None:
    x = torch.randn(*shape, device="cuda", dtype=dtype)
    for keepdim in (False, True):
        _close(op, getattr(ops, op)(x, dim, keepdim), x, dim, keepdim)
        _close(op, getattr(ops, op)(x, dim=dim, keepdim=keepdim), x, dim, keepdim)  # warm path


@pytest.mark.parametrize("dtype", DTYPES)
def test_column_sum_large_and_narrow(dtype: torch.dtype) -> None:
    # many tiles (cluster split of R), few tiles with a long R (two-stage split; argmax:
    # cluster), a partial last vector
    for shape in ((32768, 4096), (262144, 16), (100000, 3), (4096, 1001)):
        x = torch.randn(*shape, device="cuda", dtype=dtype)
        for op in ("sum", "argmax", "mean", "amax", "amin"):
            _close(op, getattr(ops, op)(x, 0), x, 0, False)
    x = torch.randn(3, 65536, 5, device="cuda", dtype=dtype)[1:]  # O > 1, long R: two-stage split
    for op in ("sum", "mean", "amin"):
        _close(op, getattr(ops, op)(x, 1, True), x, 1, True)


def test_column_views_and_fallback_copy() -> None:
    big = torch.randn(40, 50, 64, device="cuda")
    for view, dim in ((big[:, 3:43], 1), (big[..., :60], 0), (big[::2], 1), (big.transpose(0, 1), 0),
                      (big.permute(2, 0, 1), 2), (big[:, :, ::2], 1), (big[5], 0), (torch.randn(3, 1, device="cuda").expand(3, 64), 0)):
        for op in ("sum", "amax", "argmax"):
            _close(op, getattr(ops, op)(view, dim), view, dim, False)
    flat = torch.randn(100_000, device="cuda", dtype=torch.bfloat16)
    x = flat[3 : 3 + 97 * 130].view(97, 130)  # misaligned pointer: scalar path
    _close("sum", ops.sum(x, 0), x, 0, False)


def test_column_ties_nan_inf() -> None:
    x = torch.randint(0, 3, (1000, 40), device="cuda").float()
    x[:, 3] = float("-inf")
    x[17, 4] = float("nan")
    x[900, 4] = float("nan")
    x[5, 5] = float("inf")
    for op in ("argmax", "amax", "amin", "sum"):
        _close(op, getattr(ops, op)(x, 0), x, 0, False)


@pytest.mark.parametrize("op", ["sum", "mean", "amax", "amin"])
def test_any_dim_gradients(op: str) -> None:
    for shape, dim, keepdim in (((6, 33, 8), 1, False), ((6, 33, 8), 0, True), ((6, 33), -1, True), ((9, 5), 0, False)):
        x = torch.randint(-3, 3, shape, device="cuda").float().requires_grad_(True)  # ties for amax/amin
        ref = x.detach().clone().requires_grad_(True)
        out = getattr(ops, op)(x, dim, keepdim)
        g = torch.randn_like(out)
        (out * g).sum().backward()
        (getattr(torch, op)(ref, dim=dim, keepdim=keepdim) * g).sum().backward()
        torch.testing.assert_close(x.grad, ref.grad)


def test_any_dim_under_torch_compile() -> None:
    x = torch.randn(16, 300, 72, device="cuda", requires_grad=True)

    @torch.compile(fullgraph=True)
    def f(t):
        return ops.sum(t, 1, keepdim=True) * 2 + ops.amax(t, 0).unsqueeze(0).mean() + ops.argmax(t, 2).float().unsqueeze(-1)

    got = f(x)
    ref_x = x.detach().clone().requires_grad_(True)
    ref = ref_x.sum(1, keepdim=True) * 2 + ref_x.amax(0).unsqueeze(0).mean() + ref_x.argmax(2).float().unsqueeze(-1)
    torch.testing.assert_close(got, ref, rtol=1e-4, atol=1e-3)
    got.sum().backward()
    ref.sum().backward()
    torch.testing.assert_close(x.grad, ref_x.grad, rtol=1e-4, atol=1e-4)
