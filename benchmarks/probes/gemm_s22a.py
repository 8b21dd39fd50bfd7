"""Session 22 probe: the epilogue's bias loaded while the mainloop runs (early_operands,
gemm v4.10) against loaded in the epilogue one subtile ahead (early_operands=False, the
v4.9 kernel), with the plain GEMM on the same config, cuBLAS and cuBLAS addmm + eager gelu;
rotated order (bench_gemm.measure), two passes. Writes JSON to argv[1]."""
# ruff: noqa: B023 - the timed lambdas close over this iteration's tensors and run within it
import json
import sys
from dataclasses import replace

sys.path.insert(0, "benchmarks")
import bench_gemm as bg
import torch
import torch.nn.functional as F

from cuteforge.kernels.gemm.sm90.config import default_config
from cuteforge.ops import gemm

sms = torch.cuda.get_device_properties(0).multi_processor_count
out = {"command": "python benchmarks/probes/gemm_s22a.py OUT.json", "gpu": torch.cuda.get_device_name(), "rows": []}
shapes = [(8192, 8192, 8192), (4096, 4096, 4096), (2048, 8192, 28672), (2048, 14336, 4096)]
for rep in range(2):
    for m, n, k in shapes:
        a, b = bg._inputs(m, n, k)
        bias = torch.randn(n, device="cuda", dtype=torch.bfloat16)
        cfg = default_config(m, n, k, sms, fused=True)
        late = replace(cfg, early_operands=False)
        fns = {
            "cublas": lambda: a @ b,
            "cublas_gelu": lambda: F.gelu(torch.addmm(bias, a, b), approximate="tanh"),
            "plain": lambda: gemm(a, b, config=cfg),
            "bias_early": lambda: gemm(a, b, bias=bias, config=cfg),
            "bias_late": lambda: gemm(a, b, bias=bias, config=late),
            "gelu_early": lambda: gemm(a, b, bias=bias, epilogue="gelu", config=cfg),
            "gelu_late": lambda: gemm(a, b, bias=bias, epilogue="gelu", config=late),
            "silu_early": lambda: gemm(a, b, bias=bias, epilogue="silu", config=cfg),
        }
        for fn in fns.values():
            fn()
        ref = fns["gelu_late"]()
        same = bool(torch.equal(fns["gelu_early"](), ref))
        ms = bg.measure(fns)
        row = {"M": m, "N": n, "K": k, "rep": rep, "config": repr(cfg), "gelu_early_equals_late": same,
               **{f"{x}_TF": bg.tflops(m, n, k, t) for x, t in ms.items()},
               **{f"{x}_vs_plain": round(ms["plain"] / t, 4) for x, t in ms.items()},
               "gelu_early_vs_cublas_gelu": round(ms["cublas_gelu"] / ms["gelu_early"], 4),
               "gelu_late_vs_cublas_gelu": round(ms["cublas_gelu"] / ms["gelu_late"], 4)}
        out["rows"].append(row)
        print(json.dumps(row), flush=True)
        with open(sys.argv[1], "w") as f:
            json.dump(out, f, indent=1)
