"""RMSNorm / LayerNorm: cuteforge vs torch eager vs torch.compile vs quack, same process,
same inputs, forward and backward, bf16 and fp32.

Bandwidth counts the bytes a norm must move: forward reads x and writes y (2 M N
elements; weight/bias/stats are < 0.1%), backward reads x and dy and writes dx (3 M N).
It is compared with a device-to-device copy measured in the same run
(cuteforge.timing.events.copy_bandwidth). Tensors are capped at ~4 GiB (M = min(32768,
4 GiB / row bytes)). LayerNorm runs with a bias; quack's LayerNorm takes fp32
weight/bias (its API), everyone else weight/bias in x's dtype.

The JSON (written after every row, so a timeout keeps what was measured) holds the
command line, the GPU, the copy bandwidth and one row per (op, direction, dtype, shape).

Run on a GPU machine:
  python benchmarks/bench_norm.py [--quick] [--ns 4096,16384] [--compile-ns 4096] [--out FILE]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from cuteforge.bench.report import results_header, write_results  # noqa: E402
from cuteforge.ops import norm as cf_norm
from cuteforge.timing import events as timing

ALL_NS = [256, 512, 1024, 2048, 4096, 8192, 16384, 32768, 65536, 131072, 262144]
QUICK_NS = [256, 1024, 4096, 16384, 65536, 262144]


def _quack():
    try:
        import importlib

        # `quack.rmsnorm` the attribute is a function (quack/__init__ re-exports it): import the module
        return importlib.import_module("quack.rmsnorm")
    except Exception as e:  # reported in the JSON, not fatal
        print("quack unavailable:", e)
        return None


def _rows_for(n: int, es: int) -> int:
    return max(1, min(32768, (4 << 30) // (n * es)))


def _bench(fn, nbytes: float, copy_bps: float, args) -> dict:
    ms = timing.bench(fn, warmup_ms=args.warmup_ms, rep_ms=args.rep_ms)
    bps = nbytes / (ms * 1e-3)
    return {"us": round(ms * 1e3, 2), "GBps": round(bps / 1e9, 1), "pct_copy": round(100 * bps / copy_bps, 1)}


def measure(kind: str, dtype: torch.dtype, n: int, copy_bps: float, q, use_compile: bool, args) -> list[dict]:
    m = _rows_for(n, torch.empty((), dtype=dtype).element_size())
    eps = 1e-6 if kind == "rms" else 1e-5
    gen = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(m, n, device="cuda", dtype=dtype, generator=gen)
    w = (1 + 0.1 * torch.randn(n, device="cuda", generator=gen)).to(dtype)
    b = (0.1 * torch.randn(n, device="cuda", generator=gen)).to(dtype) if kind == "layer" else None
    dy = torch.randn(m, n, device="cuda", dtype=dtype, generator=gen)
    es = x.element_size()
    base = {"op": f"{kind}_norm", "dtype": str(dtype).removeprefix("torch."), "M": m, "N": n}

    if kind == "rms":
        def ref(x_, w_):
            return F.rms_norm(x_, (n,), w_, eps)

        def cf():
            return cf_norm.rms_norm(x, w, eps)
    else:
        def ref(x_, w_):
            return F.layer_norm(x_, (n,), w_, b, eps)

        def cf():
            return cf_norm.layer_norm(x, w, b, eps)

    fwd: dict = {}
    fwd["cuteforge"] = cf
    fwd["torch"] = lambda: ref(x, w)
    if use_compile:
        torch._dynamo.reset()
        comp = torch.compile(ref, dynamic=False)
        fwd["torch.compile"] = lambda: comp(x, w)
    if q is not None:
        if kind == "rms":
            fwd["quack"] = lambda: q.rmsnorm_fwd(x, w, eps=eps)
        else:
            w32, b32 = w.float(), b.float()
            fwd["quack"] = lambda: q.layernorm_fwd(x, w32, b32, eps=eps)

    out = []
    with torch.no_grad():
        y_ref = ref(x, w).float()
        y_cf = cf().float()
        err = (y_cf - y_ref).abs().max().item()
    row = {**base, "dir": "fwd", "max_abs_err_vs_torch": err,
           "correct": bool(err <= (1e-3 if dtype == torch.float32 else 6e-2) * max(1.0, y_ref.abs().max().item()))}
    del y_ref, y_cf
    for name, fn in fwd.items():
        try:
            with torch.no_grad():
                r = _bench(fn, 2 * m * n * es, copy_bps, args)
            row.update({f"{name}_{k}": v for k, v in r.items()})
        except Exception as e:
            row[f"{name}_error"] = f"{type(e).__name__}: {str(e)[:200]}"
    out.append(row)

    if not args.no_bwd:
        # stats from the cuteforge forward feed its backward (what autograd saves)
        _, _, mean, rstd = cf_norm._forward(kind, x, w, b, None, eps)
        bwd: dict = {}
        bwd["cuteforge"] = lambda: cf_norm._backward(kind, dy, x, w, mean, rstd, None, kind == "layer")
        xg, wg = x.detach().requires_grad_(), w.detach().requires_grad_()
        yt = ref(xg, wg)
        bwd["torch"] = lambda: torch.autograd.grad(yt, (xg, wg), dy, retain_graph=True)
        if use_compile:
            yc = comp(xg, wg)
            bwd["torch.compile"] = lambda: torch.autograd.grad(yc, (xg, wg), dy, retain_graph=True)
        if q is not None:
            if kind == "rms":
                _, _, q_rstd = q.rmsnorm_fwd(x, w, eps=eps, store_rstd=True)
                bwd["quack"] = lambda: q.rmsnorm_bwd(x, w, dy, q_rstd)
            else:
                _, q_rstd, q_mean = q.layernorm_fwd(x, w32, b32, eps=eps, return_rstd=True, return_mean=True)
                bwd["quack"] = lambda: q.layernorm_bwd(x, w32, dy, q_rstd, q_mean, has_bias=True)
        dx_cf, dw_cf, _ = bwd["cuteforge"]()
        dx_t, dw_t = bwd["torch"]()
        e_dx = (dx_cf.float() - dx_t.float()).abs().max().item()
        e_dw = ((dw_cf.float() - dw_t.float()).abs().max() / dw_t.float().abs().max().clamp_min(1)).item()
        tol = 1e-3 if dtype == torch.float32 else 6e-2
        row = {**base, "dir": "bwd", "max_abs_err_dx_vs_torch": e_dx, "rel_err_dweight_vs_torch": e_dw,
               "correct": bool(e_dx <= tol * max(1.0, dx_t.float().abs().max().item()) and e_dw <= tol)}
        del dx_cf, dw_cf, dx_t, dw_t
        for name, fn in bwd.items():
            try:
                r = _bench(fn, 3 * m * n * es, copy_bps, args)
                row.update({f"{name}_{k}": v for k, v in r.items()})
            except Exception as e:
                row[f"{name}_error"] = f"{type(e).__name__}: {str(e)[:200]}"
        out.append(row)
        del yt, xg, wg
    for r in out:
        for other in ("quack", "torch", "torch.compile"):
            if f"{other}_us" in r and "cuteforge_us" in r:
                r[f"speedup_vs_{other}"] = round(r[f"{other}_us"] / r["cuteforge_us"], 3)
    return out


def config_sweep(kind: str, dtype: torch.dtype, n: int, copy_bps: float, args) -> list[dict]:
    """Every candidate config of the forward and backward kernels at one shape (what the
    defaults should be); correctness against the default config's output."""
    from cuteforge.kernels.norm.config import candidate_configs

    m = _rows_for(n, torch.empty((), dtype=dtype).element_size())
    gen = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(m, n, device="cuda", dtype=dtype, generator=gen)
    w = (1 + 0.1 * torch.randn(n, device="cuda", generator=gen)).to(dtype)
    b = (0.1 * torch.randn(n, device="cuda", generator=gen)).to(dtype) if kind == "layer" else None
    dy = torch.randn(m, n, device="cuda", dtype=dtype, generator=gen)
    es, bits = x.element_size(), x.element_size() * 8
    y0, _, mean, rstd = cf_norm._forward(kind, x, w, b, None, 1e-5)
    dx0, dw0, _ = cf_norm._backward(kind, dy, x, w, mean, rstd, None, b is not None)
    rows = []
    for direction, cands in (("fwd", candidate_configs(n, bits, False)), ("bwd", candidate_configs(n, bits, True))):
        for i, cfg in enumerate(cands):
            row = {"op": f"{kind}_norm", "dir": direction, "dtype": str(dtype).removeprefix("torch."), "M": m, "N": n,
                   "config": repr(cfg), "default": i == 0}
            try:
                if direction == "fwd":
                    def fn(cfg=cfg):
                        return cf_norm._forward(kind, x, w, b, None, 1e-5, cfg)
                    y = fn()[0]
                    row["correct"] = bool(torch.allclose(y.float(), y0.float(), rtol=2e-2, atol=2e-2))
                    nbytes = 2 * m * n * es
                else:
                    def fn(cfg=cfg):
                        return cf_norm._backward(kind, dy, x, w, mean, rstd, None, b is not None, cfg)
                    dx, dw, _ = fn()
                    row["correct"] = bool(torch.allclose(dx.float(), dx0.float(), rtol=2e-2, atol=2e-2)
                                          and torch.allclose(dw.float(), dw0.float(), rtol=2e-2, atol=2e-2 * max(1.0, dw0.float().abs().max().item())))
                    nbytes = 3 * m * n * es
                row.update(_bench(fn, nbytes, copy_bps, args))
            except Exception as e:
                row["error"] = f"{type(e).__name__}: {str(e)[:200]}"
            rows.append(row)
            print("sweep", row, flush=True)
    return rows


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--quick", action="store_true", help=f"N in {QUICK_NS}")
    p.add_argument("--ns", help="comma-separated N list (overrides --quick)")
    p.add_argument("--compile-ns", default="", help="N values that also get a torch.compile contender ('all' for every N)")
    p.add_argument("--compile-dtypes", default="bfloat16", help="dtypes that get the torch.compile contender")
    p.add_argument("--dtypes", default="bfloat16,float32")
    p.add_argument("--fp32-ns", default="", help="N list for float32 (default: the same as bf16)")
    p.add_argument("--kinds", default="rms,layer")
    p.add_argument("--no-bwd", action="store_true")
    p.add_argument("--warmup-ms", type=float, default=10.0)
    p.add_argument("--rep-ms", type=float, default=50.0)
    p.add_argument("--sweep-ns", default="", help="N values (bf16 rms_norm) whose candidate configs are all measured, after the main rows")
    p.add_argument("--out")
    args = p.parse_args()
    ns = [int(v) for v in args.ns.split(",")] if args.ns else (QUICK_NS if args.quick else ALL_NS)
    cns = set(ALL_NS) if args.compile_ns == "all" else {int(v) for v in args.compile_ns.split(",") if v}
    cdt = set(args.compile_dtypes.split(","))
    gpu = torch.cuda.get_device_name()
    t0 = time.time()
    copy_bps = timing.copy_bandwidth()
    q = _quack()
    result = {
        **results_header(),
        "quack": getattr(sys.modules.get("quack"), "__version__", None) if q is not None else None,
        "copy_GBps": round(copy_bps / 1e9, 1),
        "bytes": "fwd 2*M*N*elem (x read, y written); bwd 3*M*N*elem (x, dy read, dx written)",
        "rows": [],
    }
    name = gpu.lower().replace("nvidia ", "").replace(" ", "-")
    path = Path(args.out or Path(__file__).parent / "results" / f"{name}-norm.json")
    path.parent.mkdir(parents=True, exist_ok=True)
    for dname in args.dtypes.split(","):
        for kind in args.kinds.split(","):
            dtype = getattr(torch, dname)
            for n in (ns if dtype != torch.float32 or not args.fp32_ns else [int(v) for v in args.fp32_ns.split(",")]):
                try:
                    rows = measure(kind, dtype, n, copy_bps, q, n in cns and dname in cdt, args)
                except Exception as e:
                    rows = [{"op": f"{kind}_norm", "dtype": dname, "N": n, "error": f"{type(e).__name__}: {str(e)[:300]}"}]
                torch.cuda.empty_cache()
                for r in rows:
                    result["rows"].append(r)
                    msg = " ".join(f"{c} {r.get(c + '_GBps', '-')!s:>7}" for c in ("cuteforge", "torch", "torch.compile", "quack"))
                    print(f"{r.get('op')} {r.get('dir', '?')} {r.get('dtype')} {r.get('M', '?')}x{r.get('N')} ok={r.get('correct')} "
                          f"{msg}  cf%copy={r.get('cuteforge_pct_copy')} vs quack={r.get('speedup_vs_quack')} {r.get('error', '')}", flush=True)
                result["seconds"] = round(time.time() - t0, 1)
                write_results(path, result, check=False)
    result["config_sweep"] = []
    for n in [int(v) for v in args.sweep_ns.split(",") if v]:
        try:
            result["config_sweep"] += config_sweep("rms", torch.bfloat16, n, copy_bps, args)
        except Exception as e:
            result["config_sweep"].append({"N": n, "error": f"{type(e).__name__}: {str(e)[:300]}"})
        torch.cuda.empty_cache()
        result["seconds"] = round(time.time() - t0, 1)
        write_results(path, result)
    print("copy GB/s", result["copy_GBps"], "wrote", path)


if __name__ == "__main__":
    main()
