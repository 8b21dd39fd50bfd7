"""cuteforge.jax on the CPU: the import contract, argument errors, and real sm_90a compiles
lowered into XLA custom calls (jax.export for the cuda platform needs no GPU), plus the
disk cache serving a second process. Numerics are checked on the GPU (tests/gpu/test_jax_gpu.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

SRC = str(Path(__file__).resolve().parents[1] / "src")


def _run(code: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    e = dict(os.environ)
    e["PYTHONPATH"] = SRC + os.pathsep + e.get("PYTHONPATH", "")
    e.update(env or {})
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, env=e,
                          timeout=300)


def test_import_cuteforge_does_not_import_jax():
    r = _run("""
        import sys, cuteforge, cuteforge.ops, cuteforge.kernels
        assert 'jax' not in sys.modules, 'cuteforge imported jax'
        assert 'cuteforge.jax' not in sys.modules
        print('ok')
    """)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "ok"


def test_import_without_jax_names_the_requirement():
    r = _run("""
        import sys
        sys.modules['jax'] = None   # as if JAX were not installed
        try:
            import cuteforge.jax
        except ImportError as e:
            print('ImportError:', e)
        else:
            print('imported')
    """)
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("ImportError:"), r.stdout
    assert "JAX >= 0.6" in r.stdout


# --------------------------------------------------------------------------- with JAX

try:
    import jax
    import jax.numpy as jnp

    import cuteforge.jax as cfj
except ImportError:  # the two tests above still run (and must pass) without JAX
    jax = jnp = cfj = None

needs_jax = pytest.mark.skipif(jax is None, reason="JAX is not installed (pip install jax)")


def _export(fn, *args):
    """Trace, compile the cuteforge kernels (sm_90a) and lower for CUDA; the module text."""
    import cutlass.jax as cj

    exp = jax.export.export(jax.jit(fn), platforms=["cuda"], disabled_checks=cj.get_export_disabled_safety_checks())
    return exp(*args).mlir_module()


def _calls(text: str) -> int:
    return text.count("stablehlo.custom_call @CuteDSLRT_NvJaxCutlassCall")


def _spec(shape, dtype):
    return jax.ShapeDtypeStruct(shape, dtype)


@needs_jax
def test_errors_name_the_argument():
    x = jnp.zeros((4, 8), jnp.float32)
    w = jnp.ones((8,), jnp.float32)
    with pytest.raises(TypeError, match="argument 'x' must be a jax.Array"):
        cfj.softmax([[1.0]])
    with pytest.raises(TypeError, match="argument 'x' has dtype int32"):
        cfj.softmax(jnp.zeros((4, 8), jnp.int32))
    with pytest.raises(ValueError, match="argument 'axis' must be the last axis"):
        cfj.log_softmax(x, axis=0)
    with pytest.raises(TypeError, match="argument 'axis' must be an int"):
        cfj.sum(x, axis=None)
    with pytest.raises(ValueError, match="argument 'x' must have at least 1 dim"):
        cfj.softmax(jnp.float32(1.0))
    with pytest.raises(ValueError, match="argument 'x' has a last dim of 300000"):
        cfj.softmax(jnp.zeros((1, 300000), jnp.float32))
    with pytest.raises(ValueError, match=r"argument 'weight' must have shape \(8,\)"):
        cfj.rms_norm(x, jnp.ones((4,), jnp.float32))
    with pytest.raises(TypeError, match="argument 'weight' has dtype float16"):
        cfj.rms_norm(x, jnp.ones((8,), jnp.float16))
    with pytest.raises(TypeError, match="argument 'bias' has dtype bfloat16 but 'weight' has float32"):
        cfj.layer_norm(jnp.zeros((4, 8), jnp.bfloat16), w, jnp.ones((8,), jnp.bfloat16))
    with pytest.raises(ValueError, match="argument 'residual' has shape"):
        cfj.rms_norm(x, w, residual=jnp.zeros((2, 8), jnp.float32))
    with pytest.raises(ValueError, match="argument 'eps' must be finite and >= 0"):
        cfj.layer_norm(x, w, None, -1.0)
    with pytest.raises(TypeError, match="argument 'eps' must be a float"):
        cfj.layer_norm(x, w, None, "1e-5")
    with pytest.raises(TypeError, match="argument 'keepdims' must be a bool"):
        cfj.sum(x, keepdims=1)
    with pytest.raises(ValueError, match="argument 'x' has an empty last axis"):
        cfj.amax(jnp.zeros((3, 0), jnp.float32))
    t = jnp.zeros((4,), jnp.int32)
    with pytest.raises(ValueError, match=r"argument 'target' must have shape \(4,\)"):
        cfj.cross_entropy(x, jnp.zeros((3,), jnp.int32))
    with pytest.raises(TypeError, match="argument 'target' must have an integer dtype"):
        cfj.cross_entropy(x, jnp.zeros((4,), jnp.float32))
    with pytest.raises(ValueError, match="argument 'reduction' must be one of"):
        cfj.cross_entropy(x, t, reduction="avg")
    with pytest.raises(ValueError, match="argument 'logits' must be 2-D"):
        cfj.cross_entropy(jnp.zeros((2, 2, 8), jnp.float32), t)
    with pytest.raises(TypeError, match="argument 'ignore_index' must be an int"):
        cfj.cross_entropy(x, t, ignore_index=1.5)


@needs_jax
def test_errors_inside_jit():
    """The checks run on tracers too, so a bad call fails at trace time naming the argument."""
    f = jax.jit(lambda x, w: cfj.rms_norm(x, w))
    with pytest.raises(ValueError, match="argument 'weight'"):
        f.trace(_spec((4, 8), jnp.float32), _spec((5,), jnp.float32))


@needs_jax
def test_empty_inputs_need_no_kernel():
    assert _calls(_export(cfj.softmax, _spec((0, 16), jnp.float32))) == 0
    out = jax.eval_shape(lambda x: cfj.sum(x, keepdims=True), _spec((3, 0), jnp.float32))
    assert out.shape == (3, 1)


@needs_jax
@pytest.mark.parametrize("dtype_name", ["float32", "bfloat16", "float16"])
def test_every_op_lowers_to_one_custom_call(dtype_name):
    dtype = jnp.dtype(dtype_name)
    n = 1000
    x = _spec((7, n), dtype)
    w = _spec((n,), dtype)
    b = _spec((n,), jnp.float32)
    assert _calls(_export(cfj.softmax, x)) == 1
    assert _calls(_export(cfj.log_softmax, _spec((2, 3, n), dtype))) == 1
    assert _calls(_export(lambda x: cfj.sum(x, keepdims=True), x)) == 1
    for op in (cfj.mean, cfj.amax, cfj.amin):
        assert _calls(_export(op, x)) == 1
    assert _calls(_export(lambda x, w: cfj.rms_norm(x, w, 1e-6), x, w)) == 1
    assert _calls(_export(lambda x, w, r: cfj.rms_norm(x, w, residual=r), x, w, x)) == 1
    assert _calls(_export(lambda x, w, b: cfj.layer_norm(x, w.astype(jnp.float32), b), x, w, b)) == 1
    assert _calls(_export(lambda x, t: cfj.cross_entropy(x, t), x, _spec((7,), jnp.int32))) == 1


@needs_jax
def test_gradient_uses_the_backward_kernel():
    x = _spec((7, 1000), jnp.float32)
    text = _export(jax.grad(lambda x: (cfj.softmax(x) * 2.0).sum()), x)
    assert _calls(text) == 2  # forward + backward kernels, no XLA softmax


@needs_jax
def test_shapes_and_dtypes_under_eval_shape():
    x = _spec((2, 5, 7), jnp.bfloat16)
    assert jax.eval_shape(cfj.softmax, x).shape == (2, 5, 7)
    assert jax.eval_shape(cfj.sum, x).shape == (2, 5)
    y, h = jax.eval_shape(lambda x, w, r: cfj.rms_norm(x, w, residual=r), x, _spec((7,), jnp.float32), x)
    assert y.shape == h.shape == (2, 5, 7) and y.dtype == jnp.bfloat16
    assert jax.eval_shape(lambda x, t: cfj.cross_entropy(x, t, reduction="none"), _spec((5, 7), jnp.float16),
                          _spec((5,), jnp.int32)).dtype == jnp.float32


@needs_jax
def test_dynamic_m_reuses_the_object_and_a_second_process_loads_it(tmp_path):
    """One compiled object per (dtype, N, config): a new M is a hit; the entry on disk
    serves another process with 0 compiles (the same cache as the torch ops)."""
    env = {"CUTEFORGE_CACHE_DIR": str(tmp_path / "cache")}
    code = """
        import json, jax, jax.numpy as jnp, cutlass.jax as cj
        import cuteforge.jax as cfj
        def lower(m):
            f = jax.jit(lambda x: cfj.softmax(x))
            return jax.export.export(f, platforms=["cuda"], disabled_checks=cj.get_export_disabled_safety_checks())(
                jax.ShapeDtypeStruct((m, 4096), jnp.bfloat16)).mlir_module()
        a, b = lower(100), lower(101)
        s = cfj.compile_stats()
        print(json.dumps({"compiles": s["compiles"], "l2_loads": s["l2_loads"], "same": a.split("module = ")[1][:64] == b.split("module = ")[1][:64]}))
    """
    first = _run(code, env)
    assert first.returncode == 0, first.stderr[-3000:]
    s1 = json.loads(first.stdout.strip().splitlines()[-1])
    assert s1["compiles"] == 1 and s1["same"], s1
    entries = list((tmp_path / "cache").glob("*/softmax_fwd.jax/*.o"))
    assert len(entries) == 1 and entries[0].read_bytes()[:4] == b"\x7fELF"
    meta = json.loads(entries[0].with_suffix(".json").read_text())
    assert meta["kernel"] == "softmax_fwd.jax" and "sm_90a" in meta["key"]
    second = _run(code, env)
    assert second.returncode == 0, second.stderr[-3000:]
    s2 = json.loads(second.stdout.strip().splitlines()[-1])
    assert s2["compiles"] == 0 and s2["l2_loads"] == 1, s2


@needs_jax
def test_corrupt_entry_is_quarantined_and_recompiled(tmp_path, monkeypatch):
    monkeypatch.setenv("CUTEFORGE_CACHE_DIR", str(tmp_path / "c"))
    x = _spec((3, 512), jnp.float16)
    _export(cfj.amax, x)
    (obj,) = list((tmp_path / "c").glob("*/row_reduce.jax/*.o"))
    obj.write_bytes(obj.read_bytes()[:100])
    cfj._L1.clear()
    before = cfj.compile_stats()["compiles"]
    with pytest.warns(UserWarning, match="corrupt"):
        assert _calls(_export(lambda x: cfj.amax(x), x)) == 1  # a new function: jax retraces
    assert cfj.compile_stats()["compiles"] == before + 1
    assert list((tmp_path / "c" / "quarantine").iterdir())
