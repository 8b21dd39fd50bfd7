"""RMSNorm / LayerNorm against torch on the GPU: odd N, every dtype, M in {0, 1, 3, large},
bias / fused residual, gradients of x, weight, bias, residual (fp64 reference), strided
views, N-D input, torch.compile(fullgraph=True), CUDA graphs, errors, a property test."""

from __future__ import annotations

import pytest
import torch

import cuteforge.ops as ops

pytestmark = pytest.mark.gpu

NS = [1, 7, 32, 1000, 4096, 65537, 262144]
DTYPES = [torch.float32, torch.bfloat16, torch.float16]
KINDS = ["rms", "layer"]


def _ref(kind, x, w, b, r, eps):
    """fp64 reference on the same (rounded) inputs; the residual sum is rounded to x's
    dtype first, as the kernel (and torch in x's dtype) does."""
    s = x if r is None else (x + r)
    sd = s.double()
    if kind == "rms":
        y = sd * torch.rsqrt(sd.pow(2).mean(-1, keepdim=True) + eps) * w.double()
    else:
        mu = sd.mean(-1, keepdim=True)
        y = (sd - mu) * torch.rsqrt((sd - mu).pow(2).mean(-1, keepdim=True) + eps) * w.double()
        if b is not None:
            y = y + b.double()
    return y, s


def _call(kind, x, w, b, r, eps):
    if kind == "rms":
        return ops.rms_norm(x, w, eps, residual=r)
    return ops.layer_norm(x, w, b, eps, residual=r)


def _close(got, ref, dtype, what, scale=None):
    got = got.double()
    tol = {torch.float32: 1e-4, torch.bfloat16: 1.6e-2, torch.float16: 2e-3}[dtype]
    mag = ref.abs().max().item() if ref.numel() else 0.0
    atol = tol * max(1.0, mag) * (scale or 1.0)
    torch.testing.assert_close(got, ref, rtol=tol, atol=atol, msg=lambda m: f"{what}: {m}")


