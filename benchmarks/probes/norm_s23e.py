"""Staged for the next device session (written in session 23, not run): the frozen-weight
backward (no partials) on a non-persistent grid. For that kernel the partial operands are
a stand-in whose Q rows only size the grid (`ops/norm.py: _node_plan`), and the kernel
loops `for blk in range(q, n_blocks, n_q)` with n_q the grid size, so a grid of one CTA per
row block (Q = M / rows per CTA) runs each CTA once, as torch's dx kernel does, and leaves
the tail to the block scheduler. `ctas_per_sm` then only sets ptxas's register budget. No
library change is needed to time it: this probe picks Q itself.

fp32 N = 1024 (the small-shape cell at parity with torch, norm v2.23) and bf16 N = 1024 /
2048, M = 32768: each config on its persistent grid (`bwd_groups`) and on the row grid,
torch's dx kernel beside (LayerNorm: `native_layer_norm_backward`; RMSNorm:
`_fused_rms_norm_backward`), back to back (`timing.stream`, three runs) and flushed
(event timer); dx compared bitwise with the persistent default's (each row's math does
not depend on the CTA that runs it).

    python benchmarks/probes/norm_s23e.py OUT.json
"""

from __future__ import annotations

import functools
import json
import statistics
import sys

import torch

from cuteforge import timing
from cuteforge.arch import target_arch
from cuteforge.autotune.pool import CompileJob, compile_all
from cuteforge.kernels.norm.config import NormConfig, default_bwd_config
from cuteforge.kernels.norm.spec import norm_bwd
from cuteforge.ops.norm import bwd_groups

EXTRA = [NormConfig(256, 256, 1, 4), NormConfig(256, 256, 1, 6), NormConfig(128, 128, 1, 8),
         NormConfig(128, 128, 1, 4), NormConfig(256, 256, 1, 8), NormConfig(512, 256, 1, 2)]


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
    for dtype, n in ((torch.float32, 1024), (torch.bfloat16, 1024), (torch.bfloat16, 2048)):
        bits = 32 if dtype == torch.float32 else 16
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
            for c in EXTRA:
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
                grids = {"persistent": bwd_groups(x.device, c, m), "rows": -(-m // c.rows_per_cta)}
                for grid, q in grids.items():
                    name = f"{'default' if i == 0 else f'c{i}'}_{grid}"
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
            ref = dxs.get("default_persistent")
            row["same_bits"] = {k: bool(torch.equal(ref, v)) for k, v in dxs.items() if ref is not None}
            for name, fn in calls.items():
                row[f"{name}_event_pct"] = round(100 * nbytes / (timing.bench(fn, rep_ms=20) * 1e-3) / copy, 1)
            for _rep in range(3):
                t = timing.stream(calls)
                for name, ms in t.items():
                    row.setdefault(f"{name}_stream_pct", []).append(round(100 * nbytes / (ms * 1e-3) / copy, 1))
            row["stream_median_pct"] = {k.removesuffix("_stream_pct"): statistics.median(v)
                                        for k, v in row.items() if k.endswith("_stream_pct")}
            rows.append(row)
            print(json.dumps({"kind": kind, "N": n, "dtype": row["dtype"], "median": row["stream_median_pct"]}),
                  flush=True)
            with open(path, "w") as f:
                json.dump({"command": "python benchmarks/probes/norm_s23e.py " + path,
                           "gpu": torch.cuda.get_device_name(), "copy_GBps": round(copy / 1e9, 1), "rows": rows}, f,
                          indent=1)


if __name__ == "__main__":
    main()
