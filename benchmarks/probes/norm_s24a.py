"""Session 24: the frozen-weight backward (no partials) on a row grid (`NormConfig.row_grid`:
one CTA per row block) against each cell's persistent default, over the small and middle
N of the sweep. Session 23's probe (`norm_s23e.py`, h200-norm-s23e-row-grid.json) found
the row grid 2-10 % of copy ahead at fp32 N = 1024 and bf16 N = 2048 on some shapes and
behind on others; this picks, per (kind, dtype, N), the best row-grid shape to compare.

M = 32768, N in 256..8192, fp32 and bf16, RMSNorm and LayerNorm: the default, the default
on the row grid, and row-grid candidates of 1..16 elements per thread at 4 / 8 CTAs per SM
(ptxas's register budget), torch's dx kernel beside; back to back (`timing.stream`, three
runs) and flushed (event timer). dx of every config is checked against the default's
(max abs difference, fp32 math: a different reduction order may flip a last bit).

    python benchmarks/probes/norm_s24a.py OUT.json
"""

from __future__ import annotations

import functools
import json
import statistics
import sys
from dataclasses import replace

import torch

from cuteforge import timing
from cuteforge.arch import target_arch
from cuteforge.autotune.pool import CompileJob, compile_all
from cuteforge.kernels.norm.config import NormConfig, default_bwd_config, elems_per_thread
from cuteforge.kernels.norm.spec import norm_bwd
from cuteforge.ops.norm import bwd_groups

NS = (256, 512, 1024, 2048, 4096, 8192)


def row_candidates(n: int, bits: int) -> list[NormConfig]:
    out = []
    for t, p in ((64, 64), (128, 128), (256, 256), (512, 512), (1024, 1024), (128, 64), (256, 128), (256, 64),
                 (128, 32), (256, 32), (128, 16), (256, 16)):
        e = elems_per_thread(n, p, 1)
        if not (128 // bits <= e <= 16 * 32 // bits) or p > 2 * n:
            continue
        for occ in (4, 8):
            cfg = NormConfig(t, p, 1, occ, row_grid=True)
            try:
                cfg.validate(n, bits, backward=True)
            except ValueError:
                continue
            out.append(cfg)
    return out


def torch_dx(kind: str, dy, x, n: int, mean, rstd, w, b):
    if kind == "layer":
        return functools.partial(torch.ops.aten.native_layer_norm_backward, dy, x, [n], mean, rstd, w, b,
                                 [True, False, False])
    return functools.partial(torch.ops.aten._fused_rms_norm_backward, dy, x, [n], rstd, w, [True, False])


def main() -> None:
    path = sys.argv[1]
    m = 32768
    copy = timing.copy_bandwidth()
    arch = target_arch()
    rows = []
    for dtype in (torch.float32, torch.bfloat16):
        bits = 32 if dtype == torch.float32 else 16
        for n in NS:
            for kind in ("rms", "layer"):
                x = torch.randn(m, n, device="cuda", dtype=dtype)
                dy = torch.randn(m, n, device="cuda", dtype=dtype)
                w = (1 + 0.1 * torch.randn(n, device="cuda")).to(dtype)
                b = torch.zeros(n, device="cuda", dtype=dtype)
                xf = x.float()
                mean = xf.mean(-1) if kind == "layer" else None
                xc = xf - mean[:, None] if mean is not None else xf
                rstd = torch.rsqrt(xc.pow(2).mean(-1) + 1e-5)
                st = mean if mean is not None else rstd
                nbytes = 3 * m * n * x.element_size()
                part = torch.empty(1, n, device="cuda")
                key = norm_bwd.signature.bind((x, w, dy, dy, st, rstd, x, part, part), "probe")
                params = (("has_bias", kind == "layer"), ("has_dsum", False), ("kind", kind), ("has_dw", False))
                base = default_bwd_config(n, bits, False, kind)
                cfgs = [base]
                for c in [replace(base, row_grid=True, prefetch=False, early_weight=False)] + row_candidates(n, bits):
                    try:
                        c.validate(n, bits, backward=True)
                    except ValueError:
                        continue
                    if c not in cfgs:
                        cfgs.append(c)
                outs = compile_all([CompileJob.of(norm_bwd, key, params, c, arch) for c in cfgs])
                row = {"kind": kind, "N": n, "dtype": str(dtype).removeprefix("torch."), "configs": {}, "errors": {}}
                calls, dxs = {}, {}
                for i, (c, o) in enumerate(zip(cfgs, outs)):
                    if not o.ok:
                        row["errors"][repr(c)] = str(o.error)[:200]
                        continue
                    fn = norm_bwd.get(key, params, c)
                    q = bwd_groups(x.device, c, m)
                    name = "default" if i == 0 else f"c{i}"
                    row["configs"][name] = f"{c!r} Q={q}"
                    stand = rstd.as_strided((q, n), (0, 1))
                    dxo = torch.empty_like(x)
                    calls[name] = functools.partial(fn, x, w, dy, dy, st, rstd, dxo, stand, stand)
                    dxs[name] = dxo
                try:
                    calls["torch"] = torch_dx(kind, dy, x, n, mean, rstd, w, b)
                    calls["torch"]()
                except Exception as e:  # noqa: BLE001 - an op missing from this torch: time ours alone
                    row["errors"]["torch"] = f"{type(e).__name__}: {str(e)[:200]}"
                    calls.pop("torch", None)
                for fn in calls.values():
                    fn()
                torch.cuda.synchronize()
                ref = dxs["default"].float()
                row["max_abs_diff"] = {k: float((v.float() - ref).abs().max()) for k, v in dxs.items()}
                for name, fn in calls.items():
                    row[f"{name}_event_pct"] = round(100 * nbytes / (timing.bench(fn, rep_ms=20) * 1e-3) / copy, 1)
                for _rep in range(3):
                    t = timing.stream(calls)
                    for name, ms in t.items():
                        row.setdefault(f"{name}_stream_pct", []).append(round(100 * nbytes / (ms * 1e-3) / copy, 1))
                med = {k.removesuffix("_stream_pct"): statistics.median(v) for k, v in row.items()
                       if k.endswith("_stream_pct")}
                row["stream_median_pct"] = med
                ours = {k: v for k, v in med.items() if k != "torch"}
                best = max(ours, key=ours.get)
                row["best"] = best
                rows.append(row)
                print(json.dumps({"kind": kind, "N": n, "dtype": row["dtype"], "default": med.get("default"),
                                  "best": best, "best_pct": med[best], "best_event": row[f"{best}_event_pct"],
                                  "default_event": row.get("default_event_pct"), "torch": med.get("torch"),
                                  "torch_event": row.get("torch_event_pct"), "cfg": row["configs"][best]}),
                      flush=True)
                with open(path, "w") as f:
                    json.dump({"command": "python benchmarks/probes/norm_s24a.py " + path,
                               "gpu": torch.cuda.get_device_name(), "copy_GBps": round(copy / 1e9, 1), "rows": rows},
                              f, indent=1)


if __name__ == "__main__":
    main()
