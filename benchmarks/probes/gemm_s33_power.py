"""Session 33 probe: is the fused bias + gelu tile at 8192^3 held back by the power limit
or by its instructions? Each contender runs back to back for WINDOW seconds while
`nvidia-smi -lms 50` samples the SM clock and the board power; per window: ms per call
(CUDA events over the whole loop, no flush) and the median clock / power of the samples
in its middle 60 %. Two rounds in opposite order. (Since session 34 its sampling and loop
are probe_io.py's, which also records NVML energy per call.) Shapes from argv[2] (MxNxK,...; default
8192^3 and 4096^3). Writes JSON to argv[1]."""
# ruff: noqa: B023 - the timed lambdas close over this iteration's tensors and run within it
import sys

sys.path.insert(0, "benchmarks")
sys.path.insert(0, "benchmarks/probes")
import bench_gemm as bg
import torch
import torch.nn.functional as F
from probe_io import PowerSamples, add_row, power_rounds, shapes_arg

from cuteforge.ops import gemm

WINDOW = 3.0
power = PowerSamples()
shapes = shapes_arg(2, [(8192, 8192, 8192), (4096, 4096, 4096)])
out = {"command": "python benchmarks/probes/gemm_s33_power.py OUT.json " + " ".join(sys.argv[2:]), "gpu": torch.cuda.get_device_name(), "rows": []}
for m, n, k in shapes:
    a, b = bg._inputs(m, n, k)
    bias = torch.randn(n, device="cuda", dtype=torch.bfloat16)
    fns = {
        "cublas": lambda: torch.matmul(a, b),
        "ours": lambda: gemm(a, b),
        "cublas_bias_gelu": lambda: F.gelu(torch.addmm(bias, a, b), approximate="tanh"),
        "ours_bias_gelu": lambda: gemm(a, b, bias=bias, epilogue="gelu"),
        "ours_bias": lambda: gemm(a, b, bias=bias),
        "ours_bias_silu": lambda: gemm(a, b, bias=bias, epilogue="silu"),
    }
    for row in power_rounds(fns, WINDOW, power, M=m, N=n, K=k):
        row["TF"] = bg.tflops(m, n, k, row["ms"])
        add_row(out, row)  # argv[1] rewritten after every row
power.stop()
