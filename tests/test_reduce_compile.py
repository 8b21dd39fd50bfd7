"""CPU-only checks of the row-reduce kernels: config validation and sm_90a compiles.

``CUTE_DSL_ARCH=sm_90a`` makes ``cute.compile`` run the full pipeline (MLIR ->
PTX -> CUBIN via the bundled ptxas) without a GPU, so codegen errors and
missing vectorisation are caught here; numerics are checked on the GPU.
"""

from __future__ import annotations

import os
import re

import pytest

from cuteforge.kernels.reduce import (
    OPS,
    RowReduceConfig,
    candidate_configs,
    default_config,
)

# --------------------------------------------------------------------------- configs

_NS = [1, 7, 32, 100, 1000, 1024, 4096, 16384, 65536, 65537, 262144]


@pytest.mark.parametrize(
    "cfg, match",
    [
        (RowReduceConfig(threads=48, threads_per_row=16), "multiple of 32"),
        (RowReduceConfig(threads=2048, threads_per_row=256), "multiple of 32 in"),
        (RowReduceConfig(threads=0, threads_per_row=1), "multiple of 32"),
        (RowReduceConfig(threads=256, threads_per_row=3), "power of 2"),
        (RowReduceConfig(threads=256, threads_per_row=512), "power of 2 and <= threads"),
        (RowReduceConfig(threads=96, threads_per_row=64), "must divide"),
        (RowReduceConfig(threads=256, threads_per_row=256, unroll=0), "unroll"),
        (RowReduceConfig(threads=256, threads_per_row=256, unroll=17), "unroll"),
        (RowReduceConfig(threads=1024, threads_per_row=1024, unroll=16), "registers"),
        (RowReduceConfig(threads=256, threads_per_row=256, cluster_n=3), "cluster_n"),
        (RowReduceConfig(threads=256, threads_per_row=256, cluster_n=16), "cluster_n"),
        (RowReduceConfig(threads=256, threads_per_row=256, cluster_n=8), "needs n >="),
    ],
)
def test_validate_rejects(cfg, match):
    with pytest.raises(ValueError, match=match):
        cfg.validate(4096, 32)


def test_validate_rejects_bad_problem():
    cfg = RowReduceConfig()
    with pytest.raises(ValueError, match="n must be"):
        cfg.validate(0, 32)
    with pytest.raises(ValueError, match="dtype_bits"):
        cfg.validate(4096, 8)


def test_config_is_hashable_and_frozen():
    a, b = RowReduceConfig(256, 64, 4), RowReduceConfig(256, 64, 4)
    assert a == b and hash(a) == hash(b) and len({a, b}) == 1
    with pytest.raises(AttributeError):
        a.threads = 128  # type: ignore[misc]


@pytest.mark.parametrize("bits", [16, 32])
@pytest.mark.parametrize("n", _NS)
def test_default_and_candidates_valid(n, bits):
    d = default_config(n, bits)
    d.validate(n, bits)
    cands = candidate_configs(n, bits)
    assert 1 <= len(cands) <= 8
    assert cands[0] == d
    assert len(set(cands)) == len(cands)
    for c in cands:
        c.validate(n, bits)


def test_default_config_cluster_hint():
    # few very long rows: the optional row-count hint turns on a cluster split
    c = default_config(262144, 32, m=16)
    assert c.cluster_n > 1
    c.validate(262144, 32)
    assert default_config(262144, 32, m=100000).cluster_n == 1


# --------------------------------------------------------------------------- compiles


@pytest.fixture(scope="module")
def compiler(tmp_path_factory):
    mp = pytest.MonkeyPatch()
    mp.setenv("CUTE_DSL_ARCH", "sm_90a")
    dump_dir = tmp_path_factory.mktemp("ptx")  # --keep-ptx writes a .ptx file there
    import cutlass
    import cutlass.cute as cute

    from cuteforge.kernels.reduce import make_row_reduce

    dtypes = {"f32": cutlass.Float32, "bf16": cutlass.BFloat16, "f16": cutlass.Float16}

    def compile_(op, dt, n, vec, cfg=None):
        in_dtype = dtypes[dt]
        out_dtype = cutlass.Int64 if op == "argmax" else in_dtype
        if cfg is None:
            cfg = default_config(n, in_dtype.width)
        m = cute.sym_int()
        x = cute.runtime.make_fake_tensor(
            in_dtype,
            (m, n),
            (cute.sym_int64(divisibility=vec), 1),
            assumed_align=vec * in_dtype.width // 8,
        )
        out = cute.runtime.make_fake_compact_tensor(out_dtype, (m,))
        stream = cute.runtime.make_fake_stream(use_tvm_ffi_env_stream=True)
        fn = make_row_reduce(op, in_dtype, out_dtype, n, vec, cfg)
        return cute.compile(
            fn, x, out, stream, options=f"--enable-tvm-ffi --keep-ptx --dump-dir={dump_dir}"
        )

    yield compile_
    mp.undo()


