"""Where the time of a small-N backward goes (softmax, log_softmax, rms_norm, layer_norm,
cross_entropy), at M x N with N small: the backward kernel launched directly, the ops'
Python backward (`_bwd` / `_backward`), autograd through the custom ops (the old eager
path), autograd through the public function, and torch eager; each as GPU time per call
(CUDA events, cold L2, bench.library's timing) and host time per call. Also the backward
(and cross-entropy forward) kernels under their candidate configs.

    python3 benchmarks/bench_smalln_bwd.py --out $OUT/h200-smalln-bwd.json
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
import time
from typing import Any

import torch
import torch.nn.functional as F

from cuteforge.arch import target_arch
from cuteforge.autotune.pool import CompileJob, compile_all
from cuteforge.bench.report import results_header, write_results  # noqa: E402
from cuteforge.kernels.cross_entropy import device as ce_k
from cuteforge.kernels.cross_entropy.spec import cross_entropy_bwd, cross_entropy_fwd
from cuteforge.kernels.norm import config as norm_cfg
from cuteforge.kernels.norm.spec import norm_bwd, norm_fwd
from cuteforge.kernels.reduce import row as row_cfg
from cuteforge.kernels.softmax import config as sm_cfg
from cuteforge.kernels.softmax.spec import config_for as sm_config_for
from cuteforge.kernels.softmax.spec import softmax_bwd, softmax_fwd
from cuteforge.timing import events as timing

# the modules (cuteforge.ops re-exports functions of the same names)
ce_ops = importlib.import_module("cuteforge.ops.cross_entropy")
ce_launch = importlib.import_module("cuteforge.ops.cross_entropy_launch")
norm_ops = importlib.import_module("cuteforge.ops.norm")
sm_ops = importlib.import_module("cuteforge.ops.softmax")

FAMS = ("softmax", "log_softmax", "rms_norm", "layer_norm", "cross_entropy")
P = (("ignore_index", -100),)


def gpu_us(fn: Any) -> float:
    return round(timing.bench(fn, warmup_ms=5.0, rep_ms=20.0) * 1e3, 2)


def host_us(fn: Any) -> float:
    return round(timing.host_us(fn, calls=20, loops=8), 2)


def ce_cands(n: int, bits: int) -> list[Any]:
    out = [ce_k.ce_config(n, bits)]
    for c in row_cfg.candidate_configs(n, bits):
        if c.cluster_n == 1 and c not in out:
            out.append(c)
    return out[:6]


def norm_cands(n: int, bits: int) -> list[Any]:
    out = norm_cfg.candidate_configs(n, bits, backward=True)[:6]
    base = out[0]
    for o in (base.ctas_per_sm, max(1, base.ctas_per_sm // 2)):
        c = norm_cfg.NormConfig(base.threads, base.threads_per_row, base.cluster_n, o, False, True)
        try:
            c.validate(n, bits, backward=True)
        except ValueError:
            continue
        if c not in out:
            out.append(c)
    return out


def setup(fam: str, m: int, n: int, dt: torch.dtype) -> dict[str, Any]:
    """Tensors, and (kernel, key, params, configs, args) for the bwd (and ce fwd) kernels."""
    arch = target_arch()
    bits = dt.itemsize * 8
    s: dict[str, Any] = {"x": torch.randn(m, n, device="cuda", dtype=dt), "kernels": {}}
    x = s["x"]
    dy = torch.randn(m, n, device="cuda", dtype=dt)
    s["dy"] = dy
    if fam in ("softmax", "log_softmax"):
        y = torch.softmax(x, -1) if fam == "softmax" else torch.log_softmax(x, -1)
        dx = torch.empty_like(x)
        mode = f"{fam}_bwd"
        key = softmax_bwd.signature.bind((dy, y, dx), "bench")
        cands = [sm_config_for(arch, n, bits, True, m)]
        if fam == "softmax":
            cands += [c for c in sm_cfg.candidate_configs(n, bits, True) if c not in cands][:5]
        s["kernels"]["bwd"] = (softmax_bwd, key, (("mode", mode),), cands, (dy, y, dx))
        yk = torch.empty_like(x)
        s["fwd_job"] = (softmax_fwd, softmax_fwd.signature.bind((x, yk), "bench"), (("mode", fam),),
                        sm_config_for(arch, n, bits, False, m))
        s["y"] = y
    elif fam in ("rms_norm", "layer_norm"):
        kind = fam.split("_")[0]
        w = torch.randn(n, device="cuda", dtype=dt)
        b = torch.randn(n, device="cuda", dtype=dt) if kind == "layer" else None
        s["w"], s["b"] = w, b
        rstd = torch.rand(m, device="cuda") + 0.5
        mean = torch.randn(m, device="cuda") if kind == "layer" else None
        s["rstd"], s["mean"] = rstd, mean
        dx = torch.empty_like(x)
        cands = norm_cands(n, bits) if kind == "rms" else norm_cands(n, bits)[:1] + [
            c for c in norm_cands(n, bits) if c.prefetch][:1]
        q = max(1, min(-(-m // cands[0].rows_per_cta), 132 * cands[0].ctas_per_sm // cands[0].cluster_n))
        probe = torch.empty((q, n), dtype=torch.float32, device="cuda")
        st = rstd if mean is None else mean
        key = norm_bwd.signature.bind((x, w, dy, dy, st, rstd, dx, probe, probe), "bench")
        params = (("has_bias", b is not None), ("has_dsum", False), ("kind", kind))
        s["kernels"]["bwd"] = (norm_bwd, key, params, cands, None)  # args built per config (q varies)
        s["norm_bwd_args"] = (x, w, dy, st, rstd, dx)
        yk = torch.empty_like(x)
        fkey = norm_fwd.signature.bind((x, w, w if b is None else b, x, yk, yk, rstd, rstd), "bench")
        eps = 1e-6 if kind == "rms" else 1e-5
        s["fwd_job"] = (norm_fwd, fkey, (("eps", eps), ("has_bias", b is not None), ("has_residual", False),
                                         ("kind", kind)), None)
    else:
        t = torch.randint(0, n, (m,), device="cuda")
        s["t"] = t
        loss, lse = torch.empty(m, device="cuda"), torch.logsumexp(x.float(), -1)
        dloss = torch.full((m,), 1.0 / m, device="cuda")
        dx = torch.empty_like(x)
        cands = ce_cands(n, bits)
        s["kernels"]["fwd"] = (cross_entropy_fwd, cross_entropy_fwd.signature.bind((x, t, loss, loss), "bench"), P,
                               cands, (x, t, loss, torch.empty(m, device="cuda")))
        s["kernels"]["bwd"] = (cross_entropy_bwd, cross_entropy_bwd.signature.bind((x, t, lse, dloss, dx), "bench"), P,
                               cands, (x, t, lse, dloss, dx))
        s["lse"], s["dloss"] = lse, dloss
    return s


def kernel_args(s: dict[str, Any], which: str, cfg: Any, m: int, n: int) -> tuple[Any, ...]:
    args = s["kernels"][which][4]
    if args is not None:
        return args
    x, w, dy, st, rstd, dx = s["norm_bwd_args"]
    q = max(1, min(-(-m // cfg.rows_per_cta), 132 * cfg.ctas_per_sm // cfg.cluster_n))
    part = torch.empty((q, n), dtype=torch.float32, device="cuda")
    return (x, w, dy, dy, st, rstd, dx, part, part)


def paths(fam: str, s: dict[str, Any]) -> dict[str, Any]:
    """name -> forward of the autograd variants: custom_op = the eager path before v3
    (cross_entropy: _Eager + torch reduction), public = cuteforge.ops now, torch."""
    x = s["x"]
    if fam in ("softmax", "log_softmax"):
        custom = sm_ops._softmax_op if fam == "softmax" else sm_ops._log_softmax_op
        pub = sm_ops.softmax if fam == "softmax" else sm_ops.log_softmax
        ref = (lambda v: torch.softmax(v, -1)) if fam == "softmax" else (lambda v: torch.log_softmax(v, -1))
        return {"custom_op": lambda v: custom(v, -1), "public": pub, "torch": ref}
    if fam == "rms_norm":
        w = s["w"]
        return {"custom_op": lambda v: norm_ops._rms_op(v, w, None, 1e-6)[0],
                "public": lambda v: norm_ops.rms_norm(v, w, 1e-6),
                "torch": lambda v: F.rms_norm(v, (x.shape[-1],), w, 1e-6)}
    if fam == "layer_norm":
        w, b = s["w"], s["b"]
        return {"custom_op": lambda v: norm_ops._ln_op(v, w, b, None, 1e-5)[0],
                "public": lambda v: norm_ops.layer_norm(v, w, b, 1e-5),
                "torch": lambda v: F.layer_norm(v, (x.shape[-1],), w, b, 1e-5)}
    t = s["t"]
    return {"custom_op": lambda v: ce_ops._reduce(ce_ops._Eager.apply(v, t, -100), t, "mean", -100, v.dtype),
            "public": lambda v: ce_ops.cross_entropy(v, t), "torch": lambda v: F.cross_entropy(v, t)}


def py_bwd(fam: str, s: dict[str, Any]) -> Any:
    if fam in ("softmax", "log_softmax"):
        return lambda: sm_ops._bwd(f"{fam}_bwd", s["dy"], s["y"], -1)
    if fam in ("rms_norm", "layer_norm"):
        kind = fam.split("_")[0]
        return lambda: norm_ops._backward(kind, s["dy"], s["x"], s["w"], s["mean"], s["rstd"], None, s["b"] is not None,
                                          need_dw=False)
    return lambda: ce_launch._bwd(s["x"], s["t"], s["lse"], s["dloss"], -100)


def check_eager_autograd() -> dict[str, Any]:
    """Gradients of the eager autograd paths (every input, residual, bias) against torch."""
    out: dict[str, Any] = {}
    torch.manual_seed(0)
    for dt in (torch.float32, torch.bfloat16):
        tol = 1e-3 if dt == torch.float32 else 3e-2
        x = torch.randn(3, 37, 1000, device="cuda", dtype=dt)
        r = torch.randn_like(x)
        w = torch.randn(1000, device="cuda", dtype=dt)
        b = torch.randn(1000, device="cuda", dtype=dt)
        g = torch.randn_like(x)
        for name in ("rms", "rms_res", "layer", "layer_res", "layer_nobias", "softmax", "log_softmax", "ce"):
            leaves = [t.clone().requires_grad_(True) for t in (x, w, b, r)]
            refs = [t.detach().double().requires_grad_(True) for t in (x, w, b, r)]
            xl, wl, bl, rl = leaves
            xr, wr, br, rr = refs
            if name.startswith("rms"):
                res = name.endswith("res")
                o = norm_ops.rms_norm(xl, wl, 1e-6, residual=rl if res else None)
                s_ref = xr + rr if res else xr
                ref = F.rms_norm(s_ref, (1000,), wr, 1e-6)
                got = [(o[0] * g).sum() + (o[1] * g).sum()] if res else [(o * g).sum()]
                want = [(ref * g.double()).sum() + (s_ref * g.double()).sum()] if res else [(ref * g.double()).sum()]
                used = [0, 1, 3] if res else [0, 1]
            elif name.startswith("layer"):
                res, nb = name.endswith("res"), name.endswith("nobias")
                o = norm_ops.layer_norm(xl, wl, None if nb else bl, 1e-5, residual=rl if res else None)
                s_ref = xr + rr if res else xr
                ref = F.layer_norm(s_ref, (1000,), wr, None if nb else br, 1e-5)
                got = [(o[0] * g).sum() + (o[1] * g).sum()] if res else [(o * g).sum()]
                want = [(ref * g.double()).sum() + (s_ref * g.double()).sum()] if res else [(ref * g.double()).sum()]
                used = [0, 1] + ([] if nb else [2]) + ([3] if res else [])
            elif name in ("softmax", "log_softmax"):
                o = getattr(sm_ops, name)(xl)
                ref = getattr(torch, name)(xr, -1)
                got, want, used = [(o * g).sum()], [(ref * g.double()).sum()], [0]
            else:
                x2, t = xl.view(-1, 1000), torch.randint(0, 1000, (111,), device="cuda")
                o = ce_ops.cross_entropy(x2, t)
                got, want, used = [o], [F.cross_entropy(xr.view(-1, 1000), t)], [0]
            gs = torch.autograd.grad(got[0], [leaves[i] for i in used])
            rs = torch.autograd.grad(want[0], [refs[i] for i in used])
            errs = [float(((a.double() - e).abs() / (e.abs().amax() + 1e-12)).amax()) for a, e in zip(gs, rs)]
            out[f"{name}/{str(dt)[6:]}"] = {"max_rel_err": [round(v, 6) for v in errs], "ok": all(v < tol for v in errs)}
    return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--m", type=int, default=32768)
    ap.add_argument("--ns", default="256,1024,4096")
    ap.add_argument("--fams", default=",".join(FAMS))
    ap.add_argument("--out")
    ap.add_argument("--compile-only", action="store_true",
                    help="compile the default fwd/bwd kernels of these shapes in parallel (a warm disk cache for "
                         "bench_membound) and exit")
    a = ap.parse_args()
    t0 = time.time()
    ns = [int(v) for v in a.ns.split(",")]
    fams = a.fams.split(",")
    arch = target_arch()
    setups: dict[tuple[str, str, int], dict[str, Any]] = {}
    jobs = {}
    for n in ns:  # small N first: a run cut short still has every family there
        for fam in fams:
            for dt in (torch.bfloat16, torch.float32):
                s = setup(fam, a.m, n, dt)
                if not a.compile_only:
                    setups[(fam, str(dt)[6:], n)] = s
                for k, key, params, cands, _ in s["kernels"].values():
                    for c in cands[:1] if a.compile_only else cands:
                        jobs[CompileJob.of(k, key, params, c, arch)] = None
                if "fwd_job" in s:
                    k, key, params, c = s["fwd_job"]
                    jobs[CompileJob.of(k, key, params, c, arch)] = None
    outs = compile_all(list(jobs), workers=15, arch=arch)
    bad = [o for o in outs if not o.ok]
    print(f"compiled {len(outs)} jobs ({len(bad)} failed) in {time.time() - t0:.0f} s", flush=True)
    for o in bad[:5]:
        print("  FAILED", o.job.kernel, o.job.config, (o.error or "")[:300], flush=True)
    if a.compile_only:
        return 1 if bad else 0
    try:
        checks = check_eager_autograd()
    except Exception as e:  # noqa: BLE001
        checks = {"error": f"{type(e).__name__}: {str(e)[:300]}"}
    print("eager autograd checks:", json.dumps(checks), flush=True)
    rows: list[dict[str, Any]] = []
    result = {**results_header(), "M": a.m, "eager_autograd_checks": checks, "rows": rows}
    for (fam, dts, n), s in setups.items():
        t1 = time.time()
        r: dict[str, Any] = {"fam": fam, "dtype": dts, "N": n}
        try:
            for which, (k, key, params, cands, _) in s["kernels"].items():
                cfg_rows = []
                for c in cands:
                    try:
                        launch = k.get(key, params, c)
                        args = kernel_args(s, which, c, a.m, n)
                        cfg_rows.append({"config": repr(c), "gpu_us": gpu_us(lambda launch=launch, args=args: launch(*args))})
                    except Exception as e:  # noqa: BLE001
                        cfg_rows.append({"config": repr(c), "error": f"{type(e).__name__}: {str(e)[:200]}"})
                r[f"{which}_kernel_configs"] = cfg_rows
                r[f"{which}_kernel_default_us"] = cfg_rows[0].get("gpu_us")
            pb = py_bwd(fam, s)
            r["py_bwd_gpu_us"], r["py_bwd_host_us"] = gpu_us(pb), host_us(pb)
            for name, f in paths(fam, s).items():
                xg = s["x"].detach().requires_grad_(True)
                yv = f(xg)
                g = torch.randn_like(yv)
                call = lambda yv=yv, xg=xg, g=g: torch.autograd.grad(yv, xg, g, retain_graph=True)  # noqa: E731
                r[f"{name}_ag_gpu_us"], r[f"{name}_ag_host_us"] = gpu_us(call), host_us(call)
                fcall = lambda f=f, xv=s["x"]: f(xv)  # noqa: E731
                r[f"{name}_fwd_gpu_us"], r[f"{name}_fwd_host_us"] = gpu_us(fcall), host_us(fcall)
                del xg, yv, g
        except Exception as e:  # noqa: BLE001
            r["error"] = f"{type(e).__name__}: {str(e)[:300]}"
        r["secs"] = round(time.time() - t1, 1)
        rows.append(r)
        brief = {k: v for k, v in r.items() if not k.endswith("_configs")}
        print(json.dumps(brief), flush=True)
        for which in ("fwd", "bwd"):
            for cr in r.get(f"{which}_kernel_configs", []):
                print(f"   {which} {cr.get('gpu_us')} {cr['config']} {cr.get('error', '')}", flush=True)
        write_results(a.out, result)
    print(f"done in {time.time() - t0:.0f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
