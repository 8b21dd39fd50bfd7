"""Session 33 probe: is the fused bias + gelu tile at 8192^3 held back by the power limit
or by its instructions? Each contender runs back to back for WINDOW seconds while
`nvidia-smi -lms 50` samples the SM clock and the board power; per window: ms per call
(CUDA events over the whole loop, no flush) and the median clock / power of the samples
in its middle 60 %. Two rounds in opposite order. Shapes from argv[2] (MxNxK,...; default
8192^3 and 4096^3). Writes JSON to argv[1]."""
# ruff: noqa: B023 - the timed lambdas close over this iteration's tensors and run within it
import json
import statistics
import subprocess
import sys
import threading
import time

sys.path.insert(0, "benchmarks")
import bench_gemm as bg
import torch
import torch.nn.functional as F

from cuteforge.ops import gemm

WINDOW = 3.0
samples: list[tuple[float, float, float]] = []  # (host time, SM MHz, W)
smi = subprocess.Popen(["nvidia-smi", "--query-gpu=clocks.sm,power.draw", "--format=csv,noheader,nounits", "-lms", "50"],
                       stdout=subprocess.PIPE, text=True)


def reader() -> None:
    for line in smi.stdout:  # type: ignore[union-attr]
        try:
            mhz, w = (float(x) for x in line.split(","))
        except ValueError:
            continue
        samples.append((time.perf_counter(), mhz, w))


threading.Thread(target=reader, daemon=True).start()
shapes = [(8192, 8192, 8192), (4096, 4096, 4096)]
if len(sys.argv) > 2:
    shapes = [tuple(int(x) for x in s.split("x")) for s in sys.argv[2].split(",")]
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
    for f in fns.values():
        f()
    names = list(fns)
    for rnd, order in enumerate((names, names[::-1])):
        for name in order:
            fn = fns[name]
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            calls = 0
            e0.record()
            while time.perf_counter() - t0 < WINDOW:
                for _ in range(4):
                    fn()
                calls += 4
                if calls % 16 == 0:
                    torch.cuda.synchronize()  # keep the host within a few calls of the GPU
            e1.record()
            torch.cuda.synchronize()
            t1 = time.perf_counter()
            lo, hi = t0 + 0.2 * (t1 - t0), t0 + 0.8 * (t1 - t0)
            mid = [s for s in samples if lo <= s[0] <= hi]
            row = {"M": m, "N": n, "K": k, "name": name, "round": rnd, "calls": calls,
                   "ms": round(e0.elapsed_time(e1) / calls, 4),
                   "sm_mhz": statistics.median(s[1] for s in mid) if mid else None,
                   "watts": statistics.median(s[2] for s in mid) if mid else None, "samples": len(mid)}
            row["TF"] = bg.tflops(m, n, k, row["ms"])
            out["rows"].append(row)
            print(json.dumps(row), flush=True)
            time.sleep(0.5)
with open(sys.argv[1], "w") as f:
    json.dump(out, f, indent=1)
smi.terminate()
