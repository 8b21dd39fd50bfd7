"""GPU correctness + bandwidth check for the row reductions (dev tool, needs CUDA).

    python -m cuteforge.kernels.reduce.gpu_check --check           # numerics vs torch
    python -m cuteforge.kernels.reduce.gpu_check --bench           # sum TB/s per config
    python -m cuteforge.kernels.reduce.gpu_check --bench --ops sum,argmax --dtypes f32,bf16

Compiles exactly the way the runtime does (sym_int M, sym_int64 row stride,
TVM-FFI, env stream) and calls the compiled function with torch tensors.
Prints one line per case; exit status 1 if any check failed.
"""

from __future__ import annotations

import argparse
import math
import sys
import time

import cutlass
import cutlass.cute as cute
import torch

from .row import OPS, RowReduceConfig, candidate_configs, default_config, make_row_reduce

_CUTE = {
    torch.float32: cutlass.Float32,
    torch.bfloat16: cutlass.BFloat16,
    torch.float16: cutlass.Float16,
}
_TORCH = {"f32": torch.float32, "bf16": torch.bfloat16, "f16": torch.float16}
_cache: dict = {}


def pick_vec(x: torch.Tensor) -> int:
    es = x.element_size()
    for v in (8, 4, 2, 1):
        if v * es * 8 > 128:
            continue
        if x.data_ptr() % (v * es) == 0 and (x.shape[0] <= 1 or x.stride(0) % v == 0):
            return v
    return 1


def compiled_for(op, dtype, n, vec, cfg):
    key = (op, dtype, n, vec, cfg)
    if key not in _cache:
        in_dtype = _CUTE[dtype]
        out_dtype = cutlass.Int64 if op == "argmax" else in_dtype
        m = cute.sym_int()
        x = cute.runtime.make_fake_tensor(
            in_dtype,
            (m, n),
            (cute.sym_int64(divisibility=vec), 1),
            assumed_align=vec * in_dtype.width // 8,
        )
        out = cute.runtime.make_fake_compact_tensor(out_dtype, (m,))
        stream = cute.runtime.make_fake_stream(use_tvm_ffi_env_stream=True)
        t0 = time.perf_counter()
        _cache[key] = cute.compile(
            make_row_reduce(op, in_dtype, out_dtype, n, vec, cfg),
            x,
            out,
            stream,
            options="--enable-tvm-ffi",
        )
        _cache[key + ("t",)] = time.perf_counter() - t0
    return _cache[key]


def run(op, x, cfg=None, vec=None):
    m, n = x.shape
    vec = vec or pick_vec(x)
    cfg = cfg or default_config(n, x.element_size() * 8)
    f = compiled_for(op, x.dtype, n, vec, cfg)
    out = torch.empty(m, device=x.device, dtype=torch.int64 if op == "argmax" else x.dtype)
    if m > 0:
        f(x, out)
    return out


def reference(op, x):
    if op == "sum":
        return x.sum(dim=1)
    if op == "mean":
        return x.mean(dim=1)
    if op == "amax":
        return x.amax(dim=1)
    if op == "amin":
        return x.amin(dim=1)
    return x.argmax(dim=1)