def _check_ptx(compiled, vec_bytes=None):
    assert compiled is not None
    ptx = compiled.__ptx__
    assert isinstance(ptx, str) and ".entry" in ptx and "sm_90a" in ptx
    if vec_bytes == 16:
        assert re.search(r"ld\.global[.a-zA-Z0-9:_]*\.v4\.", ptx)
    return ptx


# (op, dtype, n, vec): every op and dtype, odd N (tails), vec=1 and vec=max
_CASES = [
    ("sum", "f32", 4096, 4),
    ("sum", "bf16", 1000, 8),
    ("sum", "f16", 7, 1),
    ("mean", "f32", 65537, 4),
    ("mean", "bf16", 33, 1),
    ("amax", "f32", 1, 1),
    ("amax", "f16", 4104, 8),
    ("amin", "bf16", 262144, 8),
    ("amin", "f32", 1000, 1),
    ("argmax", "f32", 65537, 1),
    ("argmax", "bf16", 4096, 8),
    ("argmax", "f16", 100, 4),
]


@pytest.mark.parametrize("op, dt, n, vec", _CASES)
def test_compile_ops(compiler, op, dt, n, vec):
    bits = 32 if dt == "f32" else 16
    c = compiler(op, dt, n, vec)
    _check_ptx(c, vec * bits // 8 if n >= vec else None)


@pytest.mark.parametrize("op, dt, n, vec", [("sum", "bf16", 50257, 1), ("argmax", "f32", 65537, 1),
                                           ("amax", "f16", 50258, 2), ("mean", "bf16", 33, 1)])
def test_unaligned_rows_read_16_byte_vectors(compiler, op, dt, n, vec):
    """Rows whose starts are not 16-byte aligned (vec below 16 bytes) are read from their
    first 16-byte boundary in 16-byte vectors, the head and tail as scalars (reduce.md
    v3); at N = 33 bf16 too (one body vector, the leftovers around it)."""
    ptx = _check_ptx(compiler(op, dt, n, vec), 16)
    assert re.search(r"ld\.global[.a-zA-Z0-9:_]*\.(u16|b16|f32|u32|b32)\s", ptx)  # the scalar head / tail


def test_all_ops_covered():
    assert {c[0] for c in _CASES} == set(OPS)


def test_compile_every_candidate(compiler):
    n = 131072  # large enough for the cluster candidates
    cands = candidate_configs(n, 32)
    assert any(c.cluster_n > 1 for c in cands)
    for cfg in cands:
        ptx = _check_ptx(compiler("sum", "f32", n, 4, cfg), 16)
        if cfg.cluster_n > 1:
            assert "mapa" in ptx and "barrier.cluster" in ptx


def test_compile_small_n_candidates(compiler):
    n = 100
    for cfg in candidate_configs(n, 16):
        _check_ptx(compiler("argmax", "bf16", n, 4, cfg))


def test_compile_cluster_argmax(compiler):
    cfg = RowReduceConfig(512, 512, 4, cluster_n=4)
    ptx = _check_ptx(compiler("argmax", "bf16", 70000, 8, cfg), 16)
    assert "st.shared::cluster" in ptx


def test_bad_arguments():
    import cutlass

    from cuteforge.kernels.reduce import make_row_reduce

    cfg = RowReduceConfig()
    with pytest.raises(ValueError, match="unknown op"):
        make_row_reduce("prod", cutlass.Float32, cutlass.Float32, 128, 4, cfg)
    with pytest.raises(ValueError, match="vec"):
        make_row_reduce("sum", cutlass.BFloat16, cutlass.BFloat16, 128, 16, cfg)
    with pytest.raises(ValueError, match="Int64"):
        make_row_reduce("argmax", cutlass.Float32, cutlass.Float32, 128, 4, cfg)


# --------------------------------------------------------------------------- column kernel


def _compile_col(op, dt, vec, cfg, out_dt=None):
    import cutlass
    import cutlass.cute as cute

    from cuteforge.kernels.reduce import make_col_reduce

    dtypes = {"f32": cutlass.Float32, "bf16": cutlass.BFloat16, "f16": cutlass.Float16}
    in_dtype = dtypes[dt]
    out_dtype = cutlass.Int64 if op == "argmax" else dtypes[out_dt or dt]
    o, r, i = cute.sym_int(), cute.sym_int(), cute.sym_int()
    x = cute.runtime.make_fake_tensor(
        in_dtype, (o, r, i), (cute.sym_int64(divisibility=vec), cute.sym_int64(divisibility=vec), 1),
        assumed_align=vec * in_dtype.width // 8,
    )
    out = cute.runtime.make_fake_tensor(out_dtype, (o, i), (cute.sym_int64(divisibility=1), 1), assumed_align=out_dtype.width // 8)
    stream = cute.runtime.make_fake_stream(use_tvm_ffi_env_stream=True)
    return cute.compile(make_col_reduce(op, in_dtype, out_dtype, vec, cfg), x, out, stream, options="--enable-tvm-ffi --keep-ptx")


@pytest.mark.parametrize(
    "op, dt, vec, tx, cluster, out_dt",
    [("sum", "f32", 4, 8, 1, None), ("argmax", "bf16", 8, 8, 4, None), ("mean", "f16", 1, 1, 8, None),
     ("amax", "f32", 4, 32, 2, None), ("amin", "bf16", 2, 2, 1, None),
     ("sum", "f32", 4, 8, 1, "bf16"), ("sum", "f32", 1, 8, 1, "f16")],  # a norm backward's partials into the weight's dtype
)
def test_compile_col(monkeypatch, op, dt, vec, tx, cluster, out_dt):
    from cuteforge.kernels.reduce import ColReduceConfig

    monkeypatch.setenv("CUTE_DSL_ARCH", "sm_90a")
    ptx = _compile_col(op, dt, vec, ColReduceConfig(256, tx, 4, cluster), out_dt).__ptx__
    assert ".entry" in ptx and "sm_90a" in ptx
    if vec * (32 if dt == "f32" else 16) == 128:
        assert re.search(r"ld\.global[.a-zA-Z0-9:_]*\.v4\.", ptx)
    assert ("mapa" in ptx) == (cluster > 1)


def test_col_configs():
    from cuteforge.kernels.reduce import ColReduceConfig, candidate_col_configs, default_col_config

    many_tiles = default_col_config(8, 4096, 4096, 32, 4)  # 1024 CTAs: no split of R
    assert many_tiles.cluster_n == 1 and many_tiles.threads_x == 8
    assert default_col_config(1, 32768, 4096, 32, 4).cluster_n == 4  # 128 tiles: split R within one wave
    narrow = default_col_config(1, 1 << 20, 32, 32, 4)
    assert narrow.cluster_n == 8 and narrow.threads_x == 8
    assert default_col_config(1, 1 << 20, 32, 32, 4, clusters=False).cluster_n == 1
    assert default_col_config(1, 1000, 4, 32, 4).threads_x == 1
    cands = candidate_col_configs(3, 1000, 7, 16, 1)
    assert cands[0] == default_col_config(3, 1000, 7, 16, 1) and len(set(cands)) == len(cands)
    for bad, match in ((ColReduceConfig(256, 128, 4, 1), "threads_x"), (ColReduceConfig(256, 8, 0, 1), "unroll"),
                       (ColReduceConfig(256, 8, 4, 3), "cluster_n"), (ColReduceConfig(100, 8, 4, 1), "multiple of 32")):
        with pytest.raises(ValueError, match=match):
            bad.validate(32)


def test_col_autotune_candidates_validate():
    """The autotuner validates column configs through the kernel's hook (its fallback
    would call ColReduceConfig.validate(spec, limits))."""
    from cuteforge.autotune.candidates import candidates
    from cuteforge.kernels.reduce import ColReduceConfig
    from cuteforge.kernels.reduce.spec import col_reduce
    from cuteforge.signature import BoundKey

    spec = col_reduce.spec(BoundKey(("float32", "float32"), (), (4, 4)), (("op", "sum"),), ColReduceConfig(), arch="sm_90a")
    valid, invalid = candidates(col_reduce, spec, [ColReduceConfig(), ColReduceConfig(256, 8, 4, 8), ColReduceConfig(100, 8, 4, 1)])
    assert valid == [ColReduceConfig(), ColReduceConfig(256, 8, 4, 8)]
    assert "multiple of 32" in invalid[ColReduceConfig(100, 8, 4, 1)]


if os.environ.get("CUTEFORGE_SKIP_COMPILE_TESTS"):  # pragma: no cover
    pytestmark = pytest.mark.skip("compile tests disabled")


# --------------------------------------------------------------------------- op-level views (no GPU)


@pytest.fixture
def fake_kernels(monkeypatch):
    """The ops' planning with the kernels replaced by torch on CPU: checks the views
    (row vs column routing, flattened strides, the two-stage split) against torch."""
    import torch

    from cuteforge.ops import reduce as red
    from cuteforge.signature import BoundKey

    def get_for(kind):
        def get(key, params, cfg=None):
            op = dict(params)["op"]

            def fn(xv, out):
                assert out.is_contiguous()
                assert xv.stride(-1) == 1 or xv.shape[-1] == 1
                assert xv.dim() == (2 if kind == "row" else 3)
                out.copy_(getattr(torch, op)(xv, dim=1))

            return fn

        return get

    class FakeSig:
        def bind(self, tensors, where=""):
            return BoundKey(("float32", "float32"), (), (4, 4))

    for kernel, kind in ((red.row_reduce, "row"), (red.col_reduce, "col")):
        monkeypatch.setattr(kernel, "signature", FakeSig())
        monkeypatch.setattr(kernel, "get", get_for(kind))
    monkeypatch.setattr(red, "config_for", lambda *a: None)
    monkeypatch.setattr(red, "col_config_for", lambda *a: None)
    monkeypatch.setattr(red.checks, "on_cuda", lambda *a: None)  # CPU tensors stand in for CUDA ones here
    import cuteforge.autotune

    monkeypatch.setattr(cuteforge.autotune, "lookup", lambda *a, **k: None)
    red._PLANS.clear()
    yield red
    red._PLANS.clear()  # plans made with fake kernels must not outlive the test


def _views():
    import torch
    from hypothesis import strategies as st

    @st.composite
    def view(draw):
        nd = draw(st.integers(1, 4))
        shape = [draw(st.integers(1, 9)) for _ in range(nd)]
        x = torch.randn(*shape)
        if draw(st.booleans()) and nd > 1:
            perm = draw(st.permutations(range(nd)))
            x = x.permute(*perm)
        if draw(st.booleans()):
            d = draw(st.integers(0, x.dim() - 1))
            if x.shape[d] > 1:
                x = x.narrow(d, 1, x.shape[d] - 1)
        dim = draw(st.integers(-x.dim(), x.dim() - 1))
        return x, dim, draw(st.booleans()), draw(st.sampled_from(["sum", "mean", "amax", "amin", "argmax"]))

    return view()


def test_plan_views_match_torch(fake_kernels):
    import torch
    from hypothesis import given, settings

    red = fake_kernels

    @settings(max_examples=300, deadline=None)
    @given(_views())
    def check(case):
        x, dim, keepdim, op = case
        got = getattr(red, op)(x, dim, keepdim)
        ref = getattr(torch, op)(x, dim=dim, keepdim=keepdim)
        assert got.shape == ref.shape
        torch.testing.assert_close(got, ref)

    check()


def test_plan_two_stage_split(fake_kernels):
    import torch

    red = fake_kernels
    for x, dim in ((torch.randn(70000, 3), 0), (torch.randn(3, 65536, 5)[1:], 1), (torch.randn(262144, 2), 0)):
        assert red._pick_split("sum", x.unsqueeze(0) if x.dim() == 2 else x, 1) > 1
        for op in ("sum", "mean", "amax", "amin", "argmax"):
            torch.testing.assert_close(getattr(red, op)(x, dim), getattr(torch, op)(x, dim=dim), rtol=1e-5, atol=1e-3)


def test_warm_plan_is_not_reused_for_other_argument_types(fake_kernels):
    """The memo keys dim and keepdim with their types: keepdim=0 after a keepdim=False
    call still meets the check (and dim=True the dim check), as the launch table keys them."""
    import torch

    red = fake_kernels
    x = torch.randn(4, 8)
    torch.testing.assert_close(red.sum(x, -1, False), x.sum(-1))
    torch.testing.assert_close(red.sum(x, 1, False), x.sum(-1))
    with pytest.raises(TypeError, match="'keepdim' must be a bool"):
        red.sum(x, -1, 0)
    with pytest.raises(TypeError, match="'dim' must be an int"):
        red.sum(x, True, False)
