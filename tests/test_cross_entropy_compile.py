"""CPU-only checks of the cross-entropy kernels: sm_90a compiles (vectorized loads and
stores, one ex2 per element; the reduced forward's ticket protocol, without float
atomics), argument validation and the ops layer's wiring with CPU stand-ins for the
kernels; numerics are checked on the GPU."""

from __future__ import annotations

import importlib
import re

import pytest
import torch

from cuteforge.kernels.cross_entropy.device import ce_config
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
        if which == "fwd":  # 16-byte vectors through the cp.async ring (v3)
            assert re.search(r"cp\.async\.cg\.shared\.global[.a-zA-Z0-9:_]* \[[^]]+\], \[[^]]+\], 16", ptx)
            assert re.search(r"ld\.shared\.v4\.", ptx) and "cp.async.wait_group" in ptx
        else:
            assert re.search(r"ld\.global[.a-zA-Z0-9:_]*\.v4\.", ptx)
            assert re.search(r"st\.global[.a-zA-Z0-9:_]*\.v4\.", ptx)


def _compile_reduce(dt, n, vec, mean, lse, cfg=None, out_dt=None):
    import cutlass
    import cutlass.cute as cute

    from cuteforge.kernels.cross_entropy import make_ce_fwd_reduce

    d = {"f32": cutlass.Float32, "bf16": cutlass.BFloat16, "f16": cutlass.Float16}[dt]
    cfg = cfg or ce_config(n, d.width)
    m, ln = cute.sym_int(), cute.sym_int()
    rows = cute.runtime.make_fake_tensor(d, (m, n), (cute.sym_int64(divisibility=vec), 1), assumed_align=vec * d.width // 8)
    tgt = cute.runtime.make_fake_tensor(cutlass.Int64, (m,), (1,), assumed_align=8)
    od = cutlass.Float32 if out_dt == "f32" else d
    out = cute.runtime.make_fake_tensor(od, (1,), (1,), assumed_align=16)
    lse_t = cute.runtime.make_fake_tensor(cutlass.Float32, (ln,), (1,), assumed_align=4)
    work = cute.runtime.make_fake_tensor(cutlass.Int32, (cute.sym_int(),), (1,), assumed_align=16)
    stream = cute.runtime.make_fake_stream(use_tvm_ffi_env_stream=True)
    fn = make_ce_fwd_reduce(d, n, vec, cfg, -100, mean, lse, od)
    return cute.compile(fn, rows, tgt, out, lse_t, work, stream, options="--enable-tvm-ffi --keep-ptx").__ptx__


def test_compile_reduce_fp32_out(monkeypatch):
    """bf16 logits with an fp32 out (`out_dtype=torch.float32`): the fp32 result is
    stored as it is (no conversion to bf16 anywhere in the kernel); the same kernel with
    a bf16 out converts once."""
    monkeypatch.setenv("CUTE_DSL_ARCH", "sm_90a")
    ptx = _compile_reduce("bf16", 4096, 8, True, True, out_dt="f32")
    assert "cvt.rn.bf16.f32" not in ptx and "div.rn.f32" in ptx
    assert "cvt.rn.bf16.f32" in _compile_reduce("bf16", 4096, 8, True, True)


@pytest.mark.parametrize(
    "dt, n, vec, mean, lse",
    [("bf16", 4096, 8, True, True), ("f32", 65537, 1, True, False), ("f16", 7, 1, False, True),
     ("bf16", 2048, 8, False, False), ("f32", 1, 1, True, True)],
)
def test_compile_reduce(monkeypatch, dt, n, vec, mean, lse):
    """The reduced forward: the row's loads and ex2, two tickets (atom acq_rel at gpu
    scope, PTX's default scope: a group's, then the top one), strong loads of the
    partials, the counter resets, IEEE division only for mean, one rounding to the output
    dtype, no float atomics; and no row loop (the per-row forward's registers)."""
    monkeypatch.setenv("CUTE_DSL_ARCH", "sm_90a")
    ptx = _compile_reduce(dt, n, vec, mean, lse)
    assert ".entry" in ptx and "sm_90a" in ptx and "ex2.approx" in ptx
    assert len(re.findall(r"atom\.global\.acq_rel\.add\.u32", ptx)) == 2
    assert "%nctaid.x" in ptx and "ld.relaxed.gpu.global.b32" in ptx
    assert len(re.findall(r"st\.relaxed\.gpu\.global\.b32", ptx)) == 3  # one group; a group, then the top
    assert not re.search(r"(atom|red)[.a-z_:]*\.(f32|f16|bf16|f64)", ptx)  # nothing order-dependent
    assert ("div.rn.f32" in ptx) == mean and "div.approx" not in ptx and "div.full" not in ptx
    if dt != "f32":
        assert f"cvt.rn.{dt}.f32" in ptx
    if vec * (32 if dt == "f32" else 16) == 128:  # the per-row forward's cp.async ring
        assert re.search(r"cp\.async\.cg\.shared\.global[.a-zA-Z0-9:_]* \[[^]]+\], \[[^]]+\], 16", ptx)


def test_reduce_groups_and_workspace():
    """A reducing CTA reads at most 64 partials a thread (8 from 256 threads up), whole
    chunks of 8; two levels of groups reach 4M CTAs and more; the workspace has room for
    every counter and partial, plus a group of pad for the masked whole-chunk loads."""
    from cuteforge.kernels.cross_entropy import device as k

    for t in (32, 64, 128, 256, 512, 1024):
        s = k.reduce_group(t)
        assert s <= k.GROUP_MAX and s % (8 * t) == 0 and s // t <= 64
        assert k.reduce_fits(s * s, t) and not k.reduce_fits(s * s + 1, t) and s * s >= 2**22
    assert k.WORK_TOP < k.WORK_CNT1 and k.WORK_CNT1 + k.GROUP_MAX <= k.WORK_ZERO == k.WORK_GSUM
    assert k.WORK_GCNT - k.WORK_GSUM == k.GROUP_MAX and k.WORK_PART - k.WORK_GCNT == k.GROUP_MAX
    for g in (2, 2049, 10**6):
        assert k.work_words(g) >= k.WORK_PART + 2 * g + k.reduce_group(1024)


def test_bad_arguments():
    import cutlass

    from cuteforge.kernels.cross_entropy import make_ce_bwd, make_ce_fwd

    with pytest.raises(ValueError, match="cluster"):
        make_ce_fwd(cutlass.Float32, 262144, 4, RowReduceConfig(1024, 1024, 4, cluster_n=2), -100)
    with pytest.raises(ValueError, match="vec"):
        make_ce_bwd(cutlass.BFloat16, 4096, 16, default_config(4096, 16), -100)
    with pytest.raises(ValueError, match="dtype"):
        make_ce_bwd(cutlass.Int32, 4096, 4, default_config(4096, 32), -100)
    from cuteforge.kernels.cross_entropy import make_ce_fwd_reduce

    with pytest.raises(ValueError, match="cluster"):
        make_ce_fwd_reduce(cutlass.Float32, 262144, 4, RowReduceConfig(1024, 1024, 4, cluster_n=2), -100, True, True)
    with pytest.raises(ValueError, match="vec"):
        make_ce_fwd_reduce(cutlass.BFloat16, 4096, 16, default_config(4096, 16), -100, True, False)


def _reduce_key(dt="bfloat16", n=4096, one=1):
    from cuteforge.signature import BoundKey

    width = 4 if dt == "float32" else 8
    return BoundKey((dt, "int64", dt, "float32", "int32"), (("N", n), ("ONE", one)), (width, 2, width, 4, 4))


def test_reduce_registry_compile_through_cache(monkeypatch):
    """cross_entropy_fwd_reduce builds from a BoundKey with sorted parameters (what ops
    and precompile pass); a wrong output size is refused before compiling."""
    monkeypatch.setenv("CUTEFORGE_ARCH", "sm_90a")
    monkeypatch.setenv("CUTE_DSL_ARCH", "sm_90a")
    from cuteforge import cache
    from cuteforge.kernels.cross_entropy.spec import cross_entropy_fwd_reduce

    before = cache.STATS.compiles + cache.STATS.l2_loads
    key, params = next(iter(cross_entropy_fwd_reduce.specializations()))
    assert params == {"ignore_index": -100, "lse": True, "mean": True}
    assert callable(cross_entropy_fwd_reduce.get(key, tuple(sorted(params.items()))))
    assert cache.STATS.compiles + cache.STATS.l2_loads == before + 1
    p = (("ignore_index", -100), ("lse", False), ("mean", False))
    with pytest.raises(ValueError, match="'out' must have 1 element"):
        cross_entropy_fwd_reduce.get(_reduce_key(one=2), p)


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
    from cuteforge.kernels.cross_entropy.spec import (
        cross_entropy_bwd,
        cross_entropy_fwd,
        cross_entropy_fwd_reduce,
    )
    from cuteforge.signature import BoundKey

    for k, key, params in (
        (cross_entropy_fwd, BoundKey(("bfloat16", "int64", "float32", "float32"), (("N", 4096),), (8, 2, 4, 4)),
         (("ignore_index", -100),)),
        (cross_entropy_bwd, BoundKey(("bfloat16", "int64", "float32", "float32", "bfloat16"), (("N", 4096),), (8, 2, 4, 4, 8)),
         (("ignore_index", -100),)),
        (cross_entropy_fwd_reduce, _reduce_key(), (("ignore_index", -100), ("lse", True), ("mean", True))),
    ):
        spec = k.spec(key, params, None, arch="sm_90a")
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


def _reference_red_launcher(calls, works):
    """A CPU stand-in for the reduced forward (out = the fp32 sum, or sum / count, rounded
    once to out's dtype; with lse, lse[:M] and the count at lse[M]), recording each build
    (in `calls`, like _reference_launcher) and each launch's workspace (in `works`)."""
    import torch

    from cuteforge.kernels.cross_entropy.device import WORK_ZERO, ce_config

    def build(key, cfg, ignore_index, mean, with_lse):
        # key: the stand-in _red_key's ("key", dtype, N, out dtype); cfg: the row config (_row_config)
        n, bits = key[2], key[1].itemsize * 8
        assert cfg == ce_config(n, bits)
        calls.append((key, n, bits, ignore_index, mean, with_lse))

        def fn(lg, tg, out, lse, work):
            m = lg.shape[0]
            assert m > 0 and lg.shape[1] == n and lg.element_size() * 8 == bits  # M == 0 never launches
            assert out.shape == (1,) and out.dtype == key[3] and lse.dtype == torch.float32
            assert work.dtype == torch.int32 and work.shape[0] >= WORK_ZERO
            works.append(work)
            x = lg.float()
            s = torch.logsumexp(x, 1)
            ok = (tg >= 0) & (tg < x.shape[1])
            xt = x.gather(1, tg.clamp(0, x.shape[1] - 1)[:, None])[:, 0]
            loss = torch.where(tg == ignore_index, 0.0, torch.where(ok, s - xt, float("nan")))
            count = (tg != ignore_index).sum().float()
            total = loss.sum()
            out.copy_(total / count if mean else total)
            if with_lse:
                assert lse.shape == (m + 1,)
                lse[:m] = s
                lse[m] = count

        return fn

    return build


def _patch_kernels(monkeypatch, ce):
    import sys

    launch = sys.modules["cuteforge.ops.cross_entropy_launch"]
    calls: list = []
    works: list = []
    monkeypatch.setattr(launch, "_fwd_launcher", _reference_launcher(calls))
    monkeypatch.setattr(launch, "_red_key", lambda logits, target, out_dtype: ("key", logits.dtype, logits.shape[1],
                                                                                  out_dtype))
    monkeypatch.setattr(launch, "_red_get", _reference_red_launcher(calls, works))
    # the row config without a store lookup (which binds CUDA tensors): the heuristic
    monkeypatch.setattr(launch, "_row_config", lambda lg, tg, ii: launch.config_for(lg.shape[1], lg.element_size() * 8))
    monkeypatch.setattr(ce, "_PLANS", {})
    monkeypatch.setattr(launch, "_RED", {})
    # the C++ autograd node without a kernel: every backward takes its fallback, launch._bwd
    monkeypatch.setattr(launch, "_bwd_kernel", lambda *args: None)
    monkeypatch.setattr(ce, "_NODE_PLANS", {})
    import torch

    ws = torch.zeros(1 << 16, dtype=torch.int32)

    def work(device, words):
        assert device == -1 and words <= ws.shape[0]
        return ws

    monkeypatch.setattr(ce, "_work", work)
    return calls, works


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
    calls, works = _patch_kernels(monkeypatch, ce)
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
    # mean/sum launched the reduced kernel (no lse) on the stream's workspace; none never did
    assert {c[-1] for c in calls if isinstance(c[0], tuple)} == {False} and works and all(w is works[0] for w in works)
    e = torch.zeros(0, 40)
    assert torch.isnan(ce.cross_entropy(e, t[:0])) and ce.cross_entropy(e, t[:0], reduction="sum") == 0  # M = 0: no launch


@pytest.mark.parametrize("native_node", [True, False])
def test_eager_grad_path_one_launch(monkeypatch, native_node):
    """mean/sum with grad: one autograd node (the C++ one, or the Python one where that
    is unavailable) around one reduced launch with lse; its backward hands the kernel
    lse[:M] and g / count (mean) or g (sum) per row."""
    import sys

    import torch
    import torch.nn.functional as F

    import cuteforge.ops  # noqa: F401

    ce = sys.modules["cuteforge.ops.cross_entropy"]
    launch = sys.modules["cuteforge.ops.cross_entropy_launch"]  # the kernels' launchers
    calls, works = _patch_kernels(monkeypatch, ce)
    if not native_node:
        monkeypatch.setattr(ce.native, "module", lambda: None)
    seen: list = []

    def bwd(logits, target, lse, dloss, ignore_index):
        seen.append((lse.shape, dloss.clone()))
        p = torch.softmax(logits.float(), 1)
        keep = target != ignore_index
        onehot = torch.zeros_like(p)
        onehot[keep, target[keep]] = 1.0
        torch.testing.assert_close(lse, torch.logsumexp(logits.float(), 1))
        return ((p - onehot) * torch.where(keep, dloss, 0.0)[:, None]).to(logits.dtype)

    monkeypatch.setattr(launch, "_bwd", bwd)
    t = torch.tensor([1, -100, 3, 39, 0, 3])
    for dt in (torch.float32, torch.bfloat16):
        for red in ("mean", "sum"):
            x = torch.randn(6, 40).to(dt).requires_grad_(True)
            ref_x = x.detach().float().requires_grad_(True)
            got = ce.cross_entropy(x, t, reduction=red)
            want = F.cross_entropy(ref_x, t, reduction=red)
            assert got.dtype == dt and got.shape == ()
            torch.testing.assert_close(got.float(), want, **({} if dt == torch.float32 else {"rtol": 1e-2, "atol": 1e-2}))
            (got * 3).backward()
            (want * 3).backward()
            torch.testing.assert_close(x.grad.float(), ref_x.grad, **({} if dt == torch.float32 else {"rtol": 2e-2, "atol": 2e-3}))
            assert seen[-1][0] == (6,)
            torch.testing.assert_close(seen[-1][1], torch.full((6,), 3.0 / (5 if red == "mean" else 1)))
    assert len(calls) == 4 and all(c[-1] is True for c in calls)  # (dtype, reduction) each built once, with lse
    e = torch.zeros(0, 40, requires_grad=True)
    out = ce.cross_entropy(e, t[:0])
    assert torch.isnan(out)
    out.backward()
    assert e.grad.shape == (0, 40)


@pytest.mark.parametrize("native_node", [True, False])
def test_fp32_result_for_low_precision_logits(monkeypatch, native_node):
    """out_dtype=torch.float32: bf16 logits give the fp32 loss (the kernel's fp32 sum, not
    rounded to bf16) with and without grad, for every reduction; the reduced kernel is
    built for the fp32 out apart from the bf16 one; the gradient is the same; any other
    out_dtype is refused by name."""
    import sys

    import torch
    import torch.nn.functional as F

    import cuteforge.ops  # noqa: F401

    ce = sys.modules["cuteforge.ops.cross_entropy"]
    calls, _ = _patch_kernels(monkeypatch, ce)
    if not native_node:
        monkeypatch.setattr(ce.native, "module", lambda: None)

    def bwd(logits, target, lse, dloss, ignore_index):  # the backward kernel's answer
        keep = target != ignore_index
        onehot = torch.zeros(logits.shape)
        onehot[keep, target[keep]] = 1.0
        p = torch.softmax(logits.float(), 1)
        return ((p - onehot) * torch.where(keep, dloss.float(), 0.0)[:, None]).to(logits.dtype)

    monkeypatch.setattr(sys.modules["cuteforge.ops.cross_entropy_launch"], "_bwd", bwd)
    t = torch.tensor([1, -100, 3, 39, 0, 3])
    x = (torch.randn(6, 40) * 4).to(torch.bfloat16)
    for red in ("mean", "sum", "none"):
        want = F.cross_entropy(x.float(), t, reduction=red)
        for grad in (False, True):
            xg = x.clone().requires_grad_(grad)
            got = ce.cross_entropy(xg, t, reduction=red, out_dtype=torch.float32)
            assert got.dtype == torch.float32
            torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)
            if grad:
                got.sum().backward()
                ref = x.clone().requires_grad_(True)
                ce.cross_entropy(ref, t, reduction=red).float().sum().backward()
                torch.testing.assert_close(xg.grad, ref.grad)
    reduced = [c for c in calls if isinstance(c[0], tuple)]
    assert {c[0][3] for c in reduced} == {torch.float32, torch.bfloat16}  # built apart per out dtype
    assert ce.cross_entropy(x.float(), t, out_dtype=torch.float32).dtype == torch.float32  # fp32 logits: accepted
    for bad in (torch.float16, "float32", torch.float64):
        with pytest.raises(ValueError, match="'out_dtype' must be None, torch.float32"):
            ce.cross_entropy(x, t, out_dtype=bad)


