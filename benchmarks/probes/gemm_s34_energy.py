"""Session 34 probe: at the power-bound bar shapes, does a 2x2 cluster (A and B both
multicast: 192 rows of operands from L2 per CTA and k-block instead of 256) spend less
energy per GEMM than the 2x1 default, and is it faster for it? Each contender runs back to
back for WINDOW seconds; per window: ms per call (CUDA events, no flush), joules per call
(NVML's board energy counter, read through ctypes) and the median SM clock / power of
`nvidia-smi -lms 50` samples in its middle 60 %. Two rounds in opposite order. Also records
the clusters of 2 and 4 the device runs at once. Shapes from argv[2] (MxNxK,...; default
8192^3 and 2048x8192x28672). Writes JSON to argv[1]. (Its sampling moved into probe_io.py after
the runs, unchanged.)"""
# ruff: noqa: B023 - the timed lambdas close over this iteration's tensors and run within it
import sys
import time

sys.path.insert(0, "benchmarks")
sys.path.insert(0, "benchmarks/probes")
import bench_gemm as bg
import torch
import torch.nn.functional as F
from probe_io import PowerSamples, add_row, power_rounds, shapes_arg

from cuteforge.arch import max_active_clusters
from cuteforge.kernels.gemm.sm90.config import GemmConfig, default_config
from cuteforge.ops import gemm

WINDOW = 3.0
power = PowerSamples()
shapes = shapes_arg(2, [(8192, 8192, 8192), (2048, 8192, 28672)])
sms = torch.cuda.get_device_properties(0).multi_processor_count
caps, query_s = {}, {}
for c in (2, 4):
    t = time.perf_counter()
    caps[c] = max_active_clusters(0, c)
    query_s[c] = round(time.perf_counter() - t, 4)
out = {"command": "python benchmarks/probes/gemm_s34_energy.py OUT.json " + " ".join(sys.argv[2:]),
       "gpu": torch.cuda.get_device_name(), "sms": sms, "max_active_clusters": caps, "query_s": query_s, "rows": []}
print(caps, query_s, flush=True)
for m, n, k in shapes:
    a, b = bg._inputs(m, n, k)
    bias = torch.randn(n, device="cuda", dtype=torch.bfloat16)
    plain = default_config(m, n, k, sms, 2)
    fused = default_config(m, n, k, sms, 2, fused=True, vector_operands=1)
    c22 = GemmConfig(tile_m=plain.tile_m, tile_n=plain.tile_n, cluster_m=2, cluster_n=2)
    c22f = GemmConfig(tile_m=fused.tile_m, tile_n=fused.tile_n, cluster_m=2, cluster_n=2, raster=fused.raster,
                      epi_n=fused.epi_n, early_operands=fused.early_operands)
    ref = torch.matmul(a, b).float()
    for cfg in (c22, plain):
        err = (gemm(a, b, config=cfg).float() - ref).abs().max().item()
        assert err < 0.05 * ref.abs().max().item(), (cfg, err)
    fns = {
        "cublas": lambda: torch.matmul(a, b),
        "ours": lambda: gemm(a, b),
        "ours_2x2": lambda: gemm(a, b, config=c22),
        "cublas_bias_gelu": lambda: F.gelu(torch.addmm(bias, a, b), approximate="tanh"),
        "ours_bias_gelu": lambda: gemm(a, b, bias=bias, epilogue="gelu"),
        "ours_bias_gelu_2x2": lambda: gemm(a, b, bias=bias, epilogue="gelu", config=c22f),
    }
    for row in power_rounds(fns, WINDOW, power, M=m, N=n, K=k):
        row["TF"] = bg.tflops(m, n, k, row["ms"])
        add_row(out, row)  # argv[1] rewritten after every row
power.stop()
