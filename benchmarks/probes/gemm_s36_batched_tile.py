"""Session 36 probe: `default_config` picks a batched problem's tile from one batch's size
(the largest tile giving 3/4 of a wave of CTAs per batch), so 8 x 1024x2048 takes the
tiles of a lone 1024x2048. Would the whole batch's count, which gives the 128x256 2x1
tile, be faster? Per shape (LxMxNxK from argv[3], bf16, TN): cuBLAS (torch.matmul on the
3-D operands), the batched default, and 128x256 2x1 fitted to the problem, rotated order
(bench_gemm.measure), passes from argv[2] (default 1). Writes JSON to argv[1]."""
# ruff: noqa: B023 - the timed lambdas close over this iteration's tensors and run within it
import sys

sys.path.insert(0, "benchmarks")
sys.path.insert(0, "benchmarks/probes")
import bench_gemm as bg
import torch
from probe_io import add_row, probe_args

from cuteforge.kernels.gemm.sm90.config import GemmConfig, default_config, fit_swizzle
from cuteforge.ops import gemm

sms = torch.cuda.get_device_properties(0).multi_processor_count
passes, shapes, out = probe_args("gemm_s36_batched_tile.py", 1, [
    (8, 1024, 2048, 4096), (16, 512, 1024, 4096), (4, 2048, 1024, 2048), (32, 256, 512, 4096)])
for rep in range(passes):
    for batch, m, n, k in shapes:
        torch.manual_seed(0)
        a = torch.randn(batch, m, k, device="cuda", dtype=torch.bfloat16)
        b = torch.randn(batch, n, k, device="cuda", dtype=torch.bfloat16).transpose(1, 2)  # weights' .t(): TN
        cfg = default_config(m, n, k, sms, batch=batch)
        wide = fit_swizzle(GemmConfig(), m, n)
        row = {"L": batch, "M": m, "N": n, "K": k, "rep": rep, "default": repr(cfg), "wide": repr(wide)}
        fns = {"cublas": lambda: torch.matmul(a, b), "default": lambda: gemm(a, b, config=cfg),
               "wide": lambda: gemm(a, b, config=wide)}
        row["wide_rel_err"] = bg._err(fns["wide"](), fns["cublas"]())
        row["default_rel_err"] = bg._err(fns["default"](), fns["cublas"]())
        ms = bg.measure(fns)
        row.update({f"{x}_TF": bg.tflops(batch * m, n, k, t) for x, t in ms.items()})
        row["wide_vs_default"] = round(ms["default"] / ms["wide"], 4)
        row["default_vs_cublas"] = round(ms["cublas"] / ms["default"], 4)
        add_row(out, row)
