"""Does a fused epilogue cost an extra pass over memory? Template kernels with and without
an epilogue against torch eager's unfused sequence, side by side on the same inputs.

    python examples/templates/bench_fusion.py --out benchmarks/results/h200-templates-fusion.json
    python examples/templates/bench_fusion.py --compile-only --arch sm_90a   # no GPU needed
"""

from __future__ import annotations

import argparse
import os
import sys

import elementwise
import row_reduce
import torch

from cuteforge.fusion import Epilogue, relu
from cuteforge.timing.events import bench

RELU = Epilogue.from_fn(lambda acc: relu(acc))
AFFINE = Epilogue.from_fn(lambda acc, scale, bias: acc * scale + bias, scale="scalar", bias="row")


def _row(op: str, shape: list[int], dt: torch.dtype, nbytes: int, cand: dict, fused: str, plain: str, eager: str) -> dict:
    times = {k: bench(f) for k, f in cand.items()}
    return {"op": op, "shape": shape, "dtype": str(dt).removeprefix("torch."), "ms": times,
            "GBps_min_traffic": {k: nbytes / t / 1e6 for k, t in times.items()},
            "fused_over_plain": times[fused] / times[plain], "eager_over_fused": times[eager] / times[fused]}


def bench_relu_add(dt: torch.dtype, m: int = 8192, n: int = 8192) -> dict:
    kw = dict(THREADS_PER_BLOCK=256, VEC=16 // torch.empty((), dtype=dt).element_size())
    a, b = torch.randn(m, n, device="cuda", dtype=dt), torch.randn(m, n, device="cuda", dtype=dt)
    out = torch.empty_like(a)
    torch.testing.assert_close(elementwise.add(a, b, epilogue=RELU, **kw), torch.relu(a + b))
    cand = {
        "template add": lambda: elementwise.add(a, b, out=out, **kw),
        "template relu(a+b) fused": lambda: elementwise.add(a, b, out=out, epilogue=RELU, **kw),
        "torch a+b": lambda: torch.add(a, b, out=out),
        "torch relu(a+b) eager": lambda: torch.relu(a + b),
    }
    return _row("relu(a+b)", [m, n], dt, 3 * a.numel() * a.element_size(), cand, "template relu(a+b) fused", "template add", "torch relu(a+b) eager")


def bench_row_sum(dt: torch.dtype, m: int = 16384, n: int = 4096) -> dict:
    kw = dict(THREADS_PER_BLOCK=256, VEC=16 // torch.empty((), dtype=dt).element_size())
    x = torch.randn(m, n, device="cuda", dtype=dt)
    bias = torch.randn(m, device="cuda", dtype=dt)
    args = {"scale": 0.5, "bias": bias}
    got = row_reduce.row_sum(x, epilogue=AFFINE, epilogue_args=args, **kw)
    torch.testing.assert_close(got.float(), x.float().sum(-1) * 0.5 + bias.float(), rtol=2e-2, atol=2e-1)
    cand = {
        "template sum": lambda: row_reduce.row_sum(x, **kw),
        "template sum*s+bias fused": lambda: row_reduce.row_sum(x, epilogue=AFFINE, epilogue_args=args, **kw),
        "torch sum": lambda: x.sum(-1),
        "torch sum*s+bias eager": lambda: x.sum(-1) * 0.5 + bias,
    }
    return _row("sum(x,-1)*s+bias", [m, n], dt, x.numel() * x.element_size(), cand, "template sum*s+bias fused", "template sum", "torch sum*s+bias eager")


def compile_only() -> None:
    """The kernels the benchmark times, compiled from CPU tensors (shapes and dtypes only)."""
    for dt in (torch.float32, torch.bfloat16):
        kw = dict(THREADS_PER_BLOCK=256, VEC=16 // torch.empty((), dtype=dt).element_size())
        a = torch.empty(64, 8192, dtype=dt)
        for ep in (None, RELU):
            elementwise.template().compile({"a": a, "b": a.clone()}, torch.empty_like(a), epilogue=ep, **kw)
        x, out = torch.empty(64, 4096, dtype=dt), torch.empty(64, dtype=dt)
        row_reduce.template().compile({"x": x}, out, **kw)
        row_reduce.template().compile({"x": x}, out, epilogue=AFFINE,
                                      epilogue_args={"scale": 0.5, "bias": torch.empty(64, dtype=dt)}, **kw)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default=None)
    p.add_argument("--compile-only", action="store_true", help="compile the measured kernels for --arch without a GPU")
    p.add_argument("--arch", default=None, help="target, e.g. sm_90a (default: this GPU)")
    args = p.parse_args(argv)
    if args.arch:
        os.environ["CUTEFORGE_ARCH"] = args.arch
        os.environ["CUTE_DSL_ARCH"] = args.arch
    if args.compile_only:
        compile_only()
        print("compiled the measured template kernels (plain and fused) for", os.environ.get("CUTEFORGE_ARCH", "the default target"))
        return 0
    rows = []
    for dt in (torch.float32, torch.bfloat16):
        rows += [bench_relu_add(dt), bench_row_sum(dt)]
    for r in rows:
        print(f"{r['op']:18s} {r['dtype']:9s} " + "  ".join(f"{k}: {v * 1e3:.1f} us" for k, v in r["ms"].items())
              + f"  | fused/plain {r['fused_over_plain']:.3f}  eager/fused {r['eager_over_fused']:.2f}")
    if args.out:
        from cuteforge.bench.report import results_header, write_results

        cmd = "python examples/templates/bench_fusion.py " + " ".join(argv if argv is not None else sys.argv[1:])
        write_results(args.out, {**results_header(cmd), "rows": rows})
    return 0


if __name__ == "__main__":
    sys.exit(main())
