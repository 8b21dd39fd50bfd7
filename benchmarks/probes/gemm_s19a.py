"""Session 19 probe 1: sub-wave squares (1024^3, 2048^3), where the default (128x64 pingpong,
1x2) read 0.913 / 0.971x cuBLAS on the H200 under the flushed timer: smaller tiles, other
clusters, split-K (stream_k on a sub-wave problem) beside cuBLAS, rotated order
(bench_gemm.measure), two passes. Writes JSON to argv[1]."""
# ruff: noqa: B023 - the timed lambdas close over this iteration's tensors and run within it
import json
import sys

sys.path.insert(0, "benchmarks")
import bench_gemm as bg
import torch

from cuteforge.kernels.gemm.sm90.config import GemmConfig, default_config
from cuteforge.ops import gemm

sms = torch.cuda.get_device_properties(0).multi_processor_count
CFGS = [
    GemmConfig(tile_n=64, pingpong=True, cluster_m=2, cluster_n=1),
    GemmConfig(tile_n=64, pingpong=True, cluster_m=1, cluster_n=1),
    GemmConfig(tile_m=64, tile_n=128, pingpong=True, cluster_m=1, cluster_n=2),
    GemmConfig(tile_m=64, tile_n=128, pingpong=True, cluster_m=2, cluster_n=1),
    GemmConfig(tile_m=64, tile_n=64, cluster_m=1, cluster_n=2),
    GemmConfig(tile_n=128, cluster_m=1, cluster_n=1, stream_k=True),
    GemmConfig(tile_n=128, cluster_m=2, cluster_n=1, stream_k=True),
]
out = {"command": "python benchmarks/probes/gemm_s19a.py OUT.json", "gpu": torch.cuda.get_device_name(), "rows": []}
for rep in range(2):
    for m, n, k in [(1024, 1024, 1024), (2048, 2048, 2048)]:
        a, b = bg._inputs(m, n, k)
        ref = (a.float() @ b.float())
        d = default_config(m, n, k, sms)
        fns = {"cublas": lambda: a @ b, "default": lambda: gemm(a, b, config=d)}
        errs = {}
        for i, c in enumerate(CFGS):
            try:
                y = gemm(a, b, config=c)
                errs[f"c{i}"] = round(float((y.float() - ref).abs().max() / ref.abs().max()), 5)
                fns[f"c{i}"] = lambda c=c: gemm(a, b, config=c)
            except Exception as e:  # noqa: BLE001 - reported
                errs[f"c{i}"] = f"{type(e).__name__}: {str(e)[:200]}"
        ms = bg.measure(fns)
        row = {"M": m, "N": n, "K": k, "rep": rep, "default": repr(d),
               "configs": {f"c{i}": repr(c) for i, c in enumerate(CFGS)}, "errors": errs,
               **{f"{x}_TF": bg.tflops(m, n, k, t) for x, t in ms.items()},
               **{f"{x}_vs_cublas": round(ms["cublas"] / t, 4) for x, t in ms.items()}}
        out["rows"].append(row)
        print(json.dumps({k_: v for k_, v in row.items() if k_ != "configs"}), flush=True)
with open(sys.argv[1], "w") as f:
    json.dump(out, f, indent=1)
