"""Session 32 probe: the fused default at stream-K shapes, this tree against the one
before session 32's change (run once per source tree, PYTHONPATH picking it; bias held
from the mainloop on 64-wide subtiles, which spilled 144 bytes, against 32-wide subtiles
loading it in the epilogue). Each process times `ops.gemm`'s untuned default against
cuBLAS addmm + the eager activation on the same inputs (rotated order, bench_gemm.measure).
JSON to argv[1]."""
# ruff: noqa: B023 - the timed lambdas close over this iteration's tensors and run within it
import json
import sys

sys.path.insert(0, "benchmarks")
import bench_gemm as bg
import torch
import torch.nn.functional as F

import cuteforge
from cuteforge.kernels.gemm.sm90.config import default_config
from cuteforge.ops import gemm

sms = torch.cuda.get_device_properties(0).multi_processor_count
out = {"command": "PYTHONPATH=<tree>/src python benchmarks/probes/gemm_s32_streamk_ab.py OUT.json",
       "gpu": torch.cuda.get_device_name(), "source": cuteforge.__file__, "rows": []}
shapes = [(8192, 28672, 4096), (8192, 14336, 4096), (4096, 11008, 4096), (16384, 8192, 4096), (2048, 32000, 4096),
          (8192, 16384, 8192)]
torch_act = {"gelu": lambda x: F.gelu(x, approximate="tanh"), "silu": F.silu}
for m, n, k in shapes:
    a, b = bg._inputs(m, n, k)
    bias = torch.randn(n, device="cuda", dtype=torch.bfloat16)
    for act in ("gelu", "silu"):
        fns = {"cublas_epi": lambda: torch_act[act](torch.addmm(bias, a, b)),
               "fused": lambda: gemm(a, b, bias=bias, epilogue=act)}
        row = {"M": m, "N": n, "K": k, "act": act, "fused_config": repr(default_config(m, n, k, sms, fused=True)),
               "fused_rel_err": bg._err(fns["fused"](), fns["cublas_epi"]())}
        ms = bg.measure(fns)
        row.update({f"{x}_TF": bg.tflops(m, n, k, t) for x, t in ms.items()})
        row["fused_vs_cublas_epi"] = round(ms["cublas_epi"] / ms["fused"], 4)
        out["rows"].append(row)
        print(json.dumps({k_: v for k_, v in row.items() if k_ != "fused_config"}), flush=True)
        with open(sys.argv[1], "w") as f:
            json.dump(out, f, indent=1)
