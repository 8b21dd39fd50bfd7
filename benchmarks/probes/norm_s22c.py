"""Session 22 probe (written for the next device session): the register backward without
partials (frozen weight) with `early_weight` (v2.22: the weight loaded once before the row
loop and held) against the same config reading it every row, on each shape's frozen default
(`default_bwd_config(n, bits, False)`); torch's LayerNorm backward (dx only) beside it. Each
pair timed together back to back (`timing.stream`, as the small-shape bar runs), three
times, and with the event timer (L2 flushed); the two kernels' dx compared bitwise.

    python benchmarks/probes/norm_s22c.py OUT.json
"""

from __future__ import annotations

import functools
import json
import sys
from dataclasses import replace

import torch

from cuteforge import timing
from cuteforge.arch import target_arch
from cuteforge.autotune.pool import CompileJob, compile_all
from cuteforge.kernels.norm.config import default_bwd_config
from cuteforge.kernels.norm.spec import norm_bwd
from cuteforge.ops.norm import bwd_groups


def main() -> None:
    path = sys.argv[1]
    m = 32768
    copy = timing.copy_bandwidth()
    rows = []
    arch = target_arch()
    for dtype in (torch.float32, torch.bfloat16):
        bits = 32 if dtype == torch.float32 else 16
        for n in (256, 512, 1024, 2048, 4096):
            for kind in ("layer", "rms"):
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
                base = default_bwd_config(n, bits, False)
                if base.stages or base.reload:
                    continue
                cfgs = [base, replace(base, early_weight=True)]
                outs = compile_all([CompileJob.of(norm_bwd, key, params, c, arch) for c in cfgs])
                row = {"kind": kind, "N": n, "dtype": str(dtype).removeprefix("torch."), "config": repr(base)}
                calls, dxs = {}, {}
                for name, c, o in zip(("every_row", "held"), cfgs, outs):
                    if not o.ok:
                        row[f"{name}_error"] = str(o.error)[:200]
                        continue
                    q = bwd_groups(x.device, c, m)
                    stand = rstd.as_strided((q, n), (0, 1))  # as the node's stand-in
                    dxo = torch.empty_like(x)
                    fn = norm_bwd.get(key, params, c)
                    calls[name] = functools.partial(fn, x, w, dy, dy, st, rstd, dxo, stand, stand)
                    dxs[name] = dxo
                if kind == "layer":
                    calls["torch"] = functools.partial(torch.ops.aten.native_layer_norm_backward, dy, x, [n], mean, rstd,
                                                       w, b, [True, False, False])
                for fn in calls.values():
                    fn()
                torch.cuda.synchronize()
                if len(dxs) == 2:
                    row["same_bits"] = bool(torch.equal(dxs["every_row"], dxs["held"]))
                for name, fn in calls.items():
                    row[f"{name}_event_pct"] = round(100 * nbytes / (timing.bench(fn, rep_ms=20) * 1e-3) / copy, 1)
                for _rep in range(3):
                    t = timing.stream(calls)
                    for name, ms in t.items():
                        row.setdefault(f"{name}_stream_pct", []).append(round(100 * nbytes / (ms * 1e-3) / copy, 1))
                rows.append(row)
                print(json.dumps(row), flush=True)
                with open(path, "w") as f:
                    json.dump({"command": "python benchmarks/probes/norm_s22c.py " + path,
                               "gpu": torch.cuda.get_device_name(), "copy_GBps": round(copy / 1e9, 1), "rows": rows}, f,
                              indent=1)


if __name__ == "__main__":
    main()
