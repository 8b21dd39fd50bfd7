"""Reductions over a non-last dim: cuteforge's column kernel vs torch.sum(dim) and
torch.compile, same run, same inputs, plus the host time of the warm 2-D last-dim call.

Bandwidth counts the input read once and the output written once, and is compared with
a device-to-device copy measured in the same run (L2 flushed between timings).

Run on a GPU machine:  python benchmarks/bench_reduce_dims.py [--out FILE] [--no-compile]
"""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path

import torch

import cuteforge.ops as ops
from cuteforge.bench.report import results_header, write_results  # noqa: E402
from cuteforge.timing import events as timing

# (shape, dim): large column reductions (the bar), batched middle-dim, and narrow ones
# (few output columns, long R: the cluster split of R).
SHAPES = [
    ((32768, 4096), 0),
    ((4096, 32768), 0),
    ((16384, 16384), 0),
    ((8, 4096, 4096), 1),
    ((64, 2048, 512), 1),
    ((262144, 256), 0),
    ((1048576, 32), 0),
    ((4096, 4096), 0),
]


def measure(op: str, shape: tuple, dim: int, dtype: torch.dtype, copy_bps: float, compiled: bool) -> dict:
    torch._dynamo.reset()
    x = torch.randn(*shape, device="cuda", dtype=dtype)
    ref_fn = getattr(torch, op)
    contenders = {"cuteforge": lambda: getattr(ops, op)(x, dim), "torch": lambda: ref_fn(x, dim=dim)}
    if compiled:
        cf = torch.compile(lambda t: ref_fn(t, dim=dim), dynamic=False)
        contenders["torch.compile"] = lambda: cf(x)
    got, ref = contenders["cuteforge"](), contenders["torch"]()
    if op == "argmax":
        correct = bool((got == ref).all())
    else:
        r = shape[dim]
        correct = bool(torch.allclose(got.float(), ref.float(), rtol=1e-2, atol=(1e-3 if dtype == torch.float32 else 1e-2) * r**0.5))
    nbytes = x.numel() * x.element_size() + ref.numel() * ref.element_size()
    n = shape[dim]
    row = {"op": op, "shape": list(shape), "dim": dim, "M": math.prod(shape) // n, "N": n, "dtype": str(dtype).removeprefix("torch."), "correct": correct}
    for name, fn in contenders.items():
        ms = timing.bench(fn)
        row[f"{name}_us"] = round(ms * 1e3, 2)
        row[f"{name}_GBps"] = round(nbytes / (ms * 1e-3) / 1e9, 1)
        row[f"{name}_pct_copy"] = round(100 * nbytes / (ms * 1e-3) / copy_bps, 1)
    return row


def col_sweep(shape: tuple, dtype: torch.dtype, copy_bps: float) -> list[dict]:
    """Column-kernel variants at one (R, I) shape, dim 0: configs (cluster split of R)
    and two-stage splits of R, each checked against torch.sum."""
    from cuteforge.kernels.reduce import ColReduceConfig, default_col_config
    from cuteforge.kernels.reduce.spec import col_reduce
    from cuteforge.ops import reduce as red

    r, i = shape
    x = torch.randn(r, i, device="cuda", dtype=dtype)
    xv = x.view(1, r, i)
    out = torch.empty(1, i, device="cuda", dtype=dtype)
    vec = col_reduce.signature.bind((xv, out)).vec[0]
    base = default_col_config(1, r, i, x.element_size() * 8, vec)
    ref = x.double().sum(0)
    variants: list[tuple[str, int, object]] = [("default (op)", 0, None)]
    c = base.cluster_n
    for cfg in (base, ColReduceConfig(256, 8, 8, c), ColReduceConfig(256, 16, 4, c), ColReduceConfig(256, 32, 8, 8),
                ColReduceConfig(512, 8, 4, c), ColReduceConfig(256, 8, 4, max(1, c // 2))):
        variants.append((repr(cfg), 1, cfg))
    for split in (16, 64):
        variants.append((f"split={split}", split, None))
    variants.append(("split=32 " + repr(ColReduceConfig(256, 32, 8, 1)), 32, ColReduceConfig(256, 32, 8, 1)))
    rows = []
    seen = set()
    for name, split, cfg in variants:
        if name in seen:
            continue
        seen.add(name)
        try:
            if split == 0:
                fn = lambda: red.sum(x, 0)  # noqa: E731
            else:
                run = red._col_runner("sum", xv, out, vec, split=split, cfg=cfg)
                fn = lambda run=run: run(xv, out)  # noqa: E731
            got = fn()
            got = (got if got is not None else out).reshape(i)
            ok = bool(torch.allclose(got.double(), ref, rtol=1e-2, atol=(1e-3 if dtype == torch.float32 else 1e-2) * r**0.5))
            ms = timing.bench(fn)
            nbytes = x.numel() * x.element_size() + i * x.element_size()
            rows.append({"shape": list(shape), "dtype": str(dtype)[6:], "variant": name, "correct": ok,
                         "us": round(ms * 1e3, 2), "pct_copy": round(100 * nbytes / (ms * 1e-3) / copy_bps, 1)})
        except Exception as ex:  # a failing variant is a finding, not a crash
            rows.append({"shape": list(shape), "variant": name, "error": f"{type(ex).__name__}: {str(ex)[:200]}"})
        print("sweep", rows[-1], flush=True)
    return rows


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out")
    p.add_argument("--no-compile", action="store_true")
    p.add_argument("--no-sweep", action="store_true")
    args = p.parse_args()
    t0 = time.time()
    copy_bps = timing.copy_bandwidth()
    x1 = torch.randn(1, 1024, device="cuda")
    ops.sum(x1)
    from cuteforge.ops import reduce as red

    # A/B in one process: the warm path before `keepdim` (key without it), same plan.
    old_plans = {("sum", -1, x1.dtype, x1.shape, x1.stride(), x1.data_ptr() & 15, x1.get_device()):
                 red._PLANS[red._memo_key("sum", x1, -1, False)]}

    is_compiling, grad_enabled = torch.compiler.is_compiling, torch.is_grad_enabled

    def old_sum(x, dim=-1):
        if is_compiling():
            return None
        try:
            plan = old_plans[("sum", dim, x.dtype, x.shape, x.stride(), x.data_ptr() & 15, x.get_device())]
        except (AttributeError, KeyError, TypeError):
            plan = None
        if getattr(x, "requires_grad", False) and grad_enabled():
            return None
        m, launch, odt = plan
        out = x.new_empty(m) if odt is None else x.new_empty(m, dtype=odt)
        launch(x, out)
        return out

    result = {
        **results_header(),
        "copy_GBps": round(copy_bps / 1e9, 1),
        # the warm 2-D last-dim path (same measurement as bench_sum.py's host_overhead)
        "host_overhead": {
            "cuteforge_sum_us": round(timing.host_us(lambda: ops.sum(x1)), 2),
            "torch_sum_us": round(timing.host_us(lambda: torch.sum(x1, dim=-1)), 2),
            "cuteforge_sum_dim0_us": round(timing.host_us(lambda: ops.sum(x1, 0)), 2),
            "previous_warm_path_us": round(timing.host_us(lambda: old_sum(x1)), 2),
            "cuteforge_sum_again_us": round(timing.host_us(lambda: ops.sum(x1)), 2),
        },
        "rows": [],
    }
    for dtype in (torch.float32, torch.bfloat16):
        for shape, dim in SHAPES:
            row = measure("sum", shape, dim, dtype, copy_bps, not args.no_compile)
            result["rows"].append(row)
            print(row, flush=True)
            torch.cuda.empty_cache()
    for op in ("amax", "argmax", "mean"):
        row = measure(op, (32768, 4096), 0, torch.bfloat16, copy_bps, not args.no_compile)
        result["rows"].append(row)
        print(row, flush=True)
    result["col_sweep"] = []
    if not args.no_sweep:
        for shape, dtype in (((32768, 4096), torch.float32), ((32768, 4096), torch.bfloat16), ((16384, 16384), torch.float32),
                             ((262144, 256), torch.float32)):
            result["col_sweep"] += col_sweep(shape, dtype, copy_bps)
    result["seconds"] = round(time.time() - t0, 1)
    out = Path(args.out or Path(__file__).parent / "results" / "h200-reduce-dims.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    write_results(out, result)
    print(json.dumps({k: result[k] for k in ("gpu", "copy_GBps", "host_overhead", "seconds")}))
    print("wrote", out)


if __name__ == "__main__":
    main()
