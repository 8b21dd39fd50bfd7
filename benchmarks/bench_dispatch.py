"""Host cost of a warm call, piece by piece: where the microseconds of `ops.sum` go.

Each figure is the median over 50 loops of 200 calls (10k calls) of the host time per
call, with the GPU synchronized between loops so the launch queue never fills (a full
queue would measure the GPU, not the host). Same process, same inputs for all rows.

Run on a GPU machine:  python benchmarks/bench_dispatch.py [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

import cuteforge.ops as ops
from cuteforge import timing
from cuteforge.kernels.reduce.spec import row_reduce


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out")
    args = p.parse_args()
    x = torch.randn(1, 1024, device="cuda")
    y = torch.randn(1024, device="cuda")
    out = torch.empty(1, device="cuda")
    dev = x.device
    fn = row_reduce.launcher((x, out), op="sum")

    cases = {
        "torch.mul(y, y)": lambda: torch.mul(y, y),
        "torch.sum(x, -1)": lambda: torch.sum(x, dim=-1),
        "torch.empty(1, device=x.device)": lambda: torch.empty(1, dtype=torch.float32, device=x.device),
        "x.new_empty(1)": lambda: x.new_empty(1),
        "torch.empty(1, device=<cached device>)": lambda: torch.empty(1, dtype=torch.float32, device=dev),
        "memo key only": lambda: (x.dtype, x.shape, x.stride(), x.data_ptr() & 15, x.get_device()),
        "tvm-ffi call, preallocated out": lambda: fn(x, out),
        "tvm-ffi call, x.new_empty out": lambda: fn(x, x.new_empty(1)),
        "Kernel.__call__ (memoized, preallocated out)": lambda: row_reduce(x, out, op="sum"),
        "Kernel.launcher (full bind + L1 lookup)": lambda: row_reduce.launcher((x, out), op="sum"),
        "cuteforge.ops.sum(x)": lambda: ops.sum(x),
    }
    rows = {name: round(timing.host_us(f), 2) for name, f in cases.items()}
    result = {
        "command": "python benchmarks/bench_dispatch.py " + " ".join(sys.argv[1:]),
        "gpu": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "dlpack_c_exchange_api": hasattr(torch.Tensor, "__dlpack_c_exchange_api__"),
        "host_us": rows,
        "ratio_ops_sum_to_torch_mul": round(rows["cuteforge.ops.sum(x)"] / rows["torch.mul(y, y)"], 3),
    }
    print(json.dumps(result, indent=1))
    name = torch.cuda.get_device_name().lower().replace("nvidia ", "").replace(" ", "-")
    path = Path(args.out or Path(__file__).parent / "results" / f"{name}-dispatch.json")
    path.write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
