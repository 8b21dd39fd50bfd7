"""Host and event-timed microseconds of one small-N backward (torch.autograd.grad) through
cuteforge's eager autograd node, the C++ one (cuteforge.native, the default) and the
Python torch.autograd.Function it replaces (the `cuteforge_python_node_*` rows: the C++
node switched off in the same process), and through torch's own, with the autograd engine's device
threads on (the default) and off (torch.autograd.set_multithreading_enabled(False): the
backward runs on the calling thread, so a Python node needs no GIL hand-over). M = 32768,
bf16, rms_norm, layer_norm, softmax and cross_entropy (mean) at N = 256 and 1024 (`--m`,
`--ns` for others).
docs/kernels/norm.md (small-N backward) quotes the runs.

    python benchmarks/bench_autograd_thread.py --out $OUT/h200-autograd-thread.json
"""

from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F

import cuteforge.ops as ops
from cuteforge.bench.report import results_header, write_results  # noqa: E402
from cuteforge.native import backward as native
from cuteforge.timing import events as timing


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--m", type=int, default=32768)
    p.add_argument("--ns", default="256,1024")
    args = p.parse_args()
    native_module = native.module
    out: dict = {**results_header(), "rows": {}}
    m = args.m
    for n in map(int, args.ns.split(",")):
        x = torch.randn(m, n, device="cuda", dtype=torch.bfloat16)
        w = torch.randn(n, device="cuda", dtype=torch.bfloat16)
        b = torch.randn(n, device="cuda", dtype=torch.bfloat16)
        t = torch.randint(0, n, (m,), device="cuda")
        cf = {"rms_norm": lambda v, w=w: ops.rms_norm(v, w, 1e-6),
              "layer_norm": lambda v, w=w, b=b: ops.layer_norm(v, w, b, 1e-5),
              "softmax": lambda v: ops.softmax(v),
              "cross_entropy": lambda v, t=t: ops.cross_entropy(v, t)}
        ref = {"rms_norm": lambda v, w=w, n=n: F.rms_norm(v, (n,), w, 1e-6),
               "layer_norm": lambda v, w=w, b=b, n=n: F.layer_norm(v, (n,), w, b, 1e-5),
               "softmax": lambda v: torch.softmax(v, -1),
               "cross_entropy": lambda v, t=t: F.cross_entropy(v, t)}
        cases = {}
        for op in cf:
            cases[f"cuteforge_{op}"] = (cf[op], True)
            cases[f"cuteforge_python_node_{op}"] = (cf[op], False)
            cases[f"torch_{op}"] = (ref[op], True)
        for name, (f, native_node) in cases.items():
            native.module = native_module if native_node else (lambda: None)
            xg = x.detach().requires_grad_(True)
            y = f(xg)
            g = torch.randn_like(y)

            def call(y=y, xg=xg, g=g):
                return torch.autograd.grad(y, xg, g, retain_graph=True)

            r = {"grad_fn": y.grad_fn.name(), "host_us": round(timing.host_us(call), 2),
                 "gpu_us": round(timing.bench(call) * 1e3, 2)}
            with torch.autograd.set_multithreading_enabled(False):
                r["host_us_threads_off"] = round(timing.host_us(call), 2)
                r["gpu_us_threads_off"] = round(timing.bench(call) * 1e3, 2)
            out["rows"][f"{name}/{n}"] = r
            print(name, n, r, flush=True)
    native.module = native_module
    write_results(args.out, out)


if __name__ == "__main__":
    main()
