"""Long-row forwards: softmax (the default config against the v2 paths, SoftmaxConfig.path
= mbar / async / smem, kernels/softmax/chunked.py) and, with --ops, rms_norm / layer_norm
(the default against NormConfig.exchange = "mbar" and 256-thread cluster configs,
kernels/norm/config.longrow_candidates), each beside quack, one process, one GPU.

For every dtype and N: M = min(32768, 2^28 // N) rows of randn; each config's kernel is
launched directly (no op overhead), timed with cuteforge.timing.events.bench (L2 flushed before
each call, median of CUDA events) and checked against torch.softmax in fp32 (max abs
error, max error relative to the reference element, NaN count), so a fast wrong config
is flagged (`correct`: false). Copy bandwidth is measured in the same run. All configs
compile first, in parallel worker processes (cuteforge.autotune.pool).

Writes JSON to --out: command, gpu, copy_GBps, and per (op, dtype, N) a `shapes` entry:
rows of {config, path, default, us, GBps, pct_copy, max_abs_err, max_rel_err, tol_ratio,
nan, correct}, the quack figure and ratio (ours / quack) for each, and `best` (fastest
correct config). Norm shapes: rms_norm without bias, layer_norm with bias, weights in
x's dtype, no residual; checked against torch in fp32 (tolerance scaled by max |y|).

    python benchmarks/bench_longrow.py --ops softmax,rms_norm,layer_norm --out $OUT/h200-longrow.json

Backward (--ops rms_norm_bwd,layer_norm_bwd): the backward default against
kernels/norm/config.longrow_bwd_candidates (mbar exchange in the persistent backward,
256/512-thread CTAs). Inputs as above plus dy = randn; mean/rstd from torch in fp32 (no
forward kernel compiled). `us` times what ops/norm.py's `_backward` does with that config
(dx, dweight/dbias partials allocated, the kernel, the partials' column sum into the
weight's dtype); `kernel_us` the launch alone on preallocated outputs. Bytes as
bench.library.bytes_moved counts a norm backward: read x and dy, write dx (3 M N
elements), plus weight (and bias) once. dx and dweight (and dbias) are checked against
torch in fp32. quack's rmsnorm_bwd is timed beside rms_norm_bwd (quack.rmsnorm.rmsnorm_bwd,
its own partial sum included), not beside layer_norm_bwd (its JIT compile per shape would
not fit the time budget).

    python benchmarks/bench_longrow.py --ops rms_norm_bwd,layer_norm_bwd --dtypes bfloat16,float32 --out $OUT/h200-longrow-bwd.json
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
import time
from pathlib import Path
from typing import Any

import torch

from cuteforge.bench.report import results_header, write_results  # noqa: E402
from cuteforge.timing import events as timing

MAX_ELEMS = 1 << 28
OPS = ["softmax", "rms_norm", "layer_norm", "rms_norm_bwd", "layer_norm_bwd"]
DEFAULT_OPS = ["softmax", "rms_norm", "layer_norm"]
BWD_OPS = ("rms_norm_bwd", "layer_norm_bwd")
NS = [16384, 24576, 32768, 65536, 131072, 262144]
NORM_NS = [32768, 65536, 131072, 262144]
NORM_TOL = {"bfloat16": 1.6e-2, "float16": 2e-3, "float32": 1e-4}
DTYPES = ["bfloat16", "float16", "float32"]
# |y - ref| <= atol + rtol |ref| (ref: torch in fp32, rounded to the output dtype for
# 16-bit), as tests/gpu/test_softmax_gpu.py: softmax outputs of long rows are ~1/N, fp16
# subnormals at N >= 32768, so an error relative to the element alone flags a correct
# fp16 result (one subnormal ulp is 6e-8); the atol covers exactly that.
TOL = {"bfloat16": (1.6e-2, 1e-30), "float16": (1.6e-2, 1e-7), "float32": (4e-5, 1e-30)}  # (rtol, atol)


def rows_for(n: int) -> int:
    return max(1, min(32768, MAX_ELEMS // n))


def _key(n: int, dtype: torch.dtype):
    from cuteforge.signature import BoundKey, dtype_name, vector_width

    vec = vector_width(0, (n,), dtype.itemsize)
    return BoundKey((dtype_name(dtype),) * 2, (("N", n),), (vec, vec))


def plans(dtypes: list[str], ns: list[int], max_per: int) -> list[tuple[str, int, Any, bool]]:
    from cuteforge.arch import target_arch
    from cuteforge.kernels.softmax import longrow_candidates
    from cuteforge.kernels.softmax.spec import config_for

    arch = target_arch()
    out = []
    for dt in dtypes:
        bits = getattr(torch, dt).itemsize * 8
        for n in ns:
            d = config_for(arch, n, bits, False, rows_for(n), "softmax", _key(n, getattr(torch, dt)))  # the op's default
            out.append((dt, n, d, True))
            for c in longrow_candidates(n, bits)[:max_per]:
                if c != d:
                    out.append((dt, n, c, False))
    return out


def _quack_softmax():
    try:
        return importlib.import_module("quack.softmax").softmax_fwd
    except Exception as e:  # reported, never fatal
        print("quack unavailable:", e)
        return None


def _check(y: torch.Tensor, ref: torch.Tensor, dt: str) -> dict[str, Any]:
    """Errors of y against the fp32 reference; `tol_ratio` = max |y - r| / (atol + rtol |r|)
    with r the reference rounded to y's dtype (<= 1: correct)."""
    yf = y.float()
    nan = int(yf.isnan().sum())
    diff = (yf - ref).abs_()
    mae = float(diff.amax())
    rel = float((diff / ref.abs().clamp_min(1e-30)).amax())
    rtol, atol = TOL[dt]
    r = ref.to(y.dtype).float()
    ratio = float(((yf - r).abs_() / (atol + rtol * r.abs())).amax())
    return {"max_abs_err": mae, "max_rel_err": rel, "tol_ratio": round(ratio, 4), "nan": nan, "correct": nan == 0 and ratio <= 1.0}


