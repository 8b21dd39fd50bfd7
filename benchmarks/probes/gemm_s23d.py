"""Session 23 probe: on the fused bar's shapes, pingpong tiles with a bias + gelu against
the fused default (cooperative 128x256). A pingpong warpgroup's epilogue runs under the
other warpgroup's mainloop, where the cooperative tile's epilogue stalls both MMA
warpgroups; v4.7 measured pingpong 128x192 level with the default on the plain 8192^3
(h200-gemm-pp192-large.json) but never fused there. cuBLAS, cuBLAS addmm + eager gelu
(the bar's baseline) and our plain default beside; rotated order (bench_gemm.measure), two
passes; every fused contender checked bitwise against the default. Writes JSON to argv[1]."""
# ruff: noqa: B023 - the timed lambdas close over this iteration's tensors and run within it
import json
import sys
from dataclasses import replace

sys.path.insert(0, "benchmarks")
import bench_gemm as bg
import torch
import torch.nn.functional as F

from cuteforge.kernels.gemm.sm90.config import SHORT_K, GemmConfig, default_config
from cuteforge.ops import gemm

sms = torch.cuda.get_device_properties(0).multi_processor_count
out = {"command": "python benchmarks/probes/gemm_s23d.py OUT.json", "gpu": torch.cuda.get_device_name(), "rows": []}
shapes = [(8192, 8192, 8192), (2048, 8192, 28672), (4096, 4096, 4096)]
PP = {"pp192_5st": SHORT_K, "pp192_4st": replace(SHORT_K, epi_bufs=0),
      "pp192_m": replace(SHORT_K, raster="m"), "pp128_1x2": GemmConfig(tile_n=128, pingpong=True, cluster_m=1, cluster_n=2)}
for rep in range(2):
    for m, n, k in shapes:
        a, b = bg._inputs(m, n, k)
        bias = torch.randn(n, device="cuda", dtype=torch.bfloat16)
        cfg = default_config(m, n, k, sms, fused=True)
        plain = default_config(m, n, k, sms)
        fns = {
            "cublas": lambda: a @ b,
            "cublas_gelu": lambda: F.gelu(torch.addmm(bias, a, b), approximate="tanh"),
            "plain": lambda: gemm(a, b, config=plain),
            "fused": lambda: gemm(a, b, bias=bias, epilogue="gelu", config=cfg),
        }
        for name, c in PP.items():
            fns[name] = lambda c=c: gemm(a, b, bias=bias, epilogue="gelu", config=c)
        row = {"M": m, "N": n, "K": k, "rep": rep, "fused_config": repr(cfg), "configs": {k_: repr(c) for k_, c in PP.items()}}
        ref = fns["fused"]()
        for name in PP:
            try:
                row[f"{name}_same_bits"] = bool(torch.equal(fns[name](), ref))
            except Exception as e:  # noqa: BLE001
                row[f"{name}_error"] = f"{type(e).__name__}: {str(e)[:200]}"
                fns.pop(name)
        ms = bg.measure(fns)
        row.update({f"{x}_TF": bg.tflops(m, n, k, t) for x, t in ms.items()})
        row.update({f"{x}_vs_cublas_gelu": round(ms["cublas_gelu"] / t, 4) for x, t in ms.items()})
        out["rows"].append(row)
        print(json.dumps({k_: v for k_, v in row.items() if k_ != "configs"}), flush=True)
        with open(sys.argv[1], "w") as f:
            json.dump(out, f, indent=1)