def _make_input(m, n, dtype, kind, gen, misalign):
    # padded rows (row stride != n); stride a multiple of 8 elements so that
    # aligned views get vec = 16 B, misaligned views (start + 1 element) vec = 1
    row_len = -(-(n + 1) // 8) * 8 + 8
    base = torch.empty(m, row_len, device="cuda", dtype=dtype)
    x = base[:, 1 : n + 1] if misalign else base[:, :n]
    if kind == "randn":
        x.copy_(torch.randn(m, n, generator=gen, device="cuda"))
    elif kind == "ties":  # small ints: many equal maxima
        x.copy_(torch.randint(-3, 4, (m, n), generator=gen, device="cuda").to(dtype))
    elif kind == "nan":
        x.copy_(torch.randn(m, n, generator=gen, device="cuda"))
        k = max(1, n // 3)
        x[:, k] = float("nan")
        if n > 2 * k:
            x[::2, 2 * k] = float("nan")
    elif kind == "neginf":
        x.fill_(-math.inf)
    return x


def check(ops, dtypes, ns, ms, verbose=False) -> int:
    gen = torch.Generator(device="cuda").manual_seed(0)
    fails = 0
    total = 0
    for op in ops:
        for dn in dtypes:
            dtype = _TORCH[dn]
            for n in ns:
                bits = torch.finfo(dtype).bits
                cfgs = candidate_configs(n, bits)
                for m in ms:
                    for misalign in (False, True):
                        kinds = ["randn"] + (
                            ["ties", "nan", "neginf"] if op in ("argmax", "amax", "amin") else []
                        )
                        for kind in kinds:
                            x = _make_input(m, n, dtype, kind, gen, misalign)
                            ref = reference(op, x)
                            all_cfgs = (
                                kind == "randn"
                                and m == ms[-1]
                                and not misalign
                                and dn == dtypes[0]
                                and op in ("sum", "argmax")
                            )
                            for cfg in cfgs if all_cfgs else cfgs[:1]:
                                total += 1
                                try:
                                    got = run(op, x, cfg)
                                    torch.cuda.synchronize()
                                    ok, err = _compare(op, got, ref, n, dtype)
                                except Exception as e:  # noqa: BLE001
                                    ok, err = False, f"{type(e).__name__}: {str(e)[:300]}"
                                if not ok or verbose:
                                    print(
                                        f"{'ok  ' if ok else 'FAIL'} {op:6s} {dn:4s} m={m:5d} n={n:6d} vec={pick_vec(x)} "
                                        f"{kind:6s} {cfg} {err}",
                                        flush=True,
                                    )
                                fails += not ok
    print(f"check: {total - fails}/{total} passed")
    return fails


def _compare(op, got, ref, n, dtype):
    if op == "argmax":
        bad = (got != ref).nonzero()
        if len(bad):
            i = bad[0].item()
            return False, f"row {i}: got {got[i].item()} want {ref[i].item()}"
        return True, ""
    if op in ("amax", "amin"):
        same = (got == ref) | (got.isnan() & ref.isnan())
        if not bool(same.all()):
            i = (~same).nonzero()[0].item()
            return False, f"row {i}: got {got[i].item()} want {ref[i].item()}"
        return True, ""
    g, r = got.float(), ref.float()
    rtol = 1e-5 if dtype == torch.float32 else 1e-2
    atol = (1e-5 if dtype == torch.float32 else 1e-2) * math.sqrt(n) * (1 if op == "sum" else 1 / n)
    if not torch.allclose(g, r, rtol=rtol, atol=atol, equal_nan=True):
        d = (g - r).abs()
        i = int(d.argmax())
        return (
            False,
            f"row {i}: got {g[i].item()} want {r[i].item()} (max abs err {d.max().item():.3g})",
        )
    return True, ""


def check_big_offsets() -> int:
    """M*N > 2**31 elements: row offsets must be 64-bit."""
    m, n = (1 << 20) + 3, 2048  # 2.15e9 elements of bf16 = 4.3 GB
    x = torch.ones(m, n, device="cuda", dtype=torch.bfloat16)
    x[-5:] = torch.randn(5, n, device="cuda").bfloat16()
    got = run("sum", x)
    ref = x[-5:].float().sum(1)
    ok = torch.allclose(got[-5:].float(), ref, rtol=1e-2, atol=0.5) and bool(
        (got[:-5] == 2048).all()
    )
    print(
        f"{'ok  ' if ok else 'FAIL'} big-offset sum bf16 ({m}, {n}): tail {got[-5:].float().tolist()} vs {ref.tolist()}"
    )
    del x
    torch.cuda.empty_cache()
    return 0 if ok else 1


def _time(fn, iters=50, warmup=5):
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    evs = [
        (torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
        for _ in range(iters)
    ]
    for s, e in evs:
        s.record()
        fn()
        e.record()
    torch.cuda.synchronize()
    ts = sorted(s.elapsed_time(e) for s, e in evs)
    return ts[len(ts) // 2] * 1e-3


def _time_copy(x):
    y = torch.empty_like(x)
    return _time(lambda: y.copy_(x))


def _bench_shape(m, n, dn, ops, extra_cfgs):
    dtype = _TORCH[dn]
    x = torch.randn(m, n, device="cuda", dtype=dtype)
    nbytes = x.numel() * x.element_size()
    t_copy = _time_copy(x)
    print(f"== {dn} ({m}, {n}) {nbytes / 1e9:.2f} GB  copy {2 * nbytes / t_copy / 1e12:.2f} TB/s")
    bits = x.element_size() * 8
    vec = pick_vec(x)
    for op in ops:
        t_ref = _time(lambda op=op: reference(op, x))
        print(f"  {op:6s} torch            {nbytes / t_ref / 1e12:.2f} TB/s  {t_ref * 1e6:8.1f} us")
        out = torch.empty(m, device="cuda", dtype=torch.int64 if op == "argmax" else dtype)
        ref = reference(op, x)
        for cfg in list(candidate_configs(n, bits)) + list(extra_cfgs):
            try:
                cfg.validate(n, bits)
                f = compiled_for(op, dtype, n, vec, cfg)
            except Exception as e:  # noqa: BLE001
                print(f"  {op:6s} {cfg}  skipped: {str(e)[:120]}")
                continue
            t = _time(lambda f=f, out=out: f(x, out))
            ok, _ = _compare(op, out, ref, n, dtype)
            ct = _cache[(op, dtype, n, vec, cfg, "t")]
            print(
                f"  {op:6s} {nbytes / t / 1e12:5.2f} TB/s {t * 1e6:8.1f} us  "
                f"{'' if ok else 'WRONG '}{cfg}  (compile {ct:.2f}s)",
                flush=True,
            )


def bench(shapes, ops, dtypes, extra_cfgs=()):
    torch.manual_seed(0)
    for dn in dtypes:
        for m, n in shapes:
            _bench_shape(m, n, dn, ops, extra_cfgs)
            torch.cuda.empty_cache()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--check", action="store_true")
    ap.add_argument("--bench", action="store_true")
    ap.add_argument("--big", action="store_true", help="also run the M*N > 2**31 check")
    ap.add_argument("--ops", default=",".join(OPS))
    ap.add_argument("--dtypes", default="f32,bf16,f16")
    ap.add_argument("--verbose", action="store_true")
    ap.add_argument(
        "--shapes",
        default="32768x4096,16384x16384,4096x65536,1024x262144,262144x256,65536x1000,128x131072",
    )
    a = ap.parse_args(argv)
    ops = a.ops.split(",")
    dtypes = a.dtypes.split(",")
    fails = 0
    if a.check:
        fails += check(
            ops, dtypes, ns=[1, 7, 33, 1000, 4104, 65537, 262144], ms=[1, 3, 257], verbose=a.verbose
        )
        # clusters on odd N
        for op in ops:
            x = torch.randn(37, 200003, device="cuda", dtype=torch.float32)
            for cfg in (
                RowReduceConfig(1024, 1024, 4, cluster_n=2),
                RowReduceConfig(512, 512, 4, cluster_n=8),
            ):
                ok, err = _compare(op, run(op, x, cfg), reference(op, x), x.shape[1], x.dtype)
                print(f"{'ok  ' if ok else 'FAIL'} cluster {op} {cfg} {err}")
                fails += not ok
    if a.big:
        fails += check_big_offsets()
    if a.bench:
        shapes = [tuple(int(v) for v in s.split("x")) for s in a.shapes.split(",")]
        bench(
            shapes,
            ops if a.ops != ",".join(OPS) else ["sum"],
            dtypes if a.dtypes != "f32,bf16,f16" else ["f32"],
        )
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())
