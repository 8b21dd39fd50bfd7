"""cuteforge.jax on the GPU, inside jax.jit: every op against jax.nn / a jnp reference over
odd shapes and float32/bfloat16/float16, gradients of softmax/log_softmax, vmap, and a
second process that loads the compiled objects from the disk cache (0 compiles)."""

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


def _close(out, ref, dtype, scale=1.0):
    atol, rtol = TOL[dtype]
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
    code = textwrap.dedent("""
        import json, jax, jax.numpy as jnp
        import cuteforge.jax as cfj
        x = (jax.random.normal(jax.random.PRNGKey(0), (64, 1000)) * 3.0).astype(jnp.float32)
        y = jax.jit(cfj.softmax)(x)
        err = float(jnp.max(jnp.abs(y - jax.nn.softmax(x))))
        s = cfj.compile_stats()
        print(json.dumps({"compiles": s["compiles"], "l2_loads": s["l2_loads"], "err": err}))
    """)
    env = dict(os.environ)
    env["PYTHONPATH"] = str(Path(__file__).resolve().parents[2] / "src") + os.pathsep + env.get("PYTHONPATH", "")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    s = json.loads(r.stdout.strip().splitlines()[-1])
    print("second process:", s)
    assert s["compiles"] == 0 and s["l2_loads"] >= 1, s
    assert s["err"] < 1e-5, s
