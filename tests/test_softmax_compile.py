"""CPU-only checks of the softmax kernels: configs, keys, errors and sm_90a compiles.

``CUTE_DSL_ARCH=sm_90a`` makes ``cute.compile`` emit real sm_90a PTX/CUBIN with no GPU,
so codegen errors, missing vectorisation and the cluster path are caught here;
numerics are checked on the GPU (tests/gpu/test_softmax_gpu.py).
"""

from __future__ import annotations

import importlib
import re
from dataclasses import replace

import pytest
import torch
from ptxas_check import ptxas_no_spill, ptxas_report

from cuteforge.kernels.softmax import MODES, SoftmaxConfig, candidate_configs, default_config
from cuteforge.kernels.softmax.config import ASYNC_FWD_MIN_N
from cuteforge.signature import BoundKey

_NS = [1, 7, 32, 256, 1000, 4096, 16384, 65536, 65537, 131072, 262144]


@pytest.mark.parametrize(
    "cfg, match",
    [
        (SoftmaxConfig(threads=48, threads_per_row=16), "multiple of 32"),
        (SoftmaxConfig(threads=2048, threads_per_row=256), "multiple of 32"),
        (SoftmaxConfig(threads=256, threads_per_row=3), "power of 2"),
        (SoftmaxConfig(threads=256, threads_per_row=512), "power of 2"),
        (SoftmaxConfig(threads=256, threads_per_row=256, cluster_n=3), "cluster_n"),
        (SoftmaxConfig(threads=256, threads_per_row=256, cluster_n=32), "cluster_n"),
        (SoftmaxConfig(threads=256, threads_per_row=256, cluster_n=8), "needs n >="),
        (SoftmaxConfig(threads=128, threads_per_row=1), "elements per thread"),
        (SoftmaxConfig(threads=1024, threads_per_row=32), "registers"),
    ],
)
def test_validate_rejects(cfg, match):
    with pytest.raises(ValueError, match=match):
        cfg.validate(4096, 32)


def test_validate_backward_holds_two_rows():
    cfg = SoftmaxConfig(128, 32)  # 128 elements per thread: fine forward, spills backward
    cfg.validate(4096, 32, backward=False)
    with pytest.raises(ValueError, match="elements per thread"):
        cfg.validate(4096, 32, backward=True)


def test_validate_rejects_bad_problem():
    with pytest.raises(ValueError, match="n must be"):
        SoftmaxConfig().validate(0, 32)
    with pytest.raises(ValueError, match="dtype_bits"):
        SoftmaxConfig().validate(4096, 8)
    with pytest.raises(ValueError, match="unknown softmax mode"):
        from cuteforge.kernels.softmax import is_backward

        is_backward("softmin")


@pytest.mark.parametrize("backward", [False, True])
@pytest.mark.parametrize("bits", [16, 32])
@pytest.mark.parametrize("n", _NS)
def test_default_and_candidates_valid(n, bits, backward):
    d = default_config(n, bits, backward)
    d.validate(n, bits, backward)
    cands = candidate_configs(n, bits, backward)
    assert 1 <= len(cands) <= 8 and cands[0] == d and len(set(cands)) == len(cands)
    for c in cands:
        c.validate(n, bits, backward)
    try:
        assert default_config(n, bits, backward, cluster=False).cluster_n == 1
    except ValueError as e:  # without clusters only rows that fit one CTA's registers
        assert n > 16384 and "clusters" in str(e)


def test_few_rows_split_over_more_ctas():
    assert default_config(65536, 32, m=4).cluster_n > default_config(65536, 32, m=100000).cluster_n


def test_row_vec_divides_n():
    from cuteforge.kernels.softmax.spec import row_vec

    assert row_vec(BoundKey(("float32", "float32"), (("N", 4096),), (4, 4))) == 4
    assert row_vec(BoundKey(("bfloat16", "bfloat16"), (("N", 1000),), (8, 8))) == 8
    assert row_vec(BoundKey(("bfloat16", "bfloat16"), (("N", 1004),), (8, 8))) == 4
    assert row_vec(BoundKey(("bfloat16", "bfloat16"), (("N", 1004),), (2, 8))) == 2
    assert row_vec(BoundKey(("float32",) * 3, (("N", 65537),), (4, 4, 4))) == 1


# --------------------------------------------------------------------------- compiles