def _inputs(m, n, dtype, w_dtype=None, bias=False, res=False, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    x = torch.randn(m, n, device="cuda", dtype=dtype, generator=g)
    wd = w_dtype or dtype
    w = (1 + 0.5 * torch.randn(n, device="cuda", generator=g)).to(wd)
    b = (0.5 * torch.randn(n, device="cuda", generator=g)).to(wd) if bias else None
    r = torch.randn(m, n, device="cuda", dtype=dtype, generator=g) if res else None
    return x, w, b, r


def _rows_for(n):
    return 3 if n >= 65537 else 37


@pytest.mark.parametrize("kind, dtype, n", [("rms", torch.bfloat16, 4096), ("layer", torch.float32, 1000)])
def test_every_candidate_config(kind, dtype, n):
    """Every config the autotuner may pick (incl. backward prefetch/reload, clusters)
    computes the same thing as the default."""
    from cuteforge.kernels.norm.config import candidate_configs
    from cuteforge.ops import norm as impl

    m = 515
    x, w, b, _ = _inputs(m, n, dtype, bias=kind == "layer", seed=5)
    dy = torch.randn_like(x)
    bits = x.element_size() * 8
    y0, _, mean0, rstd0 = impl._forward(kind, x, w, b, None, 1e-5)
    dx0, dw0, db0 = impl._backward(kind, dy, x, w, mean0, rstd0, None, b is not None)
    for cfg in candidate_configs(n, bits, False):
        y, _, _, rstd = impl._forward(kind, x, w, b, None, 1e-5, cfg)
        _close(y, y0.double(), dtype, f"y {cfg}")
        _close(rstd, rstd0.double(), torch.float32, f"rstd {cfg}")
    for cfg in candidate_configs(n, bits, True):
        dx, dw, db = impl._backward(kind, dy, x, w, mean0, rstd0, None, b is not None, cfg)
        _close(dx, dx0.double(), dtype, f"dx {cfg}")
        _close(dw, dw0.double(), dtype, f"dw {cfg}")
        if b is not None:
            _close(db, db0.double(), dtype, f"db {cfg}")


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n", NS)
def test_forward(kind, dtype, n):
    i = NS.index(n)
    bias, res = kind == "layer" and i % 2 == 0, i % 2 == 1
    x, w, b, r = _inputs(_rows_for(n), n, dtype, bias=bias, res=res)
    eps = 1e-6 if kind == "rms" else 1e-5
    out = _call(kind, x, w, b, r, eps)
    y = out[0] if res else out
    ref_y, ref_s = _ref(kind, x, w, b, r, eps)
    assert y.dtype == dtype and y.shape == x.shape
    _close(y, ref_y, dtype, "y")
    if res:
        torch.testing.assert_close(out[1], ref_s, rtol=0, atol=0)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("n", [1280, 2056, 2560, 4608, 5120, 7000])
def test_layer_forward_between_powers_of_two(dtype, n):
    """LayerNorm's 16-bit forward at 1025..8191 on the power of two threads a
    row nearest N / 32 (32 at 1280, 64 at 2560, 128 at 4608 / 5120), with and without the residual,
    from one row to many, against torch."""
    for m, res in ((1, False), (7, True), (3001, False), (3001, True)):
        x, w, b, r = _inputs(m, n, dtype, bias=True, res=res)
        out = _call("layer", x, w, b, r, 1e-5)
        ref_y, ref_s = _ref("layer", x, w, b, r, 1e-5)
        _close(out[0] if res else out, ref_y, dtype, f"y m={m} res={res}")
        if res:
            torch.testing.assert_close(out[1], ref_s, rtol=0, atol=0)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("m", [0, 1, 3, 32768])
def test_rows(kind, m):
    x, w, b, r = _inputs(m, 1000 if m < 32768 else 4096, torch.bfloat16, bias=True, res=True)
    y, s = _call(kind, x, w, b, r, 1e-5)
    ref_y, ref_s = _ref(kind, x, w, b if kind == "layer" else None, r, 1e-5)
    assert y.shape == x.shape and s.shape == x.shape
    _close(y, ref_y, torch.bfloat16, "y")
    torch.testing.assert_close(s, ref_s, rtol=0, atol=0)


@pytest.mark.parametrize("kind", KINDS)
def test_fp32_weight_with_half_x(kind):
    x, w, b, _ = _inputs(64, 4096, torch.bfloat16, w_dtype=torch.float32, bias=True)
    y = _call(kind, x, w, b, None, 1e-5)
    _close(y, _ref(kind, x, w, b if kind == "layer" else None, None, 1e-5)[0], torch.bfloat16, "y")


def _grad_case(kind, m, n, dtype, bias, res, w_dtype=None):
    x, w, b, r = _inputs(m, n, dtype, w_dtype=w_dtype, bias=bias and kind == "layer", res=res, seed=1)
    leaves = [t.requires_grad_() for t in (x, w, b, r) if t is not None]
    eps = 1e-5
    out = _call(kind, x, w, b, r, eps)
    g = torch.Generator(device="cuda").manual_seed(2)
    dy = torch.randn(m, n, device="cuda", generator=g).to(dtype)
    loss = (out[0] if res else out).float().mul(dy.float()).sum()
    if res:
        ds = torch.randn(m, n, device="cuda", generator=g).to(dtype)
        loss = loss + out[1].float().mul(ds.float()).sum()
    grads = torch.autograd.grad(loss, leaves)
    # fp64 reference on the same inputs
    ref_leaves = [t.detach().double().requires_grad_() for t in leaves]
    it = iter(ref_leaves)
    xd = next(it)
    wd = next(it)
    bd = next(it) if b is not None else None
    rd = next(it) if r is not None else None
    s = xd if rd is None else (xd + rd)
    if kind == "rms":
        yd = s * torch.rsqrt(s.pow(2).mean(-1, keepdim=True) + eps) * wd
    else:
        mu = s.mean(-1, keepdim=True)
        yd = (s - mu) * torch.rsqrt((s - mu).pow(2).mean(-1, keepdim=True) + eps) * wd
        if bd is not None:
            yd = yd + bd
    ref_loss = (yd * dy.double()).sum()
    if res:
        ref_loss = ref_loss + (s * ds.double()).sum()
    ref_grads = torch.autograd.grad(ref_loss, ref_leaves)
    names = ["x", "weight"] + (["bias"] if b is not None else []) + (["residual"] if r is not None else [])
    for name, got, ref, leaf in zip(names, grads, ref_grads, leaves):
        assert got.dtype == leaf.dtype and got.shape == leaf.shape, name
        # dweight/dbias sum M rows of products rounded in x's dtype: their rounding errors
        # grow like sqrt(M), and so does the largest |dweight| that _close's atol scales
        # with already (another sqrt(M) factor would let a dropped partial pass)
        _close(got, ref, dtype if name in ("x", "residual") else leaf.dtype if dtype == torch.float32 else dtype,
               f"d{name}")


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("n", NS)
def test_backward(kind, dtype, n):
    i = NS.index(n)
    _grad_case(kind, _rows_for(n), n, dtype, bias=i % 2 == 0, res=i % 2 == 1)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("m", [1, 3, 4099])
def test_backward_rows_fp16(kind, m):
    _grad_case(kind, m, 1000, torch.float16, bias=True, res=True)
    _grad_case(kind, m, 4096, torch.float16, bias=True, res=False, w_dtype=torch.float32)


def test_backward_zero_rows():
    x = torch.randn(0, 64, device="cuda", requires_grad=True)
    w = torch.ones(64, device="cuda", requires_grad=True)
    ops.rms_norm(x, w).sum().backward()
    assert x.grad.shape == (0, 64) and torch.equal(w.grad, torch.zeros(64, device="cuda"))


def test_strided_views_and_nd():
    big = torch.randn(64, 1030, device="cuda")
    w = torch.randn(1000, device="cuda")
    for view in (big[:, :1000], big[:, 3:1003], big[::2, 10:1010]):
        assert view.stride(-1) == 1
        _close(ops.rms_norm(view, w), _ref("rms", view, w, None, None, 1e-6)[0], torch.float32, "view")
    x3 = torch.randn(4, 5, 1000, device="cuda", dtype=torch.bfloat16)
    y3 = ops.layer_norm(x3, w.bfloat16())
    assert y3.shape == x3.shape
    _close(y3, _ref("layer", x3, w.bfloat16(), None, None, 1e-5)[0], torch.bfloat16, "3-D")
    xt = torch.randn(1000, 8, device="cuda").t()  # last-dim stride 8: copied, still right
    _close(ops.rms_norm(xt, w), _ref("rms", xt, w, None, None, 1e-6)[0], torch.float32, "transposed")


@pytest.mark.parametrize("kind", KINDS)
def test_backward_of_transposed_input(kind):
    # x whose last dim is not unit-stride: the forward copies it, and the backward must
    # take the saved (strided) x as well
    x = torch.randn(1000, 8, device="cuda", requires_grad=True)
    w = torch.randn(1000, device="cuda", requires_grad=True)
    out = _call(kind, x.t(), w, None, None, 1e-5)
    g = torch.randn_like(out)
    gx, gw = torch.autograd.grad((out * g).sum(), (x, w))
    xr, wr = x.detach().double().requires_grad_(), w.detach().double().requires_grad_()
    ref = _ref(kind, xr.t(), wr, None, None, 1e-5)[0]
    rgx, rgw = torch.autograd.grad((ref * g.double()).sum(), (xr, wr))
    _close(gx, rgx, torch.float32, "dx")
    _close(gw, rgw, torch.float32, "dweight")


@pytest.mark.parametrize("kind", KINDS)
def test_grad_of_x_only_and_custom_op_autograd(kind):
    # weight/bias without grad: the eager autograd.Function skips the dweight sums; the
    # custom ops' register_autograd (what torch.compile uses) gives the same dx in eager
    x, w, b, r = _inputs(300, 1000, torch.float32, bias=kind == "layer", res=True, seed=5)
    g = torch.randn_like(x)
    xg = x.clone().requires_grad_()
    out = _call(kind, xg, w, b, r, 1e-5)
    (gx,) = torch.autograd.grad(out[0], xg, g)
    xr = x.double().requires_grad_()
    ref = _ref(kind, xr, w, b, r, 1e-5)[0]
    (rgx,) = torch.autograd.grad(ref, xr, g.double())
    _close(gx, rgx, torch.float32, "dx (eager)")
    xc = x.clone().requires_grad_()
    if kind == "rms":
        yc = torch.ops.cuteforge.rms_norm(xc, w, r, 1e-5)[0]
    else:
        yc = torch.ops.cuteforge.layer_norm(xc, w, b, r, 1e-5)[0]
    (gc,) = torch.autograd.grad(yc, xc, g)
    _close(gc, rgx, torch.float32, "dx (custom op)")


def test_torch_compile_fullgraph():
    x, w, b, r = _inputs(128, 2048, torch.bfloat16, bias=True, res=True, seed=3)

    def f(x, w, b, r):
        y, s = ops.layer_norm(x, w, b, 1e-5, residual=r)
        z = ops.rms_norm(s, w, 1e-6)
        return (y.float().sum() + z.float().square().sum())

    leaves = [t.clone().requires_grad_() for t in (x, w, b, r)]
    eager = f(*leaves)
    eg = torch.autograd.grad(eager, leaves)
    leaves2 = [t.clone().requires_grad_() for t in (x, w, b, r)]
    cf = torch.compile(f, fullgraph=True)
    comp = cf(*leaves2)
    cg = torch.autograd.grad(comp, leaves2)
    torch.testing.assert_close(comp, eager, rtol=1e-3, atol=1e-2)
    for a, e in zip(cg, eg):
        torch.testing.assert_close(a.float(), e.float(), rtol=2e-2, atol=2e-2 * e.float().abs().max().item())


def test_cuda_graph_capture():
    x, w, b, _ = _inputs(256, 4096, torch.bfloat16, bias=True)
    y0 = ops.layer_norm(x, w, b)  # warm: compile outside the capture
    z0 = ops.rms_norm(x, w)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        ops.layer_norm(x, w, b)
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y = ops.layer_norm(x, w, b)
        z = ops.rms_norm(x, w)
    x.copy_(torch.randn_like(x))  # new data in the captured input buffer
    graph.replay()
    torch.cuda.synchronize()
    torch.testing.assert_close(y, ops.layer_norm(x, w, b))
    torch.testing.assert_close(z, ops.rms_norm(x, w))
    assert not torch.equal(y, y0) and not torch.equal(z, z0)


def test_errors():
    x = torch.randn(4, 8, device="cuda")
    w = torch.randn(8, device="cuda")
    with pytest.raises(ValueError, match="'weight' is on cpu"):
        ops.rms_norm(x, w.cpu())
    with pytest.raises(ValueError, match="'x' must be a CUDA"):
        ops.rms_norm(x.cpu(), w.cpu())
    with pytest.raises(TypeError, match="'weight' has dtype"):
        ops.rms_norm(x.bfloat16(), w.half())
    with pytest.raises(TypeError, match="'x' has dtype"):
        ops.layer_norm(x.double(), w.double())
    with pytest.raises(ValueError, match="'weight' must have shape \\(8,\\)"):
        ops.rms_norm(x, torch.randn(9, device="cuda"))
    with pytest.raises(ValueError, match="'bias' must have shape"):
        ops.layer_norm(x, w, torch.randn(7, device="cuda"))
    with pytest.raises(TypeError, match="'bias' has dtype"):
        ops.layer_norm(x.bfloat16(), w.bfloat16(), w.float())
    with pytest.raises(ValueError, match="'residual' has shape"):
        ops.rms_norm(x, w, residual=torch.randn(4, 9, device="cuda"))
    with pytest.raises(TypeError, match="'residual' has dtype"):
        ops.layer_norm(x, w, residual=x.half())
    with pytest.raises(ValueError, match="'eps' must be finite and >= 0"):
        ops.rms_norm(x, w, -1e-6)
    with pytest.raises(ValueError, match="last dim in"):
        ops.rms_norm(torch.randn(2, 0, device="cuda"), torch.randn(0, device="cuda"))
    with pytest.raises(ValueError, match="'eps'"):
        x.requires_grad_()
        ops.layer_norm(x, w, None, float("nan"))


def test_property():
    hypothesis = pytest.importorskip("hypothesis")
    st = hypothesis.strategies

    @hypothesis.settings(max_examples=25, deadline=None, derandomize=True)
    @hypothesis.given(
        kind=st.sampled_from(KINDS),
        m=st.integers(0, 40),
        n=st.sampled_from([1, 3, 8, 100, 1000, 1024]),
        dtype=st.sampled_from(DTYPES),
        bias=st.booleans(),
        res=st.booleans(),
        scale=st.sampled_from([1e-3, 1.0, 300.0]),
    )
    def check(kind, m, n, dtype, bias, res, scale):
        x, w, b, r = _inputs(m, n, dtype, bias=bias and kind == "layer", res=res, seed=m * 7 + n)
        x = (x.float() * scale).to(dtype)
        out = _call(kind, x, w, b, r, 1e-5)
        y = out[0] if res else out
        ref_y, ref_s = _ref(kind, x, w, b, r, 1e-5)
        _close(y, ref_y, dtype, "y")
        if res:
            torch.testing.assert_close(out[1], ref_s, rtol=0, atol=0)

    check()



# --------------------------------------------------------------------------- v2 forward: mbarrier exchange
# NormConfig.exchange = "mbar" (kernels/norm/common.py make_allreduce_mbar): not a default
# yet, so every long-row candidate (config.longrow_candidates) runs explicitly.

V2_CASES = [(torch.bfloat16, 32768), (torch.bfloat16, 65537), (torch.bfloat16, 262144),
            (torch.float16, 65537), (torch.float32, 65537), (torch.float32, 262144)]


def _v2_variant(kind, n):
    """(has_bias, has_residual) per case: both kinds see residual on and off, odd N too."""
    odd = n % 2 == 1
    return (kind == "layer" and not odd), (odd or n == 262144)


def _v2_cases():
    from cuteforge.kernels.norm.config import longrow_candidates

    out = []
    for kind in KINDS:
        for dt, n in V2_CASES:
            for c in longrow_candidates(n, dt.itemsize * 8):
                out.append((kind, dt, n, c))
    return out


@pytest.fixture(scope="module")
def _warm_norm_v2():
    """Compile every v2 case in parallel worker processes first (a failed build fails its test)."""
    from cuteforge.arch import target_arch
    from cuteforge.autotune.pool import CompileJob, compile_all
    from cuteforge.kernels.norm.spec import norm_fwd

    jobs = []
    for kind, dt, n, c in _v2_cases():
        bias, res = _v2_variant(kind, n)
        x = torch.empty(1, n, device="cuda", dtype=dt)
        w = torch.empty(n, device="cuda", dtype=dt)
        rs = torch.empty(1, device="cuda")
        key = norm_fwd.signature.bind((x, w, w, x, x, x, rs, rs), "warm")
        eps = 1e-6 if kind == "rms" else 1e-5
        params = (("eps", eps), ("has_bias", bias), ("has_residual", res), ("kind", kind))
        jobs.append(CompileJob.of(norm_fwd, key, params, c, target_arch()))
    compile_all(jobs)
    yield


@pytest.mark.parametrize("kind, dtype, n, cfg", _v2_cases(), ids=lambda v: repr(v).replace(" ", "") if not isinstance(v, str) else v)
def test_v2_forward_candidates_match_torch(_warm_norm_v2, kind, dtype, n, cfg):
    from cuteforge.ops import norm as impl

    bias, res = _v2_variant(kind, n)
    eps = 1e-6 if kind == "rms" else 1e-5
    for m in (1, 7, 1000 if n <= 65537 else 130):
        x, w, b, r = _inputs(m, n, dtype, bias=bias, res=res, seed=m)
        x = x + 3.0  # a mean far from 0: LayerNorm's centred variance must not cancel
        y, ro, mean, rstd = impl._forward(kind, x, w, b, r, eps, cfg)
        ref_y, ref_s = _ref(kind, x, w, b, r, eps)
        _close(y, ref_y, dtype, f"y {cfg} m={m}")
        sd = ref_s.double()
        if kind == "layer":
            mu = sd.mean(-1)
            torch.testing.assert_close(mean.double(), mu, rtol=1e-5, atol=1e-5)
            var = (sd - mu[:, None]).pow(2).mean(-1)
        else:
            var = sd.pow(2).mean(-1)
        torch.testing.assert_close(rstd.double(), torch.rsqrt(var + eps), rtol=1e-4, atol=0)
        if res:
            torch.testing.assert_close(ro, ref_s, rtol=0, atol=0)


def test_v2_forward_strided_view():
    """A row-strided, misaligned view (narrower vectors) through an mbar config."""
    from cuteforge.kernels.norm import NormConfig
    from cuteforge.ops import norm as impl

    cfg = NormConfig(256, 256, 8, 1, exchange="mbar")
    base = torch.randn(9, 65536 + 8, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(65536, device="cuda", dtype=torch.bfloat16)
    for x in (base[:, :65536], base[::2, 3:65539]):
        for kind in KINDS:
            y, _, _, _ = impl._forward(kind, x, w, None, None, 1e-5, cfg)
            _close(y, _ref(kind, x, w, None, None, 1e-5)[0], torch.bfloat16, f"{kind} view")


@pytest.mark.parametrize("dtype, offset", [(torch.float32, 1000.0), (torch.bfloat16, 64.0), (torch.float16, 256.0)])
def test_layer_moments_exchange_far_mean(dtype, offset):
    """LayerNorm over a cluster takes its mean and variance from one exchange of per-warp
    moments (Chan's merge): with the mean far from 0 (|mean| / std = offset) the
    variance must still match the fp64 two-pass one, through the register forward (a
    padded N keeps the two-exchange form) and the staged forward; y too, in fp32, bf16
    and fp16."""
    from cuteforge.kernels.norm import NormConfig
    from cuteforge.ops import norm as impl

    cfgs = [NormConfig(256, 256, 8, 1, exchange="mbar"), NormConfig(512, 512, 4, 1, exchange="mbar"),
            NormConfig(512, 512, 16, 1, exchange="mbar"), NormConfig(512, 512, 4, 1, exchange="mbar", stages=2),
            NormConfig(256, 256, 16, 2, exchange="mbar", stages=3), NormConfig(512, 512, 16, 1, exchange="mbar", stages=2),
            NormConfig(512, 512, 4, 1, exchange="mbar", stages=6, lag=1),
            NormConfig(256, 256, 16, 1, exchange="mbar", stages=4, lag=1),
            # merged moments (one lane per pair, and four pairs a lane), the
            # FFMA-folded normalisation for 16-bit x, rows counted
            NormConfig(256, 256, 4, 1, exchange="mbar", stages=2, short_chains=True),
            NormConfig(256, 256, 16, 1, exchange="mbar", stages=4, lag=1, short_chains=True)]
    bits = dtype.itemsize * 8
    shorts = 0
    for n in (65536, 65537, 262144):
        ran = []
        for cfg in cfgs:
            try:
                cfg.validate(n, bits)
            except ValueError:
                continue
            ran.append(cfg.stages > 0)
            shorts += cfg.short_chains
            x, w, b, _ = _inputs(5, n, dtype, bias=True, seed=n)
            x = (x.float() + offset).to(dtype)
            y, _, mean, rstd = impl._forward("layer", x, w, b, None, 1e-6, cfg)
            sd = x.double()
            mu = sd.mean(-1)
            var = (sd - mu[:, None]).pow(2).mean(-1)
            torch.testing.assert_close(mean.double(), mu, rtol=1e-5, atol=0, msg=lambda m, at=f"{n} {cfg}": f"mean {at}: {m}")
            torch.testing.assert_close(rstd.double(), torch.rsqrt(var + 1e-6), rtol=1e-4, atol=0,
                                       msg=lambda m, at=f"{n} {cfg}": f"rstd {at}: {m}")
            _close(y, _ref("layer", x, w, b, None, 1e-6)[0], dtype, f"y {n} {cfg}")
        assert False in ran and (n % 2 == 1 or True in ran), (n, ran)
    # the short_chains configs ran: both at 65536, and (16-bit) the lagged one at 262144
    assert shorts == (2 if bits == 32 else 3), shorts


# --------------------------------------------------------------------------- backward: mbarrier exchange
# NormConfig.exchange = "mbar" in the persistent backward (kernels/norm/bwd.py, two
# mbarriers alternating over a CTA's rows: exchange.make_allreduce_mbar_rows). Not a
# default yet, so every backward long-row candidate (config.longrow_bwd_candidates) runs
# explicitly against an fp64 reference of dx, dweight, dbias. Even N use the variant
# bench_longrow.py times (rms without bias, layer with bias, no dsum: the compiles are
# shared through the disk cache); N = 65537 adds the fused-residual gradient (dsum).

V2_BWD_CASES = [(torch.bfloat16, 32768), (torch.bfloat16, 65537), (torch.bfloat16, 262144),
                (torch.float16, 65537), (torch.float32, 32768), (torch.float32, 262144)]


def _v2_bwd_variant(kind, n):
    """(has_bias, has_dsum) per case."""
    return kind == "layer", n % 2 == 1


def _v2_bwd_cases():
    from cuteforge.kernels.norm.config import longrow_bwd_candidates

    return [(kind, dt, n, c) for kind in KINDS for dt, n in V2_BWD_CASES for c in longrow_bwd_candidates(n, dt.itemsize * 8)]


def _v2_bwd_key(kind, dt, n, bias, dsum):
    from cuteforge.kernels.norm.spec import norm_bwd

    x = torch.empty(1, n, device="cuda", dtype=dt)
    w = torch.empty(n, device="cuda", dtype=dt)
    st = torch.empty(1, device="cuda")
    part = torch.empty(1, n, device="cuda")
    key = norm_bwd.signature.bind((x, w, x, x, st, st, x, part, part), "warm")
    return key, (("has_bias", bias), ("has_dsum", dsum), ("kind", kind))


@pytest.fixture(scope="module")
def _warm_norm_v2_bwd():
    """Compile every v2 backward case (and the forward defaults it does not need: the
    statistics come from torch) in parallel worker processes first."""
    from cuteforge.arch import target_arch
    from cuteforge.autotune.pool import CompileJob, compile_all
    from cuteforge.kernels.norm.spec import norm_bwd

    jobs = []
    for kind, dt, n, c in _v2_bwd_cases():
        key, params = _v2_bwd_key(kind, dt, n, *_v2_bwd_variant(kind, n))
        jobs.append(CompileJob.of(norm_bwd, key, params, c, target_arch()))
    compile_all(jobs)
    yield


def _v2_bwd_reference(kind, x, w, b, dy, ds, eps):
    """fp64 (dx, dweight, dbias) and the fp32 statistics the kernel is given."""
    xd = x.double().requires_grad_()
    wd = w.double().requires_grad_()
    bd = None if b is None else b.double().requires_grad_()
    if kind == "rms":
        mu = None
        rstd = torch.rsqrt(xd.pow(2).mean(-1, keepdim=True) + eps)
        y = xd * rstd * wd
    else:
        mu = xd.mean(-1, keepdim=True)
        rstd = torch.rsqrt((xd - mu).pow(2).mean(-1, keepdim=True) + eps)
        y = (xd - mu) * rstd * wd + (0.0 if bd is None else bd)
    leaves = [xd, wd] + ([bd] if bd is not None else [])
    grads = torch.autograd.grad((y * dy.double()).sum(), leaves)
    dx = grads[0] + (0.0 if ds is None else ds.double())
    stats = (None if mu is None else mu.detach().squeeze(-1).float(), rstd.detach().squeeze(-1).float())
    return dx, grads[1], (grads[2] if bd is not None else None), stats


@pytest.mark.parametrize("kind, dtype, n, cfg", _v2_bwd_cases(), ids=lambda v: repr(v).replace(" ", "") if not isinstance(v, str) else v)
def test_v2_bwd_candidates_match_fp64(_warm_norm_v2_bwd, kind, dtype, n, cfg):
    from cuteforge.ops import norm as impl

    bias, dsum = _v2_bwd_variant(kind, n)
    eps = 1e-6 if kind == "rms" else 1e-5
    for m in (1, 7, 1000 if n <= 65537 else 130):
        x, w, b, _ = _inputs(m, n, dtype, bias=bias, seed=m + 11)
        x = x + 3.0  # a mean far from 0
        g = torch.Generator(device="cuda").manual_seed(m + 12)
        dy = torch.randn(m, n, device="cuda", generator=g).to(dtype)
        ds = torch.randn(m, n, device="cuda", generator=g).to(dtype) if dsum else None
        ref_dx, ref_dw, ref_db, (mean, rstd) = _v2_bwd_reference(kind, x, w, b, dy, ds, eps)
        dx, dw, db = impl._backward(kind, dy, x, w, mean, rstd, ds, bias, cfg)
        assert dx.dtype == dtype and dw.dtype == w.dtype
        _close(dx, ref_dx, dtype, f"dx {cfg} m={m}")
        _close(dw, ref_dw, dtype, f"dweight {cfg} m={m}")
        if bias:
            _close(db, ref_db, dtype, f"dbias {cfg} m={m}")
        del ref_dx, ref_dw, ref_db


def test_v2_bwd_many_rows_per_cluster():
    """Hundreds of rows per CTA group (the two mbarriers wrap their phases many times),
    rms and layer, against the default (barrier) backward on the same inputs."""
    from cuteforge.kernels.norm.config import cluster_bwd_config
    from cuteforge.ops import norm as impl

    n, m = 32768, 6001
    cfg = cluster_bwd_config(n, 16)
    assert cfg is not None and cfg.exchange == "mbar"
    for kind in KINDS:
        x, w, b, _ = _inputs(m, n, torch.bfloat16, bias=kind == "layer", seed=21)
        dy = torch.randn_like(x)
        _, _, mean, rstd = impl._forward(kind, x, w, b, None, 1e-5)
        dx0, dw0, db0 = impl._backward(kind, dy, x, w, mean, rstd, None, b is not None)
        dx, dw, db = impl._backward(kind, dy, x, w, mean, rstd, None, b is not None, cfg)
        _close(dx, dx0.double(), torch.bfloat16, f"{kind} dx")
        _close(dw, dw0.double(), torch.bfloat16, f"{kind} dweight")
        if b is not None:
            _close(db, db0.double(), torch.bfloat16, f"{kind} dbias")


def test_v2_bwd_strided_view():
    """A row-strided, misaligned view (narrower vectors) through a backward mbar config."""
    from cuteforge.kernels.norm import NormConfig
    from cuteforge.ops import norm as impl

    cfg = NormConfig(256, 256, 16, 1, exchange="mbar")
    base = torch.randn(9, 65536 + 8, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(65536, device="cuda", dtype=torch.bfloat16)
    for x in (base[:, :65536], base[::2, 3:65539]):
        dy = torch.randn(x.shape, device="cuda", dtype=torch.bfloat16)
        for kind in KINDS:
            ref_dx, ref_dw, _, (mean, rstd) = _v2_bwd_reference(kind, x, w, None, dy, None, 1e-5)
            dx, dw, _ = impl._backward(kind, dy, x, w, mean, rstd, None, False, cfg)
            _close(dx, ref_dx, torch.bfloat16, f"{kind} view dx")
            _close(dw, ref_dw, torch.bfloat16, f"{kind} view dweight")


# --------------------------------------------------------------------------- staged backward
# NormConfig.stages > 0 (kernels/norm/bwd.py make_norm_bwd_staged): rows of x / dy (/ dsum)
# brought into shared memory by cp.async.bulk on per-stage mbarriers. Every staged
# candidate (config.staged_candidates) at N = 4096, 8192, 16384 against an fp64 reference
# of dx, dweight, dbias, with and without the fused residual's dsum; N = 65537 cannot be
# staged (rows of a multiple of 16 bytes only: validate rejects it); a strided view and a
# misaligned one (which builds the register path instead).

STAGED_NS = [4096, 8192, 16384]


def _bwd_cases(candidates, ns):
    """(kind, dtype, n, config, dsum) for every candidates(n, bits) config at each n."""
    return [(kind, dt, n, c, dsum) for kind in KINDS for dt in DTYPES for n in ns
            for c in candidates(n, dt.itemsize * 8) for dsum in (False, True)]


def _staged_cases():
    from cuteforge.kernels.norm.config import staged_candidates

    return _bwd_cases(staged_candidates, STAGED_NS)


def _warm_bwd(cases):
    """Compile every case's backward kernel up front, over the worker pool."""
    from cuteforge.arch import target_arch
    from cuteforge.autotune.pool import CompileJob, compile_all
    from cuteforge.kernels.norm.spec import norm_bwd

    jobs = []
    for kind, dt, n, c, dsum in cases:
        key, params = _v2_bwd_key(kind, dt, n, kind == "layer", dsum)
        jobs.append(CompileJob.of(norm_bwd, key, params, c, target_arch()))
    compile_all(jobs)


@pytest.fixture(scope="module")
def _warm_norm_staged():
    _warm_bwd(_staged_cases())
    yield


def _bwd_matches_fp64(kind, dtype, n, cfg, dsum, seed, ms=(1, 7, 1000)):
    """_backward with cfg against the fp64 reference of dx, dweight (, dbias) at M = ms."""
    from cuteforge.ops import norm as impl

    bias = kind == "layer"
    eps = 1e-6 if kind == "rms" else 1e-5
    for m in ms:
        x, w, b, _ = _inputs(m, n, dtype, bias=bias, seed=m + seed)
        x = x + 3.0  # a mean far from 0
        g = torch.Generator(device="cuda").manual_seed(m + seed + 1)
        dy = torch.randn(m, n, device="cuda", generator=g).to(dtype)
        ds = torch.randn(m, n, device="cuda", generator=g).to(dtype) if dsum else None
        ref_dx, ref_dw, ref_db, (mean, rstd) = _v2_bwd_reference(kind, x, w, b, dy, ds, eps)
        dx, dw, db = impl._backward(kind, dy, x, w, mean, rstd, ds, bias, cfg)
        assert dx.dtype == dtype and dw.dtype == w.dtype
        _close(dx, ref_dx, dtype, f"dx {cfg} m={m}")
        _close(dw, ref_dw, dtype, f"dweight {cfg} m={m}")
        if bias:
            _close(db, ref_db, dtype, f"dbias {cfg} m={m}")
        del ref_dx, ref_dw, ref_db


def _bwd_many_rows(cfg, n, m, seed, label):
    """m rows through cfg (the mbarriers wrap their phases many times), bf16 x with bf16
    and fp32 weight, against the fp64 reference."""
    from cuteforge.ops import norm as impl

    for kind in KINDS:
        for wd in (torch.bfloat16, torch.float32):
            x, w, b, _ = _inputs(m, n, torch.bfloat16, w_dtype=wd, bias=kind == "layer", seed=seed)
            dy = torch.randn_like(x)
            ref_dx, ref_dw, ref_db, (mean, rstd) = _v2_bwd_reference(kind, x, w, b, dy, None, 1e-5)
            dx, dw, db = impl._backward(kind, dy, x, w, mean, rstd, None, b is not None, cfg)
            _close(dx, ref_dx, torch.bfloat16, f"{kind} {label} {wd} dx")
            _close(dw, ref_dw, torch.bfloat16, f"{kind} {label} {wd} dweight", scale=4.0)
            if b is not None:
                _close(db, ref_db, torch.bfloat16, f"{kind} {label} {wd} dbias", scale=4.0)
            del ref_dx, ref_dw, ref_db


def _bwd_strided_views(cfg, n):
    """A row-strided 16-byte aligned view (staged) and a misaligned one (the register path
    is built instead) through cfg."""
    from cuteforge.ops import norm as impl

    base = torch.randn(9, n + 8, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(n, device="cuda", dtype=torch.bfloat16)
    for x in (base[:, :n], base[::2, 3:n + 3]):
        dy = torch.randn(x.shape, device="cuda", dtype=torch.bfloat16)
        for kind in KINDS:
            ref_dx, ref_dw, _, (mean, rstd) = _v2_bwd_reference(kind, x, w, None, dy, None, 1e-5)
            dx, dw, _ = impl._backward(kind, dy, x, w, mean, rstd, None, False, cfg)
            _close(dx, ref_dx, torch.bfloat16, f"{kind} view dx")
            _close(dw, ref_dw, torch.bfloat16, f"{kind} view dweight")


@pytest.mark.parametrize("kind, dtype, n, cfg, dsum", _staged_cases(),
                         ids=lambda v: repr(v).replace(" ", "") if not isinstance(v, str) else v)
def test_staged_bwd_matches_fp64(_warm_norm_staged, kind, dtype, n, cfg, dsum):
    _bwd_matches_fp64(kind, dtype, n, cfg, dsum, seed=31)


def test_staged_bwd_many_rows_and_fp32_weight():
    """Thousands of rows per CTA (the stage mbarriers wrap their phases many times) and
    fp32 weight with bf16 x, against the fp64 reference."""
    from cuteforge.kernels.norm.config import staged_config

    for n, m in ((4096, 20001), (16384, 3001)):
        _bwd_many_rows(staged_config(n, 16), n, m, seed=41, label=str(n))


def test_staged_bwd_strided_views():
    """A row-strided 16-byte aligned view (staged) and a misaligned one (the register path
    is built instead) through a staged config; N = 65537 is rejected by validate."""
    from cuteforge.kernels.norm import NormConfig
    from cuteforge.kernels.norm.config import staged_config

    with pytest.raises(ValueError, match="multiple of 16 bytes"):
        NormConfig(512, 512, 1, 1, stages=2).validate(65537, 16, backward=True)
    assert staged_config(65537, 16) is None
    _bwd_strided_views(staged_config(8192, 16), 8192)


# --------------------------------------------------------------------------- cluster-staged backward
# NormConfig.stages > 0 with cluster_n > 1 (exchange "mbar"): each CTA of the cluster stages
# its contiguous N / cluster_n chunk of x / dy (/ dsum) by bulk copies and the row sums meet
# through the mbarrier exchange. Every config.longrow_staged_candidates config at
# N = 32768, 65536 against an fp64 reference of dx, dweight, dbias, with and without dsum,
# bf16 / fp16 / fp32, M = 1, 7, 1000. Odd N cannot be staged (chunks of a multiple of 16
# bytes): validate rejects it.

CLUSTER_STAGED_NS = [32768, 65536]


def _cluster_staged_cases():
    from cuteforge.kernels.norm.config import longrow_staged_candidates

    return _bwd_cases(longrow_staged_candidates, CLUSTER_STAGED_NS)


@pytest.fixture(scope="module")
def _warm_norm_cluster_staged():
    _warm_bwd(_cluster_staged_cases())
    yield


@pytest.mark.parametrize("kind, dtype, n, cfg, dsum", _cluster_staged_cases(),
                         ids=lambda v: repr(v).replace(" ", "") if not isinstance(v, str) else v)
def test_cluster_staged_bwd_matches_fp64(_warm_norm_cluster_staged, kind, dtype, n, cfg, dsum):
    assert cfg.cluster_n > 1 and cfg.stages >= 1 and cfg.exchange == "mbar"
    _bwd_matches_fp64(kind, dtype, n, cfg, dsum, seed=51)


def test_cluster_staged_bwd_many_rows_fp32_weight_and_views():
    """Thousands of rows per cluster (stage and exchange mbarriers wrap their phases many
    times) with bf16 and fp32 weight; a row-strided aligned view (staged) and a misaligned
    one (the register path is built instead); odd N rejected."""
    from cuteforge.kernels.norm import NormConfig
    from cuteforge.kernels.norm.config import cluster_staged_config

    with pytest.raises(ValueError, match="multiple of 16 bytes"):
        NormConfig(512, 512, 2, 1, exchange="mbar", stages=2).validate(65537, 16, backward=True)
    with pytest.raises(ValueError, match="mbar"):
        NormConfig(512, 512, 2, 1, stages=2).validate(65536, 16, backward=True)
    assert cluster_staged_config(65537, 16) is None
    n = 32768
    cfg = cluster_staged_config(n, 16)
    assert cfg is not None and cfg.cluster_n > 1
    _bwd_many_rows(cfg, n, 3001, seed=61, label="")
    _bwd_strided_views(cfg, n)


# --------------------------------------------------------------------------- part-ring backward
# NormConfig.parts >= 2 (kernels/norm/ring.py): the staged chunks travel as parts through a
# ring of part slots, each refilled once every warp has read its part for dx. Every ring
# candidate (config.longrow_staged_candidates: fp32 N = 262144) against the fp64 reference
# at M = 1, 7, 130 with and without dsum (dsum's third operand leaves fewer slots: some
# fall back to whole-row stages); forced ring configs on one CTA and on a 2-CTA cluster
# through thousands of rows (every slot's full and empty mbarriers wrap their phases many
# times), bf16 and fp32 weight, and a row-strided view.

RING_NS = [262144]


def _ring_cases():
    from cuteforge.kernels.norm.config import longrow_staged_candidates

    return [c for c in _bwd_cases(longrow_staged_candidates, RING_NS) if c[3].parts]


@pytest.fixture(scope="module")
def _warm_norm_ring():
    _warm_bwd(_ring_cases())
    yield


@pytest.mark.parametrize("kind, dtype, n, cfg, dsum", _ring_cases(),
                         ids=lambda v: repr(v).replace(" ", "") if not isinstance(v, str) else v)
def test_ring_bwd_matches_fp64(_warm_norm_ring, kind, dtype, n, cfg, dsum):
    assert cfg.parts >= 2 and cfg.stages >= 1
    # 130 rows of 1 MiB: 7 clusters each take 18-19 rows, 150 parts through 9 slots; an
    # fp64 reference of 1000 rows (2 GiB a tensor) ran a shared GPU out of memory
    _bwd_matches_fp64(kind, dtype, n, cfg, dsum, seed=71, ms=(1, 7, 130))


def test_ring_bwd_many_rows_and_views():
    """Forced ring configs (parts 2 / 4, one CTA and a 2-CTA cluster) through 3001 rows
    with bf16 and fp32 weight, and a strided view, against the fp64 reference."""
    from cuteforge.kernels.norm.config import cluster_staged_config, ring_config, staged_config

    one = ring_config(staged_config(16384, 16), 16384, 16, 4)
    two = ring_config(cluster_staged_config(32768, 16), 32768, 16, 2)
    assert one is not None and one.cluster_n == 1 and two is not None and two.cluster_n == 2
    _bwd_many_rows(one, 16384, 3001, seed=73, label="ring one CTA")
    _bwd_many_rows(two, 32768, 3001, seed=74, label="ring cluster")
    _bwd_strided_views(two, 32768)


# --------------------------------------------------------------------------- staged forward (prepared)
# NormConfig.stages > 0 on the forward (kernels/norm/fwd.py make_norm_fwd_staged; never a
# default): each CTA stages its N / cluster_n chunk of x (and the residual) by bulk copies,
# S rows ahead over a persistent grid, the statistics come from shared memory, the row
# sums meet through the mbarrier exchange. Every config.longrow_staged_fwd_candidates
# config at N = 32768, 65536, 262144 against the fp64 reference (y, x + residual, mean,
# rstd), rms without bias / layer with bias, with and without the residual, bf16 / fp16 /
# fp32, M = 1, 7, 1000 (M = 1000 wraps every stage's mbarrier phase many times). Select
# them with `-k staged_fwd`.

STAGED_FWD_NS = [32768, 65536, 262144]


def _fwd_cases(candidates, ns, residuals):
    """(kind, dtype, n, config, residual) for every kind, dtype, n in ``ns`` and each config
    i of ``candidates(n, bits)``, with the residual flags ``residuals(i)``."""
    out = []
    for kind in KINDS:
        for dt in DTYPES:
            for n in ns:
                for i, c in enumerate(candidates(n, dt.itemsize * 8)):
                    out += [(kind, dt, n, c, res) for res in residuals(i)]
    return out


def _staged_fwd_cases():
    from cuteforge.kernels.norm.config import longrow_staged_fwd_candidates

    return _fwd_cases(longrow_staged_fwd_candidates, STAGED_FWD_NS, lambda i: (False, True))


def _warm_fwd_cases(cases):
    """Compile forward cases (kind, dtype, n, config, residual; rms without bias, layer with
    one) in parallel worker processes (a failed build fails its test later)."""
    from cuteforge.arch import target_arch
    from cuteforge.autotune.pool import CompileJob, compile_all
    from cuteforge.kernels.norm.spec import norm_fwd

    jobs = []
    for kind, dt, n, c, res in cases:
        x = torch.empty(1, n, device="cuda", dtype=dt)
        w = torch.empty(n, device="cuda", dtype=dt)
        rs = torch.empty(1, device="cuda")
        key = norm_fwd.signature.bind((x, w, w, x, x, x, rs, rs), "warm")
        eps = 1e-6 if kind == "rms" else 1e-5
        params = (("eps", eps), ("has_bias", kind == "layer"), ("has_residual", res), ("kind", kind))
        jobs.append(CompileJob.of(norm_fwd, key, params, c, target_arch()))
    compile_all(jobs)


@pytest.fixture(scope="module")
def _warm_norm_staged_fwd():
    """Compile every staged forward case in parallel worker processes first."""
    _warm_fwd_cases(_staged_fwd_cases())
    yield


def _check_fwd(kind, x, w, b, r, eps, got, dtype, what):
    y, ro, mean, rstd = got
    ref_y, ref_s = _ref(kind, x, w, b, r, eps)
    _close(y, ref_y, dtype, f"y {what}")
    sd = ref_s.double()
    if kind == "layer":
        mu = sd.mean(-1)
        torch.testing.assert_close(mean.double(), mu, rtol=1e-5, atol=1e-5)
        var = (sd - mu[:, None]).pow(2).mean(-1)
    else:
        var = sd.pow(2).mean(-1)
    torch.testing.assert_close(rstd.double(), torch.rsqrt(var + eps), rtol=1e-4, atol=0)
    if r is not None:
        torch.testing.assert_close(ro, ref_s, rtol=0, atol=0)


@pytest.mark.parametrize("kind, dtype, n, cfg, res", _staged_fwd_cases(),
                         ids=lambda v: repr(v).replace(" ", "") if not isinstance(v, str) else v)
def test_staged_fwd_candidates_match_torch(_warm_norm_staged_fwd, kind, dtype, n, cfg, res):
    _check_fwd_rows(kind, dtype, n, cfg, res, (1, 7, 1000))


def _check_fwd_rows(kind, dtype, n, cfg, res, ms):
    """``cfg`` through ops/norm.py's forward on M = each of ``ms`` rows (rms without bias,
    layer with one, the residual fused when ``res``) against the fp64 reference."""
    from cuteforge.ops import norm as impl

    eps = 1e-6 if kind == "rms" else 1e-5
    for m in ms:
        x, w, b, r = _inputs(m, n, dtype, bias=kind == "layer", res=res, seed=m)
        x = x + 3.0  # a mean far from 0: LayerNorm's centred variance must not cancel
        got = impl._forward(kind, x, w, b, r, eps, cfg)
        _check_fwd(kind, x, w, b, r, eps, got, dtype, f"{cfg} m={m}")
        assert got[0].dtype == dtype
        del got


def test_staged_fwd_fp32_weight_and_one_cta_rows():
    """fp32 weight / bias with bf16 x (weight chunks of twice the bytes) through cluster
    configs, and one-CTA staged rows (N = 4096..16384, no cluster: the CTA barrier
    reduction) against the fp64 reference."""
    from cuteforge.kernels.norm.config import longrow_staged_fwd_candidates
    from cuteforge.ops import norm as impl

    for n in (4096, 16384, 65536):
        for cfg in longrow_staged_fwd_candidates(n, 16)[:3]:
            for kind in KINDS:
                for wd in (torch.bfloat16, torch.float32):
                    x, w, b, r = _inputs(301, n, torch.bfloat16, w_dtype=wd, bias=kind == "layer", res=True, seed=43)
                    got = impl._forward(kind, x, w, b, r, 1e-5, cfg)
                    _check_fwd(kind, x, w, b, r, 1e-5, got, torch.bfloat16, f"{kind} {n} {wd} {cfg}")


# the lagged staged forward (NormConfig.lag = 1: LayerNorm over a cluster posts row
# j's moments, then finishes row j - 1 from its stage). Select with `-k lagged`.

def _lagged_cases():
    """(kind, dtype, n, config, residual): LayerNorm with each dtype at N = 32768, 65536,
    131072, 262144 on the lagged default where there is one and on 3 stages of 256 threads
    at one CTA per SM, lag = 1, with and without the residual (s formed again from the
    stage), and the residual's own lagged default; RMSNorm once (lag does not apply)."""
    from dataclasses import replace

    from cuteforge.kernels.norm.config import default_config, staged_fwd_config

    out = []
    for dt in DTYPES:
        bits = dt.itemsize * 8
        for n in (32768, 65536, 131072, 262144):
            d = default_config(n, bits, kind="layer")
            cfgs = [d] if d.lag else []
            for threads, stages in ((256, 3), (512, 6), (256, 4)):
                c = staged_fwd_config(n, bits, threads, stages)
                if c is not None and c.cluster_n > 1 and replace(c, lag=1, ctas_per_sm=1) not in cfgs:
                    cfgs.append(replace(c, lag=1, ctas_per_sm=1))
            for c in cfgs[:2]:
                out += [("layer", dt, n, c, res) for res in (False, True)]
            dr = default_config(n, bits, kind="layer", residual=True)
            if dr.lag and dr not in cfgs[:2]:  # the residual's own lagged default
                out.append(("layer", dt, n, dr, True))
    out.append(("rms", torch.bfloat16, 262144, out[-1][3], False))
    return out


@pytest.fixture(scope="module")
def _warm_norm_lagged():
    _warm_fwd_cases(_lagged_cases())
    yield


@pytest.mark.parametrize("kind, dtype, n, cfg, res", _lagged_cases(),
                         ids=lambda v: repr(v).replace(" ", "") if not isinstance(v, str) else v)
def test_lagged_fwd_matches_torch(_warm_norm_lagged, kind, dtype, n, cfg, res):
    """M = 1 (only the tail finish), 2, 7 (fewer rows than groups), 1000 (every exchange slot
    and stage phase reused many times) against the fp64 reference."""
    _check_fwd_rows(kind, dtype, n, cfg, res, (1, 2, 7, 1000))


def test_lagged_fwd_many_rows_per_group():
    """More rows than stages x groups at the 262144 / 65536 defaults with lag (every group
    wraps its stage ring and its four exchange slots), and a strided view; the 262144 shape
    also with `short_chains` (its rows counted, not divided out)."""
    from dataclasses import replace

    from cuteforge.kernels.norm.config import staged_fwd_config
    from cuteforge.ops import norm as impl

    for n, threads, stages, occ, kib, m, short in (
            (262144, 256, 3, 1, 32, 131, False), (262144, 256, 4, 1, 32, 131, False), (262144, 256, 4, 1, 32, 131, True),
            (65536, 512, 2, 3, 32, 1311, False), (65536, 512, 6, 1, 32, 1311, False), (65536, 256, 3, 2, 16, 1311, False),
            (65536, 256, 3, 2, 16, 1311, True),
            # weight and bias held as loaded (2 CTAs per SM)
            (262144, 256, 3, 2, 32, 131, False), (131072, 256, 3, 2, 32, 263, False)):
        cfg = replace(staged_fwd_config(n, 16, threads, stages, kib * 1024), lag=1, ctas_per_sm=occ, short_chains=short)
        x, w, b, _ = _inputs(m, n, torch.bfloat16, bias=True, seed=m)
        got = impl._forward("layer", x, w, b, None, 1e-5, cfg)
        _check_fwd("layer", x, w, b, None, 1e-5, got, torch.bfloat16, f"{cfg} m={m}")
        base = torch.randn(9, n + 8, device="cuda", dtype=torch.bfloat16)
        xv = base[:, 8:]
        got = impl._forward("layer", xv, w, b, None, 1e-5, cfg)
        _check_fwd("layer", xv, w, b, None, 1e-5, got, torch.bfloat16, f"view {cfg}")


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_short_chains_within_one_ulp(dtype):
    """`short_chains` (the 16-bit N = 262144 default's) against the same config without it,
    rows with |mean| / std from 0 to 64: mean and rstd within fp32 rounding of the merge
    order (rtol 1e-5); y within one output ulp plus the fold's own rounding. The FFMA fold
    rounds s * rstd and mean * rstd, each to 2^-24 relative, an absolute error of about
    2^-23 (|s| + |mean|) rstd |w| in y: far under an ulp of y at |y| ~ |w|, but more than
    an ulp of the outputs that cancel to near 0 (seen: 27 / 45 ulps of such a bf16 / fp16
    output), so the bound has that term, with a factor 4 of margin."""
    from dataclasses import replace

    from cuteforge.kernels.norm.config import default_config
    from cuteforge.ops import norm as impl

    n = 262144
    cfg = default_config(n, 16, kind="layer")
    assert cfg.short_chains, cfg
    x, w, b, _ = _inputs(67, n, dtype, bias=True, seed=31)
    x = (x.float() + torch.linspace(0, 64, 67, device="cuda")[:, None]).to(dtype)
    ys, _, ms, rs = impl._forward("layer", x, w, b, None, 1e-5, cfg)
    y0, _, m0, r0 = impl._forward("layer", x, w, b, None, 1e-5, replace(cfg, short_chains=False))
    torch.testing.assert_close(ms, m0, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(rs, r0, rtol=1e-5, atol=0)
    ulp = 2.0 ** -(7 if dtype == torch.bfloat16 else 10)
    diff = (ys.float() - y0.float()).abs()
    fold = (x.float().abs() + m0.abs()[:, None]) * r0[:, None] * w.float().abs() * 2.0 ** -21
    bound = torch.maximum(ys.float().abs(), y0.float().abs()) * ulp + fold
    assert bool((diff <= bound).all()), float((diff / bound).max())
    _check_fwd("layer", x, w, b, None, 1e-5, (ys, None, ms, rs), dtype, "short_chains")


def test_staged_fwd_strided_views():
    """A row-strided 16-byte aligned view (staged) and a misaligned one (the register
    forward is built instead) through a staged cluster config, with a strided residual;
    N = 65537 is rejected by validate."""
    from cuteforge.kernels.norm import NormConfig
    from cuteforge.kernels.norm.config import longrow_staged_fwd_candidates
    from cuteforge.ops import norm as impl

    with pytest.raises(ValueError, match="multiple of 16 bytes"):
        NormConfig(512, 512, 4, 1, exchange="mbar", stages=2).validate(65537, 16)
    assert longrow_staged_fwd_candidates(65537, 16) == []
    n = 65536
    for cfg in longrow_staged_fwd_candidates(n, 16)[:2]:
        base = torch.randn(9, n + 8, device="cuda", dtype=torch.bfloat16)
        rbase = torch.randn(9, n + 8, device="cuda", dtype=torch.bfloat16)
        w = torch.randn(n, device="cuda", dtype=torch.bfloat16)
        for x, r in ((base[:, :n], rbase[:, 8:]), (base[::2, 3:n + 3], rbase[::2, :n])):
            for kind in KINDS:
                for rr in (None, r):
                    got = impl._forward(kind, x, w, None, rr, 1e-5, cfg)
                    _check_fwd(kind, x, w, None, rr, 1e-5, got, torch.bfloat16, f"{kind} view {cfg}")


# --------------------------------------------------------------------------- cp_async forward
# NormConfig.cp_async: the register forward with x (and the residual), weight and bias
# brought into shared memory by 16-byte cp.async at kernel start. Every
# config.async_fwd_candidates config at N = 32768, 65536, 262144 against the fp64 reference
# (y, x + residual, mean, rstd), rms without bias / layer with bias, the residual on every
# other candidate, bf16 / fp16 / fp32, M = 1, 7, 1000 (130 at 262144). Select them with
# `-k cp_async`.

ASYNC_FWD_NS = [32768, 65536, 262144]


def _async_fwd_cases():
    from cuteforge.kernels.norm.config import async_fwd_candidates

    return _fwd_cases(async_fwd_candidates, ASYNC_FWD_NS, lambda i: (i % 2 == 1,))


@pytest.fixture(scope="module")
def _warm_norm_async_fwd():
    """Compile every cp_async forward case in parallel worker processes first."""
    _warm_fwd_cases(_async_fwd_cases())
    yield


@pytest.mark.parametrize("kind, dtype, n, cfg, res", _async_fwd_cases(),
                         ids=lambda v: repr(v).replace(" ", "") if not isinstance(v, str) else v)
def test_cp_async_fwd_candidates_match_torch(_warm_norm_async_fwd, kind, dtype, n, cfg, res):
    _check_fwd_rows(kind, dtype, n, cfg, res, (1, 7, 1000 if n < 262144 else 130))


def test_cp_async_fwd_partial_rounds_views_and_fp32_weight():
    """cp_async on one-CTA rows with a partial round (N = 4104: some threads own one vector
    fewer), many rows per CTA, a row-strided aligned view (cp_async) and a misaligned one
    (built without it), and an fp32 weight on bf16 x (8-byte vectors: built without it)."""
    from cuteforge.kernels.norm import NormConfig
    from cuteforge.ops import norm as impl

    for n, cfg in ((4104, NormConfig(256, 128, 1, 2, cp_async=2)), (4104, NormConfig(256, 64, 1, 2, cp_async=2)),
                   (65536, NormConfig(256, 256, 8, 1, exchange="mbar", cp_async=2))):
        for kind in KINDS:
            for wd in (torch.bfloat16, torch.float32):
                x, w, b, r = _inputs(301, n, torch.bfloat16, w_dtype=wd, bias=kind == "layer", res=True, seed=7)
                got = impl._forward(kind, x, w, b, r, 1e-5, cfg)
                _check_fwd(kind, x, w, b, r, 1e-5, got, torch.bfloat16, f"{kind} {n} {wd} {cfg}")
            base = torch.randn(9, n + 8, device="cuda", dtype=torch.bfloat16)
            w = torch.randn(n, device="cuda", dtype=torch.bfloat16)
            for xv in (base[:, :n], base[::2, 3:n + 3]):
                got = impl._forward(kind, xv, w, None, None, 1e-5, cfg)
                _check_fwd(kind, xv, w, None, None, 1e-5, got, torch.bfloat16, f"{kind} view {cfg}")


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_bwd_early_weight_matches_per_row_weight(kind, dtype):
    """early_weight in the register backward (the weight loaded once and held
    across the rows) gives the bits of the default, which reads it every row: dx, dweight
    and dbias, with and without partials (frozen weight), over row counts from one row to
    many rows per CTA group, ragged N (the padded tail) and the prefetching default."""
    from dataclasses import replace

    from cuteforge.kernels.norm.config import default_bwd_config
    from cuteforge.ops import norm as impl

    bits = 32 if dtype == torch.float32 else 16
    bias = kind == "layer"
    for n in (7, 1000, 1024, 4096):
        for need_dw in (True, False):
            # the persistent heuristic either way: its loop over rows is what early_weight
            # holds the weight across (the frozen default's row grid runs each CTA once)
            cfg = replace(default_bwd_config(n, bits, True), early_weight=False)
            if cfg.stages or cfg.reload:
                continue
            held = replace(cfg, early_weight=True)
            for m in (1, 7, 3000):
                x, w, b, _ = _inputs(m, n, dtype, bias=bias, seed=m + n)
                dy = torch.randn_like(x)
                _, _, mean, rstd = impl._forward(kind, x, w, b, None, 1e-5)
                base = impl._backward(kind, dy, x, w, mean, rstd, None, bias, cfg, need_dw)
                got = impl._backward(kind, dy, x, w, mean, rstd, None, bias, held, need_dw)
                for a, c, what in zip(base, got, ("dx", "dweight", "dbias")):
                    if a is None:
                        assert c is None, what
                        continue
                    assert torch.equal(a, c), f"{what} n={n} m={m} need_dw={need_dw} {cfg}"


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("dtype, n", [(torch.float32, 256), (torch.float32, 1000), (torch.float32, 1024),
                                      (torch.float32, 4096), (torch.bfloat16, 256), (torch.bfloat16, 1024),
                                      (torch.float16, 2048), (torch.bfloat16, 3000), (torch.bfloat16, 8192),
                                      (torch.float32, 8192), (torch.bfloat16, 262144), (torch.float16, 262144)])
def test_frozen_default_backward_matches_torch(kind, dtype, n):
    """The frozen-weight defaults (one CTA per row block on the row grid; the
    part ring at 16-bit N = 262144, 2-CTA staged clusters at fp32 8192) through autograd,
    weight and bias frozen, from one row to 40000 rows (more CTAs than fit the GPU at once:
    the block scheduler runs them in waves; 300 rows at N = 262144: more than the clusters'
    row slots), N ragged (1000, 3000: padded tails) or whole, against torch in fp32."""
    from cuteforge.kernels.norm.config import default_bwd_config

    bits = 32 if dtype == torch.float32 else 16
    cfg = default_bwd_config(n, bits, False)
    assert cfg != default_bwd_config(n, bits, True)  # these shapes have their own frozen default
    assert cfg.row_grid or cfg.stages
    for m in (1, 7, 300) if n > 65536 else (1, 7, 3001, 40000):
        _frozen_dx_case(kind, m, n, dtype, cfg)


def _frozen_dx_case(kind, m, n, dtype, cfg):
    """dx through autograd with the weight (and bias) frozen, against torch in fp32."""
    x, w, b, _ = _inputs(m, n, dtype, bias=kind == "layer", seed=m)
    dy = torch.randn_like(x)
    xl = x.clone().requires_grad_()
    y = ops.rms_norm(xl, w) if kind == "rms" else ops.layer_norm(xl, w, b)
    (dx,) = torch.autograd.grad(y, xl, dy)
    xr = x.float().requires_grad_()
    if kind == "rms":
        yr = torch.nn.functional.rms_norm(xr, (n,), w.float(), 1e-6)
    else:
        yr = torch.nn.functional.layer_norm(xr, (n,), w.float(), b.float(), 1e-5)
    (dxr,) = torch.autograd.grad(yr, xr, dy.float())
    tol = 1e-4 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(dx.float(), dxr, atol=tol * max(1.0, dxr.abs().max().item()), rtol=tol,
                               msg=lambda s: f"m={m} {cfg}: {s}")


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("dtype, n", [(torch.float32, 4104), (torch.float32, 4608), (torch.float32, 5000),
                                      (torch.float32, 5120), (torch.float32, 7168), (torch.float32, 8184),
                                      (torch.bfloat16, 4608), (torch.bfloat16, 5640), (torch.float16, 6144),
                                      (torch.bfloat16, 7168)])
def test_row_staged_backward_below_8192(kind, dtype, n):
    """fp32 rows of 4097..8191 take the row-staged backward (256 threads, 3
    stages) with partials (training: dx, dweight, dbias and the residual's gradient against
    fp64) and without (frozen weight: dx against torch); 16-bit rows of 5633..8191 with
    partials and 4097..8191 without (256 threads, 2 stages; 3 stages on 2 CTAs per
    SM with partials at 4097..5632). From one row to more rows than the persistent CTAs
    hold stages."""
    from cuteforge.kernels.norm.config import default_bwd_config

    bits = 32 if dtype == torch.float32 else 16
    assert default_bwd_config(n, bits, True, kind).stages == (3 if bits == 32 or n <= 5632 else 2)
    cfg = default_bwd_config(n, bits, False)
    assert cfg.stages == (3 if bits == 32 else 2) and cfg.threads == 256, cfg
    for m in (1, 7, 3001):
        _grad_case(kind, m, n, dtype, bias=True, res=m == 7)
        _frozen_dx_case(kind, m, n, dtype, cfg)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("dtype, n", [(torch.bfloat16, 768), (torch.bfloat16, 1280), (torch.float32, 1280),
                                      (torch.float16, 1152), (torch.bfloat16, 1283),
                                      (torch.bfloat16, 2056), (torch.bfloat16, 2560), (torch.float16, 2816),
                                      (torch.bfloat16, 3072), (torch.bfloat16, 3584), (torch.float32, 2304),
                                      (torch.float32, 2560), (torch.bfloat16, 2050), (torch.float16, 2815)])
def test_backward_defaults_between_2048_and_4096(kind, dtype, n):
    """16-bit rows of 2049..3584 with partials on the row-staged backward (128
    threads, 4 CTAs per SM), LayerNorm's register backward at 2049..3071 (fp32, and 16-bit
    rows that are not 16-byte aligned) and both norms' at 1025..1408 on 2 CTAs per SM with
    prefetch, 16-bit 768 with prefetch: training gradients against fp64, one row to more
    rows than the CTAs hold stages."""
    from cuteforge.kernels.norm.config import default_bwd_config

    bits = 32 if dtype == torch.float32 else 16
    cfg = default_bwd_config(n, bits, True, kind)
    assert cfg.stages == (0 if bits == 32 or n % 8 or n < 2049 else 3 if n < 3072 else 2), cfg
    for m in (1, 7, 3001):
        _grad_case(kind, m, n, dtype, bias=True, res=m == 7)
