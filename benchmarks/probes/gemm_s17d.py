"""Session 17 probe 4: short K, pingpong 128x192 variants: 4 ring stages (4 staging
buffers per warpgroup) vs 5 stages (2 buffers per warpgroup: epi_stages patched for
stages=5 configs in this process) vs 64-wide subtiles; default, cuBLAS, quack."""
# ruff: noqa: B023 - the timed lambdas close over this iteration's tensors and run within it
import json
import os
import sys

os.environ["CUTEFORGE_CACHE_DIR"] = "/tmp/cfc_s17d"
sys.path.insert(0, "benchmarks")
import bench_gemm as bg
import torch

from cuteforge.kernels.gemm.sm90 import config as gcfg
from cuteforge.kernels.gemm.sm90.config import GemmConfig, default_config, fit_swizzle
from cuteforge.ops import gemm

_orig = gcfg.GemmConfig.epi_stages
gcfg.GemmConfig.epi_stages = lambda self, ob: 2 if (self.pingpong and self.stages == 5) else _orig(self, ob)
sms = torch.cuda.get_device_properties(0).multi_processor_count
q = bg._quack()
out = {"command": "python .gpu/probe/s17d.py", "rows": []}
def save():
    return json.dump(out, open(sys.argv[1], "w"), indent=1)
C = {"pp192n": GemmConfig(tile_m=128, tile_n=192, pingpong=True, raster="n"),
     "pp192n_s5": GemmConfig(tile_m=128, tile_n=192, pingpong=True, raster="n", stages=5),
     "pp192n_e64": GemmConfig(tile_m=128, tile_n=192, pingpong=True, raster="n", epi_n=64)}
for name, c in C.items():
    print(name, c.smem_bytes(2, 2, c.resolved_stages(2, 2, gcfg.limits_for("sm_90a"))), flush=True)
shapes = [(8192, 8192, 512), (16384, 16384, 1024), (8192, 8192, 1024), (4096, 16384, 512), (16384, 4096, 1024), (8192, 8192, 2048)]
for rep in range(2):
    for m, n, k in shapes:
        a, b = bg._inputs(m, n, k)
        d = default_config(m, n, k, sms)
        fns = {"cublas": lambda: torch.matmul(a, b), "quack": lambda: q.gemm(a, b, tuned=False),
               "default": lambda: gemm(a, b, config=d)}
        for name, c in C.items():
            fns[name] = lambda c=fit_swizzle(c, m, n): gemm(a, b, config=c)
        ref = torch.matmul(a, b)
        row = {"M": m, "N": n, "K": k, "rep": rep, "default": repr(d)}
        for name, fn in fns.items():
            row[f"{name}_err"] = bg._err(fn(), ref)
        ms = bg.measure(fns)
        for name, t in ms.items():
            row[f"{name}_TF"] = bg.tflops(m, n, k, t)
            row[f"{name}_vs_cublas"] = round(ms["cublas"] / t, 4)
        print(json.dumps({k2: v for k2, v in row.items() if not k2.endswith(("_TF",)) and k2 != "default"}), flush=True)
        out["rows"].append(row)
        save()
