"""Session 17 probe 2: pingpong 128x192 (quack's sm90 default: 192 accumulators per
consumer thread, each warpgroup its own tile) and cooperative 256x192 raster n, swizzle
fitted, against the default, cuBLAS and quack; plain (2 passes) and bias+gelu."""
# ruff: noqa: B023 - the timed lambdas close over this iteration's tensors and run within it
import json
import sys

sys.path.insert(0, "benchmarks")
import bench_gemm as bg
import torch
import torch.nn.functional as F

from cuteforge.kernels.gemm.sm90.config import GemmConfig, default_config, fit_swizzle
from cuteforge.ops import gemm

sms = torch.cuda.get_device_properties(0).multi_processor_count
q = bg._quack()
out = {"command": "python .gpu/probe/s17b.py", "check": [], "rows": []}
def save():
    return json.dump(out, open(sys.argv[1], "w"), indent=1)
C = {"pp192m": GemmConfig(tile_m=128, tile_n=192, pingpong=True),
     "pp192n": GemmConfig(tile_m=128, tile_n=192, pingpong=True, raster="n"),
     "t21n": GemmConfig(tile_m=256, tile_n=192, store_overlap=False, raster="n")}
for (m, n, k) in [(1000, 1000, 1000), (257, 193, 77), (3001, 4999, 333), (7, 1024, 1000)]:
    a, b = bg._inputs(m, n, k)
    bias = torch.randn(n, device="cuda", dtype=torch.bfloat16)
    ref = torch.matmul(a.float(), b.float())
    refg = F.gelu(ref + bias.float(), approximate="tanh")
    for name in ("pp192m", "pp192n"):
        c = fit_swizzle(C[name], m, n)
        r = {"M": m, "N": n, "K": k, "cfg": name}
        try:
            r["plain_err"] = bg._err(gemm(a, b, config=c), ref)
            r["gelu_err"] = bg._err(gemm(a, b, bias=bias, epilogue="gelu", config=c), refg)
            r["silu_err"] = bg._err(gemm(a, b, bias=bias, epilogue="silu", config=c), F.silu(ref + bias.float()))
        except Exception as e:
            r["error"] = f"{type(e).__name__}: {str(e)[:300]}"
        print(json.dumps(r), flush=True)
        out["check"].append(r)
save()
shapes = [(8192, 8192, 8192), (4096, 4096, 4096), (2048, 8192, 28672), (16384, 16384, 1024), (8192, 8192, 4096),
          (16384, 16384, 16384), (2048, 2048, 2048), (2048, 14336, 4096)]
for rep in range(2):
    for m, n, k in shapes:
        if rep and (m, n, k) in [(16384, 16384, 16384), (2048, 14336, 4096)]:
            continue
        a, b = bg._inputs(m, n, k)
        d = default_config(m, n, k, sms)
        fns = {"cublas": lambda: torch.matmul(a, b), "quack": lambda: q.gemm(a, b, tuned=False),
               "default": lambda: gemm(a, b, config=d)}
        for name, c in C.items():
            fns[name] = lambda c=fit_swizzle(c, m, n): gemm(a, b, config=c)
        ref = torch.matmul(a, b)
        row = {"M": m, "N": n, "K": k, "rep": rep, "kind": "plain", "default": repr(d)}
        for name, fn in fns.items():
            row[f"{name}_err"] = bg._err(fn(), ref)
        ms = bg.measure(fns)
        for name, t in ms.items():
            row[f"{name}_TF"] = bg.tflops(m, n, k, t)
            row[f"{name}_vs_cublas"] = round(ms["cublas"] / t, 4)
        print(json.dumps({k2: v for k2, v in row.items() if not k2.endswith(("_err", "_TF")) and k2 != "default"}), flush=True)
        out["rows"].append(row)
        save()
        if rep == 0 and (m, n, k) in [(8192, 8192, 8192), (2048, 8192, 28672), (4096, 4096, 4096), (2048, 14336, 4096)]:
            bias = torch.randn(n, device="cuda", dtype=torch.bfloat16)
            fd = default_config(m, n, k, sms, fused=True)
            fns = {"eager": lambda: F.gelu(torch.addmm(bias, a, b), approximate="tanh"),
                   "default": lambda: gemm(a, b, bias=bias, epilogue="gelu", config=fd)}
            for name, c in C.items():
                fns[name] = lambda c=fit_swizzle(c, m, n): gemm(a, b, bias=bias, epilogue="gelu", config=c)
            row = {"M": m, "N": n, "K": k, "kind": "bias+gelu", "default": repr(fd)}
            ref = fns["eager"]()
            for name, fn in fns.items():
                row[f"{name}_err"] = bg._err(fn(), ref)
            ms = bg.measure(fns)
            for name, t in ms.items():
                row[f"{name}_vs_eager"] = round(ms["eager"] / t, 4)
            print(json.dumps({k2: v for k2, v in row.items() if not k2.endswith("_err") and k2 != "default"}), flush=True)
            out["rows"].append(row)
            save()