def test_no_grad_plan_compiles_on_first_run(monkeypatch):
    """A call with grad plans (validates) the no-grad path but compiles only the variant
    it runs (with lse); the no-grad variant compiles on the first call without grad."""
    import sys

    import torch

    import cuteforge.ops  # noqa: F401

    ce = sys.modules["cuteforge.ops.cross_entropy"]
    launch = sys.modules["cuteforge.ops.cross_entropy_launch"]  # the kernels' launchers
    calls, _ = _patch_kernels(monkeypatch, ce)
    monkeypatch.setattr(launch, "_bwd", lambda logits, *a: torch.zeros_like(logits))
    x, t = torch.randn(6, 40, requires_grad=True), torch.tensor([1, -100, 3, 39, 0, 3])
    ce.cross_entropy(x, t).backward()
    ce.cross_entropy(x, t).backward()
    assert [c[-1] for c in calls] == [True]
    with torch.no_grad():
        ce.cross_entropy(x, t)
        ce.cross_entropy(x, t)
    assert [c[-1] for c in calls] == [True, False]


def test_reduce_launcher_params_match_precompile(monkeypatch):
    """The ops layer asks for the reduced kernel with the parameters in the order
    precompile uses (sorted), so a precompiled entry is the one a training step loads."""
    import sys

    import torch

    import cuteforge.ops  # noqa: F401
    from cuteforge.kernels.cross_entropy.spec import cross_entropy_fwd_reduce

    launch = sys.modules["cuteforge.ops.cross_entropy_launch"]  # the kernels' launchers
    asked: list = []

    class Fake:  # the registered kernel, on a CPU: records what it is asked for
        class signature:  # noqa: N801
            @staticmethod
            def bind(tensors, where):
                assert [tuple(a.shape) for a in tensors[2:]] == [(1,), (1,), (4,)]
                return "key"

        @staticmethod
        def get(key, params, config):
            asked.append(params)
            return lambda *a: None

    monkeypatch.setattr(launch, "cross_entropy_fwd_reduce", Fake)
    monkeypatch.setattr(launch, "_RED", {})
    monkeypatch.setattr(launch, "_row_config", lambda lg, tg, ii: launch.config_for(lg.shape[1], lg.element_size() * 8))
    fn, words = launch._red_launcher(torch.randn(6, 40), torch.zeros(6, dtype=torch.long), -100, True, True,
                                     torch.float32)
    _, params = next(iter(cross_entropy_fwd_reduce.specializations()))
    assert asked == [tuple(sorted(params.items()))] and callable(fn) and words == launch.work_words(1)


