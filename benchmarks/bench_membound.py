"""Memory-bound library ops, forward and backward: cuteforge vs torch eager vs torch.compile
vs quack, side by side in one process on the same inputs.

Ops: sum, softmax, log_softmax, rms_norm, layer_norm, cross_entropy. Shapes: M x N with
N from 256 to 262144 and M = 32768 capped so one input stays at 2**28 elements (a 32768 x
262144 input would be 16 GiB: the bandwidth is the same at 1 GiB). Bandwidth counts the
bytes a kernel must move once (inputs read, outputs written) and is compared with a
device-to-device copy measured in the same run. Backward is timed through autograd
(`torch.autograd.grad` of a saved forward), the way training calls it.

Writes benchmarks/results/<gpu>-membound.json (or --out) and a PNG of GB/s vs N per op.

Run on a GPU machine:
  python benchmarks/bench_membound.py [--ops softmax,rms_norm] [--dtypes bfloat16,float32]
                                      [--ns 256,4096,...] [--no-compile | --compile-ns 4096,65536]
                                      [--no-quack] [--out F]
"""

from __future__ import annotations

import argparse
import json
import sys
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

import cuteforge.ops as ops
from cuteforge import timing

NS = (256, 512, 1024, 2048, 4096, 8192, 16384, 32768, 65536, 131072, 262144)
MAX_ELEMS = 1 << 28
OPS = ("sum", "softmax", "log_softmax", "rms_norm", "layer_norm", "cross_entropy")


