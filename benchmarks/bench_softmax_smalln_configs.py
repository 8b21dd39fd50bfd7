"""Short-row softmax kernels alone under a grid of CTA shapes: which (threads,
threads_per_row) the register path wants at N = 256..2048, where the defaults move
50-65 % of copy bandwidth. Every config of the grid that validates is compiled (in
parallel worker processes), launched directly on preallocated tensors (no op overhead)
and timed with cuteforge.timing.events.bench; torch's own kernel
(torch._softmax / _softmax_backward_data / _log_softmax_backward_data) is timed beside it.

    python benchmarks/bench_softmax_smalln_configs.py --out $OUT/h200-softmax-smalln-configs.json
"""

from __future__ import annotations

import argparse

import torch

from cuteforge.arch import target_arch
from cuteforge.autotune.pool import CompileJob, compile_all
from cuteforge.bench.report import results_header, write_results  # noqa: E402
from cuteforge.kernels.softmax.config import SoftmaxConfig
from cuteforge.kernels.softmax.spec import config_for, softmax_bwd, softmax_fwd
from cuteforge.signature import BoundKey, dtype_name, vector_width
from cuteforge.timing import events as timing

TORCH = {"softmax": lambda x: torch._softmax(x, -1, False),
         "softmax_bwd": lambda g, y: torch._softmax_backward_data(g, y, -1, y.dtype),
         "log_softmax_bwd": lambda g, y: torch._log_softmax_backward_data(g, y, -1, y.dtype)}


def grid(n: int, bits: int, bwd: bool) -> list[SoftmaxConfig]:
    out = []
    for threads in (128, 256, 512, 1024):
        for tpr in (4, 8, 16, 32, 64, 128):
            cfg = SoftmaxConfig(threads, tpr, 1)
            try:
                cfg.validate(n, bits, bwd)
            except ValueError:
                continue
            if n // tpr <= 64 and n // tpr >= 4:  # 4..64 elements a thread
                out.append(cfg)
    return out


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--ns", default="256,512,1024,2048")
    p.add_argument("--m", type=int, default=32768)
    p.add_argument("--modes", default="softmax,softmax_bwd,log_softmax_bwd")
    p.add_argument("--out", required=True)
    a = p.parse_args()
    arch = target_arch()
    plans = []
    for mode in a.modes.split(","):
        bwd = mode.endswith("_bwd")
        k = softmax_bwd if bwd else softmax_fwd
        for dt in (torch.bfloat16, torch.float32):
            for n in map(int, a.ns.split(",")):
                nargs = 3 if bwd else 2
                key = BoundKey((dtype_name(dt),) * nargs, (("N", n),), (vector_width(0, (n,), dt.itemsize),) * nargs)
                default = config_for(arch, n, dt.itemsize * 8, bwd, a.m)
                cfgs = [default] + [c for c in grid(n, dt.itemsize * 8, bwd) if c != default]
                plans += [(mode, dt, n, k, key, c, c == default) for c in cfgs]
    compile_all([CompileJob.of(k, key, (("mode", mode),), c, arch) for mode, _dt, _n, k, key, c, _d in plans], arch=arch)
    copy_bps = timing.copy_bandwidth()
    rows, cur = [], None
    for mode, dt, n, k, key, cfg, is_default in plans:
        if cur != (mode, dt, n):
            cur = (mode, dt, n)
            ts = [torch.randn(a.m, n, device="cuda", dtype=dt) for _ in range(len(key.dtypes))]
            nbytes = len(ts) * ts[0].numel() * ts[0].element_size()
            t_ms = timing.bench(lambda ts=ts, mode=mode: TORCH[mode](*ts[:-1]))
            rows.append({"mode": mode, "dtype": dtype_name(dt), "N": n, "config": "torch", "us": round(t_ms * 1e3, 2),
                         "pct_copy": round(100 * nbytes / (t_ms * 1e-3) / copy_bps, 1)})
            print(rows[-1], flush=True)
        fn = k.get(key, (("mode", mode),), cfg)
        ms = timing.bench(lambda fn=fn, ts=ts: fn(*ts))
        rows.append({"mode": mode, "dtype": dtype_name(dt), "N": n, "config": repr(cfg), "default": is_default,
                     "us": round(ms * 1e3, 2), "pct_copy": round(100 * nbytes / (ms * 1e-3) / copy_bps, 1)})
        print(rows[-1], flush=True)
    write_results(a.out, {**results_header(), "M": a.m, "copy_GBps": round(copy_bps / 1e9, 1), "rows": rows})


if __name__ == "__main__":
    main()
