"""Memory-bound library ops, forward and backward: cuteforge vs torch eager vs torch.compile
vs quack, side by side in one process on the same inputs.

Ops: sum, softmax, log_softmax, rms_norm, layer_norm, cross_entropy. Shapes: M x N with
N from 256 to 262144 and M = 32768 capped so one input stays at 2**28 elements (a 32768 x
262144 input would be 16 GiB: the bandwidth is the same at 1 GiB). Bandwidth counts the
bytes a kernel must move once (inputs read, outputs written) and is compared with a
device-to-device copy measured in the same run. Backward is timed through autograd
(`torch.autograd.grad` of a saved forward), the way training calls it.

Writes benchmarks/results/<gpu>-membound.json (or --out), after every row; the PNGs of GB/s
vs N per op come from it on any machine: `cuteforge bench --from FILE --plot DIR`.

Run on a GPU machine:
  python benchmarks/bench_membound.py [--ops softmax,rms_norm] [--dtypes bfloat16,float32]
                                      [--ns 256,4096,...] [--no-compile | --compile-ns 4096,65536]
                                      [--no-quack] [--m M (small-M sweeps)] [--flush zero|read]
                                      [--timer event|stream] [--repeat K] [--train-weight] [--out F]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import torch

from cuteforge.bench.library import TIMERS, WITH_BACKWARD, contenders, measure
from cuteforge.bench.report import results_header, write_results  # noqa: E402
from cuteforge.timing import events as timing

NS = (256, 512, 1024, 2048, 4096, 8192, 16384, 32768, 65536, 131072, 262144)
MAX_ELEMS = 1 << 28
OPS = ("sum", "softmax", "log_softmax", "rms_norm", "layer_norm", "cross_entropy")


def shape_for(n: int) -> tuple[int, int]:
    return min(32768, MAX_ELEMS // n), n


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--ops", default=",".join(OPS))
    p.add_argument("--dtypes", default="bfloat16,float32")
    p.add_argument("--ns", default=",".join(map(str, NS)))
    p.add_argument("--no-backward", action="store_true")
    p.add_argument("--no-compile", action="store_true")
    p.add_argument("--compile-ns", help="run torch.compile only at these N (each shape is a fresh compile: seconds)")
    p.add_argument("--no-quack", action="store_true")
    p.add_argument("--m", type=int, help="rows for every shape (default: 32768, capped at 2**28 elements)")
    p.add_argument("--flush", default="zero", choices=timing.FLUSH_MODES,
                   help="how L2 is flushed before each timed call: zero (the default, Triton's: leaves "
                        "dirty lines whose write-back a short read-only kernel pays) or read (clean lines)")
    p.add_argument("--timer", default="event", choices=TIMERS,
                   help="event: CUDA events around each call, L2 flushed (the default); stream: wall time per "
                        "call of calls made back to back, contenders interleaved (small M / small N, where a "
                        "call is host-bound and one event pair reads the host's jitter)")
    p.add_argument("--repeat", type=int, default=1,
                   help="time each shape this many times (median; each run's ratio to torch and to quack kept; "
                        "the event timer rotates the contenders' order each run)")
    p.add_argument("--train-weight", action="store_true",
                   help="norm backward with weight and bias requiring grad (dweight / dbias computed by both "
                        "torch and cuteforge); without it they are frozen and neither computes them")
    p.add_argument("--out")
    args = p.parse_args()
    timing.set_flush_mode(args.flush)
    copy_bps = timing.copy_bandwidth()
    print(f"copy: {copy_bps / 1e9:.0f} GB/s", flush=True)
    name = torch.cuda.get_device_name().lower().replace("nvidia ", "").replace(" ", "-")
    path = Path(args.out or Path(__file__).parent / "results" / f"{name}-membound.json")
    rows: list[dict[str, Any]] = []

    def save(complete: bool) -> None:  # after every row: a run cut short keeps what it measured
        result = {
            **results_header(),
            "copy_GBps": round(copy_bps / 1e9, 1),
            "flush": args.flush if args.timer == "event" else None,  # stream: no flush
            "timer": args.timer,
            "complete": complete,
            "summary": _summary(rows),
            "membound": rows,
        }
        write_results(path, result, check=complete)

    compile_ns = {int(v) for v in args.compile_ns.split(",")} if args.compile_ns else None
    for op in args.ops.split(","):
        for dt_name in args.dtypes.split(","):
            dtype = getattr(torch, dt_name)
            for n in map(int, args.ns.split(",")):
                m, n = (args.m, n) if args.m else shape_for(n)
                for backward in (False, True) if op in WITH_BACKWARD and not args.no_backward else (False,):
                    torch._dynamo.reset()  # a fresh compile per shape (dynamo's recompile limit)
                    compiled = not args.no_compile and (compile_ns is None or n in compile_ns)
                    fns = contenders(op, compiled, with_quack=not args.no_quack)
                    row = measure(op, m, n, dtype, fns, copy_bps, backward, warmup_ms=10, rep_ms=40, timer=args.timer,
                                  train_params=args.train_weight, repeat=args.repeat)
                    rows.append(row)
                    print(json.dumps(row), flush=True)
                    save(False)
                    torch.cuda.empty_cache()
    save(True)
    print(json.dumps(_summary(rows), indent=1))
    print(f"wrote {path}; plots from it, on any machine: cuteforge bench --from {path} --plot DIR")


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
