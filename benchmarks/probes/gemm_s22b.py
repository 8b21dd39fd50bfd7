"""Session 22 probe (written for the next device session): single-wave problems with the
default's swizzle against swizzle 1. With swizzle > 1 the DSL's tile scheduler decodes tile
coordinates with hardware integer divisions (get_flat_coord of the swizzled layout); with
swizzle 1 it uses FastDivmod divisors made on the host. In the SASS of the 1024^3 default
(128x64 pingpong, 1x2), the producer runs 335 instructions with 9 divisions between
setmaxnreg and its first TMA load, against 151 with 2 at swizzle 1 (gemm.md, Not done).
Every cluster of a single-wave problem runs at most one tile, so the swizzle buys no L2
reuse there. Rotated order (bench_gemm.measure), two passes, cuBLAS beside; each row also
checks that the two configs give the same bits. Writes JSON to argv[1]."""
# ruff: noqa: B023 - the timed lambdas close over this iteration's tensors and run within it
import json
import sys
from dataclasses import replace

sys.path.insert(0, "benchmarks")
import bench_gemm as bg
import torch

from cuteforge.kernels.gemm.sm90.config import default_config, scheduled_clusters
from cuteforge.ops import gemm

sms = torch.cuda.get_device_properties(0).multi_processor_count
out = {"command": "python benchmarks/probes/gemm_s22b.py OUT.json", "gpu": torch.cuda.get_device_name(), "rows": []}
shapes = [(1024, 1024, 1024), (2048, 2048, 2048), (1024, 1024, 4096), (2048, 4096, 4096), (128, 4096, 4096),
          (2048, 2048, 512)]
for rep in range(2):
    for m, n, k in shapes:
        a, b = bg._inputs(m, n, k)
        cfg = default_config(m, n, k, sms)
        one = replace(cfg, swizzle=1)
        workers = sms // (cfg.cluster_m * cfg.cluster_n)
        row = {"M": m, "N": n, "K": k, "rep": rep, "config": repr(cfg),
               "clusters": scheduled_clusters(cfg, m, n), "workers": workers}
        fns = {"cublas": lambda: a @ b, "default": lambda: gemm(a, b, config=cfg),
               "swizzle1": lambda: gemm(a, b, config=one)}
        row["same_bits"] = bool(torch.equal(fns["default"](), fns["swizzle1"]()))
        ms = bg.measure(fns)
        row.update({f"{x}_TF": bg.tflops(m, n, k, t) for x, t in ms.items()})
        row.update({f"{x}_vs_cublas": round(ms["cublas"] / t, 4) for x, t in ms.items()})
        row["swizzle1_vs_default"] = round(ms["default"] / ms["swizzle1"], 4)
        out["rows"].append(row)
        print(json.dumps(row), flush=True)
        with open(sys.argv[1], "w") as f:
            json.dump(out, f, indent=1)