def test_beyond_two_levels_reduces_with_torch(monkeypatch):
    """A grid past kernels.reduce_fits (millions of rows) keeps the per-row kernel and
    reduces with torch ops, with and without grad."""
    import sys

    import torch
    import torch.nn.functional as F

    import cuteforge.ops  # noqa: F401

    ce = sys.modules["cuteforge.ops.cross_entropy"]
    launch = sys.modules["cuteforge.ops.cross_entropy_launch"]  # the kernels' launchers
    calls, works = _patch_kernels(monkeypatch, ce)
    monkeypatch.setattr(launch, "reduce_fits", lambda ctas, threads: False)
    monkeypatch.setattr(launch, "_bwd", lambda logits, target, lse, dloss, ii: torch.full_like(logits, float(dloss[0])))
    x, t = torch.randn(6, 40), torch.tensor([1, -100, 3, 39, 0, 3])
    for red in ("mean", "sum"):
        torch.testing.assert_close(ce.cross_entropy(x, t, reduction=red), F.cross_entropy(x, t, reduction=red))
        xg = x.clone().requires_grad_(True)
        got = ce.cross_entropy(xg, t, reduction=red)
        torch.testing.assert_close(got, F.cross_entropy(x, t, reduction=red))
        got.backward()
        assert torch.all(xg.grad == (0.2 if red == "mean" else 1.0))
    assert works == [] and all(not isinstance(c[0], tuple) for c in calls)  # only the per-row kernel


