"""Session 31 probe: 16-bit bias + gelu on the fused default's 128x256 tile with 32-wide
subtiles and the bias loaded in the epilogue (the form fp8's rowwise scales measured
faster in, h200-gemm-s31-rowwise-cfg.json) against the default (64-wide, bias held from
the mainloop) and the two mixed forms. cuBLAS, cuBLAS addmm + eager gelu (the bar's
baseline) and our plain default beside; rotated order (bench_gemm.measure), two passes;
every fused contender checked bitwise against the default. Writes JSON to argv[1]."""
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
out = {"command": "python benchmarks/probes/gemm_s31_fused_narrow.py OUT.json", "gpu": torch.cuda.get_device_name(), "rows": []}
shapes = [(8192, 8192, 8192), (2048, 8192, 28672), (4096, 4096, 4096), (2048, 14336, 4096)]
for rep in range(2):
    for m, n, k in shapes:
        a, b = bg._inputs(m, n, k)
        bias = torch.randn(n, device="cuda", dtype=torch.bfloat16)
        cfg = default_config(m, n, k, sms, fused=True)
        plain = default_config(m, n, k, sms)
        forms = {"32n_late": replace(cfg, epi_n=32, early_operands=False), "64n_late": replace(cfg, early_operands=False),
                 "32n_early": replace(cfg, epi_n=32)}
        fns = {
            "cublas": lambda: a @ b,
            "cublas_gelu": lambda: F.gelu(torch.addmm(bias, a, b), approximate="tanh"),
            "plain": lambda: gemm(a, b, config=plain),
            "fused": lambda: gemm(a, b, bias=bias, epilogue="gelu", config=cfg),
        }
        for name, c in forms.items():
            fns[name] = lambda c=c: gemm(a, b, bias=bias, epilogue="gelu", config=c)
        row = {"M": m, "N": n, "K": k, "rep": rep, "fused_config": repr(cfg), "configs": {k_: repr(c) for k_, c in forms.items()}}
        ref = fns["fused"]()
        for name in forms:
            row[f"{name}_same_bits"] = bool(torch.equal(fns[name](), ref))
        ms = bg.measure(fns)
        row.update({f"{x}_TF": bg.tflops(m, n, k, t) for x, t in ms.items()})
        row.update({f"{x}_vs_cublas_gelu": round(ms["cublas_gelu"] / t, 4) for x, t in ms.items()})
        out["rows"].append(row)
        print(json.dumps({k_: v for k_, v in row.items() if k_ != "configs"}), flush=True)
        with open(sys.argv[1], "w") as f:
            json.dump(out, f, indent=1)
