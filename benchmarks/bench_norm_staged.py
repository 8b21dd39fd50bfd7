"""Row-staged norm backward (NormConfig.stages) against the current backward default,
one process, one GPU, same inputs.

For every op (rms_norm_bwd without bias, layer_norm_bwd with bias), dtype and N: M =
min(32768, 2^28 // N) rows (bench_membound.py's shapes), the default config and every
`config.staged_candidates(n, bits)` timed through ops/norm.py's `_backward` (`us`,
`pct_copy`: output allocation, the kernel, the partials' column sum) and as the launch alone
(`kernel_us`, `kernel_pct_copy`), checked against torch in fp32 (`correct`); quack's
rmsnorm_bwd beside rms_norm_bwd. Bytes = 3 M N elements + weight (+ bias), as
bench.library counts a norm backward. The timing and the checks are bench_longrow.py's
(`run_bwd_shape`).

    python benchmarks/bench_norm_staged.py --dtypes bfloat16,float16,float32 --ns 4096,8192,16384 \\
        --out $OUT/h200-norm-staged.json

Long rows (each CTA of a cluster stages its chunk of the row,
`config.longrow_staged_candidates`) at N > 16384:

    python benchmarks/bench_norm_staged.py --dtypes bfloat16,float32 --ns 32768,65536,131072,262144 \\
        --out $OUT/h200-norm-staged-longrow.json

``--fwd`` (the staged forward): rms_norm (no bias) and layer_norm (bias), no
residual, the forward default and every `config.longrow_staged_fwd_candidates(n, bits)`
config, launched alone on the same inputs (M = bench_longrow.rows_for(N)), checked
against torch in fp32, quack's rmsnorm_fwd / layernorm_fwd beside them. Bytes = 2 M N
elements (x read, y written), as bench_longrow.py counts a forward.

    python benchmarks/bench_norm_staged.py --fwd --dtypes bfloat16,float16,float32 \\
        --ns 4096,8192,16384,32768,65536,131072,262144 --out $OUT/h200-norm-staged-fwd.json

``--ab-lag`` times each staged cluster default, then it with ``lag=1`` (LayerNorm's lagged
statistics), then the default again (A B A in one process):

    python benchmarks/bench_norm_staged.py --fwd --ops layer_norm --dtypes bfloat16,float16,float32 \
        --ns 32768,65536,131072,262144 --defaults-only --no-quack --ab-lag --out $OUT/lag-ab.json

``--deep-lag`` times the default against every cluster-staged shape of >= 2 stages
(``deep_fwd_candidates``), each also lagged at 1, 2 and 3 CTAs per SM where that fits: the
sweep the earlier LayerNorm defaults were picked from on the H200:

    python benchmarks/bench_norm_staged.py --fwd --ops layer_norm --dtypes bfloat16 \
        --ns 65536,131072,262144 --deep-lag --no-quack --rep-ms 15 --out $OUT/h200-norm-fwd-layer-deep-lag.json

``--residual`` fuses the residual add (x + r is normalised and written too; bytes 4 M N);
``--configs "NormConfig(...);..."`` times those configs beside each shape's default (a
previous default, say), with ``--defaults-only`` nothing else:

    python benchmarks/bench_norm_staged.py --fwd --ops layer_norm --dtypes float32 --ns 262144 \\
        --defaults-only --residual --configs "NormConfig(512,512,16,2,exchange='mbar',cp_async=1)" --out X.json
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).parent))

from bench_longrow import (  # noqa: E402
    _bwd_key_params,
    _norm_case,
    _norm_check,
    _norm_key_params,
    _quack_bwd,
    _quack_norm,
    result_header,
    rows_for,
    run_bwd_shape,
)

from cuteforge.bench.report import write_results  # noqa: E402
from cuteforge.timing import events as timing  # noqa: E402

OPS = ("rms_norm_bwd", "layer_norm_bwd")
FWD_OPS = ("rms_norm", "layer_norm")


def plans(ops: list[str], dtypes: list[str], ns: list[int], register: bool = False) -> list[tuple[str, str, int, Any, bool]]:
    """(op, dtype, N, config, is_default) for the backward: each shape's default, then its
    staged candidates; with ``register`` (--register) also the register-backward tuner
    candidates (`candidate_configs(backward=True)`: threads, occupancy, prefetch, reload)."""
    from cuteforge.kernels.norm.config import (
        candidate_configs,
        default_config,
        longrow_staged_candidates,
        staged_candidates,
    )

    out = []
    for op in ops:
        for dt in dtypes:
            bits = getattr(torch, dt).itemsize * 8
            for n in ns:
                d = default_config(n, bits, backward=True, kind=op.split("_")[0])
                out.append((op, dt, n, d, True))
                cands = staged_candidates(n, bits) if n <= 16384 else []
                if n > 16384 or not cands:  # rows split over a cluster
                    cands += [c for c in longrow_staged_candidates(n, bits) if c not in cands]
                if register:
                    cands += [c for c in candidate_configs(n, bits, backward=True) if c not in cands]
                out += [(op, dt, n, c, False) for c in cands if c != d]
    return out


def deep_fwd_candidates(n: int, bits: int, lag: bool = False) -> list[Any]:
    """--deep: every cluster-staged forward shape with 8..64 elements per thread: clusters
    of 2..16 CTAs of 256 / 512 / 1024 threads at 1, 2, 3, 4 and 6 stages (those that fit
    whole), as many CTAs per SM as fit, and one-stage shapes at one CTA per SM too (room
    for weight and bias in shared memory). With ``lag`` (--deep-lag) each shape of >= 2
    stages also lagged at 1, 2 and 3 CTAs per SM where they fit."""

    from cuteforge.kernels.norm.config import fitted_fwd_config, staged_config

    out = []
    for c in (2, 4, 8, 16):
        for t in (256, 512, 1024):
            for s in (1, 2, 3, 4, 6):
                if not 8 <= n // c // t <= 64:
                    continue
                cfg = staged_config(n, bits, 64, s, threads=t, cluster_n=c, backward=False)
                if cfg is None or cfg.stages != s:
                    continue
                shapes = [cfg, replace(cfg, ctas_per_sm=1)] if s == 1 else [cfg]
                if lag and s >= 2:
                    shapes += [fitted_fwd_config(cfg, n, bits, 1, occ) for occ in (1, 2, 3)]
                for c_ in shapes:
                    if c_ is not None and c_ not in out:
                        out.append(c_)
    return out


def fwd_plans(ops: list[str], dtypes: list[str], ns: list[int], deep: bool = False,
              cp_async: bool = False, residual: bool = False,
              deep_lag: bool = False) -> list[tuple[str, str, int, Any, bool]]:
    """(op, dtype, n, config, is_default): the forward default and every staged forward
    candidate; with ``deep`` also ``deep_fwd_candidates`` at N >= 32768. With
    ``cp_async`` instead: the default, the staged and register long-row defaults,
    every ``async_fwd_candidates`` config and the register shapes they come from."""

    from cuteforge.kernels.norm.config import (
        async_fwd_candidates,
        default_config,
        default_register_fwd_config,
        longrow_candidates,
        longrow_staged_fwd_candidates,
    )

    def candidates(n: int, bits: int, kind: str) -> list[Any]:
        if cp_async:
            cands = [default_register_fwd_config(n, bits, kind)]
            for c in async_fwd_candidates(n, bits):
                # the plain twin: the same shape loading straight into registers (ctas_per_sm
                # does not bind it)
                cands += [c, replace(c, cp_async=0, ctas_per_sm=1)]
            return cands
        cands = longrow_staged_fwd_candidates(n, bits)
        if deep_lag and n >= 32768:  # the staged shapes of >= 2 stages, lagged and not
            cands += [c for c in deep_fwd_candidates(n, bits, True) if c.stages >= 2]
        elif deep and n >= 32768:  # and the register forward's long-row candidates
            cands += deep_fwd_candidates(n, bits) + longrow_candidates(n, bits)
        return cands

    out = []
    for op in ops:
        kind = "rms" if op == "rms_norm" else "layer"
        for dt in dtypes:
            bits = getattr(torch, dt).itemsize * 8
            for n in ns:
                d = default_config(n, bits, False, kind, residual)
                out.append((op, dt, n, d, True))
                seen = [d]
                for c in candidates(n, bits, kind):
                    if c not in seen:
                        seen.append(c)
                        out.append((op, dt, n, c, False))
    return out


def main_fwd(args: argparse.Namespace, t0: float) -> None:
    """--fwd: the forward default against the staged forward candidates, kernel alone."""
    ops = [o for o in args.ops.split(",") if o] if args.ops != ",".join(OPS) else list(FWD_OPS)
    if set(ops) - set(FWD_OPS):
        raise SystemExit(f"--fwd --ops: choose from {FWD_OPS}")
    dtypes = [d for d in args.dtypes.split(",") if d]
    ns = [int(v) for v in args.ns.split(",") if v]
    from cuteforge.arch import target_arch
    from cuteforge.autotune.pool import CompileJob, compile_all
    from cuteforge.kernels.norm.spec import norm_fwd

    arch = target_arch()
    todo = fwd_plans(ops, dtypes, ns, args.deep, args.cp_async, args.residual, args.deep_lag)
    if args.defaults_only:
        todo = [t for t in todo if t[4]]
    todo += [(op, dt, n, c, False) for op, dt, n, _, d in list(todo) if d for c in _extra_configs(args.configs, n, dt, False)]
    if args.ab_lag:  # each staged cluster default, then it with lag = 1, then it again
        todo += [(op, dt, n, cc, False) for op, dt, n, c, d in list(todo) if d and c.stages >= 2 and c.cluster_n > 1
                 for cc in (replace(c, lag=1), c)]
    tc = time.time()
    jobs = []
    res = args.residual
    for op, dt, n, c, _ in todo:
        key, nparams = _norm_key_params(op, _norm_case(op, dt, n, 1), res)
        jobs.append(CompileJob.of(norm_fwd, key, nparams, c, arch))
    outcomes = compile_all(jobs)
    failed = {i: str(o.error)[:300] for i, o in enumerate(outcomes) if not o.ok}
    result = result_header("bench_norm_staged.py", arch, time.time() - tc, len(jobs), len(failed),
                           "bytes = 2*M*N*size (x read, y written; with --residual 4*M*N*size: x, r read, "
                           "y, x + r written); the launch alone")
    result["residual"] = res
    result["quack"] = None if args.no_quack else getattr(sys.modules.get("quack"), "__version__", None)
    copy_bps = result["copy_GBps"] * 1e9
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)

    def save() -> None:
        result["seconds"] = round(time.time() - t0, 1)
        write_results(out, result, check=False)

    def _time(fn, nbytes: int) -> dict[str, Any]:
        ms = timing.bench(fn, warmup_ms=5, rep_ms=args.rep_ms)
        bps = nbytes / (ms * 1e-3)
        return {"us": round(ms * 1e3, 2), "GBps": round(bps / 1e9, 1), "pct_copy": round(100 * bps / copy_bps, 1)}

    groups: dict[tuple[str, str, int], list[tuple[int, Any, bool]]] = {}
    for i, (op, dt, n, c, d) in enumerate(todo):
        groups.setdefault((op, dt, n), []).append((i, c, d))
    for (op, dt, n), cfgs in groups.items():
        m = rows_for(n)
        torch.cuda.empty_cache()
        case = _norm_case(op, dt, n, m)
        x, w, b, y = case["x"], case["w"], case["b"], case["y"]
        r = torch.randn_like(x) if res else x  # the residual (x stands in when unfused)
        s_out = torch.empty_like(x) if res else y
        xf = (x.float() + r.float()).to(x.dtype).float() if res else x.float()  # what gets normalised
        if op == "rms_norm":
            ref = torch.nn.functional.rms_norm(xf, (n,), w.float(), 1e-6)
        else:
            ref = torch.nn.functional.layer_norm(xf, (n,), w.float(), b.float(), 1e-5)
        del xf
        nbytes = (4 if res else 2) * x.numel() * x.element_size()
        shape: dict[str, Any] = {"op": op, "dtype": dt, "M": m, "N": n, "rows": []}
        result["shapes"].append(shape)
        qn = None if args.no_quack or res else _quack_norm(op)
        if qn is not None:
            try:
                qy = qn(case)
                qy = qy[0] if isinstance(qy, tuple) else qy
                shape["quack"] = {**_time(lambda qn=qn, c=case: qn(c), nbytes), **_norm_check(qy, ref, dt)}
            except Exception as e:  # reported, never fatal
                shape["quack"] = {"error": f"{type(e).__name__}: {str(e)[:200]}"}
        key, nparams = _norm_key_params(op, case, res)
        bb = w if b is None else b
        for i, c, d in cfgs:
            row: dict[str, Any] = {"config": repr(c), "threads": c.threads, "cluster_n": c.cluster_n,
                                   "ctas_per_sm": c.ctas_per_sm, "stages": c.stages, "cp_async": c.cp_async,
                                   "lag": c.lag, "default": d}
            if i in failed:
                row["error"] = "compile: " + failed[i]
            else:
                try:
                    fn = norm_fwd.get(key, nparams, c)
                    args_ = (x, w, bb, r, y, s_out, case["mean"] if b is not None else case["rstd"], case["rstd"])
                    y.fill_(float("nan"))
                    fn(*args_)
                    torch.cuda.synchronize()
                    row.update(_norm_check(y, ref, dt))
                    if res and not torch.equal(s_out, (x.float() + r.float()).to(x.dtype)):
                        row["correct"] = False  # x + r must come back exactly
                    row.update(_time(lambda fn=fn, a=args_: fn(*a), nbytes))
                    q = shape.get("quack", {})
                    if "GBps" in q:
                        row["vs_quack"] = round(row["GBps"] / q["GBps"], 3)
                except Exception as e:
                    row["error"] = f"{type(e).__name__}: {str(e)[:300]}"
            shape["rows"].append(row)
            print(op, dt, m, n, json.dumps(row), flush=True)
        ok = [r for r in shape["rows"] if r.get("correct") and "GBps" in r]
        if ok:
            bst = max(ok, key=lambda r: r["GBps"])
            shape["best"] = {k: bst.get(k) for k in ("config", "GBps", "pct_copy", "vs_quack")}
        del case, x, y, r, s_out, ref
        save()

    print(f"copy {result['copy_GBps']} GB/s")
    for s in result["shapes"]:
        d = next((r for r in s["rows"] if r["default"]), {})
        st = [r for r in s["rows"] if r.get("stages") and "pct_copy" in r]
        bs = max(st, key=lambda r: r["pct_copy"]) if st else {}
        print(f"{s['op']:10s} {s['dtype']:9s} {s['M']:6d} x {s['N']:6d}  default {d.get('pct_copy', '-')}% "
              f"({d.get('correct')})  best staged {bs.get('pct_copy', '-')}% ({bs.get('correct')}) "
              f"T={bs.get('threads')} C={bs.get('cluster_n')} S={bs.get('stages')} occ={bs.get('ctas_per_sm')}  "
              f"quack {s.get('quack', {}).get('pct_copy', '-')}%")
    save()
    print("wrote", out, "in", result["seconds"], "s")


def _extra_configs(configs: str, n: int, dtype: str, backward: bool) -> list[Any]:
    """--configs: those of the ';'-separated NormConfig(...) reprs that validate for this N
    and dtype (one list can name shapes for several N; the others are skipped)."""
    from cuteforge.kernels.norm.config import NormConfig

    out = []
    for text in filter(str.strip, configs.split(";")):
        cfg = eval(text, {"NormConfig": NormConfig})  # noqa: S307 - CLI input
        try:
            cfg.validate(n, 32 if dtype == "float32" else 16, backward=backward)
        except ValueError:
            continue
        out.append(cfg)
    return out


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--fwd", action="store_true", help="the staged forward against the forward default")
    p.add_argument("--cp-async", action="store_true",
                   help="--fwd: the cp_async register forward shapes and their plain twins instead")
    p.add_argument("--deep", action="store_true",
                   help="--fwd: also every cluster-staged shape and the register long-row candidates at N >= 32768")
    p.add_argument("--deep-lag", action="store_true",
                   help="--fwd: instead of --deep's set, every staged cluster shape of >= 2 stages, each also "
                        "lagged at 1-3 CTAs per SM")
    p.add_argument("--ops", default=",".join(OPS))
    p.add_argument("--dtypes", default="bfloat16,float16,float32")
    p.add_argument("--ns", default="4096,8192,16384")
    p.add_argument("--rep-ms", type=float, default=25.0)
    p.add_argument("--no-quack", action="store_true")
    p.add_argument("--defaults-only", action="store_true", help="time only each shape's default config")
    p.add_argument("--residual", action="store_true",
                   help="--fwd: fuse the residual add (x + r normalised and written): bytes = 4 M N")
    p.add_argument("--configs", default="",
                   help="';'-separated NormConfig(...) reprs timed beside each shape's default (and the "
                        "candidates unless --defaults-only), e.g. a previous default; those that do not validate for a "
                        "shape are skipped there")
    p.add_argument("--frozen", action="store_true",
                   help="backward: also each config's kernel without partials (frozen weight and bias), launch alone")
    p.add_argument("--register", action="store_true",
                   help="backward: also every register-backward tuner candidate (threads, occupancy, prefetch, reload)")
    p.add_argument("--ab-lag", action="store_true",
                   help="also time each staged cluster default with lag=1, then the default again")
    p.add_argument("--out", required=True)
    args = p.parse_args()
    t0 = time.time()
    if args.fwd:
        main_fwd(args, t0)
        return
    ops = [o for o in args.ops.split(",") if o]
    if set(ops) - set(OPS):
        p.error(f"--ops: choose from {OPS}")
    dtypes = [d for d in args.dtypes.split(",") if d]
    ns = [int(v) for v in args.ns.split(",") if v]
    from cuteforge.arch import target_arch
    from cuteforge.autotune.pool import CompileJob, compile_all
    from cuteforge.kernels.norm.spec import norm_bwd

    arch = target_arch()
    todo = plans(ops, dtypes, ns, args.register)
    if args.defaults_only:
        todo = [t for t in todo if t[4]]
    todo += [(op, dt, n, c, False) for op, dt, n, _, d in list(todo) if d for c in _extra_configs(args.configs, n, dt, True)]
    tc = time.time()
    jobs = []
    for op, dt, n, c, _ in todo:
        key, bparams = _bwd_key_params(op, dt, n)
        jobs.append(CompileJob.of(norm_bwd, key, bparams, c, arch))
        if args.frozen:  # the same config without partials, compiled alongside
            jobs.append(CompileJob.of(norm_bwd, key, tuple(sorted(bparams + (("has_dw", False),))), c, arch))
    outcomes = compile_all(jobs)
    per = 2 if args.frozen else 1  # jobs per plan
    failed = {i // per: str(o.error)[:300] for i, o in enumerate(outcomes) if not o.ok}
    result = result_header("bench_norm_staged.py", arch, time.time() - tc, len(jobs), len(failed),
                           "bytes = 3*M*N*size + weight/bias")
    copy_bps = result["copy_GBps"] * 1e9
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)

    def save() -> None:
        result["seconds"] = round(time.time() - t0, 1)
        write_results(out, result, check=False)

    def _time(fn, nbytes: int) -> dict[str, Any]:
        ms = timing.bench(fn, warmup_ms=5, rep_ms=args.rep_ms)
        bps = nbytes / (ms * 1e-3)
        return {"us": round(ms * 1e3, 2), "GBps": round(bps / 1e9, 1), "pct_copy": round(100 * bps / copy_bps, 1)}

    groups: dict[tuple[str, str, int], list[tuple[int, Any, bool]]] = {}
    for i, (op, dt, n, c, d) in enumerate(todo):
        groups.setdefault((op, dt, n), []).append((i, c, d))
    for (op, dt, n), cfgs in groups.items():
        torch.cuda.empty_cache()
        shape: dict[str, Any] = {"op": op, "dtype": dt, "M": rows_for(n), "N": n, "rows": []}
        result["shapes"].append(shape)
        run_bwd_shape(shape, op, dt, n, cfgs, failed, _time, None if args.no_quack else _quack_bwd(op), args.frozen)
        for r in shape["rows"]:
            r["stages"] = next((c.stages for i, c, _ in cfgs if repr(c) == r["config"]), 0)
            r["cluster_n"] = next((c.cluster_n for i, c, _ in cfgs if repr(c) == r["config"]), 1)
        ok = [r for r in shape["rows"] if r.get("correct") and "GBps" in r]
        if ok:
            b = max(ok, key=lambda r: r["GBps"])
            shape["best"] = {k: b.get(k) for k in ("config", "GBps", "pct_copy", "kernel_pct_copy", "vs_quack")}
        save()

    print(f"copy {result['copy_GBps']} GB/s")
    for s in result["shapes"]:
        d = next((r for r in s["rows"] if r["default"]), {})
        st = [r for r in s["rows"] if r.get("stages") and "pct_copy" in r]
        bs = max(st, key=lambda r: r["pct_copy"]) if st else {}
        print(f"{s['op']:15s} {s['dtype']:9s} {s['M']:6d} x {s['N']:6d}  default {d.get('pct_copy', '-')}% "
              f"({d.get('correct')})  best staged {bs.get('pct_copy', '-')}% ({bs.get('correct')}) "
              f"T={bs.get('threads')} C={bs.get('cluster_n')} S={bs.get('stages')} occ={bs.get('ctas_per_sm')}  quack {s.get('quack', {}).get('pct_copy', '-')}%")
    save()
    print("wrote", out, "in", result["seconds"], "s")


if __name__ == "__main__":
    main()