def test_mean_and_sum_take_the_reduced_kernel_at_any_n() -> None:
    """mean/sum take the one-launch reduced forward wherever its grid fits, 16-bit
    rows past 16384 included (with v3's forward it read level or ahead of the per-row
    kernel + torch's reduction there on the H200, h200-cross-entropy-reduced.json), and
    precompile builds it for every dtype."""
    from cuteforge.kernels.cross_entropy import device as k
    from cuteforge.kernels.cross_entropy import spec

    launch = importlib.import_module("cuteforge.ops.cross_entropy_launch")

    def words(m: int, n: int, dt: torch.dtype) -> int:
        return launch._red_words(torch.empty(m, n, dtype=dt, device="meta"), k.ce_config(n, dt.itemsize * 8))

    for n in (16385, 65536, 131072):
        assert words(32768, n, torch.bfloat16) > 0 and words(32768, n, torch.float16) > 0
    assert words(8, 65536, torch.float32) > 0
    widths = {key.dtypes[0] for key, _ in spec._reduce_specs()}
    assert widths == {"float32", "bfloat16", "float16"}


def test_forward_ring_holds_no_chunk_in_registers(monkeypatch):
    """The forward's cp.async ring (v3): a thread keeps its vectors in flight in shared
    memory and widens FOLD_VALUES at a time, so 16-bit rows compile to few registers with
    no spill (the defaults at N = 16384 / 32768, and 256 x 8 at 16384, which v2's loop
    assembled to 120 registers: two CTAs of 256 per SM, 85.9 % of copy against 103.2 % on
    the H200, docs/kernels/cross_entropy.md v3)."""
    from ptxas_check import ptxas_no_spill

    from cuteforge.kernels.cross_entropy import device as kernels

    monkeypatch.setenv("CUTE_DSL_ARCH", "sm_90a")

    def regs(n, cfg=None):
        return int(re.search(r"Used (\d+) registers", ptxas_no_spill(_compile("fwd", "bf16", n, 8, cfg))).group(1))

    assert regs(16384) <= 48 and regs(32768) <= 48
    assert regs(16384, RowReduceConfig(256, 256, 8)) <= 48
    monkeypatch.setattr(kernels, "PIPELINE", False)
    assert regs(16384, RowReduceConfig(256, 256, 8)) >= 96


