"""Session 17 probe 3: short K (the pingpong default's range): pingpong 128x192 against
the default pingpong 128x128 raster n, cuBLAS and quack, two passes; bias+gelu too."""
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
out = {"command": "python .gpu/probe/s17c.py", "rows": []}
def save():
    return json.dump(out, open(sys.argv[1], "w"), indent=1)
C = {"pp192n": GemmConfig(tile_m=128, tile_n=192, pingpong=True, raster="n"),
     "pp192m": GemmConfig(tile_m=128, tile_n=192, pingpong=True),
     "pp192n12": GemmConfig(tile_m=128, tile_n=192, pingpong=True, raster="n", cluster_m=1, cluster_n=2)}
shapes = [(16384, 16384, 1024), (8192, 8192, 1024), (4096, 4096, 1024), (16384, 4096, 1024), (4096, 16384, 512),
          (8192, 8192, 512), (8192, 8192, 2048)]
for rep in range(2):
    for m, n, k in shapes:
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
        if rep == 0 and k == 1024 and m >= 8192:
            bias = torch.randn(n, device="cuda", dtype=torch.bfloat16)
            fd = default_config(m, n, k, sms, fused=True)
            fns = {"eager": lambda: F.gelu(torch.addmm(bias, a, b), approximate="tanh"),
                   "default": lambda: gemm(a, b, bias=bias, epilogue="gelu", config=fd),
                   "pp128n": lambda: gemm(a, b, bias=bias, epilogue="gelu", config=fit_swizzle(GemmConfig(tile_n=128, pingpong=True, raster="n"), m, n))}
            for name in ("pp192n", "pp192m"):
                fns[name] = lambda c=fit_swizzle(C[name], m, n): gemm(a, b, bias=bias, epilogue="gelu", config=c)
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
