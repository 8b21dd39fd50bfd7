"""Session 33 probe: do full epilogue operands (a residual) cost more through ptxas's
spill than the overlapped stores buy? The residual default as it was before this session
(`default_config` without `full_operands`: 64-wide subtiles on 128x256, "fused") against
the same tile without `store_overlap` (ptxas: no spill on 128x256) and with 32-wide
subtiles, with and without overlap. Epilogues: residual alone (acc + r), bias + gelu +
residual, bias + silu + residual (argv[3], a comma list of res / gelu_res / silu_res;
default res,gelu_res); shapes from argv[4] (MxNxK,...). Baselines: cuBLAS addmm with the
residual as C (`torch.addmm(r, a, b)`), and `act(addmm(bias, a, b)) + r` eager. Rotated
order (bench_gemm.measure), passes from argv[2] (default 2); every form checked bitwise
against "fused". Writes JSON to argv[1] after every row."""
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
epis = sys.argv[3].split(",") if len(sys.argv) > 3 else ["res", "gelu_res"]
out = {"command": "python benchmarks/probes/gemm_s33_residual.py OUT.json " + " ".join(sys.argv[2:]),
       "gpu": torch.cuda.get_device_name(), "rows": []}
shapes = [(8192, 8192, 8192), (4096, 4096, 4096), (2048, 8192, 28672), (8192, 28672, 4096), (4096, 14336, 4096)]
if len(sys.argv) > 4:
    shapes = [tuple(int(x) for x in s.split("x")) for s in sys.argv[4].split(",")]
for rep in range(passes):
    for m, n, k in shapes:
        a, b = bg._inputs(m, n, k)
        bias = torch.randn(n, device="cuda", dtype=torch.bfloat16)
        r = torch.randn(m, n, device="cuda", dtype=torch.bfloat16)
        for epi in epis:
            act = {"res": None, "gelu_res": "gelu", "silu_res": "silu"}[epi]
            vec = 0 if act is None else 1
            # "fused": the default before session 33, which had no full_operands rule (64-wide
            # subtiles on 128x256 without stream-K); its "32n" form is the session-33 default.
            cfg = default_config(m, n, k, sms, fused=True, vector_operands=vec)
            forms = {"no_overlap": replace(cfg, store_overlap=False)}
            if cfg.epi_n != 32:
                forms["32n"] = replace(cfg, epi_n=32)
            forms["32n_no_overlap"] = replace(cfg, epi_n=32, store_overlap=False)
            if epi == "res":
                fns = {"cublas_epi": lambda: torch.addmm(r, a, b),
                       "fused": lambda: gemm(a, b, residual=r, config=cfg)}
                for name, c in forms.items():
                    fns[name] = lambda c=c: gemm(a, b, residual=r, config=c)
            else:
                eager = (lambda x: F.gelu(x, approximate="tanh")) if act == "gelu" else F.silu
                fns = {"cublas_epi": lambda: eager(torch.addmm(bias, a, b)) + r,
                       "fused": lambda: gemm(a, b, bias=bias, epilogue=act, residual=r, config=cfg)}
                for name, c in forms.items():
                    fns[name] = lambda c=c: gemm(a, b, bias=bias, epilogue=act, residual=r, config=c)
            row = {"M": m, "N": n, "K": k, "epi": epi, "rep": rep, "fused_config": repr(cfg)}
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
