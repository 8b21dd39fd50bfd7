"""Session 32 probe: is the 32-wide subtile the better 16-bit fused default? The fused
default (128x256, 64-wide subtiles, operands held from the mainloop) against the same
tile with 32-wide subtiles (operands held: "32n_early"; loaded in the epilogue:
"32n_late"), over more shapes and epilogues than session 31's probe
(gemm_s31_fused_narrow.py): bias + gelu, bias + silu and bias alone, K = 4096 to 28672.
Baseline: cuBLAS addmm + the eager activation (the bar's). Rotated order
(bench_gemm.measure), passes given by argv[2] (default 2); each form checked bitwise
against the default. Writes JSON to argv[1] after every row."""
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
passes = int(sys.argv[2]) if len(sys.argv) > 2 else 2
out = {"command": f"python benchmarks/probes/gemm_s32_fused_narrow.py OUT.json {passes}",
       "gpu": torch.cuda.get_device_name(), "rows": []}
shapes = [(8192, 8192, 8192), (2048, 8192, 28672), (4096, 4096, 4096), (2048, 14336, 4096), (8192, 8192, 4096),
          (4096, 14336, 4096), (8192, 28672, 4096), (8192, 4096, 14336)]
torch_act = {"gelu": lambda x: F.gelu(x, approximate="tanh"), "silu": F.silu, None: lambda x: x}
for rep in range(passes):
    for m, n, k in shapes:
        a, b = bg._inputs(m, n, k)
        bias = torch.randn(n, device="cuda", dtype=torch.bfloat16)
        cfg = default_config(m, n, k, sms, fused=True)
        forms = {"32n_early": replace(cfg, epi_n=32), "32n_late": replace(cfg, epi_n=32, early_operands=False)}
        for act in ("gelu", "silu", None):
            fns = {
                "cublas_epi": lambda: torch_act[act](torch.addmm(bias, a, b)),
                "fused": lambda: gemm(a, b, bias=bias, epilogue=act, config=cfg),
            }
            for name, c in forms.items():
                fns[name] = lambda c=c: gemm(a, b, bias=bias, epilogue=act, config=c)
            row = {"M": m, "N": n, "K": k, "act": act or "bias", "rep": rep, "fused_config": repr(cfg)}
            ref = fns["fused"]()
            row["fused_rel_err"] = bg._err(ref, fns["cublas_epi"]())
            for name in forms:
                row[f"{name}_same_bits"] = bool(torch.equal(fns[name](), ref))
            ms = bg.measure(fns)
            row.update({f"{x}_TF": bg.tflops(m, n, k, t) for x, t in ms.items()})
            row.update({f"{x}_vs_cublas_epi": round(ms["cublas_epi"] / t, 4) for x, t in ms.items()})
            out["rows"].append(row)
            print(json.dumps(row), flush=True)
            with open(sys.argv[1], "w") as f:
                json.dump(out, f, indent=1)
