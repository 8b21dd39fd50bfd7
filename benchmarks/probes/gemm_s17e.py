"""Session 17 probe 5: fused bias + gelu / silu at short K: the v4.7 default (pingpong
128x192, 5 stages) against pingpong 128x128 (the v4.6 default there) and the cooperative
fused tile, and cuBLAS addmm + eager activation; balanced order, two passes."""
# ruff: noqa: B023 - the timed lambdas close over this iteration's tensors and run within it
import json
import sys

sys.path.insert(0, "benchmarks")
import bench_gemm as bg
import torch
import torch.nn.functional as F

from cuteforge.kernels.gemm.sm90.config import (
    SHORT_K_NARROW,
    GemmConfig,
    default_config,
    fit_swizzle,
)
from cuteforge.ops import gemm

sms = torch.cuda.get_device_properties(0).multi_processor_count
out = {"command": "python .gpu/probe/s17e.py", "rows": []}
for rep in range(int(sys.argv[2]) if len(sys.argv) > 2 else 2):
    for m, n, k in [(16384, 16384, 1024), (8192, 8192, 1024), (8192, 8192, 512), (4096, 16384, 512)][:int(sys.argv[3]) if len(sys.argv) > 3 else 4]:
        a, b = bg._inputs(m, n, k)
        bias = torch.randn(n, device="cuda", dtype=torch.bfloat16)
        for act in ("gelu", "silu"):
            tf = (lambda x: F.gelu(x, approximate="tanh")) if act == "gelu" else F.silu
            cfgs = {"default": default_config(m, n, k, sms, fused=True), "pp128": fit_swizzle(SHORT_K_NARROW, m, n),
                    "coop": fit_swizzle(GemmConfig(epi_n=64, raster="n"), m, n)}
            fns = {"eager": lambda tf=tf: tf(torch.addmm(bias, a, b))}
            for name, c in cfgs.items():
                fns[name] = lambda c=c, act=act: gemm(a, b, bias=bias, epilogue=act, config=c)
            ref = fns["eager"]()
            row = {"M": m, "N": n, "K": k, "act": act, "rep": rep, **{f"{x}_config": repr(c) for x, c in cfgs.items()}}
            for name, fn in fns.items():
                row[f"{name}_err"] = bg._err(fn(), ref)
            ms = bg.measure(fns)
            for name, t in ms.items():
                row[f"{name}_vs_eager"] = round(ms["eager"] / t, 4)
            print(json.dumps({x: v for x, v in row.items() if x.endswith("_vs_eager") or x in ("M", "N", "K", "act")}), flush=True)
            out["rows"].append(row)
            json.dump(out, open(sys.argv[1], "w"), indent=1)
