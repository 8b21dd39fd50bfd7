"""Session 17 probe: 256x192 cooperative tile (192 fp32 accumulators per consumer thread,
no held-store overlap) against the 128x256 default, cuBLAS and quack. Correctness on
ragged shapes first, then balanced-order timing, plain and bias+gelu."""
# ruff: noqa: B023 - the timed lambdas close over this iteration's tensors and run within it
import json
import sys
from dataclasses import replace

sys.path.insert(0, "benchmarks")
import bench_gemm as bg
import torch
import torch.nn.functional as F

from cuteforge.kernels.gemm.sm90.config import GemmConfig, default_config
from cuteforge.ops import gemm

sms = torch.cuda.get_device_properties(0).multi_processor_count
q = bg._quack()
out = {"command": "python .gpu/probe/s17a.py", "check": [], "rows": []}
def save():
    return json.dump(out, open(sys.argv[1], "w"), indent=1)
T = dict(tile_m=256, tile_n=192, store_overlap=False)
cands = {"t21": GemmConfig(**T), "t12": GemmConfig(**T, cluster_m=1, cluster_n=2),
         "t21sk": GemmConfig(**T, stream_k=True), "t21n": GemmConfig(**T, raster="n")}
# correctness: ragged, batched, gelu
for (m, n, k) in [(1000, 1000, 1000), (257, 193, 77), (3001, 4999, 333), (7, 65537 // 64, 1000)]:
    a, b = bg._inputs(m, n, k)
    bias = torch.randn(n, device="cuda", dtype=torch.bfloat16)
    ref = torch.matmul(a.float(), b.float())
    refg = F.gelu(ref + bias.float(), approximate="tanh")
    for name, c in cands.items():
        r = {"M": m, "N": n, "K": k, "cfg": name}
        try:
            r["plain_err"] = bg._err(gemm(a, b, config=c), ref)
            r["gelu_err"] = bg._err(gemm(a, b, bias=bias, epilogue="gelu", config=replace(c, stream_k=False)), refg)
        except Exception as e:
            r["error"] = f"{type(e).__name__}: {str(e)[:300]}"
        print(json.dumps(r), flush=True)
        out["check"].append(r)
save()
for m, n, k in [(8192, 8192, 8192), (4096, 4096, 4096), (2048, 8192, 28672), (16384, 16384, 1024), (16384, 16384, 16384), (8192, 8192, 4096)]:
    a, b = bg._inputs(m, n, k)
    d = default_config(m, n, k, sms)
    fns = {"cublas": lambda: torch.matmul(a, b), "quack": lambda: q.gemm(a, b, tuned=False),
           "default": lambda: gemm(a, b, config=d)}
    for name, c in cands.items():
        fns[name] = lambda c=c: gemm(a, b, config=c)
    ref = torch.matmul(a, b)
    row = {"M": m, "N": n, "K": k, "kind": "plain", "default": repr(d)}
    for name, fn in fns.items():
        row[f"{name}_err"] = bg._err(fn(), ref)
    ms = bg.measure(fns)
    for name, t in ms.items():
        row[f"{name}_TF"] = bg.tflops(m, n, k, t)
        row[f"{name}_vs_cublas"] = round(ms["cublas"] / t, 4)
    print(json.dumps({k2: v for k2, v in row.items() if not k2.endswith("_err") and k2 != "default"}), flush=True)
    out["rows"].append(row)
    save()
    if (m, n, k) in [(8192, 8192, 8192), (2048, 8192, 28672), (4096, 4096, 4096)]:
        bias = torch.randn(n, device="cuda", dtype=torch.bfloat16)
        fd = default_config(m, n, k, sms, fused=True)
        fns = {"eager": lambda: F.gelu(torch.addmm(bias, a, b), approximate="tanh"),
               "default": lambda: gemm(a, b, bias=bias, epilogue="gelu", config=fd)}
        for name in ("t21n", "t12", "t21"):
            fns[name] = lambda c=replace(cands[name], raster="n"): gemm(a, b, bias=bias, epilogue="gelu", config=c)
        row = {"M": m, "N": n, "K": k, "kind": "bias+gelu"}
        ref = fns["eager"]()
        for name, fn in fns.items():
            row[f"{name}_err"] = bg._err(fn(), ref)
        ms = bg.measure(fns)
        for name, t in ms.items():
            row[f"{name}_vs_eager"] = round(ms["eager"] / t, 4)
        print(json.dumps({k2: v for k2, v in row.items() if not k2.endswith("_err")}), flush=True)
        out["rows"].append(row)
        save()