@pytest.mark.parametrize("dt, n, vec", [("bf16", 50257, 1), ("f32", 50257, 1), ("f16", 32002, 2), ("bf16", 33, 1)])
def test_forward_realigns_rows_not_on_16_bytes(monkeypatch, dt, n, vec):
    """a row that does not start on 16 bytes is read from its first 16-byte boundary
    in 16-byte vectors (through the cp.async ring where the row is long), the head before
    it and the tail after it as scalars; it assembles without spilling."""
    from ptxas_check import ptxas_no_spill

    monkeypatch.setenv("CUTE_DSL_ARCH", "sm_90a")
    ptx = _compile("fwd", dt, n, vec)
    assert re.search(r"ld\.global[.a-zA-Z0-9:_]*\.v4\.|cp\.async\.cg\.shared\.global[^;]*, 16;", ptx)
    if n >= 32002:
        assert re.search(r"cp\.async\.cg\.shared\.global[^;]*, 16;", ptx)
    ptxas_no_spill(ptx)


@pytest.mark.parametrize("dt, n, vec", [("bf16", 50257, 1), ("f32", 50257, 1), ("bf16", 33, 1), ("bf16", 4096, 8)])
def test_backward_realigns_rows_not_on_16_bytes(monkeypatch, dt, n, vec):
    """the backward reads and writes a row that does not start on 16 bytes in
    16-byte vectors from its first 16-byte boundary (where logits and dlogits share the
    head), and keeps its 16-byte vectors on aligned rows; no spill."""
    from ptxas_check import ptxas_no_spill

    monkeypatch.setenv("CUTE_DSL_ARCH", "sm_90a")
    ptx = _compile("bwd", dt, n, vec)
    assert re.search(r"ld\.global[.a-zA-Z0-9:_]*\.v4\.", ptx) and re.search(r"st\.global[.a-zA-Z0-9:_]*\.v4\.", ptx)
    ptxas_no_spill(ptx)


def test_check_targets_raises_before_launch(monkeypatch):
    """An out-of-range target (not ignore_index) with check_targets=True is a ValueError
    naming it, raised before any launch; without it the call runs (its row is NaN on the
    GPU), and ignore_index rows are never out of range."""
    import sys

    import pytest
    import torch

    import cuteforge.ops  # noqa: F401

    ce = sys.modules["cuteforge.ops.cross_entropy"]
    calls, _ = _patch_kernels(monkeypatch, ce)
    x = torch.randn(4, 10)
    bad = torch.tensor([1, 10, -100, 3])
    n = len(calls)
    with pytest.raises(ValueError, match=r"argument 'target' has target\[1\] = 10, outside \[0, 10\)"):
        ce.cross_entropy(x, bad, check_targets=True)
    with pytest.raises(ValueError, match=r"target\[0\] = -1"):
        ce.cross_entropy(x, torch.tensor([-1, 0, 0, 0]), reduction="none", check_targets=True)
    assert ce.cross_entropy(x, torch.tensor([1, 9, -100, 0]), check_targets=True).isfinite()
    ce.cross_entropy(x, bad, reduction="none")  # unchecked: runs
    assert len(calls) >= n