@pytest.fixture(scope="module")
def compiler(tmp_path_factory):
    mp = pytest.MonkeyPatch()
    mp.setenv("CUTE_DSL_ARCH", "sm_90a")
    dump_dir = tmp_path_factory.mktemp("ptx")
    import cutlass
    import cutlass.cute as cute

    from cuteforge.kernels.softmax import is_backward, make_softmax

    dtypes = {"f32": cutlass.Float32, "bf16": cutlass.BFloat16, "f16": cutlass.Float16}

    def compile_(mode, dt, n, vec, cfg=None, same_heads=False):
        d = dtypes[dt]
        bwd = is_backward(mode)
        cfg = cfg or default_config(n, d.width, bwd)
        m = cute.sym_int()
        ts = [
            cute.runtime.make_fake_tensor(d, (m, n), (cute.sym_int64(divisibility=vec), 1), assumed_align=vec * d.width // 8)
            for _ in range(3 if bwd else 2)
        ]
        stream = cute.runtime.make_fake_stream(use_tvm_ffi_env_stream=True)
        if cfg.path != "regs":  # v2 forward paths (the long-row forward default)
            from cuteforge.kernels.softmax.chunked import make_softmax_chunked

            fn = make_softmax_chunked(mode, d, n, vec, cfg, same_heads)
        else:
            fn = make_softmax(mode, d, n, vec, cfg, same_heads)
        c = cute.compile(fn, *ts, stream, options=f"--enable-tvm-ffi --keep-ptx --dump-dir={dump_dir}")
        ptx = c.__ptx__
        assert isinstance(ptx, str) and ".entry" in ptx and "sm_90a" in ptx
        return ptx

    yield compile_
    mp.undo()


# (mode, dtype, n, vec): every mode and dtype, tiny/odd N (vec 1), clusters of 2..16
_CASES = [
    ("softmax", "f32", 4096, 4),
    ("softmax", "bf16", 65536, 8),  # cluster
    ("log_softmax", "f16", 1000, 8),
    ("log_softmax", "f32", 7, 1),
    ("softmax_bwd", "bf16", 262144, 8),  # cluster of 16
    ("softmax_bwd", "f32", 1, 1),
    ("log_softmax_bwd", "f32", 65537, 1),  # cluster, scalar accesses
    ("log_softmax_bwd", "bf16", 256, 8),
]


@pytest.mark.parametrize("mode, dt, n, vec", _CASES)
def test_compile(compiler, mode, dt, n, vec):
    ptx = compiler(mode, dt, n, vec)
    bits = 32 if dt == "f32" else 16
    d = default_config(n, bits, mode.endswith("_bwd"))
    if vec * bits == 128:
        load = r"cp\.async\.cg\.shared\.global" if d.path == "async" else r"ld\.global[.a-zA-Z0-9:_]*\.v4\."
        assert re.search(load, ptx) and re.search(r"st\.global[.a-zA-Z0-9:_]*\.v4\.", ptx)
    if d.cluster_n > 1 and d.path == "regs":
        assert "mapa" in ptx and "barrier.cluster" in ptx
    elif d.cluster_n > 1:
        assert "st.async.shared::cluster.mbarrier::complete_tx::bytes" in ptx
    if mode in ("softmax", "log_softmax"):
        assert "ex2.approx" in ptx


# rows that do not start on 16 bytes (vec 1): realigned, 16-byte vectors on every path
_UNALIGNED_CASES = [
    ("softmax", "f32", 50257, None),  # regs, cluster of 2
    ("log_softmax", "bf16", 1001, None),  # regs
    ("log_softmax_bwd", "bf16", 1001, None),  # regs
    ("softmax_bwd", "f32", 50257, None),  # regs, cluster of 4
    ("softmax", "bf16", 50257, None),  # async
    ("log_softmax", "bf16", 65537, SoftmaxConfig(256, 256, 8, "smem")),
    ("softmax_bwd", "bf16", 50257, None),  # mbar
]


@pytest.mark.parametrize("mode, dt, n, cfg", _UNALIGNED_CASES)
def test_rows_not_on_16_bytes_use_16_byte_vectors(compiler, mode, dt, n, cfg):
    """Odd N: the rows are realigned (row_split), so the bulk moves in 16-byte vectors
    (cp.async on the staged paths) and only the leftovers and the element-by-element
    fallback of an operand with another head are scalar."""
    ptx = compiler(mode, dt, n, 1, cfg)
    bits = 32 if dt == "f32" else 16
    path = (cfg or default_config(n, bits, mode.endswith("_bwd"))).path
    if path in ("async", "smem"):
        assert "cp.async.cg.shared.global" in ptx
    else:
        assert re.search(r"ld\.global[.a-zA-Z0-9:_]*\.v4\.", ptx)
    assert re.search(r"st\.global[.a-zA-Z0-9:_]*\.v4\.", ptx)
    scalar = rf"(?:ld|st)\.global(?![.a-zA-Z0-9:_]*\.v[24]\.)[.a-zA-Z0-9:_]*\.b{bits}\s"  # not .v2 / .v4
    assert re.search(scalar, ptx)  # the head and tail


def test_realigned_forward_defaults():
    """Long rows that do not start on 16 bytes: the forward holds the row (`mbar`) where
    the H200 sweep measured it ahead of `async`, log_softmax keeps `async` at <= 32
    elements a thread; aligned rows and the backward are unchanged; the op's key decides
    (spec.config_for)."""
    from cuteforge.kernels.softmax.spec import config_for
    from cuteforge.signature import BoundKey

    def cfg(n, mode, realigned=True, bits=16, backward=False):
        return default_config(n, bits, backward, mode=mode, realigned=realigned)

    assert cfg(131073, "softmax") == SoftmaxConfig(256, 256, 8, "mbar")
    assert cfg(131073, "log_softmax") == SoftmaxConfig(256, 256, 8, "mbar")  # 64 a thread
    assert cfg(131080, "softmax") == SoftmaxConfig(256, 256, 8, "mbar")  # a shifted view: 16384 vectors
    assert cfg(262143, "log_softmax") == SoftmaxConfig(256, 256, 16, "mbar")
    assert cfg(32001, "softmax") == SoftmaxConfig(256, 256, 4, "mbar")
    assert cfg(32001, "log_softmax") == SoftmaxConfig(256, 256, 4, "async")  # 32 a thread
    assert cfg(65537, "log_softmax").path == "async"
    assert cfg(50257, "log_softmax").path == "mbar"  # 56 a thread
    assert cfg(262144, "softmax", realigned=False).path == "async"
    assert cfg(262143, "softmax", bits=32).path == "mbar"
    # fp32 rows the register path would split over a cluster (H200 sweep)
    assert cfg(50257, "softmax", bits=32) == SoftmaxConfig(256, 256, 4, "mbar")
    assert cfg(65537, "log_softmax", bits=32) == SoftmaxConfig(256, 256, 8, "mbar")
    assert cfg(32768, "softmax", bits=32).path == "regs"  # one CTA: unchanged
    assert cfg(65536, "softmax", realigned=False, bits=32).path == "regs"
    assert cfg(131073, "log_softmax", bits=32) == SoftmaxConfig(256, 256, 8, "mbar")  # 64 a thread
    assert cfg(151937, "softmax_bwd", backward=True) == default_config(151937, 16, True)
    assert cfg(8191, "softmax").path == "regs"
    for n, vec, want in ((50257, 1, "mbar"), (50256, 8, "async"), (50256, 4, "mbar")):  # vec 4: a shifted view
        key = BoundKey(("bfloat16", "bfloat16"), (("N", n),), (vec, vec))
        assert config_for("sm_90a", n, 16, False, 32768, "softmax", key).path == want, (n, vec)
    assert config_for("sm_90a", 50257, 16, False, 32768).path == "async"  # no key: as before


@pytest.mark.parametrize("mode, dt, n, path, bound", [
    ("softmax", "bf16", 262143, "async", True), ("softmax", "f16", 262143, "async", True),
    ("softmax", "bf16", 131073, "async", True), ("log_softmax", "bf16", 131073, "async", False),
    ("softmax", "bf16", 200001, "async", False), ("softmax", "bf16", 262143, "mbar", True),
    ("log_softmax", "bf16", 262143, "mbar", True)])
def test_forward_register_budget(compiler, mode, dt, n, path, bound):
    """The 16-bit long forward that holds 64 values a thread is built for 3 CTAs per SM
    (chunked.FWD_MIN_CTAS): ptxas gave the realigned same_heads async build at 262143
    96-100 registers without it (2 CTAs per SM; 75.6 against 86.4 % of copy with it,
    H200 sweep): 80 with it and no spill; the `mbar` builds (the realigned
    defaults) spill a few bytes under it, timed so. log_softmax on `async` (it rereads its
    staged chunk) and shorter shares carry no bound."""
    cfg = replace(default_config(n, 16), path=path)
    ptx = compiler(mode, dt, n, 1, cfg, True)
    assert (".minnctapersm 3" in ptx) == bound
    if bound:
        info = ptxas_report(ptx)
        regs = int(re.search(r"Used (\d+) registers", info).group(1))
        spill = int(re.search(r"(\d+) bytes spill stores", info).group(1))
        assert regs <= 80 and spill <= (0 if path == "async" else 32), info[-600:]


def test_forward_register_budget_only_at_64(compiler):
    """A larger share (the kernel API allows 128 elements a thread) keeps its registers:
    under the 3-CTA budget it spilled (bf16 393216: 392 bytes)."""
    ptx = compiler("softmax", "bf16", 393216, 8, SoftmaxConfig(256, 256, 16, "async"))
    assert ".minnctapersm" not in ptx


@pytest.mark.parametrize("mode, dt, n", [("softmax_bwd", "bf16", 151937), ("log_softmax_bwd", "f32", 20001),
                                         ("softmax", "bf16", 50257), ("log_softmax", "f32", 1001)])
def test_same_heads_builds_no_fallback(compiler, mode, dt, n):
    """same_heads (the ops, on operands whose rows start alike): the only scalar accesses
    are the leftovers (at most two per input and output, one slot a thread at these N);
    without it each operand other than the reference has an element-by-element loop."""
    bits = 32 if dt == "f32" else 16
    scalar = rf"(?:ld|st)\.global(?![.a-zA-Z0-9:_]*\.v[24]\.)[.a-zA-Z0-9:_]*\.b{bits}\s"  # not .v2 / .v4
    lean = len(re.findall(scalar, compiler(mode, dt, n, 1, None, True)))
    full = len(re.findall(scalar, compiler(mode, dt, n, 1)))
    assert 1 <= lean <= 3 and full > lean + 8, (lean, full)


def test_kernel_params_and_same_heads():
    """("same_heads", True) only where rows are realigned and the operands start alike; the
    op's check looks at pointers and row strides (16 bytes apart is the same head)."""
    from cuteforge.kernels.softmax.spec import kernel_params
    from cuteforge.ops.softmax import _same_heads

    odd = BoundKey(("bfloat16",) * 2, (("N", 50257),), (1, 1))
    even = BoundKey(("bfloat16",) * 2, (("N", 4096),), (8, 8))
    assert kernel_params("softmax", odd, True) == (("mode", "softmax"), ("same_heads", True))
    assert kernel_params("softmax", odd, False) == (("mode", "softmax"),)
    assert kernel_params("softmax", even, True) == (("mode", "softmax"),)
    base = torch.empty(8 * 1008 + 8, dtype=torch.bfloat16)
    assert _same_heads(1001, base[: 4 * 1001].view(4, 1001)) == (base.data_ptr() % 16 == 0)
    shifted = base[1 : 1 + 4 * 1001].view(4, 1001)
    assert not _same_heads(1001, shifted)
    padded = base[: 4 * 1009].view(4, 1009)[:, :1001]  # stride 1009 = 1001 + 8 elements (16 bytes)
    assert _same_heads(1001, padded) == (base.data_ptr() % 16 == 0)
    assert not _same_heads(1001, base[: 4 * 1002].view(4, 1002)[:, :1001])


def test_same_heads_parameter_must_be_a_bool():
    from cuteforge.kernels.softmax.spec import softmax_fwd

    key = BoundKey(("bfloat16",) * 2, (("N", 50257),), (1, 1))
    spec = softmax_fwd.spec(key, (("mode", "softmax"), ("same_heads", "False")))
    with pytest.raises(ValueError, match="same_heads must be a bool"):
        softmax_fwd.builder(spec)


def test_all_modes_covered():
    assert {c[0] for c in _CASES} == set(MODES)


def test_bad_builder_arguments():
    import cutlass

    from cuteforge.kernels.softmax import make_softmax

    cfg = SoftmaxConfig()
    with pytest.raises(ValueError, match="unknown softmax mode"):
        make_softmax("softmin", cutlass.Float32, 128, 4, cfg)
    with pytest.raises(ValueError, match="vec"):
        make_softmax("softmax", cutlass.BFloat16, 128, 16, cfg)
    with pytest.raises(ValueError, match="multiple of vec"):
        make_softmax("softmax", cutlass.Float32, 130, 4, cfg)
    with pytest.raises(ValueError, match="unsupported dtype"):
        make_softmax("softmax", cutlass.Float64, 128, 1, cfg)


def test_registry_compile_through_cache(monkeypatch):
    """The registered kernels build from a BoundKey (what ops and precompile use)."""
    monkeypatch.setenv("CUTEFORGE_ARCH", "sm_90a")
    monkeypatch.setenv("CUTE_DSL_ARCH", "sm_90a")
    from cuteforge import cache
    from cuteforge.kernels.softmax.spec import softmax_bwd, softmax_fwd

    before = cache.STATS.compiles + cache.STATS.l2_loads
    key = BoundKey(("bfloat16", "bfloat16"), (("N", 1004),), (8, 8))  # vec lowered to 4
    assert callable(softmax_fwd.get(key, (("mode", "log_softmax"),)))
    key = BoundKey(("float16",) * 3, (("N", 16384),), (8, 8, 8))
    assert callable(softmax_bwd.get(key, (("mode", "softmax_bwd"),)))
    assert cache.STATS.compiles + cache.STATS.l2_loads == before + 2
    with pytest.raises(ValueError, match="mode must be one of"):
        softmax_fwd.get(BoundKey(("float32",) * 2, (("N", 64),), (4, 4)), (("mode", "softmax_bwd"),))


def test_op_errors_without_gpu():
    sm = importlib.import_module("cuteforge.ops.softmax")  # the package attribute is the function

    with pytest.raises(TypeError, match="'x' must be a torch.Tensor"):
        sm.softmax([[1.0, 2.0]])
    with pytest.raises(ValueError, match="'x' must be a CUDA tensor"):
        sm.log_softmax(torch.randn(3, 4))
    with pytest.raises(ValueError, match="'grad' must be a CUDA tensor"):
        sm.softmax_backward(torch.randn(3, 4), torch.randn(3, 4))
    assert hasattr(torch.ops.cuteforge, "softmax") and hasattr(torch.ops.cuteforge, "log_softmax_backward")


def test_every_lane_gets_the_row_result(compiler):
    """Regression (found on the H200): with 1 < partial slots < 32 the final fold must span
    the whole warp, since every thread scales its own elements by the row's (max, sum).
    fp32 N=4096: 4 warps per row, so 4 slots; 5 butterfly steps before the shared-memory
    exchange and 5 after, each shuffling the pair (max, sum)."""
    cfg = SoftmaxConfig(128, 128, 1)
    ptx = compiler("softmax", "f32", 4096, 4, cfg)
    assert ptx.count("shfl.sync.bfly") == 2 * (5 + 5)
    ptx = compiler("softmax_bwd", "f32", 4096, 4, cfg)
    assert ptx.count("shfl.sync.bfly") == 5 + 5  # one value backward


def test_autotune_candidates_validate():
    """The autotuner validates each candidate through the kernel's hook: every config the
    kernel offers passes, a bad one is dropped with its reason."""
    from cuteforge.autotune.candidates import candidates
    from cuteforge.kernels.softmax.spec import softmax_bwd, softmax_fwd

    for k, mode, nargs in ((softmax_fwd, "softmax", 2), (softmax_bwd, "softmax_bwd", 3)):
        spec = k.spec(BoundKey(("bfloat16",) * nargs, (("N", 4096),), (8,) * nargs), (("mode", mode),), None, arch="sm_90a")
        valid, invalid = candidates(k, spec)
        assert invalid == {} and valid == k.configs(spec) and len(valid) > 1
        valid, invalid = candidates(k, spec, [SoftmaxConfig(48, 16)])
        assert valid == [] and "multiple of 32" in invalid[SoftmaxConfig(48, 16)]


# --------------------------------------------------------------------------- v2 forward paths (chunked.py)


@pytest.mark.parametrize(
    "cfg, backward, match",
    [
        (SoftmaxConfig(256, 256, 4, "fast"), False, "path="),
        (SoftmaxConfig(256, 256, 4, "async"), True, "forward-only"),
        (SoftmaxConfig(256, 256, 4, "smem"), True, "forward-only"),
        (SoftmaxConfig(256, 256, 1, "mbar"), True, "needs a cluster"),
        (SoftmaxConfig(256, 16, 4, "mbar"), True, "multiple of 32"),
        (SoftmaxConfig(256, 256, 1, "mbar"), True, "needs a cluster"),
        (SoftmaxConfig(256, 256, 1, "smem"), False, "shared memory"),  # 128 KiB of bf16 row per CTA... x2 rows
    ],
)
def test_v2_validate_rejects(cfg, backward, match):
    n = 131072 if match == "shared memory" else 65536
    with pytest.raises(ValueError, match=match):
        cfg.validate(n, 16, backward)


def test_v2_paths_need_sm90():
    from cuteforge.arch import limits_for

    with pytest.raises(ValueError, match="sm_90"):
        SoftmaxConfig(256, 256, 1, "async").validate(16384, 16, False, limits_for("sm_80"))


@pytest.mark.parametrize("bits", [16, 32])
@pytest.mark.parametrize("n", [32768, 65536, 65537, 131072, 262144])
def test_longrow_candidates_valid(n, bits):
    from cuteforge.arch import limits_for
    from cuteforge.kernels.softmax import longrow_candidates

    cands = longrow_candidates(n, bits)
    assert len(cands) >= 4 and len(set(cands)) == len(cands)
    assert {c.path for c in cands} >= {"mbar", "async", "smem"}
    for c in cands:
        c.validate(n, bits, False, limits_for("sm_90a"))
    d = default_config(n, bits)
    assert d.path == ("async" if n >= ASYNC_FWD_MIN_N[bits] else "regs")
    assert default_config(n, bits, backward=True).path == "mbar"


# 16-bit forward from 16385 and fp32 from 131073 default to the v2 async path: the
# default must validate (sm_90a limits) for every N, odd ones included, and any M.
_DENSE_NS = sorted({*range(1, 262145, 331), *(2**k + e for k in range(1, 19) for e in (-1, 0, 1)), 24577, 100000, 262144} - {262145})


@pytest.mark.parametrize("bits", [16, 32])
def test_default_validates_for_every_n(bits):
    from cuteforge.arch import limits_for

    lim = limits_for("sm_90a")
    for n in _DENSE_NS:
        for m in (None, 1, 7, 1000, 32768):
            d = default_config(n, bits, m=m)
            d.validate(n, bits, False, lim)
            assert (d.path == "async") == (n >= ASYNC_FWD_MIN_N[bits])
            if d.path == "async":
                # a thread's share of the row's whole 16-byte vectors; the < 2 vectors of a
                # realigned row's head and tail go element by element on top (row_split)
                vec = 128 // bits
                body = (n - vec + 1) // vec * vec if n % vec else n
                assert d.threads == d.threads_per_row == 256 and d.elems_per_thread(body) <= 64
    want = {(16, 32768): 4, (16, 65536): 8, (16, 131072): 8, (16, 131073): 8, (16, 131081): 8, (16, 131080): 16,
            (16, 262144): 16, (32, 262144): 16}
    for (b, n), c in want.items():
        if b == bits:
            assert default_config(n, bits) == SoftmaxConfig(256, 256, c, "async")


@pytest.fixture(scope="module")
def compiler_v2(tmp_path_factory):
    mp = pytest.MonkeyPatch()
    mp.setenv("CUTE_DSL_ARCH", "sm_90a")
    dump_dir = tmp_path_factory.mktemp("ptx_v2")
    import cutlass
    import cutlass.cute as cute

    from cuteforge.kernels.softmax.chunked import make_softmax_chunked

    dtypes = {"f32": cutlass.Float32, "bf16": cutlass.BFloat16, "f16": cutlass.Float16}

    def compile_(mode, dt, n, vec, cfg):
        d = dtypes[dt]
        m = cute.sym_int()
        ts = [
            cute.runtime.make_fake_tensor(d, (m, n), (cute.sym_int64(divisibility=vec), 1), assumed_align=vec * d.width // 8)
            for _ in range(2)
        ]
        stream = cute.runtime.make_fake_stream(use_tvm_ffi_env_stream=True)
        c = cute.compile(make_softmax_chunked(mode, d, n, vec, cfg), *ts, stream, options=f"--enable-tvm-ffi --keep-ptx --dump-dir={dump_dir}")
        ptx = c.__ptx__
        assert isinstance(ptx, str) and ".entry" in ptx and "sm_90a" in ptx
        return ptx

    yield compile_
    mp.undo()


# (mode, dtype, n, vec, config): every path and dtype, clusters of 1..16, odd N (vec 1:
# the staged paths fall back to register loads), N not a multiple of the cluster's round
_V2_CASES = [
    ("softmax", "bf16", 65536, 8, SoftmaxConfig(256, 256, 4, "mbar")),
    ("softmax", "bf16", 65536, 8, SoftmaxConfig(256, 256, 4, "async")),
    ("softmax", "bf16", 65536, 8, SoftmaxConfig(256, 256, 2, "smem")),
    ("log_softmax", "f16", 262144, 8, SoftmaxConfig(512, 512, 16, "smem")),
    ("log_softmax", "bf16", 32768, 8, SoftmaxConfig(256, 256, 1, "async")),
    ("softmax", "f32", 131072, 4, SoftmaxConfig(256, 256, 8, "async")),
    ("log_softmax", "f32", 65536, 4, SoftmaxConfig(256, 256, 4, "smem")),
    ("softmax", "f16", 65537, 1, SoftmaxConfig(512, 512, 2, "async")),
    ("softmax", "bf16", 65537, 1, SoftmaxConfig(256, 256, 4, "mbar")),
    ("softmax", "bf16", 100000, 8, SoftmaxConfig(256, 256, 8, "smem")),
    # the forward defaults between and beyond the measured N (odd N: vec 1)
    ("softmax", "bf16", 24577, 1, default_config(24577, 16)),
    ("log_softmax", "f16", 49152, 8, default_config(49152, 16, m=1)),
    ("softmax", "f32", 200000, 4, default_config(200000, 32)),
    ("softmax", "f32", 1000, 4, SoftmaxConfig(128, 32, 1, "smem")),
]


@pytest.mark.parametrize("mode, dt, n, vec, cfg", _V2_CASES)
def test_v2_compile(compiler_v2, mode, dt, n, vec, cfg):
    from cuteforge.kernels.rows.split import row_vectors

    ptx = compiler_v2(mode, dt, n, vec, cfg)
    bits = 32 if dt == "f32" else 16
    bv = row_vectors(n, vec, bits)[0]  # rows not on 16 bytes are realigned (bv > vec)
    staged = cfg.path in ("async", "smem") and bv * bits == 128
    assert ("cp.async.cg.shared.global" in ptx) == staged
    if bv * bits == 128:
        assert re.search(r"st\.global[.a-zA-Z0-9:_]*\.v4\.", ptx)
        if not staged:
            assert re.search(r"ld\.global[.a-zA-Z0-9:_]*\.v4\.", ptx)
    if cfg.cluster_n > 1:
        # the exchange: st.async counted on an mbarrier, no full release/acquire barrier
        assert "st.async.shared::cluster.mbarrier::complete_tx::bytes" in ptx
        assert "mbarrier.try_wait" in ptx and "barrier.cluster.arrive.relaxed" in ptx
        assert not re.search(r"barrier\.cluster\.arrive(\.release)?;", ptx)
    assert "ex2.approx" in ptx


def test_log_softmax_async_output_rereads_the_chunk(compiler_v2):
    """log_softmax on the async path writes x - lse from the staged chunk read again, so no
    fp32 copy of the row is held across the exchange: no more registers than softmax on the
    same config (they were 110 vs 80 at 64 bf16 elements per thread), no spill."""
    from ptxas_check import ptxas_no_spill

    def regs(mode, n, c):
        info = ptxas_no_spill(compiler_v2(mode, "bf16", n, 8, SoftmaxConfig(256, 256, c, "async")))
        return int(re.search(r"Used (\d+) registers", info).group(1))

    for n, c in ((131072, 8), (65536, 8)):
        assert regs("log_softmax", n, c) <= regs("softmax", n, c), n


def test_v2_registry_build(monkeypatch):
    """The registered forward kernel builds a v2 config from a BoundKey (the bench path)."""
    monkeypatch.setenv("CUTEFORGE_ARCH", "sm_90a")
    monkeypatch.setenv("CUTE_DSL_ARCH", "sm_90a")
    from cuteforge.kernels.softmax.spec import softmax_bwd, softmax_fwd

    key = BoundKey(("bfloat16", "bfloat16"), (("N", 65536),), (8, 8))
    assert callable(softmax_fwd.get(key, (("mode", "softmax"),), SoftmaxConfig(256, 256, 4, "smem")))
    bkey = BoundKey(("bfloat16",) * 3, (("N", 65536),), (8,) * 3)
    assert callable(softmax_bwd.get(bkey, (("mode", "softmax_bwd"),), SoftmaxConfig(256, 256, 4, "mbar")))
    with pytest.raises(ValueError, match="forward-only"):
        softmax_bwd.get(bkey, (("mode", "softmax_bwd"),), SoftmaxConfig(256, 256, 4, "async"))


def test_warm_path_memo_key():
    """The eager warm path looks plans up by exactly `_memo_key`'s tuple (a stored plan is
    hit), and any change the slow path depends on misses (the slow path then runs: here on
    CPU it raises, so a wrong plan is never reused): dim's type, dtype, shape, strides,
    pointer alignment."""
    sm = importlib.import_module("cuteforge.ops.softmax")
    calls: list[tuple[int, ...]] = []

    def launch(*ts: torch.Tensor) -> None:
        calls.append(tuple(ts[-1].shape))

    def run(t: torch.Tensor) -> torch.Tensor:  # a forward plan: run(x) -> y
        calls.append(tuple(t.shape))
        return torch.empty(t.shape)

    x = torch.randn(4, 64)
    for mode, fn in (("softmax", sm.softmax), ("log_softmax", sm.log_softmax)):
        sm._FWD[sm._memo_key(mode, -1, x)] = run
        sm._FWD[sm._memo_key(mode, 1, x)] = run
        assert fn(x).shape == (4, 64) and fn(x, 1).shape == (4, 64)
        assert calls == [(4, 64)] * 2
        calls.clear()
        big = torch.randn(4, 80)
        for other, dim in ((x, True), (x.half(), -1), (x[:2], -1), (x.t(), -1), (big[:, 16:], -1), (torch.randn(257)[1:].view(4, 64), -1)):
            with pytest.raises((TypeError, ValueError)):
                fn(other, dim)
        assert calls == []
    g = torch.randn(4, 64)
    sm.remember(sm._PLANS, sm._memo_key("softmax_bwd", -1, g, x), ((4, 64), launch))
    assert sm.softmax_backward(g, x).shape == (4, 64) and calls == [(4, 64)]
    for dy, y in ((x, g.half()), (g[:, :32], x[:, :32]), (torch.randn(257)[1:].view(4, 64), x)):
        with pytest.raises((TypeError, ValueError)):
            sm.softmax_backward(dy, y)
    assert len(calls) == 1
    sm._PLANS.clear()
    sm._FWD.clear()


# --------------------------------------------------------------------------- backward, path mbar (chunked.py)


def test_bwd_mbar_validate_and_candidates():
    from cuteforge.arch import limits_for
    from cuteforge.kernels.softmax.config import LONGROW_BWD_MIN_N, longrow_bwd_candidates

    SoftmaxConfig(256, 256, 4, "mbar").validate(65536, 16, True, limits_for("sm_90a"))
    with pytest.raises(ValueError, match="sm_80"):
        SoftmaxConfig(256, 256, 4, "mbar").validate(65536, 16, True, limits_for("sm_80"))
    with pytest.raises(ValueError, match="elements per thread"):  # 128 per input: the backward's limit is 64
        SoftmaxConfig(256, 256, 2, "mbar").validate(65536, 16, True)
    for bits in (16, 32):
        assert longrow_bwd_candidates(LONGROW_BWD_MIN_N - 1, bits) == []
        assert all(c.path == "regs" for c in candidate_configs(16384, bits, True))
        for n in (32768, 65536, 65537, 131072, 262144):
            cands = longrow_bwd_candidates(n, bits)
            assert cands and len(set(cands)) == len(cands)
            assert {c.threads for c in cands} == {256, 512}
            for c in cands:
                assert c.path == "mbar" and c.threads == c.threads_per_row and 2 <= c.cluster_n <= 16
                assert c.elems_per_thread(n) <= 64
                c.validate(n, bits, True, limits_for("sm_90a"))
            auto = candidate_configs(n, bits, True)
            assert auto[0] == default_config(n, bits, True)
            assert {c for c in auto[1:] if c.path == "mbar"} == set(cands[:4]) - {auto[0]}
            assert all(c.path in ("regs", "mbar") for c in auto)


def _bwd_mbar_compile_cases():
    from cuteforge.kernels.softmax.config import longrow_bwd_candidates

    out = []
    for dt, bits in (("bf16", 16), ("f16", 16), ("f32", 32)):
        for n in (65536, 65537, 262144):
            vec = 1 if n % 2 else 128 // bits
            cfgs = longrow_bwd_candidates(n, bits)
            if n == 65536:
                cfgs = [*cfgs, SoftmaxConfig(256, 256, 4, "mbar")]  # 64 per input, cluster 4
            for i, c in enumerate(cfgs):
                out.append(("softmax_bwd" if i % 2 == 0 else "log_softmax_bwd", dt, n, vec, c))
    out.append(("log_softmax_bwd", "bf16", 262144, 8, SoftmaxConfig(512, 512, 16, "mbar")))
    out.append(("softmax_bwd", "f32", 65536, 4, SoftmaxConfig(512, 512, 8, "mbar")))
    return out


@pytest.mark.parametrize("mode, dt, n, vec, cfg", _bwd_mbar_compile_cases())
def test_bwd_mbar_compile(compiler, mode, dt, n, vec, cfg):
    """The chunked backward for sm_90a: 16-byte loads of both inputs and 16-byte stores
    where the row allows, the st.async + mbarrier exchange and no full cluster barrier
    (release arrive / acquire wait) around it, no register spill."""
    ptx = compiler(mode, dt, n, vec, cfg)
    bits = 32 if dt == "f32" else 16
    if vec * bits == 128:
        assert re.search(r"ld\.global[.a-zA-Z0-9:_]*\.v4\.", ptx) and re.search(r"st\.global[.a-zA-Z0-9:_]*\.v4\.", ptx)
    assert "st.async.shared::cluster.mbarrier::complete_tx::bytes.b32" in ptx
    assert "mbarrier.try_wait" in ptx and "barrier.cluster.arrive.relaxed" in ptx
    assert "mbarrier.arrive.expect_tx" in ptx
    assert not re.search(r"barrier\.cluster\.arrive(\.release)?(\.aligned)?;", ptx)
    assert "ex2.approx" in ptx if mode == "log_softmax_bwd" else True
    _check_bwd_registers(mode, dt, n, vec, cfg, ptx)


def _check_bwd_registers(mode, dt, n, vec, cfg, ptx):
    """No spill, except under the two-CTA register budget of fp16 softmax_bwd at > 32
    elements per input (chunked.py): <= 128 registers there and a few bytes of spill
    accepted (N = 262144: 97.9 % of copy against 75.0 % at 142 registers, docs/kernels/softmax.md)."""
    from cuteforge.kernels.rows.split import split

    bv, nv, _, _ = split(n, vec, 32 if dt == "f32" else 16, cfg.threads_per_row)  # realigned rows: bv > vec
    per_input = -(-nv // (cfg.cluster_n * cfg.threads_per_row)) * bv
    if dt == "f16" and mode == "softmax_bwd" and per_input > 32 and cfg.threads == 256:
        assert ".minnctapersm 2" in ptx
        info = ptxas_report(ptx)
        regs = int(re.search(r"Used (\d+) registers", info).group(1))
        spill = int(re.search(r"(\d+) bytes spill stores", info).group(1))
        assert regs <= 128 and spill <= 64, info[-600:]
    else:
        assert ".minnctapersm" not in ptx
        ptxas_no_spill(ptx)


def test_bwd_mbar_tx_bytes(compiler):
    """Each CTA expects one 4-byte partial per warp of every CTA and row of the cluster."""
    for cfg, n in ((SoftmaxConfig(512, 512, 8, "mbar"), 65536), (SoftmaxConfig(256, 256, 4, "mbar"), 32768)):
        ptx = compiler("softmax_bwd", "bf16", n, 8, cfg)
        tx = cfg.threads // 32 * cfg.cluster_n * 4
        reg = re.search(r"mbarrier\.arrive\.expect_tx\.shared\.b64\s+[^,]+,\s*\[[^\]]+\],\s*(%r\d+);", ptx).group(1)
        assert re.search(rf"mov\.b32\s+{reg},\s*{tx};", ptx), (reg, tx)


@pytest.mark.parametrize("bits", [16, 32])
def test_bwd_mbar_defaults_for_every_n(bits):
    """Backward rows of N >= 32768 default to `mbar` (16-bit: h200-softmax-bwd-mbar.json;
    fp32: H200 backward sweep), shorter rows keep `regs`;
    every default validates for sm_90a at any M, and the measured winners are reproduced."""
    from cuteforge.arch import limits_for
    from cuteforge.kernels.softmax.config import MBAR_BWD_MIN_N

    lim = limits_for("sm_90a")
    for n in _DENSE_NS:
        for m in (None, 1, 7, 1000, 32768):
            d = default_config(n, bits, True, m)
            d.validate(n, bits, True, lim)
            assert (d.path == "mbar") == (n >= MBAR_BWD_MIN_N[bits])
            if d.path == "mbar":
                assert d.threads == d.threads_per_row in (256, 512) and d.cluster_n >= 2
                assert d.elems_per_thread(n) <= (64 if bits == 16 else 50)
    if bits == 16:
        want = {32768: 4, 65536: 8, 100000: 16, 131072: 16, 131073: 16, 262144: 16}
        for n, c in want.items():
            assert default_config(n, 16, True) == SoftmaxConfig(256, 256, c, "mbar")
    else:
        assert default_config(50257, 32, True) == SoftmaxConfig(256, 256, 8, "mbar")
        assert default_config(200001, 32, True) == SoftmaxConfig(256, 256, 16, "mbar")
        assert default_config(262143, 32, True) == SoftmaxConfig(512, 512, 16, "mbar")


# the 16-bit backward defaults between the measured N (odd N: vector 1; 33..64 per input)
@pytest.mark.parametrize("mode, dt, n, vec", [
    ("softmax_bwd", "bf16", 32769, 1),
    ("log_softmax_bwd", "f16", 100000, 8),
    ("softmax_bwd", "f16", 131073, 1),
    ("softmax_bwd", "f16", 262144, 8),
    ("log_softmax_bwd", "bf16", 262144, 8),
])
def test_bwd_mbar_default_compiles(compiler, mode, dt, n, vec):
    cfg = default_config(n, 16, True)
    assert cfg.path == "mbar"
    ptx = compiler(mode, dt, n, vec, cfg)
    assert "st.async.shared::cluster.mbarrier::complete_tx::bytes.b32" in ptx
    assert not re.search(r"barrier\.cluster\.arrive(\.release)?(\.aligned)?;", ptx)
    _check_bwd_registers(mode, dt, n, vec, cfg, ptx)