def norm_plans(ops: list[str], dtypes: list[str], ns: list[int]) -> list[tuple[str, str, int, Any, bool]]:
    """(op, dtype, n, config, is_default): the current default and every long-row candidate."""
    from cuteforge.kernels.norm.config import default_config, longrow_candidates

    out = []
    for op in ops:
        for dt in dtypes:
            bits = getattr(torch, dt).itemsize * 8
            for n in ns:
                d = default_config(n, bits)
                out.append((op, dt, n, d, True))
                out += [(op, dt, n, c, False) for c in longrow_candidates(n, bits) if c != d]
    return out


def _norm_case(op: str, dt: str, n: int, m: int) -> dict[str, Any]:
    gen = torch.Generator(device="cuda").manual_seed(0)
    dtype = getattr(torch, dt)
    x = torch.randn(m, n, device="cuda", dtype=dtype, generator=gen)
    w = (1 + 0.1 * torch.randn(n, device="cuda", generator=gen)).to(dtype)
    b = (0.1 * torch.randn(n, device="cuda", generator=gen)).to(dtype) if op == "layer_norm" else None
    stats = torch.empty(m, device="cuda")
    return {"x": x, "w": w, "b": b, "y": torch.empty_like(x), "mean": torch.empty_like(stats), "rstd": stats}


def _norm_key_params(op: str, case: dict[str, Any], residual: bool = False) -> tuple[Any, tuple[tuple[str, Any], ...]]:
    from cuteforge.kernels.norm.spec import norm_fwd

    x, w, b, y, r = case["x"], case["w"], case["b"], case["y"], case["rstd"]
    key = norm_fwd.signature.bind((x[:1], w, w if b is None else b, x[:1], y[:1], y[:1], r[:1], r[:1]), "bench_longrow")
    kind = "rms" if op == "rms_norm" else "layer"
    eps = 1e-6 if kind == "rms" else 1e-5
    return key, (("eps", eps), ("has_bias", b is not None), ("has_residual", residual), ("kind", kind))


