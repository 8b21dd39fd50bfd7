"""Session 24 probe: `act_overlap` (gemm v4.11) on the fused bar's shapes. The fused
default (cooperative 128x256, store_overlap) runs the activation on the whole tile before
the next mainloop starts, with both MMA warpgroups waiting; with act_overlap the tile is
held as its rounded pre-activation value and the activation runs per subtile under the
next tile's first MMAs. cuBLAS, cuBLAS addmm + the eager activation (the bar's baseline)
and our plain default beside; rotated order (bench_gemm.measure), two passes. The
act_overlap output is compared with torch's eager rounding: act(x rounded to bf16) in
fp32, rounded (within a bf16 ulp or so of max(|act(x)|, |x| / 2): MUFU tanh). Writes JSON to argv[1]."""
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
out = {"command": "python benchmarks/probes/gemm_s24b.py OUT.json", "gpu": torch.cuda.get_device_name(), "rows": []}
shapes = [(8192, 8192, 8192), (4096, 4096, 4096), (2048, 8192, 28672), (2048, 14336, 4096), (8192, 8192, 2048)]
ACT = {"gelu": lambda x: F.gelu(x, approximate="tanh"), "silu": F.silu}
for rep in range(2):
    for m, n, k in shapes:
        a, b = bg._inputs(m, n, k)
        bias = torch.randn(n, device="cuda", dtype=torch.bfloat16)
        for act in ("gelu", "silu"):
            tf = ACT[act]
            cfg = default_config(m, n, k, sms, fused=True)
            ao = replace(cfg, act_overlap=not cfg.act_overlap)
            plain = default_config(m, n, k, sms)
            fns = {
                "cublas": lambda: a @ b,
                "cublas_act": lambda: tf(torch.addmm(bias, a, b)),
                "plain": lambda: gemm(a, b, config=plain),
                "fused": lambda: gemm(a, b, bias=bias, epilogue=act, config=cfg),
                "fused_flip": lambda: gemm(a, b, bias=bias, epilogue=act, config=ao),
            }
            row = {"M": m, "N": n, "K": k, "act": act, "rep": rep, "fused_config": repr(cfg), "flip_config": repr(ao)}
            if rep == 0:
                pre = gemm(a, b, bias=bias, config=cfg).float()  # x rounded to bf16, same tile order
                eager = tf(pre).bfloat16().float()
                for name in ("fused", "fused_flip"):
                    got = fns[name]().float()
                    # in bf16 ulps of max(|act(x)|, |x| / 2): where act(x) ~ 0 (x < -3) the
                    # MUFU tanh's absolute error on h (1 + tanh u) is an error in h's ulps
                    ulp = torch.maximum(eager.abs(), pre.abs() * 0.5).clamp_min(2.0**-100) * 2.0**-7
                    row[f"{name}_max_ulps_vs_eager_rounding"] = round(float(((got - eager).abs() / ulp).max()), 3)
                    row[f"{name}_rel_err"] = bg._err(fns[name](), fns["cublas_act"]())
            ms = bg.measure(fns)
            row.update({f"{x}_TF": bg.tflops(m, n, k, t) for x, t in ms.items()})
            row.update({f"{x}_vs_cublas_act": round(ms["cublas_act"] / t, 4) for x, t in ms.items()})
            out["rows"].append(row)
            print(json.dumps({k_: v for k_, v in row.items() if "config" not in k_}), flush=True)
            with open(sys.argv[1], "w") as f:
                json.dump(out, f, indent=1)
