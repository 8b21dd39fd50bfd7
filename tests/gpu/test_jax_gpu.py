"""cuteforge.jax on the GPU, inside jax.jit: every op against jax.nn / a jnp reference over
odd shapes and float32/bfloat16/float16 (bfloat16/float16 for gemm), gradients (jax.grad)
of softmax/log_softmax, the norms, cross-entropy and gemm against jax.grad of the
reference, vmap, and a second process that loads the compiled objects from the disk cache
(0 compiles)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")  # share the GPU with torch

pytestmark = pytest.mark.gpu

jax = pytest.importorskip("jax")
jnp = pytest.importorskip("jax.numpy")


def _jax_gpu() -> bool:
    try:
        return jax.devices()[0].platform == "gpu"
    except RuntimeError:
        return False


if not _jax_gpu():
    pytest.skip("JAX has no CUDA device here", allow_module_level=True)

cfj = pytest.importorskip("cuteforge.jax")

SIZES = [1, 7, 1000, 65537]
SHAPES = [(m, n) for m in SIZES for n in SIZES if m * n <= 1000 * 65537]
DTYPES = [jnp.float32, jnp.bfloat16, jnp.float16]
TOL = {jnp.float32: (2e-5, 2e-5), jnp.bfloat16: (2e-2, 2e-2), jnp.float16: (2e-3, 5e-3)}  # (atol, rtol)


def _x(shape, dtype, seed=0, scale=3.0):
    return (jax.random.normal(jax.random.PRNGKey(seed), shape, jnp.float32) * scale).astype(dtype)


def _close(out, ref, dtype, scale=1.0, tol=None):
    atol, rtol = tol or TOL[dtype]
    out = jnp.asarray(out, jnp.float32)
    ref = jnp.asarray(ref, jnp.float32).astype(dtype).astype(jnp.float32)  # the reference rounded like the op
    assert out.shape == ref.shape
    err = jnp.abs(out - ref)
    bound = atol * scale + rtol * jnp.abs(ref)
    worst = float(jnp.max(err - bound)) if err.size else 0.0
    assert worst <= 0, f"max error {float(jnp.max(err)):.3g} exceeds tolerance (atol {atol * scale:.3g}, rtol {rtol})"
    assert bool(jnp.all(jnp.isfinite(out) == jnp.isfinite(ref)))


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: jnp.dtype(d).name)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("mode", ["softmax", "log_softmax"])
def test_softmax_vs_jax_nn(mode, shape, dtype):
    x = _x(shape, dtype)
    ours = jax.jit(getattr(cfj, mode))(x)
    ref = getattr(jax.nn, mode)(x.astype(jnp.float32), axis=-1)
    assert ours.dtype == dtype
    _close(ours, ref, dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: jnp.dtype(d).name)
@pytest.mark.parametrize("mode", ["softmax", "log_softmax"])
@pytest.mark.parametrize("shape", [(7, 1000), (1000, 7), (3, 65537)], ids=str)
def test_softmax_grad(mode, shape, dtype):
    x = _x(shape, dtype, 1)
    g = _x(shape, jnp.float32, 2, 1.0)

    def loss(f):
        return lambda x: jnp.sum(f(x).astype(jnp.float32) * g)

    ours = jax.jit(jax.grad(loss(getattr(cfj, mode))))(x)
    ref = jax.grad(loss(lambda v: getattr(jax.nn, mode)(v.astype(jnp.float32)).astype(dtype)))(x)
    _close(ours, ref.astype(jnp.float32), dtype, scale=4.0)


def test_softmax_nd_vmap_and_composition():
    x = _x((2, 3, 1000), jnp.float32)
    _close(jax.jit(cfj.softmax)(x), jax.nn.softmax(x), jnp.float32)
    _close(jax.vmap(cfj.log_softmax)(x), jax.nn.log_softmax(x), jnp.float32)
    w = _x((1000,), jnp.float32, 3, 1.0)

    @jax.jit
    def f(x, w):
        return cfj.sum(cfj.rms_norm(cfj.softmax(x), w, 1e-6))

    p = jax.nn.softmax(x)
    ref = jnp.sum(p * jax.lax.rsqrt(jnp.mean(p * p, -1, keepdims=True) + 1e-6) * w, -1)
    for _ in range(3):  # repeated calls of one executable (XLA may replay a command buffer)
        _close(f(x, w), ref, jnp.float32, scale=10.0)


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: jnp.dtype(d).name)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_sum_vs_jnp(shape, dtype):
    x = _x(shape, dtype, 4, 1.0)
    ours = jax.jit(cfj.sum)(x)
    ref = jnp.sum(x.astype(jnp.float32), -1)
    _close(ours, ref, dtype, scale=float(jnp.sqrt(shape[1])) * 2)


@pytest.mark.parametrize("op", ["mean", "amax", "amin"])
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: jnp.dtype(d).name)
@pytest.mark.parametrize("shape", [(7, 1000), (1000, 7), (1, 65537)], ids=str)
def test_other_reductions(op, shape, dtype):
    x = _x(shape, dtype, 5, 1.0)
    ours = jax.jit(lambda v: getattr(cfj, op)(v, keepdims=True))(x)
    ref = getattr(jnp, {"mean": "mean", "amax": "max", "amin": "min"}[op])(x.astype(jnp.float32), -1, keepdims=True)
    _close(ours, ref, dtype)


def _ref_norm(kind, x, w, b, eps):
    x = x.astype(jnp.float32)
    if kind == "rms":
        y = x * jax.lax.rsqrt(jnp.mean(x * x, -1, keepdims=True) + eps)
    else:
        mu = jnp.mean(x, -1, keepdims=True)
        y = (x - mu) * jax.lax.rsqrt(jnp.mean((x - mu) ** 2, -1, keepdims=True) + eps)
    y = y * w.astype(jnp.float32)
    return y if b is None else y + b.astype(jnp.float32)


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: jnp.dtype(d).name)
@pytest.mark.parametrize("shape", [(m, n) for m in (1, 7, 1000) for n in SIZES], ids=str)
@pytest.mark.parametrize("kind", ["rms", "layer"])
def test_norm_vs_jnp(kind, shape, dtype):
    n = shape[1]
    x = _x(shape, dtype, 6, 2.0)
    w = _x((n,), dtype, 7, 1.0)
    b = _x((n,), dtype, 8, 1.0) if kind == "layer" else None
    if kind == "rms":
        ours = jax.jit(lambda x, w: cfj.rms_norm(x, w, 1e-6))(x, w)
    else:
        ours = jax.jit(lambda x, w, b: cfj.layer_norm(x, w, b, 1e-5))(x, w, b)
    _close(ours, _ref_norm(kind, x, w, b, 1e-6 if kind == "rms" else 1e-5), dtype, scale=4.0)


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: jnp.dtype(d).name)
@pytest.mark.parametrize("kind", ["rms", "layer"])
def test_norm_residual_fp32_weight(kind, dtype):
    shape = (1000, 4096)
    x, r = _x(shape, dtype, 9, 1.0), _x(shape, dtype, 10, 1.0)
    w = _x((4096,), jnp.float32, 11, 1.0)
    f = (lambda x, w, r: cfj.rms_norm(x, w, residual=r)) if kind == "rms" else (
        lambda x, w, r: cfj.layer_norm(x, w, None, 1e-5, residual=r))
    y, h = jax.jit(f)(x, w, r)
    h_ref = (x.astype(jnp.float32) + r.astype(jnp.float32)).astype(dtype)
    _close(h, h_ref, dtype)
    _close(y, _ref_norm(kind, h_ref, w, None, 1e-6 if kind == "rms" else 1e-5), dtype, scale=4.0)


def _ref_ce(x, t, ignore_index):
    x = x.astype(jnp.float32)
    lse = jax.nn.logsumexp(x, -1)
    picked = jnp.take_along_axis(x, jnp.clip(t, 0, x.shape[1] - 1)[:, None], -1)[:, 0]
    return jnp.where(t == ignore_index, 0.0, lse - picked)


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: jnp.dtype(d).name)
@pytest.mark.parametrize("shape", [(m, n) for m in (1, 7, 1000) for n in (7, 1000, 65537)], ids=str)
def test_cross_entropy_vs_jnp(shape, dtype):
    m, n = shape
    x = _x(shape, dtype, 12)
    t = jax.random.randint(jax.random.PRNGKey(13), (m,), 0, n, jnp.int32)
    t = t.at[::3].set(-100)  # ignored rows
    ref = _ref_ce(x, t, -100)
    none = jax.jit(lambda x, t: cfj.cross_entropy(x, t, reduction="none"))(x, t)
    assert none.dtype == jnp.float32
    _close(none, ref, jnp.float32, scale=10.0)
    total = jax.jit(lambda x, t: cfj.cross_entropy(x, t, reduction="sum"))(x, t)
    assert abs(float(total) - float(jnp.sum(ref))) <= 1e-3 * (1 + abs(float(jnp.sum(ref))))
    mean = jax.jit(lambda x, t: cfj.cross_entropy(x, t))(x, t)
    kept = int(jnp.sum(t != -100))
    if kept:
        assert abs(float(mean) - float(jnp.sum(ref)) / kept) <= 1e-3 * (1 + abs(float(jnp.sum(ref)) / kept))
    else:
        assert jnp.isnan(mean)


def test_second_process_loads_from_the_cache():
    """A kernel compiled once is not compiled again by a later process."""
    x = _x((64, 1000), jnp.float32)
    _close(jax.jit(lambda v: cfj.softmax(v))(x), jax.nn.softmax(x), jnp.float32)
    a, b = _x((64, 1000), jnp.bfloat16, 1, 1.0), _x((1000, 64), jnp.bfloat16, 2, 1.0)
    _close(jax.jit(cfj.gemm)(a, b), _mm(a, b), jnp.bfloat16, scale=32.0)
    code = textwrap.dedent("""
        import json, jax, jax.numpy as jnp
        import cuteforge.jax as cfj
        x = (jax.random.normal(jax.random.PRNGKey(0), (64, 1000)) * 3.0).astype(jnp.float32)
        y = jax.jit(cfj.softmax)(x)
        err = float(jnp.max(jnp.abs(y - jax.nn.softmax(x))))
        a = jax.random.normal(jax.random.PRNGKey(1), (64, 1000)).astype(jnp.bfloat16)
        b = jax.random.normal(jax.random.PRNGKey(2), (1000, 64)).astype(jnp.bfloat16)
        c = jax.jit(cfj.gemm)(a, b).astype(jnp.float32)
        ref = jnp.matmul(a.astype(jnp.float32), b.astype(jnp.float32), precision=jax.lax.Precision.HIGHEST)
        gemm_err = float(jnp.max(jnp.abs(c - ref) / (1.0 + jnp.abs(ref))))
        s = cfj.compile_stats()
        print(json.dumps({"compiles": s["compiles"], "l2_loads": s["l2_loads"], "err": err, "gemm_err": gemm_err}))
    """)
    env = dict(os.environ)
    env["PYTHONPATH"] = str(Path(__file__).resolve().parents[2] / "src") + os.pathsep + env.get("PYTHONPATH", "")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    s = json.loads(r.stdout.strip().splitlines()[-1])
    print("second process:", s)
    assert s["compiles"] == 0 and s["l2_loads"] >= 2, s
    assert s["err"] < 1e-5 and s["gemm_err"] < 2e-2, s


# --------------------------------------------------------------------------- backward passes


def _mm(a, b):
    """fp32 reference matmul (HIGHEST: no TF32 on the GPU)."""
    return jnp.matmul(a.astype(jnp.float32), b.astype(jnp.float32), precision=jax.lax.Precision.HIGHEST)


GTOL = {jnp.float32: 1e-4, jnp.bfloat16: 1.6e-2, jnp.float16: 2e-3}


def _close_grad(got, ref, dtype, what):
    """As tests/gpu/test_norm_gpu.py: rtol = tol, atol = tol * max(1, max |ref|)."""
    tol = GTOL[jnp.dtype(dtype).type]
    got = jnp.asarray(got, jnp.float32)
    ref = jnp.asarray(ref, jnp.float32)
    assert got.shape == ref.shape, (what, got.shape, ref.shape)
    if not ref.size:
        return
    atol = tol * max(1.0, float(jnp.max(jnp.abs(ref))))
    excess = float(jnp.max(jnp.abs(got - ref) - (atol + tol * jnp.abs(ref))))
    assert excess <= 0, f"{what}: max error {float(jnp.max(jnp.abs(got - ref))):.3g} (atol {atol:.3g}, rtol {tol})"
    assert bool(jnp.all(jnp.isfinite(got))), what


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: jnp.dtype(d).name)
@pytest.mark.parametrize("shape", [(m, n) for m in (1, 7, 1000) for n in (7, 1000, 65537)], ids=str)
@pytest.mark.parametrize("kind", ["rms", "layer"])
def test_norm_grad(kind, shape, dtype):
    """dx, dweight (and dbias for layer_norm) from norm_bwd vs jax.grad of the reference."""
    m, n = shape
    x = _x(shape, dtype, 20, 2.0)
    w = _x((n,), dtype, 21, 1.0)
    b = _x((n,), dtype, 22, 1.0) if kind == "layer" else None
    gy = _x(shape, jnp.float32, 23, 1.0)
    eps = 1e-6 if kind == "rms" else 1e-5

    def ours(x, w, b):
        y = cfj.rms_norm(x, w, eps) if kind == "rms" else cfj.layer_norm(x, w, b, eps)
        return jnp.sum(y.astype(jnp.float32) * gy)

    def ref(x, w, b):
        return jnp.sum(_ref_norm(kind, x, w, b, eps).astype(dtype).astype(jnp.float32) * gy)

    argnums = (0, 1) if b is None else (0, 1, 2)
    got = jax.jit(jax.grad(ours, argnums))(x, w, b)
    want = jax.grad(ref, argnums)(x, w, b)
    for name, g_, r_ in zip(("dx", "dweight", "dbias"), got, want):
        assert g_.dtype == dtype, name
        _close_grad(g_, r_, dtype, name)


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: jnp.dtype(d).name)
@pytest.mark.parametrize("kind", ["rms", "layer"])
def test_norm_grad_residual_fp32_weight(kind, dtype):
    """Fused residual (its gradient is dx; dsum = the cotangent of x + residual) and an
    fp32 weight / bias with 16-bit x."""
    shape, n = (1000, 4096), 4096
    x, r = _x(shape, dtype, 24, 1.0), _x(shape, dtype, 25, 1.0)
    w = _x((n,), jnp.float32, 26, 1.0)
    b = _x((n,), jnp.float32, 27, 1.0) if kind == "layer" else None
    gy, gh = _x(shape, jnp.float32, 28, 1.0), _x(shape, jnp.float32, 29, 1.0)
    eps = 1e-6 if kind == "rms" else 1e-5

    def ours(x, w, b, r):
        y, h = cfj.rms_norm(x, w, eps, residual=r) if kind == "rms" else cfj.layer_norm(x, w, b, eps, residual=r)
        return jnp.sum(y.astype(jnp.float32) * gy) + jnp.sum(h.astype(jnp.float32) * gh)

    def ref(x, w, b, r):
        h = (x.astype(jnp.float32) + r.astype(jnp.float32)).astype(dtype)
        y = _ref_norm(kind, h, w, b, eps).astype(dtype)
        return jnp.sum(y.astype(jnp.float32) * gy) + jnp.sum(h.astype(jnp.float32) * gh)

    argnums = (0, 1, 3) if b is None else (0, 1, 2, 3)
    got = jax.jit(jax.grad(ours, argnums))(x, w, b, r)
    want = jax.grad(ref, argnums)(x, w, b, r)
    names = ("dx", "dweight", "dresidual") if b is None else ("dx", "dweight", "dbias", "dresidual")
    for name, g_, r_ in zip(names, got, want):
        _close_grad(g_, r_, dtype, name)


CE_GRAD_CASES = [((m, n), ("mean", "sum", "none")[i % 3])
                 for i, (m, n) in enumerate((m, n) for m in (1, 7, 1000) for n in (7, 1000, 65537))]


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: jnp.dtype(d).name)
@pytest.mark.parametrize(("shape", "reduction"), CE_GRAD_CASES, ids=str)
def test_cross_entropy_grad(shape, reduction, dtype):
    """dlogits from cross_entropy_bwd (ignored rows: zeros) vs jax.grad of the reference;
    each reduction on three of the nine shapes."""
    m, n = shape
    x = _x(shape, dtype, 30)
    t = jax.random.randint(jax.random.PRNGKey(31), (m,), 0, n, jnp.int32)
    t = t.at[1::3].set(-100)  # ignored rows (row 0 kept, so the mean is defined)
    g = _x((m,), jnp.float32, 32, 1.0)

    def wrap(fn):
        def f(x):
            v = fn(x)
            return jnp.sum(v * g) if reduction == "none" else v * 2.0
        return f

    def ref(x):
        per = _ref_ce(x, t, -100)
        if reduction == "none":
            return per
        return jnp.sum(per) if reduction == "sum" else jnp.sum(per) / jnp.sum(t != -100)

    got = jax.jit(jax.grad(wrap(lambda v: cfj.cross_entropy(v, t, reduction=reduction))))(x)
    want = jax.grad(wrap(ref))(x)
    assert got.dtype == dtype
    _close_grad(got, want, dtype, "dlogits")
    if m > 1:
        assert float(jnp.max(jnp.abs(got[1::3].astype(jnp.float32)))) == 0.0  # ignored rows


# --------------------------------------------------------------------------- gemm

GEMM_DTYPES = [jnp.bfloat16, jnp.float16]
# (M, K, N): K = 7 and N = 7 / 65537 are not 16-byte rows (padded to 8 by the op)
GEMM_SHAPES = [(m, k, n) for m in (1, 7, 1000) for k in (7, 1000) for n in (7, 1000, 65537)]


@pytest.mark.parametrize("dtype", GEMM_DTYPES, ids=lambda d: jnp.dtype(d).name)
@pytest.mark.parametrize("mkn", GEMM_SHAPES, ids=str)
def test_gemm_vs_jnp(mkn, dtype):
    m, k, n = mkn
    a, b = _x((m, k), dtype, 40, 1.0), _x((k, n), dtype, 41, 1.0)
    ours = jax.jit(cfj.gemm)(a, b)
    assert ours.dtype == dtype and ours.shape == (m, n)
    _close(ours, _mm(a, b), dtype, scale=float(k) ** 0.5)


@pytest.mark.parametrize("out_dtype", [jnp.float32, jnp.bfloat16], ids=lambda d: jnp.dtype(d).name)
@pytest.mark.parametrize("epilogue", [None, "relu", "gelu", "silu"])
@pytest.mark.parametrize("bias_dtype", [None, jnp.float32, jnp.bfloat16],
                         ids=lambda d: "no_bias" if d is None else f"bias_{jnp.dtype(d).name}")
def test_gemm_epilogues(bias_dtype, epilogue, out_dtype):
    m, k, n = 1000, 520, 1000
    a, b = _x((m, k), jnp.float16, 42, 1.0), _x((k, n), jnp.float16, 43, 1.0)
    bias = None if bias_dtype is None else _x((n,), bias_dtype, 44, 1.0)
    ours = jax.jit(lambda a, b, c: cfj.gemm(a, b, bias=c, epilogue=epilogue, out_dtype=out_dtype))(a, b, bias)
    assert ours.dtype == out_dtype
    z = _mm(a, b) + (0.0 if bias is None else bias.astype(jnp.float32))
    ref = {None: lambda v: v, "relu": jax.nn.relu, "gelu": lambda v: jax.nn.gelu(v, approximate=True),
           "silu": jax.nn.silu}[epilogue](z)
    # tanh.approx.f32 in gelu/silu (~2^-11 relative): fp32 output gets the fp16 tolerance there
    tol = TOL[jnp.float16] if out_dtype == jnp.float32 and epilogue in ("gelu", "silu") else None
    _close(ours, ref, out_dtype, scale=float(k) ** 0.5, tol=tol)


@pytest.mark.parametrize(("a_shape", "b_shape"), [((3, 7, 1000), (1000, 7)), ((3, 7, 64), (3, 64, 1000)),
                                                  ((7, 64), (3, 64, 24)), ((2, 1000, 13), (2, 13, 65537))], ids=str)
def test_gemm_batched(a_shape, b_shape):
    a, b = _x(a_shape, jnp.float16, 45, 1.0), _x(b_shape, jnp.float16, 46, 1.0)
    ours = jax.jit(cfj.gemm)(a, b)
    _close(ours, _mm(a, b), jnp.float16, scale=float(a_shape[-1]) ** 0.5)


def test_gemm_empty_and_vmap():
    a, b = jnp.zeros((4, 0), jnp.bfloat16), jnp.zeros((0, 8), jnp.bfloat16)
    bias = jnp.ones((8,), jnp.float32)
    out = jax.jit(lambda a, b, c: cfj.gemm(a, b, bias=c, epilogue="relu"))(a, b, bias)
    assert out.shape == (4, 8) and bool(jnp.all(out == 1.0))
    assert jax.jit(cfj.gemm)(jnp.zeros((0, 16), jnp.bfloat16), jnp.zeros((16, 8), jnp.bfloat16)).shape == (0, 8)
    x, w = _x((3, 7, 64), jnp.bfloat16, 47, 1.0), _x((64, 24), jnp.bfloat16, 48, 1.0)
    _close(jax.vmap(lambda v: cfj.gemm(v, w))(x), _mm(x, w), jnp.bfloat16, scale=8.0)


@pytest.mark.parametrize("dtype", GEMM_DTYPES, ids=lambda d: jnp.dtype(d).name)
@pytest.mark.parametrize("mkn", [(7, 1000, 7), (1000, 7, 1000), (1, 64, 65537), (1000, 520, 1000)], ids=str)
@pytest.mark.parametrize("epilogue", [None, "gelu"])
def test_gemm_grad(epilogue, mkn, dtype):
    """dA, dB (two kernel GEMMs) and dbias vs jax.grad of the fp32 reference."""
    m, k, n = mkn
    a, b = _x((m, k), dtype, 50, 1.0), _x((k, n), dtype, 51, 1.0)
    bias = _x((n,), jnp.float32, 52, 1.0) if epilogue else None
    g = _x((m, n), jnp.float32, 53, 1.0)

    def ours(a, b, bias):
        return jnp.sum(cfj.gemm(a, b, bias=bias, epilogue=epilogue).astype(jnp.float32) * g)

    def ref(a, b, bias):
        z = _mm(a, b) + (0.0 if bias is None else bias)
        y = jax.nn.gelu(z, approximate=True) if epilogue else z
        return jnp.sum(y.astype(dtype).astype(jnp.float32) * g)

    argnums = (0, 1, 2) if bias is not None else (0, 1)
    got = jax.jit(jax.grad(ours, argnums))(a, b, bias)
    want = jax.grad(ref, argnums)(a, b, bias)
    for name, g_, r_, leaf in zip(("da", "db", "dbias"), got, want, (a, b, bias)):
        assert g_.dtype == leaf.dtype and g_.shape == leaf.shape, name
        _close_grad(g_, r_, dtype, name)


def test_gemm_grad_batched_and_second_order():
    a, b = _x((2, 7, 64), jnp.bfloat16, 54, 1.0), _x((2, 64, 1000), jnp.bfloat16, 55, 1.0)
    g = _x((2, 7, 1000), jnp.float32, 56, 1.0)
    got = jax.jit(jax.grad(lambda a, b: jnp.sum(cfj.gemm(a, b).astype(jnp.float32) * g), (0, 1)))(a, b)
    want = jax.grad(lambda a, b: jnp.sum(_mm(a, b).astype(jnp.bfloat16).astype(jnp.float32) * g), (0, 1))(a, b)
    for name, g_, r_ in zip(("da", "db"), got, want):
        _close_grad(g_, r_, jnp.bfloat16, name)
    # the backward is itself made of the differentiable gemm: a Hessian-vector product
    # (reverse over reverse; a custom_vjp has no forward mode) works
    a2, b2 = _x((8, 16), jnp.bfloat16, 57, 1.0), _x((16, 8), jnp.bfloat16, 58, 1.0)

    def hvp(f):
        return lambda a, v: jax.grad(lambda x: jnp.vdot(jax.grad(f)(x).astype(jnp.float32), v.astype(jnp.float32)))(a)

    def f(a):
        return jnp.sum(cfj.gemm(a, b2).astype(jnp.float32) ** 2)

    def f_ref(a):
        return jnp.sum(_mm(a, b2).astype(jnp.bfloat16).astype(jnp.float32) ** 2)

    _close_grad(jax.jit(hvp(f))(a2, a2), hvp(f_ref)(a2, a2), jnp.bfloat16, "hvp")