def _norm_check(y: torch.Tensor, ref: torch.Tensor, dt: str) -> dict[str, Any]:
    """As tests/gpu/test_norm_gpu.py: |y - r| <= tol max(1, max|r|) + tol |r|."""
    yf = y.float()
    nan = int(yf.isnan().sum())
    diff = (yf - ref).abs_()
    tol = NORM_TOL[dt]
    ratio = float((diff / (tol * max(1.0, float(ref.abs().amax())) + tol * ref.abs())).amax())
    return {"max_abs_err": float(diff.amax()), "tol_ratio": round(ratio, 4), "nan": nan, "correct": nan == 0 and ratio <= 1.0}


def _quack_norm(op: str):
    try:
        q = importlib.import_module("quack.rmsnorm")
    except Exception as e:  # reported, never fatal
        print("quack norms unavailable:", e)
        return None
    if op == "rms_norm":
        return lambda c: q.rmsnorm_fwd(c["x"], c["w"], eps=1e-6)
    if hasattr(q, "layernorm_fwd"):  # takes fp32 weight / bias
        return lambda c: q.layernorm_fwd(c["x"], c["w"].float(), c["b"].float(), eps=1e-5)
    return None


def bwd_plans(ops: list[str], dtypes: list[str], ns: list[int]) -> list[tuple[str, str, int, Any, bool]]:
    """(op, dtype, n, config, is_default) for the backward: the default and every
    backward long-row candidate."""
    from cuteforge.kernels.norm.config import default_config, longrow_bwd_candidates

    out = []
    for op in ops:
        for dt in dtypes:
            bits = getattr(torch, dt).itemsize * 8
            for n in ns:
                d = default_config(n, bits, backward=True, kind=op.split("_")[0])
                out.append((op, dt, n, d, True))
                out += [(op, dt, n, c, False) for c in longrow_bwd_candidates(n, bits) if c != d]
    return out


def _bwd_key_params(op: str, dt: str, n: int) -> tuple[Any, tuple[tuple[str, Any], ...]]:
    """The key ops/norm.py binds for this backward (weight in x's dtype, no dsum;
    rms without bias, layer with bias)."""
    from cuteforge.kernels.norm.spec import norm_bwd

    dtype = getattr(torch, dt)
    x = torch.empty(1, n, device="cuda", dtype=dtype)
    w = torch.empty(n, device="cuda", dtype=dtype)
    st = torch.empty(1, device="cuda")
    part = torch.empty(1, n, device="cuda")
    key = norm_bwd.signature.bind((x, w, x, x, st, st, x, part, part), "bench_longrow")
    kind = "rms" if op == "rms_norm_bwd" else "layer"
    return key, (("has_bias", kind == "layer"), ("has_dsum", False), ("kind", kind))


def _quack_bwd(op: str):
    """quack's rmsnorm backward (dx, dw; its partial sum included), None for layer_norm_bwd."""
    if op != "rms_norm_bwd":
        return None
    try:
        q = importlib.import_module("quack.rmsnorm")
    except Exception as e:  # reported, never fatal
        print("quack norms unavailable:", e)
        return None
    return lambda c: q.rmsnorm_bwd(c["x"], c["w"], c["dy"], c["rstd"])[:2]


