"""Session 32 probe: fused epilogues on stream-K shapes after the change that loads their
row / col operands in the epilogue (`loads_operands_early` is False with stream_k; held from
the mainloop they spilled 144 bytes). The fused default (now 64-wide subtiles, loaded
late) against the 32-wide late form, our plain default, and cuBLAS addmm + the eager
activation (the bar's baseline). Rotated order (bench_gemm.measure), passes given by
argv[2] (default 2); the 32-wide form checked bitwise against the default. JSON to argv[1]."""
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
out = {"command": f"python benchmarks/probes/gemm_s32_streamk.py OUT.json {passes}",
       "gpu": torch.cuda.get_device_name(), "rows": []}
shapes = [(8192, 28672, 4096), (8192, 14336, 4096), (4096, 11008, 4096), (16384, 8192, 4096), (2048, 32000, 4096),
          (8192, 16384, 8192)]
torch_act = {"gelu": lambda x: F.gelu(x, approximate="tanh"), "silu": F.silu}
for rep in range(passes):
    for m, n, k in shapes:
        a, b = bg._inputs(m, n, k)
        bias = torch.randn(n, device="cuda", dtype=torch.bfloat16)
        cfg = default_config(m, n, k, sms, fused=True)
        plain = default_config(m, n, k, sms)
        assert cfg.stream_k and not cfg.loads_operands_early, cfg
        narrow = replace(cfg, epi_n=32, early_operands=False)
        for act in ("gelu", "silu"):
            fns = {
                "cublas_epi": lambda: torch_act[act](torch.addmm(bias, a, b)),
                "plain": lambda: gemm(a, b, config=plain),
                "fused": lambda: gemm(a, b, bias=bias, epilogue=act, config=cfg),
                "32n_late": lambda: gemm(a, b, bias=bias, epilogue=act, config=narrow),
            }
            row = {"M": m, "N": n, "K": k, "act": act, "rep": rep, "fused_config": repr(cfg)}
            ref = fns["fused"]()
            row["fused_rel_err"] = bg._err(ref, fns["cublas_epi"]())
            row["32n_late_same_bits"] = bool(torch.equal(fns["32n_late"](), ref))
            ms = bg.measure(fns)
            row.update({f"{x}_TF": bg.tflops(m, n, k, t) for x, t in ms.items()})
            row.update({f"{x}_vs_cublas_epi": round(ms["cublas_epi"] / t, 4) for x, t in ms.items()})
            out["rows"].append(row)
            print(json.dumps({k_: v for k_, v in row.items() if k_ != "fused_config"}), flush=True)
            with open(sys.argv[1], "w") as f:
                json.dump(out, f, indent=1)