def shape_for(n: int) -> tuple[int, int]:
    return min(32768, MAX_ELEMS // n), n


# --- each op: inputs, the contenders' forward functions, bytes moved -----------------------
# A forward function takes the inputs tuple and returns one tensor (the loss for
# cross_entropy). Backward differentiates that tensor w.r.t. the first input.


def _inputs(op: str, m: int, n: int, dtype: torch.dtype) -> tuple[torch.Tensor, ...]:
    x = torch.randn(m, n, device="cuda", dtype=dtype)
    if op in ("rms_norm", "layer_norm"):
        w = torch.randn(n, device="cuda", dtype=dtype)
        b = torch.randn(n, device="cuda", dtype=dtype)
        return (x, w, b)
    if op == "cross_entropy":
        return (x, torch.randint(0, n, (m,), device="cuda"))
    return (x,)


def _torch_fn(op: str) -> Callable[..., torch.Tensor]:
    return {
        "sum": lambda x: x.sum(-1),
        "softmax": lambda x: torch.softmax(x, -1),
        "log_softmax": lambda x: torch.log_softmax(x, -1),
        "rms_norm": lambda x, w, b: F.rms_norm(x, (x.shape[-1],), w, 1e-6),
        "layer_norm": lambda x, w, b: F.layer_norm(x, (x.shape[-1],), w, b, 1e-5),
        "cross_entropy": lambda x, t: F.cross_entropy(x, t),
    }[op]


def _cuteforge_fn(op: str) -> Callable[..., torch.Tensor] | None:
    f = getattr(ops, op, None)
    if f is None:
        return None
    if op == "rms_norm":
        return lambda x, w, b: f(x, w, 1e-6)
    if op == "layer_norm":
        return lambda x, w, b: f(x, w, b, 1e-5)
    return f


def _quack_fn(op: str) -> Callable[..., torch.Tensor] | None:
    try:
        import quack
    except Exception:
        return None
    if op == "softmax":
        return quack.softmax
    if op == "rms_norm":
        return lambda x, w, b: quack.rmsnorm(x, w, eps=1e-6)
    if op == "cross_entropy":
        return lambda x, t: quack.cross_entropy(x, t)
    return None  # quack 0.6.5 has no sum / log_softmax op; its layernorm has no autograd


def _bytes(op: str, inputs: tuple[torch.Tensor, ...], backward: bool) -> int:
    x = inputs[0]
    xb = x.numel() * x.element_size()
    m, n = x.shape
    if op == "sum":
        return xb + m * x.element_size()
    if op == "cross_entropy":
        # fwd: logits + targets in, loss/lse out; bwd: logits in, dlogits out.
        return xb * (2 if backward else 1) + m * 8 * (1 if backward else 2)
    if op in ("rms_norm", "layer_norm"):
        params = n * x.element_size() * (2 if op == "layer_norm" else 1)
        # fwd: x in, y out; bwd: x, dy in, dx out (+ weight/bias grads, small)
        return xb * (3 if backward else 2) + params
    return xb * (3 if backward else 2)  # softmax family: fwd x->y; bwd y, dy -> dx


def _check(got: torch.Tensor, ref: torch.Tensor, dtype: torch.dtype) -> bool:
    tol = 2e-2 if dtype != torch.float32 else 1e-3
    return bool(torch.allclose(got.float(), ref.float(), rtol=tol, atol=tol))


def measure(op: str, m: int, n: int, dtype: torch.dtype, backward: bool, contenders: dict[str, Callable[..., torch.Tensor]],
            copy_bps: float) -> dict[str, Any]:
    inputs = _inputs(op, m, n, dtype)
    row: dict[str, Any] = {"op": op + ("_bwd" if backward else ""), "M": m, "N": n, "dtype": str(dtype).removeprefix("torch.")}
    nbytes = _bytes(op, inputs, backward)
    ref_out = None
    for name, fn in contenders.items():
        try:
            if backward:
                x = inputs[0].detach().requires_grad_(True)
                args = (x, *inputs[1:])
                y = fn(*args)
                dy = torch.randn_like(y)
                (g,) = torch.autograd.grad(y, x, dy, retain_graph=True)
                out = g

                def call(y=y, x=x, dy=dy) -> Any:
                    return torch.autograd.grad(y, x, dy, retain_graph=True)
            else:
                out = fn(*inputs)

                def call(fn=fn) -> Any:
                    return fn(*inputs)

            if name == "torch":
                ref_out = out
            elif ref_out is not None:
                row[f"{name}_correct"] = _check(out, ref_out, dtype)
            ms = timing.bench(call, warmup_ms=10, rep_ms=40)
        except Exception as e:  # record and go on: one failing contender must not end the sweep
            row[f"{name}_error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:200]}"
            traceback.print_exc(limit=2)
            continue
        row[f"{name}_us"] = round(ms * 1e3, 2)
        row[f"{name}_GBps"] = round(nbytes / (ms * 1e-3) / 1e9, 1)
        row[f"{name}_pct_copy"] = round(100 * nbytes / (ms * 1e-3) / copy_bps, 1)
    if "cuteforge_GBps" in row and "quack_GBps" in row:
        row["cuteforge_over_quack"] = round(row["cuteforge_GBps"] / row["quack_GBps"], 3)
    if "cuteforge_GBps" in row and "torch_GBps" in row:
        row["cuteforge_over_torch"] = round(row["cuteforge_GBps"] / row["torch_GBps"], 3)
    return row


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--ops", default=",".join(OPS))
    p.add_argument("--dtypes", default="bfloat16,float32")
    p.add_argument("--ns", default=",".join(map(str, NS)))
    p.add_argument("--no-backward", action="store_true")
    p.add_argument("--no-compile", action="store_true")
    p.add_argument("--compile-ns", help="run torch.compile only at these N (each shape is a fresh compile: seconds)")
    p.add_argument("--no-quack", action="store_true")
    p.add_argument("--out")
    args = p.parse_args()
    copy_bps = timing.copy_bandwidth()
    print(f"copy: {copy_bps / 1e9:.0f} GB/s", flush=True)
    rows: list[dict[str, Any]] = []
    missing = []
    for op in args.ops.split(","):
        cf = _cuteforge_fn(op)
        if cf is None:
            missing.append(op)
            print(f"cuteforge.ops.{op}: not available, skipped", flush=True)
            continue
        for dt_name in args.dtypes.split(","):
            dtype = getattr(torch, dt_name)
            for n in map(int, args.ns.split(",")):
                m, n = shape_for(n)
                for backward in (False,) if args.no_backward or op == "sum" else (False, True):
                    torch._dynamo.reset()  # a fresh compile per shape (dynamo's recompile limit)
                    contenders: dict[str, Callable[..., torch.Tensor]] = {"torch": _torch_fn(op), "cuteforge": cf}
                    compile_ns = {int(v) for v in args.compile_ns.split(",")} if args.compile_ns else None
                    if not args.no_compile and (compile_ns is None or n in compile_ns):
                        contenders["torch.compile"] = torch.compile(_torch_fn(op), dynamic=False)
                    q = None if args.no_quack else _quack_fn(op)
                    if q is not None:
                        contenders["quack"] = q
                    row = measure(op, m, n, dtype, backward, contenders, copy_bps)
                    rows.append(row)
                    print(json.dumps(row), flush=True)
                    torch.cuda.empty_cache()
    summary = _summary(rows)
    result = {
        "command": "python benchmarks/bench_membound.py " + " ".join(sys.argv[1:]),
        "gpu": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "copy_GBps": round(copy_bps / 1e9, 1),
        "missing_ops": missing,
        "summary": summary,
        "membound": rows,
    }
    print(json.dumps(summary, indent=1))
    name = torch.cuda.get_device_name().lower().replace("nvidia ", "").replace(" ", "-")
    path = Path(args.out or Path(__file__).parent / "results" / f"{name}-membound.json")
    path.write_text(json.dumps(result, indent=1))
    try:
        from cuteforge.report import plot_results

        for png in plot_results([result], path.parent):
            print("plot:", png)
    except Exception as e:  # plots are a convenience; the JSON is the record
        print(f"no plot: {e}")


def _summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Per op and dtype: worst % of copy at N >= 4096, worst ratio to quack and to torch."""
    out: dict[str, dict[str, float | None]] = {}

    def low(s: dict[str, float | None], k: str, v: float | None) -> None:
        if v is not None:
            s[k] = v if s.get(k) is None else min(s[k], v)  # type: ignore[type-var]

    for r in rows:
        s = out.setdefault(f"{r['op']}/{r['dtype']}", {})
        if r["N"] >= 4096:
            low(s, "min_pct_copy_N>=4096", r.get("cuteforge_pct_copy"))
        low(s, "min_over_quack", r.get("cuteforge_over_quack"))
        if r["N"] <= 2048:
            low(s, "min_over_torch_N<=2048", r.get("cuteforge_over_torch"))
    return out


if __name__ == "__main__":
    main()
