"""Session 36 probe: is `stream_k_ends` worth making the default for batched problems too?
`default_config` keeps batched problems (L > 1) on whole tiles in the last wave because
batched ends had not run on a GPU; they pass the GPU tests since session 36. Here, at
batched shapes whose last wave is more than half full with ends of >= 32 k-blocks (as
the L = 1 rule asks), the batched default, the same with `stream_k=True,
stream_k_ends=True` ("ends"; fused: also in the fused stream-K default's form, 32-wide
subtiles with late operands, "ends32"), and cuBLAS (torch.matmul on the 3-D operands;
fused: + bias, then eager gelu), rotated order (bench_gemm.measure), passes from argv[2]
(default 2); every ends output checked against the default's. Shapes from argv[3]
(LxMxNxK,...). Writes JSON to argv[1] after every row."""
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
passes, shapes, out = probe_args("gemm_s36_batched_ends.py", 2, [
    (2, 2048, 8192, 28672), (2, 4096, 4096, 16384), (8, 1024, 4096, 16384), (2, 4096, 8192, 8192), (4, 2048, 8192, 8192)])
for rep in range(passes):
    for batch, m, n, k in shapes:
        torch.manual_seed(0)
        a = torch.randn(batch, m, k, device="cuda", dtype=torch.bfloat16)
        b = torch.randn(batch, n, k, device="cuda", dtype=torch.bfloat16).transpose(1, 2)  # weights' .t(): TN
        bias = torch.randn(n, device="cuda", dtype=torch.bfloat16)
        for fused in (False, True):
            cfg = default_config(m, n, k, sms, fused=fused, vector_operands=1 if fused else 0, batch=batch)
            ends = replace(cfg, stream_k=True, stream_k_ends=True)
            workers = sms // (cfg.cluster_m * cfg.cluster_n)
            row = {"L": batch, "M": m, "N": n, "K": k, "fused": fused, "rep": rep, "config": repr(cfg),
                   "ends_len": stream_k_ends_len(scheduled_clusters(cfg, m, n, batch), workers, -(-k // cfg.tile_k))}
            cublas = (lambda: F.gelu(torch.matmul(a, b) + bias, approximate="tanh")) if fused else (
                lambda: torch.matmul(a, b))
            fns = ends_contenders(gemm, a, b, bias, cfg, ends, fused, cublas)
            for name in [x for x in fns if x.startswith("ends")]:
                row[f"{name}_rel_err"] = bg._err(fns[name](), fns["default"]())
            row["default_rel_err"] = bg._err(fns["default"](), fns["cublas"]())
            ms = bg.measure(fns)
            row.update({f"{x}_TF": bg.tflops(batch * m, n, k, t) for x, t in ms.items()})
            for name in [x for x in ms if x.startswith("ends")]:
                row[f"{name}_vs_default"] = round(ms["default"] / ms[name], 4)
            row["default_vs_cublas"] = round(ms["cublas"] / ms["default"], 4)
            add_row(out, row)
