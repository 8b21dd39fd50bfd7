"""The fp32 32768 x 1024 norm backward without partials (frozen weight) on a
grid of register-path configs, each timed by the launch alone two ways: the event timer
with L2 flushed (`timing.bench`) and back to back (`timing.stream`, as the small-shape bar
runs); torch's LayerNorm backward kernel (`aten.native_layer_norm_backward`, dx only) beside
it in the same run. Question: does some shape close the back-to-back gap to torch there?

    python benchmarks/probes/norm_s21c.py OUT.json
"""

from __future__ import annotations

import functools
import itertools
import json
import sys

import torch

from cuteforge import timing
from cuteforge.arch import target_arch
from cuteforge.autotune.pool import CompileJob, compile_all
from cuteforge.kernels.norm.config import NormConfig, default_config
from cuteforge.kernels.norm.spec import norm_bwd
from cuteforge.ops.norm import bwd_groups


def grid(n: int) -> list[NormConfig]:
    out = [default_config(n, 32, backward=True)]
    for p, t, o, pf in itertools.product((32, 64, 128, 256), (128, 256, 512), (1, 2, 4), (False, True)):
        c = NormConfig(max(t, p), p, 1, o, False, pf)
        try:
            c.validate(n, 32, backward=True)
        except ValueError:
            continue
        if c not in out:
            out.append(c)
    return out


def main() -> None:
    path = sys.argv[1]
    m = 32768
    copy = timing.copy_bandwidth()
    rows = []
    arch = target_arch()
    for n in (1024,):
        for kind in ("layer", "rms"):
            x = torch.randn(m, n, device="cuda")
            dy = torch.randn(m, n, device="cuda")
            w = 1 + 0.1 * torch.randn(n, device="cuda")
            b = torch.zeros(n, device="cuda")
            mean = x.mean(-1) if kind == "layer" else None
            xc = x - mean[:, None] if mean is not None else x
            rstd = torch.rsqrt(xc.pow(2).mean(-1) + 1e-5)
            st = mean if mean is not None else rstd
            nbytes = 3 * m * n * 4
            part = torch.empty(1, n, device="cuda")
            key = norm_bwd.signature.bind((x, w, dy, dy, st, rstd, x, part, part), "probe")
            params = (("has_bias", kind == "layer"), ("has_dsum", False), ("kind", kind), ("has_dw", False))
            cfgs = grid(n)
            outs = compile_all([CompileJob.of(norm_bwd, key, params, c, arch) for c in cfgs])
            dxo = torch.empty_like(x)
            ref = None
            if kind == "layer":
                tfn = functools.partial(torch.ops.aten.native_layer_norm_backward, dy, x, [n], mean, rstd, w, b,
                                        [True, False, False])
                ref = tfn()[0]
                rows.append({"kind": kind, "N": n, "config": "torch",
                             "event_pct": round(100 * nbytes / (timing.bench(tfn, rep_ms=30) * 1e-3) / copy, 1),
                             "stream_pct": round(100 * nbytes / (timing.stream({"t": tfn})["t"] * 1e-3) / copy, 1)})
                print(json.dumps(rows[-1]), flush=True)
            for c, o in zip(cfgs, outs):
                r = {"kind": kind, "N": n, "config": repr(c), "default": c == cfgs[0]}
                if not o.ok:
                    r["error"] = str(o.error)[:200]
                    rows.append(r)
                    continue
                q = bwd_groups(x.device, c, m)
                stand = rstd.as_strided((q, n), (0, 1))  # as the node's stand-in
                fn = norm_bwd.get(key, params, c)
                a = (x, w, dy, dy, st, rstd, dxo, stand, stand)
                fn(*a)
                torch.cuda.synchronize()
                if ref is not None:
                    r["max_err"] = float((dxo - ref).abs().max())
                call = functools.partial(fn, *a)
                r["event_pct"] = round(100 * nbytes / (timing.bench(call, rep_ms=30) * 1e-3) / copy, 1)
                r["stream_pct"] = round(100 * nbytes / (timing.stream({"k": call})["k"] * 1e-3) / copy, 1)
                rows.append(r)
                print(json.dumps(r), flush=True)
            with open(path, "w") as f:
                json.dump({"command": "python benchmarks/probes/norm_s21c.py " + path,
                           "gpu": torch.cuda.get_device_name(), "copy_GBps": round(copy / 1e9, 1), "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
