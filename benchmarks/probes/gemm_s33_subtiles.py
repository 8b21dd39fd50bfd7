"""Session 33 probe: narrower subtiles where ptxas says a full epilogue operand spills on
the other defaults. fp8 (per-tensor scales) on 128x256: the default's 64-wide subtiles
against 32-wide (operands held; ptxas, 8192^3, bias + gelu + residual: 64 bytes of spill
-> 0). 16-bit short K on pingpong 128x192: the default's 32-wide against 16-wide (112 ->
16 bytes; a residual alone 16 -> 0). Residual alone and bias + gelu + residual, each pair
in rotated order (bench_gemm.measure), two passes, checked bitwise. argv[2] (optional):
only the cases of that kind (fp8 or bf16). Writes JSON to argv[1] after every row."""
# ruff: noqa: B023 - the timed lambdas close over this iteration's tensors and run within it
import json
import sys
from dataclasses import replace

sys.path.insert(0, "benchmarks")
import bench_gemm as bg
import torch

from cuteforge.kernels.gemm.sm90.config import default_config
from cuteforge.ops import gemm

sms = torch.cuda.get_device_properties(0).multi_processor_count
out = {"command": "python benchmarks/probes/gemm_s33_subtiles.py OUT.json " + " ".join(sys.argv[2:]), "gpu": torch.cuda.get_device_name(), "rows": []}
cases = [("fp8", s, 32) for s in ((8192, 8192, 8192), (4096, 4096, 4096), (8192, 8192, 4096))]
cases += [("bf16", s, 16) for s in ((8192, 8192, 1024), (8192, 8192, 512), (16384, 4096, 1024))]
if len(sys.argv) > 2:
    cases = [c for c in cases if c[0] == sys.argv[2]]
for rep in range(2):
    for kind, (m, n, k), alt_n in cases:
        if kind == "fp8":
            a, b, sa, sb = bg._fp8_inputs(m, n, k)
            extra = {"scale_a": sa, "scale_b": sb}
        else:
            a, b = bg._inputs(m, n, k)
            extra = {}
        bias = torch.randn(n, device="cuda", dtype=torch.bfloat16)
        r = torch.randn(m, n, device="cuda", dtype=torch.bfloat16)
        for epi in ("res", "gelu_res"):
            kw = dict(extra, residual=r) if epi == "res" else dict(extra, residual=r, bias=bias, epilogue="gelu")
            cfg = default_config(m, n, k, sms, 1 if kind == "fp8" else 2, fused=True, vector_operands=int(epi != "res"),
                                 full_operands=1)
            alt = replace(cfg, epi_n=alt_n)
            fns = {"default": lambda: gemm(a, b, config=cfg, **kw), "alt": lambda: gemm(a, b, config=alt, **kw)}
            row = {"kind": kind, "M": m, "N": n, "K": k, "epi": epi, "rep": rep, "default_config": repr(cfg),
                   "alt_epi_n": alt_n, "same_bits": bool(torch.equal(fns["default"](), fns["alt"]()))}
            ms = bg.measure(fns)
            row.update({f"{x}_TF": bg.tflops(m, n, k, t) for x, t in ms.items()})
            row["alt_over_default"] = round(ms["default"] / ms["alt"], 4)
            out["rows"].append(row)
            print(json.dumps(row), flush=True)
            with open(sys.argv[1], "w") as f:
                json.dump(out, f, indent=1)
