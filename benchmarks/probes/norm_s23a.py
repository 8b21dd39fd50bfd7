"""Session 23 probe: the frozen-weight backward (no partials) at fp32 N = 1024, the one
small-shape cell below torch (rms / layer backward, 32768 x 1024, 0.988-0.989 over five
H200 runs). Session 21's grid stopped at 4 CTAs per SM; torch's dx kernel runs one block
per row with no persistent loop, so the block scheduler keeps more rows in flight. This
times more CTAs per SM (a smaller register budget each) with and without prefetch against
the default (FROZEN_BWD) and torch's LayerNorm backward (dx only), each set timed back to
back (`timing.stream`, three times) and with the event timer (L2 flushed); dx compared
with the default's bitwise.

    python benchmarks/probes/norm_s23a.py OUT.json
"""

from __future__ import annotations

import functools
import json
import sys

import torch

from cuteforge import timing
from cuteforge.arch import target_arch
from cuteforge.autotune.pool import CompileJob, compile_all
from cuteforge.kernels.norm.config import NormConfig, default_bwd_config
from cuteforge.kernels.norm.spec import norm_bwd
from cuteforge.ops.norm import bwd_groups

CONFIGS = [
    NormConfig(128, 128, 1, 8), NormConfig(128, 128, 1, 8, prefetch=True), NormConfig(128, 128, 1, 12),
    NormConfig(128, 128, 1, 16), NormConfig(256, 256, 1, 6), NormConfig(256, 256, 1, 8),
    NormConfig(256, 128, 1, 6), NormConfig(128, 64, 1, 8), NormConfig(64, 64, 1, 16),
    NormConfig(64, 64, 1, 24), NormConfig(256, 256, 1, 4, prefetch=True, early_weight=True),
]


def main() -> None:
    path = sys.argv[1]
    m = 32768
    copy = timing.copy_bandwidth()
    rows = []
    arch = target_arch()
    dtype = torch.float32
    for n in (1024, 512, 2048):
        for kind in ("layer", "rms"):
            x = torch.randn(m, n, device="cuda", dtype=dtype)
            dy = torch.randn(m, n, device="cuda", dtype=dtype)
            w = (1 + 0.1 * torch.randn(n, device="cuda")).to(dtype)
            b = torch.zeros(n, device="cuda", dtype=dtype)
            mean = x.mean(-1) if kind == "layer" else None
            xc = x - mean[:, None] if mean is not None else x
            rstd = torch.rsqrt(xc.pow(2).mean(-1) + 1e-5)
            st = mean if mean is not None else rstd
            nbytes = 3 * m * n * x.element_size()
            part = torch.empty(1, n, device="cuda")
            key = norm_bwd.signature.bind((x, w, dy, dy, st, rstd, x, part, part), "probe")
            params = (("has_bias", kind == "layer"), ("has_dsum", False), ("kind", kind), ("has_dw", False))
            base = default_bwd_config(n, 32, False)
            cfgs = [base] + [c for c in CONFIGS if c != base]
            valid = []
            for c in cfgs:
                try:
                    c.validate(n, 32, backward=True)
                    valid.append(c)
                except ValueError:
                    pass
            outs = compile_all([CompileJob.of(norm_bwd, key, params, c, arch) for c in valid])
            calls, dxs = {}, {}
            row = {"kind": kind, "N": n, "default": repr(base), "configs": {}}
            for i, (c, o) in enumerate(zip(valid, outs)):
                name = "default" if i == 0 else f"c{i}"
                row["configs"][name] = repr(c)
                if not o.ok:
                    row[f"{name}_error"] = str(o.error)[:200]
                    continue
                q = bwd_groups(x.device, c, m)
                stand = rstd.as_strided((q, n), (0, 1))
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
            row["same_bits"] = {k: bool(torch.equal(dxs["default"], v)) for k, v in dxs.items() if k != "default"}
            for name, fn in calls.items():
                row[f"{name}_event_pct"] = round(100 * nbytes / (timing.bench(fn, rep_ms=20) * 1e-3) / copy, 1)
            for _rep in range(3):
                t = timing.stream(calls)
                for name, ms in t.items():
                    row.setdefault(f"{name}_stream_pct", []).append(round(100 * nbytes / (ms * 1e-3) / copy, 1))
            rows.append(row)
            print(json.dumps(row), flush=True)
            with open(path, "w") as f:
                json.dump({"command": "python benchmarks/probes/norm_s23a.py " + path,
                           "gpu": torch.cuda.get_device_name(), "copy_GBps": round(copy / 1e9, 1), "rows": rows}, f,
                          indent=1)


if __name__ == "__main__":
    main()
