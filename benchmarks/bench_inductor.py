"""torch.compile(mode="max-autotune") of a transformer block with and without
cuteforge.inductor.enable(), next to eager, in one process on the same inputs.

    python3 benchmarks/bench_inductor.py --out $OUT/h200-inductor.json [--shapes 4x512,8x1024]

Per shape: eager ms, compiled-stock ms, compiled-with-cuteforge ms (CUDA-event medians of
--reps runs), the speed-up, max error against eager, compile seconds, and the choice log
(which cuteforge candidates won or lost). GEMM backends are limited to ATEN,TRITON and
the FX graph cache is off so both compiles really autotune, within a GPU call's time.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

import torch
import torch.nn as nn
import torch.nn.functional as F


class Block(nn.Module):
    def __init__(self, d: int, heads: int, h: int) -> None:
        super().__init__()
        self.heads = heads
        self.ln = nn.LayerNorm(d)
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)
        self.rn = nn.RMSNorm(d, eps=1e-6)
        self.up = nn.Linear(d, h)
        self.down = nn.Linear(h, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, d = x.shape
        q, k, v = self.qkv(self.ln(x)).view(b, s, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4).unbind(0)
        att = torch.softmax((q @ k.transpose(-1, -2)) * (d // self.heads) ** -0.5, dim=-1)
        x = x + self.proj((att @ v).transpose(1, 2).reshape(b, s, d))
        return x + self.down(F.gelu(self.up(self.rn(x)), approximate="tanh"))


def _time(fn: Any, x: torch.Tensor, reps: int) -> float:
    for _ in range(5):
        fn(x)
    torch.cuda.synchronize()
    ts = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn(x)
        b.record()
        torch.cuda.synchronize()
        ts.append(a.elapsed_time(b))
    ts.sort()
    return ts[len(ts) // 2]


def _compiled(m: nn.Module, x: torch.Tensor) -> tuple[Any, float]:
    from torch._inductor import config

    torch._dynamo.reset()
    f = torch.compile(m, mode="max-autotune")  # mode= and options= exclude each other: limits via config.patch
    t0 = time.perf_counter()
    with config.patch(max_autotune_gemm_backends="ATEN,TRITON", fx_graph_cache=False):
        f(x)
    torch.cuda.synchronize()
    return f, time.perf_counter() - t0


def main() -> int:
    import cuteforge.inductor as ci

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", default="4x512,8x1024", help="BxS,... (batch x sequence); d=1024, 8 heads, mlp 4096")
    ap.add_argument("--d", type=int, default=1024)
    ap.add_argument("--reps", type=int, default=50)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    dev = torch.cuda.get_device_name()
    rows = []
    torch.manual_seed(0)
    m = Block(args.d, 8, 4 * args.d).cuda().to(torch.bfloat16).eval()
    for shape in args.shapes.split(","):
        bsz, seq = map(int, shape.split("x"))
        x = torch.randn(bsz, seq, args.d, device="cuda", dtype=torch.bfloat16)
        with torch.no_grad():
            ref = m(x)
            eager = _time(m, x, args.reps)
            ci.disable()
            stock, stock_s = _compiled(m, x)
            stock_ms = _time(stock, x, args.reps)
            stock_err = (stock(x).float() - ref.float()).abs().max().item()
            assert ci.enable(), "cuteforge.inductor.enable() refused on this torch"
            ci.clear_choices_log()
            cf, cf_s = _compiled(m, x)
            cf_ms = _time(cf, x, args.reps)
            cf_err = (cf(x).float() - ref.float()).abs().max().item()
            log = ci.choices_log()
            ci.disable()
            # re-time stock after: the two compiled runs side by side, same inputs
            stock_ms2 = _time(stock, x, args.reps)
        row = {"shape": [bsz, seq, args.d], "eager_ms": eager, "compiled_stock_ms": min(stock_ms, stock_ms2),
               "compiled_cuteforge_ms": cf_ms, "speedup_vs_stock": min(stock_ms, stock_ms2) / cf_ms,
               "max_err_stock": stock_err, "max_err_cuteforge": cf_err, "compile_s_stock": stock_s,
               "compile_s_cuteforge": cf_s, "cuteforge_won": sum(e["cuteforge_won"] for e in log),
               "selections": len(log), "choices": log}
        rows.append(row)
        print(f"{bsz}x{seq}x{args.d}: eager {eager:.3f} ms | compiled stock {row['compiled_stock_ms']:.3f} ms | "
              f"with cuteforge {cf_ms:.3f} ms | {row['speedup_vs_stock']:.3f}x | cuteforge won "
              f"{row['cuteforge_won']}/{len(log)} | err {stock_err:.3g}/{cf_err:.3g} | compile {stock_s:.0f}/{cf_s:.0f} s")
        for e in log:
            print(f"    {e['op']:22s} {str(e['shapes']):34s} {'WON ' if e['cuteforge_won'] else 'lost'} "
                  f"cuteforge {e['cuteforge_best_ms']:.4f} ms vs inductor {e['inductor_best']} {e['inductor_best_ms']}")
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"command": " ".join([sys.executable, *sys.argv]), "device": dev, "torch": torch.__version__,
                       "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
