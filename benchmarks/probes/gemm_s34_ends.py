"""Session 34 probe (written in session 34, to be run in a later one): does cutting a
nearly full last wave (`GemmConfig.stream_k_ends`) speed up the shapes whose last wave
`stream_k_split` leaves whole? 8192^3 (34 of 66 clusters in the last wave) and
2048x8192x28672 (58 of 66), plain and with bias + gelu: the default, the default with
`stream_k=True, stream_k_ends=True` (fused: also on 32-wide subtiles with late operands,
"ends32", the fused stream-K default's form), cuBLAS and cuBLAS addmm + eager gelu, rotated order
(bench_gemm.measure), passes from argv[2] (default 2); every ends output checked against
the default's (stream-K sums in another order: a few bf16 ulps). Shapes from argv[3]
(MxNxK,...). Writes JSON to argv[1] after every row."""
# ruff: noqa: B023 - the timed lambdas close over this iteration's tensors and run within it
import sys
from dataclasses import replace

sys.path.insert(0, "benchmarks")
sys.path.insert(0, "benchmarks/probes")
import bench_gemm as bg
import torch
import torch.nn.functional as F
from probe_io import add_row, ends_contenders, probe_args

from cuteforge.kernels.gemm.sm90.config import default_config, scheduled_clusters, stream_k_ends_len
from cuteforge.ops import gemm

sms = torch.cuda.get_device_properties(0).multi_processor_count
passes, shapes, out = probe_args("gemm_s34_ends.py", 2, [(8192, 8192, 8192), (2048, 8192, 28672)])
for rep in range(passes):
    for m, n, k in shapes:
        a, b = bg._inputs(m, n, k)
        bias = torch.randn(n, device="cuda", dtype=torch.bfloat16)
        for fused in (False, True):
            cfg = default_config(m, n, k, sms, fused=fused, vector_operands=1 if fused else 0)
            ends = replace(cfg, stream_k=True, stream_k_ends=True)
            workers = sms // (cfg.cluster_m * cfg.cluster_n)
            row = {"M": m, "N": n, "K": k, "fused": fused, "rep": rep, "config": repr(cfg),
                   "ends_len": stream_k_ends_len(scheduled_clusters(cfg, m, n), workers, -(-k // cfg.tile_k))}
            cublas = (lambda: F.gelu(torch.addmm(bias, a, b), approximate="tanh")) if fused else (
                lambda: torch.matmul(a, b))
            fns = ends_contenders(gemm, a, b, bias, cfg, ends, fused, cublas)
            row["ends_rel_err"] = bg._err(fns["ends"](), fns["default"]())
            row["default_rel_err"] = bg._err(fns["default"](), fns["cublas"]())
            ms = bg.measure(fns)
            row.update({f"{x}_TF": bg.tflops(m, n, k, t) for x, t in ms.items()})
            row["ends_vs_default"] = round(ms["default"] / ms["ends"], 4)
            row["ends_vs_cublas"] = round(ms["cublas"] / ms["ends"], 4)
            if "ends32" in ms:
                row["ends32_vs_default"] = round(ms["default"] / ms["ends32"], 4)
                row["ends32_vs_cublas"] = round(ms["cublas"] / ms["ends32"], 4)
            add_row(out, row)
