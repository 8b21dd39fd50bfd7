"""Session 31 probe: where the fused bias + gelu tile loses to our plain one at the bar's
compute-bound shapes (2-3 % at 8192^3 in h200-gemm-s31-fused-narrow.json). Splits the
difference into the config (plain runs 32-wide subtiles and raster m, a fused epilogue 64-wide
and raster n), the bias, and the activation's math (relu against gelu), with the 32-wide
late form and cuBLAS, cuBLAS addmm + eager gelu beside; rotated order (bench_gemm.measure),
two passes. Writes JSON to argv[1]."""
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
out = {"command": "python benchmarks/probes/gemm_s31_fused_parts.py OUT.json", "gpu": torch.cuda.get_device_name(), "rows": []}
shapes = [(8192, 8192, 8192), (2048, 8192, 28672)]
for rep in range(2):
    for m, n, k in shapes:
        a, b = bg._inputs(m, n, k)
        bias = torch.randn(n, device="cuda", dtype=torch.bfloat16)
        fused = default_config(m, n, k, sms, fused=True)
        plain = default_config(m, n, k, sms)
        late = replace(fused, epi_n=32, early_operands=False)
        cfgs = {"fused": fused, "plain": plain, "late32": late}
        fns = {
            "cublas": lambda: a @ b,
            "cublas_gelu": lambda: F.gelu(torch.addmm(bias, a, b), approximate="tanh"),
            "plain": lambda: gemm(a, b, config=plain),
            "plain_on_fused_cfg": lambda: gemm(a, b, config=fused),
            "bias": lambda: gemm(a, b, bias=bias, config=fused),
            "bias_relu": lambda: gemm(a, b, bias=bias, epilogue="relu", config=fused),
            "bias_gelu": lambda: gemm(a, b, bias=bias, epilogue="gelu", config=fused),
            "bias_gelu_on_plain_cfg": lambda: gemm(a, b, bias=bias, epilogue="gelu", config=plain),
            "bias_gelu_late32": lambda: gemm(a, b, bias=bias, epilogue="gelu", config=late),
            "gelu_no_bias": lambda: gemm(a, b, epilogue="gelu", config=fused),
        }
        row = {"M": m, "N": n, "K": k, "rep": rep, "configs": {k_: repr(c) for k_, c in cfgs.items()}}
        ref = fns["bias_gelu"]()
        for name in ("bias_gelu_on_plain_cfg", "bias_gelu_late32"):
            row[f"{name}_same_bits"] = bool(torch.equal(fns[name](), ref))
        ms = bg.measure(fns)
        row.update({f"{x}_TF": bg.tflops(m, n, k, t) for x, t in ms.items()})
        row.update({f"{x}_vs_cublas_gelu": round(ms["cublas_gelu"] / t, 4) for x, t in ms.items()})
        out["rows"].append(row)
        print(json.dumps({k_: v for k_, v in row.items() if k_ != "configs"}), flush=True)
        with open(sys.argv[1], "w") as f:
            json.dump(out, f, indent=1)