def run_bwd_shape(shape: dict[str, Any], op: str, dt: str, n: int, cfgs: list[tuple[int, Any, bool]],
                  failed: dict[int, str], time_fn: Any, qbwd: Any, frozen: bool = False) -> None:
    """Time and check the default and every candidate backward config at one shape.
    ``frozen``: also the launch alone of the kernel without partials (has_dw=False, what
    a backward with frozen weight and bias runs; dx checked), as kernel_frozen_*."""
    from cuteforge.kernels.norm.spec import norm_bwd
    from cuteforge.ops import norm as impl
    from cuteforge.ops.norm import bwd_groups

    kind = "rms" if op == "rms_norm_bwd" else "layer"
    has_bias = kind == "layer"
    dtype = getattr(torch, dt)
    m = shape["M"]
    gen = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(m, n, device="cuda", dtype=dtype, generator=gen)
    dy = torch.randn(m, n, device="cuda", dtype=dtype, generator=gen)
    w = (1 + 0.1 * torch.randn(n, device="cuda", generator=gen)).to(dtype)
    eps = 1e-6 if kind == "rms" else 1e-5
    # fp32 reference: statistics, dx, dweight, dbias. A copy even for fp32 x: x.float()
    # would be x itself, and RMSNorm's xhat below is formed in place (it scaled the fp32
    # inputs the kernels were then timed and checked on: rms fp32 rows read "correct": false
    # before 2026-11-24, quack's the same)
    xf = x.to(torch.float32, copy=True)
    mean = xf.mean(-1) if kind == "layer" else None
    xc = xf - mean[:, None] if mean is not None else xf
    rstd = torch.rsqrt(xc.pow(2).mean(-1) + eps)
    del xf
    xhat = xc.mul_(rstd[:, None])
    dyf = dy.float()
    gw = dyf * w.float()
    c1 = (gw * xhat).mean(-1, keepdim=True)
    c2 = gw.mean(-1, keepdim=True) if kind == "layer" else 0.0
    ref_dx = (gw - xhat * c1 - c2) * rstd[:, None]
    del gw
    ref_dw = (dyf * xhat).sum(0)
    ref_db = dyf.sum(0) if has_bias else None
    del xhat, dyf
    elt = x.element_size()
    nbytes = 3 * m * n * elt + n * elt * (2 if has_bias else 1)
    case = {"x": x, "dy": dy, "w": w, "rstd": rstd}

    def check(dx: torch.Tensor, dw: torch.Tensor, db: torch.Tensor | None) -> dict[str, Any]:
        out = {f"dx_{k}": v for k, v in _norm_check(dx, ref_dx, dt).items()}
        cw = _norm_check(dw, ref_dw, dt)
        out["dw_tol_ratio"] = cw["tol_ratio"]
        ok = out["dx_correct"] and cw["correct"]
        if db is not None:
            cb = _norm_check(db, ref_db, dt)
            out["db_tol_ratio"] = cb["tol_ratio"]
            ok = ok and cb["correct"]
        out["correct"] = bool(ok)
        return out

    if qbwd is not None:
        try:
            qdx, qdw = qbwd(case)
            shape["quack"] = {**time_fn(lambda: qbwd(case), nbytes), **check(qdx, qdw, None)}
        except Exception as e:
            shape["quack"] = {"error": f"{type(e).__name__}: {str(e)[:200]}"}
    key, bparams = _bwd_key_params(op, dt, n)
    st = mean if mean is not None else rstd
    for i, c, d in cfgs:
        r: dict[str, Any] = {"config": repr(c), "exchange": c.exchange, "threads": c.threads, "cluster_n": c.cluster_n,
                             "ctas_per_sm": c.ctas_per_sm, "reload": c.reload, "prefetch": c.prefetch, "default": d}
        if i in failed:
            r["error"] = "compile: " + failed[i]
        else:
            try:
                dx, dw, db = impl._backward(kind, dy, x, w, mean, rstd, None, has_bias, c)
                torch.cuda.synchronize()
                r.update(check(dx, dw, db))
                del dx, dw, db
                r.update(time_fn(lambda c=c: impl._backward(kind, dy, x, w, mean, rstd, None, has_bias, c), nbytes))
                # the launch alone, on preallocated outputs (q as ops/norm.py picks it)
                q = bwd_groups(x.device, c, m)
                dxo = torch.empty_like(x)
                dwp = torch.empty(q, n, device="cuda")
                dbp = torch.empty(q, n, device="cuda") if has_bias else dwp
                fn = norm_bwd.get(key, bparams, c)
                a = (x, w, dy, dy, st, rstd, dxo, dwp, dbp)
                k = time_fn(lambda fn=fn, a=a: fn(*a), nbytes)
                r.update({"kernel_us": k["us"], "kernel_pct_copy": k["pct_copy"], "Q": q})
                if frozen:
                    fn0 = norm_bwd.get(key, tuple(sorted(bparams + (("has_dw", False),))), c)
                    dxo.zero_()
                    fn0(*a)
                    torch.cuda.synchronize()
                    r["frozen_dx_correct"] = _norm_check(dxo, ref_dx, dt)["correct"]
                    k0 = time_fn(lambda fn=fn0, a=a: fn(*a), nbytes)
                    r.update({"kernel_frozen_us": k0["us"], "kernel_frozen_pct_copy": k0["pct_copy"]})
                del dxo, dwp, dbp, a
                qs = shape.get("quack", {})
                if "GBps" in qs:
                    r["vs_quack"] = round(r["GBps"] / qs["GBps"], 3)
            except Exception as e:
                r["error"] = f"{type(e).__name__}: {str(e)[:300]}"
        shape["rows"].append(r)
        print(op, dt, m, n, json.dumps(r), flush=True)


