"""CPU-only checks of the cross-entropy kernels: sm_90a compiles (vectorized loads and
stores, one ex2 per element) and argument validation; numerics are checked on the GPU."""

from __future__ import annotations

import re

import pytest

from cuteforge.kernels.cross_entropy.kernels import ce_config
from cuteforge.kernels.reduce.row import RowReduceConfig, default_config


def _compile(which, dt, n, vec, cfg=None):
    import cutlass
    import cutlass.cute as cute

    from cuteforge.kernels.cross_entropy import make_ce_bwd, make_ce_fwd

    d = {"f32": cutlass.Float32, "bf16": cutlass.BFloat16, "f16": cutlass.Float16}[dt]
    cfg = cfg or ce_config(n, d.width)
    m = cute.sym_int()

    def rows():
        return cute.runtime.make_fake_tensor(d, (m, n), (cute.sym_int64(divisibility=vec), 1), assumed_align=vec * d.width // 8)

    tgt = cute.runtime.make_fake_tensor(cutlass.Int64, (m,), (1,), assumed_align=8)
    f1 = cute.runtime.make_fake_tensor(cutlass.Float32, (m,), (1,), assumed_align=4)
    f2 = cute.runtime.make_fake_tensor(cutlass.Float32, (m,), (1,), assumed_align=4)
    stream = cute.runtime.make_fake_stream(use_tvm_ffi_env_stream=True)
    opts = "--enable-tvm-ffi --keep-ptx"
    if which == "fwd":
        return cute.compile(make_ce_fwd(d, n, vec, cfg, -100), rows(), tgt, f1, f2, stream, options=opts).__ptx__
    return cute.compile(make_ce_bwd(d, n, vec, cfg, -100), rows(), tgt, f1, f2, rows(), stream, options=opts).__ptx__


@pytest.mark.parametrize(
    "which, dt, n, vec",
    [("fwd", "bf16", 4096, 8), ("bwd", "bf16", 4096, 8), ("fwd", "f32", 65537, 1), ("bwd", "f16", 1000, 8),
     ("fwd", "f16", 7, 1), ("bwd", "f32", 262144, 4)],
)
def test_compile(monkeypatch, which, dt, n, vec):
    monkeypatch.setenv("CUTE_DSL_ARCH", "sm_90a")
    ptx = _compile(which, dt, n, vec)
    assert ".entry" in ptx and "sm_90a" in ptx and "ex2.approx" in ptx
    if vec * (32 if dt == "f32" else 16) == 128:
        assert re.search(r"ld\.global[.a-zA-Z0-9:_]*\.v4\.", ptx)
        if which == "bwd":
            assert re.search(r"st\.global[.a-zA-Z0-9:_]*\.v4\.", ptx)


def test_bad_arguments():
    import cutlass

    from cuteforge.kernels.cross_entropy import make_ce_bwd, make_ce_fwd

    with pytest.raises(ValueError, match="cluster"):
        make_ce_fwd(cutlass.Float32, 262144, 4, RowReduceConfig(1024, 1024, 4, cluster_n=2), -100)
    with pytest.raises(ValueError, match="vec"):
        make_ce_bwd(cutlass.BFloat16, 4096, 16, default_config(4096, 16), -100)
    with pytest.raises(ValueError, match="dtype"):
        make_ce_bwd(cutlass.Int32, 4096, 4, default_config(4096, 32), -100)


@pytest.mark.parametrize("bits", [16, 32])
@pytest.mark.parametrize("n", [1, 7, 1000, 4096, 16384, 32768, 65537, 262144])
def test_ce_config_valid(n, bits):
    cfg = ce_config(n, bits)
    cfg.validate(n, bits)
    assert cfg.cluster_n == 1


def test_op_errors_without_gpu():
    import torch

    import cuteforge.ops as ops

    x, t = torch.randn(4, 5), torch.zeros(4, dtype=torch.long)
    with pytest.raises(ValueError, match="'logits' must be a CUDA tensor"):
        ops.cross_entropy(x, t)
    with pytest.raises(ValueError, match="'ignore_index'=9223372036854775808 does not fit in int64"):
        ops.cross_entropy(x, t, ignore_index=2**63)
    with pytest.raises(TypeError, match="'target' must be int64"):
        ops.cross_entropy(x, t.int())


def test_compiled_call_checks_its_arguments():
    """Under torch.compile the arguments are checked while tracing: an unknown reduction
    must raise, not reduce as "mean" (the custom op never sees `reduction`)."""
    import torch

    import cuteforge.ops as ops

    x, t = torch.randn(4, 5), torch.zeros(4, dtype=torch.long)
    f = torch.compile(lambda a, b: ops.cross_entropy(a, b, reduction="avg"), backend="eager")
    with pytest.raises(ValueError, match="'reduction' must be one of"):
        f(x, t)
    g = torch.compile(lambda a, b: ops.cross_entropy(a, b), backend="eager", fullgraph=True)
    with pytest.raises(ValueError, match="'logits' must be a CUDA tensor"):  # traced whole; fails when it runs
        g(x, t)


def test_autotune_candidates_validate():
    """The autotuner validates each candidate through the kernel's hook: every config the
    kernel offers passes; a cluster config is dropped with its reason."""
    from cuteforge.autotune.candidates import candidates
    from cuteforge.kernels.cross_entropy.spec import cross_entropy_bwd, cross_entropy_fwd
    from cuteforge.signature import BoundKey

    for k, key in (
        (cross_entropy_fwd, BoundKey(("bfloat16", "int64", "float32", "float32"), (("N", 4096),), (8, 2, 4, 4))),
        (cross_entropy_bwd, BoundKey(("bfloat16", "int64", "float32", "float32", "bfloat16"), (("N", 4096),), (8, 2, 4, 4, 8))),
    ):
        spec = k.spec(key, (("ignore_index", -100),), None, arch="sm_90a")
        valid, invalid = candidates(k, spec)
        assert invalid == {} and valid == k.configs(spec) and len(valid) > 1
        bad = RowReduceConfig(1024, 1024, 4, cluster_n=2)
        valid, invalid = candidates(k, spec, [bad])
        assert valid == [] and "cluster" in invalid[bad]


def _reference_launcher(calls):
    """A CPU stand-in for the compiled forward (same outputs as the kernel: loss 0 on
    ignored rows, NaN on out-of-range targets, lse always), recording each build."""
    import torch

    def build(logits, target, ignore_index):
        calls.append((logits.dtype, tuple(logits.shape), logits.stride(), logits.data_ptr() & 15, target.data_ptr() & 15,
                      ignore_index))

        def fn(lg, tg, loss, lse):
            x = lg.float()
            s = torch.logsumexp(x, 1)
            ok = (tg >= 0) & (tg < x.shape[1])
            xt = x.gather(1, tg.clamp(0, x.shape[1] - 1)[:, None])[:, 0]
            loss.copy_(torch.where(tg == ignore_index, 0.0, torch.where(ok, s - xt, float("nan"))))
            lse.copy_(s)

        return fn

    return build


def test_warm_path_memo_key_and_reductions(monkeypatch):
    """The eager warm path: a repeated call reuses its plan (no second build); every
    argument the plan depends on (reduction, ignore_index and its type, dtype, shape,
    strides, alignment of logits and target) misses and rebuilds, so a changed argument
    never reuses a wrong plan; and the plan's reductions (fp32 and bf16, mean with ignored
    rows, all ignored) give torch's answer."""
    import sys

    import torch
    import torch.nn.functional as F

    import cuteforge.ops  # noqa: F401

    ce = sys.modules["cuteforge.ops.cross_entropy"]
    calls: list = []
    monkeypatch.setattr(ce, "_fwd_launcher", _reference_launcher(calls))
    monkeypatch.setattr(ce, "_PLANS", {})
    x = torch.randn(6, 40)
    t = torch.tensor([1, 5, 3, 39, 0, 3])
    for dt in (torch.float32, torch.bfloat16):
        xd = x.to(dt)
        for red in ("mean", "sum", "none"):
            for ii, tt in ((-100, t), (3, t), (-100, torch.tensor([1, -100, 3, 39, -100, 7]))):
                n = len(calls)
                for _ in range(2):
                    got = ce.cross_entropy(xd, tt, reduction=red, ignore_index=ii)
                    want = F.cross_entropy(xd.float(), tt, reduction=red, ignore_index=ii).to(dt)
                    assert got.dtype == dt and got.shape == want.shape
                    torch.testing.assert_close(got, want)
                assert len(calls) == n + (tt is t or ii == 3)  # built once (same layout: hit), hit after
    assert torch.isnan(ce.cross_entropy(x, torch.full((6,), -100), reduction="mean"))  # all ignored: NaN, as torch
    n = len(calls)
    ce.cross_entropy(x, t, ignore_index=1)
    with pytest.raises(TypeError, match="'ignore_index' must be an int"):
        ce.cross_entropy(x, t, ignore_index=True)  # True == 1, but not its plan
    with pytest.raises(ValueError, match="'reduction' must be one of"):
        ce.cross_entropy(x, t, reduction="avg")
    buf = torch.randn(6 * 40 + 1)
    t_buf = torch.zeros(7, dtype=torch.long)
    t_buf[1:] = t
    for lg, tg in ((buf[1:].view(6, 40), t), (x, t_buf[1:]), (torch.randn(6, 48)[:, :40], t), (x[:5], t[:5])):
        ce.cross_entropy(lg, tg)
    assert len(calls) == n + 1 + 4
    ce.cross_entropy(x, t[::1])  # same layout as t: a hit
    assert len(calls) == n + 5
