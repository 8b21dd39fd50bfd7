"""Host cost of a warm call, piece by piece: where the microseconds of `ops.sum` go.

Each figure is the median over 50 loops of 200 calls (10k calls) of the host time per
call, with the GPU synchronized between loops so the launch queue never fills (a full
queue would measure the GPU, not the host). Same process, same inputs for all rows.

Run on a GPU machine:  python benchmarks/bench_dispatch.py [--out FILE]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import torch

import cuteforge.ops as ops
from cuteforge.bench.report import results_header, write_results  # noqa: E402
from cuteforge.kernels.reduce.spec import row_reduce
from cuteforge.timing import events as timing


def _table_of(name: str) -> Any:
    """The op's C launch table (`native.launch.Table`) for a `_library_pairs` row, or None."""
    import importlib

    op = name.split()[0]
    for module, tables in (("reduce", ("sum", "amax")), ("softmax", ("softmax", "log_softmax")), ("norm", ("rms_norm", "layer_norm"))):
        if op in tables:
            mod = importlib.import_module(f"cuteforge.ops.{module}")
            return mod._TABLES[op.removesuffix("_norm") if module == "norm" else op]
    return None


def _bypassing(table: Any, fn: Any) -> Any:
    """fn with the op's C table out of the way: the Python memo finds the plan, which still
    launches in C (what the table saves: the Python key and lookup; the toggle costs ~0.1 us
    per call, counted against this contender)."""
    def call() -> Any:
        saved, table.call = table.call, None
        try:
            return fn()
        finally:
            table.call = saved
    return call


def _library_pairs() -> dict[str, tuple[Any, Any]]:
    """(cuteforge call, torch call) per library op on a small warm input (host-bound)."""
    import torch.nn.functional as F

    x = torch.randn(4, 1024, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(1024, device="cuda", dtype=torch.bfloat16)
    t = torch.randint(0, 1024, (4,), device="cuda")
    a = torch.randn(128, 128, device="cuda", dtype=torch.bfloat16)
    xf, r, x3 = x.float(), torch.randn_like(x), x.view(2, 2, 1024)
    bias = torch.randn(128, device="cuda", dtype=torch.bfloat16)
    pairs: dict[str, tuple[Any, Any]] = {
        "sum bf16 (4,1024)": (lambda: ops.sum(x), lambda: torch.sum(x, -1)),
        "amax bf16 (4,1024)": (lambda: ops.amax(x), lambda: torch.amax(x, -1)),
        "softmax bf16 (4,1024)": (lambda: ops.softmax(x), lambda: torch.softmax(x, -1)),
        "log_softmax bf16 (4,1024)": (lambda: ops.log_softmax(x), lambda: torch.log_softmax(x, -1)),
        "rms_norm bf16 (4,1024)": (lambda: ops.rms_norm(x, w, 1e-6), lambda: F.rms_norm(x, (1024,), w, 1e-6)),
        "layer_norm bf16 (4,1024)": (lambda: ops.layer_norm(x, w, w, 1e-5), lambda: F.layer_norm(x, (1024,), w, w, 1e-5)),
        "cross_entropy bf16 (4,1024)": (lambda: ops.cross_entropy(x, t), lambda: F.cross_entropy(x, t)),
        "cross_entropy bf16 (4,1024) sum": (lambda: ops.cross_entropy(x, t, reduction="sum"),
                                            lambda: F.cross_entropy(x, t, reduction="sum")),
        "cross_entropy bf16 (4,1024) none": (lambda: ops.cross_entropy(x, t, reduction="none"),
                                             lambda: F.cross_entropy(x, t, reduction="none")),
        "cross_entropy fp32 (4,1024)": (lambda: ops.cross_entropy(xf, t), lambda: F.cross_entropy(xf, t)),
        "rms_norm bf16 (4,1024) residual": (lambda: ops.rms_norm(x, w, 1e-6, residual=r),
                                            lambda: (F.rms_norm(x + r, (1024,), w, 1e-6), x + r)),
        "rms_norm bf16 (2,2,1024) 3-D": (lambda: ops.rms_norm(x3, w, 1e-6), lambda: F.rms_norm(x3, (1024,), w, 1e-6)),
    }
    if torch.cuda.get_device_capability() == (9, 0):
        pairs["gemm bf16 128^3"] = (lambda: ops.gemm(a, a), lambda: torch.matmul(a, a))
        pairs["gemm bf16 128^3 bias+gelu"] = (lambda: ops.gemm(a, a, bias=bias, epilogue="gelu"),
                                              lambda: F.gelu(torch.addmm(bias, a, a), approximate="tanh"))
        # fp8 (e4m3, B column-major as _scaled_mm wants): number scales (a one-element
        # tensor made once per warm entry), tensor scales, and rowwise scales
        a8 = a.to(torch.float8_e4m3fn)
        b8 = a.to(torch.float8_e4m3fn).t()
        one = torch.ones((), device="cuda")
        sa, sb = torch.rand(128, 1, device="cuda") + 0.5, torch.rand(1, 128, device="cuda") + 0.5
        pairs["gemm fp8 128^3 number scales"] = (
            lambda: ops.gemm(a8, b8, scale_a=0.5, scale_b=2.0),
            lambda: torch._scaled_mm(a8, b8, torch.tensor(0.5, device="cuda"), torch.tensor(2.0, device="cuda"),
                                     out_dtype=torch.bfloat16))
        pairs["gemm fp8 128^3 tensor scales"] = (
            lambda: ops.gemm(a8, b8, scale_a=one, scale_b=one),
            lambda: torch._scaled_mm(a8, b8, one, one, out_dtype=torch.bfloat16))
        pairs["gemm fp8 128^3 rowwise scales"] = (
            lambda: ops.gemm(a8, b8, scale_a=sa, scale_b=sb),
            lambda: torch._scaled_mm(a8, b8, sa, sb, out_dtype=torch.bfloat16))
    for ours, _ in pairs.values():
        ours()  # compile or load outside the timed loops
    torch.cuda.synchronize()
    return pairs


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
    library: dict[str, dict[str, float]] = {}
    for name, (ours, theirs) in _library_pairs().items():
        fns = {"cuteforge": ours, "torch": theirs}
        table = _table_of(name)
        if table is not None and table.call is not None:  # same-run A/B of the C launch table
            fns["cuteforge_python_key"] = _bypassing(table, ours)
        us = timing.host_us_interleaved(fns)
        library[name] = {k: round(v, 2) for k, v in us.items()} | {"ratio": round(us["cuteforge"] / us["torch"], 3)}
    result = {
        **results_header(),
        "dlpack_c_exchange_api": hasattr(torch.Tensor, "__dlpack_c_exchange_api__"),
        "host_us": rows,
        "ratio_ops_sum_to_torch_mul": round(rows["cuteforge.ops.sum(x)"] / rows["torch.mul(y, y)"], 3),
        # Each library op against the torch op it replaces, same small input, warm, loops
        # interleaved: us per call; "cuteforge_python_key": the same op with its C launch
        # table bypassed (the Python memo key and lookup in front of the same C launch).
        "library_host_us": library,
    }
    print(json.dumps(result, indent=1))
    name = torch.cuda.get_device_name().lower().replace("nvidia ", "").replace(" ", "-")
    path = Path(args.out or Path(__file__).parent / "results" / f"{name}-dispatch.json")
    write_results(path, result)


if __name__ == "__main__":
    main()