def result_header(script: str, arch: str, compile_s: float, configs: int, failures: int, bytes_note: str) -> dict[str, Any]:
    """The head of a long-row results JSON: command, device, compile summary, timing
    method and the copy bandwidth measured now (shared with bench_norm_staged.py)."""
    return {
        **results_header(f"python benchmarks/{script} " + " ".join(sys.argv[1:])),
        "arch": arch,
        "compile_s": round(compile_s, 1),
        "configs": configs,
        "compile_failures": failures,
        "timing": "cuteforge.timing.events.bench: L2 flushed before each call, median of CUDA-event times; " + bytes_note,
        "copy_GBps": round(timing.copy_bandwidth() / 1e9, 1),
        "shapes": [],
    }


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--ops", default=",".join(DEFAULT_OPS), help=f"comma list of {OPS}")
    p.add_argument("--dtypes", default=",".join(DTYPES))
    p.add_argument("--ns", default=",".join(map(str, NS)), help="softmax N")
    p.add_argument("--norm-ns", default=",".join(map(str, NORM_NS)), help="rms_norm / layer_norm N")
    p.add_argument("--max-per", type=int, default=12, help="v2 candidates per (dtype, N)")
    p.add_argument("--rep-ms", type=float, default=30.0)
    p.add_argument("--no-quack", action="store_true")
    p.add_argument("--out", required=True)
    args = p.parse_args()
    t0 = time.time()
    ops = [o for o in args.ops.split(",") if o]
    if set(ops) - set(OPS):
        p.error(f"--ops: unknown {sorted(set(ops) - set(OPS))}; choose from {OPS}")
    dtypes = [d for d in args.dtypes.split(",") if d]
    ns = [int(v) for v in args.ns.split(",") if v]
    norm_ns = [int(v) for v in args.norm_ns.split(",") if v]
    from cuteforge.arch import target_arch
    from cuteforge.autotune.pool import CompileJob, compile_all
    from cuteforge.kernels.norm.spec import norm_bwd, norm_fwd
    from cuteforge.kernels.softmax.spec import softmax_fwd

    arch = target_arch()
    todo = plans(dtypes, ns, args.max_per) if "softmax" in ops else []
    ntodo = norm_plans([o for o in ops if o in ("rms_norm", "layer_norm")], dtypes, norm_ns)
    btodo = bwd_plans([o for o in ops if o in BWD_OPS], dtypes, norm_ns)
    params = (("mode", "softmax"),)
    tc = time.time()
    jobs = [CompileJob.of(softmax_fwd, _key(n, getattr(torch, dt)), params, c, arch) for dt, n, c, _ in todo]
    for op, dt, n, c, _ in ntodo:
        key, nparams = _norm_key_params(op, _norm_case(op, dt, n, 1))
        jobs.append(CompileJob.of(norm_fwd, key, nparams, c, arch))
    bjob0 = len(jobs)
    for op, dt, n, c, _ in btodo:
        key, bparams = _bwd_key_params(op, dt, n)
        jobs.append(CompileJob.of(norm_bwd, key, bparams, c, arch))
    outcomes = compile_all(jobs)
    failed = {i: str(o.error)[:300] for i, o in enumerate(outcomes) if not o.ok}
    result = result_header("bench_longrow.py", arch, time.time() - tc, len(jobs), len(failed),
                           "bytes = 2*M*N*size (backward: 3*M*N*size + weight/bias)")
    copy_bps = result["copy_GBps"] * 1e9
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)

    def save() -> None:  # after every shape: a run cut short still leaves its figures
        result["seconds"] = round(time.time() - t0, 1)
        write_results(out, result, check=bool(result["shapes"]))

    qfwd = None if args.no_quack or "softmax" not in ops else _quack_softmax()
    result["quack"] = None if args.no_quack else getattr(sys.modules.get("quack"), "__version__", None)
    save()

    def _time(fn, nbytes: int) -> dict[str, Any]:
        ms = timing.bench(fn, warmup_ms=5, rep_ms=args.rep_ms)
        bps = nbytes / (ms * 1e-3)
        return {"us": round(ms * 1e3, 2), "GBps": round(bps / 1e9, 1), "pct_copy": round(100 * bps / copy_bps, 1)}

    def _best(shape: dict[str, Any]) -> None:
        ok = [r for r in shape["rows"] if r.get("correct") and "GBps" in r]
        if ok:
            b = max(ok, key=lambda r: r["GBps"])
            shape["best"] = {k: b[k] for k in ("config", "GBps", "pct_copy") if k in b} | {"vs_quack": b.get("vs_quack")}

    groups: dict[tuple[str, int], list[tuple[int, Any, bool]]] = {}
    for i, (dt, n, c, d) in enumerate(todo):
        groups.setdefault((dt, n), []).append((i, c, d))
    for (dt, n), cfgs in groups.items():
        dtype = getattr(torch, dt)
        m = rows_for(n)
        torch.cuda.empty_cache()
        torch.manual_seed(0)
        x = torch.randn(m, n, device="cuda", dtype=dtype)
        y = torch.empty_like(x)
        ref = torch.softmax(x.float(), dim=-1)
        nbytes = 2 * x.numel() * x.element_size()
        shape: dict[str, Any] = {"op": "softmax", "dtype": dt, "M": m, "N": n, "rows": []}
        result["shapes"].append(shape)
        if qfwd is not None:
            try:
                shape["quack"] = {**_time(lambda x=x: qfwd(x), nbytes), **_check(qfwd(x), ref, dt)}
            except Exception as e:
                shape["quack"] = {"error": f"{type(e).__name__}: {str(e)[:200]}"}
        for i, c, d in cfgs:
            r: dict[str, Any] = {"config": repr(c), "path": c.path, "threads": c.threads, "cluster_n": c.cluster_n, "default": d}
            if i in failed:
                r["error"] = "compile: " + failed[i]
            else:
                try:
                    fn = softmax_fwd.get(_key(n, dtype), params, c)
                    y.fill_(float("nan"))
                    fn(x, y)
                    torch.cuda.synchronize()
                    r.update(_check(y, ref, dt))
                    r.update(_time(lambda fn=fn, x=x, y=y: fn(x, y), nbytes))
                    q = shape.get("quack", {})
                    if "GBps" in q:
                        r["vs_quack"] = round(r["GBps"] / q["GBps"], 3)
                except Exception as e:
                    r["error"] = f"{type(e).__name__}: {str(e)[:300]}"
            shape["rows"].append(r)
            print("softmax", dt, m, n, json.dumps(r), flush=True)
        del x, y, ref
        _best(shape)
        save()

    ngroups: dict[tuple[str, str, int], list[tuple[int, Any, bool]]] = {}
    for j, (op, dt, n, c, d) in enumerate(ntodo):
        ngroups.setdefault((op, dt, n), []).append((len(todo) + j, c, d))
    for (op, dt, n), cfgs in ngroups.items():
        m = rows_for(n)
        torch.cuda.empty_cache()
        case = _norm_case(op, dt, n, m)
        x, w, b, y = case["x"], case["w"], case["b"], case["y"]
        xf = x.float()
        if op == "rms_norm":
            ref = torch.nn.functional.rms_norm(xf, (n,), w.float(), 1e-6)
        else:
            ref = torch.nn.functional.layer_norm(xf, (n,), w.float(), b.float(), 1e-5)
        del xf
        nbytes = 2 * x.numel() * x.element_size()
        shape = {"op": op, "dtype": dt, "M": m, "N": n, "rows": []}
        result["shapes"].append(shape)
        qn = None if args.no_quack else _quack_norm(op)
        if qn is not None:
            try:
                qy = qn(case)
                qy = qy[0] if isinstance(qy, tuple) else qy
                shape["quack"] = {**_time(lambda qn=qn, c=case: qn(c), nbytes), **_norm_check(qy, ref, dt)}
            except Exception as e:
                shape["quack"] = {"error": f"{type(e).__name__}: {str(e)[:200]}"}
        key, nparams = _norm_key_params(op, case)
        bb = w if b is None else b
        for i, c, d in cfgs:
            r = {"config": repr(c), "exchange": c.exchange, "threads": c.threads, "cluster_n": c.cluster_n, "default": d}
            if i in failed:
                r["error"] = "compile: " + failed[i]
            else:
                try:
                    fn = norm_fwd.get(key, nparams, c)
                    args_ = (x, w, bb, x, y, y, case["mean"] if b is not None else case["rstd"], case["rstd"])
                    y.fill_(float("nan"))
                    fn(*args_)
                    torch.cuda.synchronize()
                    r.update(_norm_check(y, ref, dt))
                    r.update(_time(lambda fn=fn, a=args_: fn(*a), nbytes))
                    q = shape.get("quack", {})
                    if "GBps" in q:
                        r["vs_quack"] = round(r["GBps"] / q["GBps"], 3)
                except Exception as e:
                    r["error"] = f"{type(e).__name__}: {str(e)[:300]}"
            shape["rows"].append(r)
            print(op, dt, m, n, json.dumps(r), flush=True)
        del case, x, y, ref
        _best(shape)
        save()

    bgroups: dict[tuple[str, str, int], list[tuple[int, Any, bool]]] = {}
    for j, (op, dt, n, c, d) in enumerate(btodo):
        bgroups.setdefault((op, dt, n), []).append((bjob0 + j, c, d))
    for (op, dt, n), cfgs in bgroups.items():
        torch.cuda.empty_cache()
        shape = {"op": op, "dtype": dt, "M": rows_for(n), "N": n, "rows": []}
        result["shapes"].append(shape)
        run_bwd_shape(shape, op, dt, n, cfgs, failed, _time, None if args.no_quack else _quack_bwd(op))
        _best(shape)
        save()

    print(f"copy {result['copy_GBps']} GB/s")
    for s in result["shapes"]:
        d = next((r for r in s["rows"] if r["default"]), {})
        print(
            f"{s['op']:10s} {s['dtype']:9s} {s['M']:6d} x {s['N']:6d}  default {d.get('pct_copy', '-')}%  "
            f"best {s.get('best', {}).get('pct_copy', '-')}% {s.get('best', {}).get('config', '')}  "
            f"quack {s.get('quack', {}).get('pct_copy', '-')}%"
        )
    save()
    print("wrote", out, "in", result["seconds"], "s")


if __name__ == "__main__":
    main()
