"""torch.compile(mode="max-autotune") of a transformer block with and without
cuteforge.inductor.enable(), next to eager, in one process on the same inputs.

    python3 benchmarks/bench_inductor.py --out $OUT/h200-inductor.json [--shapes 4x512,8x1024]

Per shape: eager ms, compiled-stock ms, compiled-with-cuteforge ms (each compiled through
an entry function with its own code object; --rounds interleaved rounds of --reps CUDA-event timings each,
the median of the round medians), the speed-up, max error against eager, compile seconds, and the choice log
(which cuteforge candidates won or lost). GEMM backends are limited to ATEN,TRITON and
the FX graph cache is off so both compiles really autotune, within a GPU call's time. A
compile that fails (a selection with no valid choice, ...) is reported in its row
(`error_stock` / `error_cuteforge`) and the bench goes on.

First, `gemm_diag` (--gemm-diag MxKxN,...): one bias addmm in Inductor's layouts through
cuBLAS and every cuteforge entry point, timed by Inductor's benchmarker and by
cuteforge.timing.events.bench, with host us per call, profiler GPU us per call and whether the call
blocks the host: what the GEMM choice pays for beyond the kernel, if anything.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import types
from typing import Any

import torch
import torch.nn as nn
import torch.nn.functional as F

from cuteforge.bench.report import results_header, write_results  # noqa: E402


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


def _entry(m: nn.Module, tag: str) -> Any:
    """`lambda x: m(x)` with a code object of its own (Dynamo's cache lives on it)."""

    def run(x: torch.Tensor) -> torch.Tensor:
        return m(x)

    code = run.__code__.replace(co_name=f"run_{tag}")
    return types.FunctionType(code, run.__globals__, f"run_{tag}", run.__defaults__, run.__closure__)


_PICKS: list[dict[str, Any]] = []  # every autotuning selection's winner during the current compile


def _record_pick(timings: dict[Any, float], name: str, input_nodes: Any, *rest: Any) -> None:
    try:
        win, ms = min(timings.items(), key=lambda kv: kv[1])
        shapes = [list(map(int, n.get_size())) for n in input_nodes]
        _PICKS.append({"op": name, "shapes": shapes, "winner": str(win.name), "winner_ms": float(ms)})
    except Exception:  # noqa: BLE001 - a record, never a reason to fail the compile
        pass


def _compiled(m: Any, x: torch.Tensor, reset: bool) -> tuple[Any, float, list[dict[str, Any]]]:
    """The compiled entry, its compile seconds, and the winner of every autotuning
    selection it made (what tells tuning noise apart from a cuteforge effect when the two
    graphs differ with no cuteforge winner)."""
    from torch._inductor import config, select_algorithm

    if reset:
        torch._dynamo.reset()
    f = torch.compile(m, mode="max-autotune")  # mode= and options= exclude each other: limits via config.patch
    _PICKS.clear()
    cache = select_algorithm.get_algorithm_selector_cache()
    cache.add_feedback_saver(_record_pick)
    t0 = time.perf_counter()
    try:
        with config.patch(max_autotune_gemm_backends="ATEN,TRITON", fx_graph_cache=False):
            f(x)
        torch.cuda.synchronize()
    finally:
        fns = getattr(select_algorithm.get_algorithm_selector_cache(), "feedback_saver_fns", [])
        if _record_pick in fns:
            fns.remove(_record_pick)
    return f, time.perf_counter() - t0, list(_PICKS)


def _error(e: BaseException) -> str:
    msg = f"{type(e).__name__}: {e}"
    return msg if len(msg) <= 2000 else msg[:2000] + " ..."


def _kernel_us(fn: Any, calls: int = 20) -> dict[str, Any]:
    """GPU time per call of every kernel (and copy/memset) fn launches, from the profiler."""
    from torch.profiler import ProfilerActivity, profile

    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
    per: dict[str, float] = {}
    for e in prof.key_averages():
        t = float(getattr(e, "self_device_time_total", 0.0) or getattr(e, "self_cuda_time_total", 0.0) or 0.0)
        if t > 0:
            per[str(e.key)[:120]] = t / calls
    return {"total_us": sum(per.values()), "launches_per_call": len(per), "kernels_us": per}


def _blocks_host(fn: Any) -> bool:
    """Whether fn waits for the GPU: queue ~20 ms of GPU sleep, then time fn's host call."""
    fn()
    torch.cuda.synchronize()
    torch.cuda._sleep(40_000_000)
    t0 = time.perf_counter()
    fn()
    dt = time.perf_counter() - t0
    torch.cuda.synchronize()
    return dt > 0.005


def gemm_diag(M: int, K: int, N: int, act: str = "none") -> dict[str, Any]:
    """Why does the cuteforge GEMM choice time slower than cuBLAS inside Inductor's
    selection? One addmm (bias, bf16) in the layouts Inductor hands over (a row-major, b =
    w.t(), the bias expanded to (M, N) with stride (0, 1)), every way in: cuBLAS, the extern
    kernel Inductor times (the plain function cuteforge.inductor.custom_ops.cuteforge_addmm), the same
    through its custom op, the extern function of the Linear + act choice, the op
    torch.ops.cuteforge.gemm and the eager cuteforge.ops.gemm. Each timed
    by Inductor's own benchmarker (what selection compares), by cuteforge.timing.events.bench,
    with host microseconds per call, the profiler's GPU time per call, and whether the call
    blocks the host (a synchronization would make Inductor's timing include host time).
    With act (gelu, silu, relu): also the Linear + act choice both ways (F.linear + the eager
    act, the extern cuteforge_linear_bias_act with the act fused) and the fused eager ops.gemm."""
    from torch._inductor.runtime.benchmarking import benchmarker

    import cuteforge.inductor as ci
    from cuteforge.ops.gemm import gemm
    from cuteforge.timing.events import bench, host_us

    dt = torch.bfloat16
    a = torch.randn(M, K, device="cuda", dtype=dt)
    w = torch.randn(N, K, device="cuda", dtype=dt)
    bias = torch.randn(N, device="cuda", dtype=dt)
    b, inp = w.t(), bias.expand(M, N)
    key, kinds = ci.custom_ops._preset_key("none", True)
    fns = {
        "cublas_addmm": lambda: torch.addmm(inp, a, b),
        "cuteforge_extern_addmm": lambda: ci.custom_ops.cuteforge_addmm(inp, a, b),
        "cuteforge_inductor_custom_op_addmm": lambda: torch.ops.cuteforge_inductor.addmm.default(inp, a, b),
        "cuteforge_extern_linear_bias_act": lambda: ci.custom_ops.cuteforge_linear_bias_act(a, w, bias, act="none"),
        "cuteforge_op_gemm": lambda: torch.ops.cuteforge.gemm(a, b, [bias], key, kinds, None),
        "cuteforge_eager_gemm": lambda: gemm(a, b, bias=bias),
    }
    if act != "none":
        tf = {"gelu": lambda y: F.gelu(y, approximate="tanh"), "silu": F.silu, "relu": F.relu}[act]
        fns[f"cublas_linear_{act}"] = lambda: tf(F.linear(a, w, bias))
        fns[f"cuteforge_extern_linear_bias_{act}"] = lambda: ci.custom_ops.cuteforge_linear_bias_act(a, w, bias, act=act)
        fns[f"cuteforge_eager_gemm_{act}"] = lambda: gemm(a, b, bias=bias, epilogue=act)
    out: dict[str, Any] = {"shape": [M, K, N], "layout": "a (M,K) row-major, b = w.t(), bias expanded (0, 1)"}
    refs = {"none": fns["cublas_addmm"]().float()}
    if act != "none":
        refs[act] = fns[f"cublas_linear_{act}"]().float()
    for name, fn in fns.items():
        r: dict[str, Any] = {}
        try:
            r["max_err"] = (fn().float() - refs[act if name.endswith(act) else "none"]).abs().max().item()
            r["inductor_benchmarker_ms"] = float(benchmarker.benchmark_gpu(fn))
            r["cuteforge_bench_ms"] = bench(fn)
            r["host_us"] = host_us(fn)
            r["blocks_host"] = _blocks_host(fn)
            r["profiler"] = _kernel_us(fn)
        except Exception as e:  # noqa: BLE001 - one failing path must not hide the others
            r["error"] = _error(e)
        out[name] = r
        print(f"  gemm diag {name:24s} " + " ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}"
                                                   for k, v in r.items() if k != "profiler")
              + (f" gpu_us/call={r['profiler']['total_us']:.1f} launches={r['profiler']['launches_per_call']}"
                 if "profiler" in r else ""))
    return out


def main() -> int:
    import cuteforge.inductor as ci

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", default="4x512,8x1024", help="BxS,... (batch x sequence); d=1024, 8 heads, mlp 4096")
    ap.add_argument("--d", type=int, default=1024)
    ap.add_argument("--reps", type=int, default=50)
    ap.add_argument("--rounds", type=int, default=5, help="interleaved timing rounds of stock and cuteforge")
    ap.add_argument("--out", default=None)
    ap.add_argument("--gemm-diag", default="2048x1024x4096,2048x4096x1024",
                    help="MxKxN,... addmm shapes for the GEMM timing diagnosis ('' to skip)")
    ap.add_argument("--diag-act", default="none", help="gemm diag: also the Linear + act choice (gelu, silu, relu)")
    ap.add_argument("--no-block", action="store_true", help="only the GEMM diagnosis")
    args = ap.parse_args()
    torch.cuda.init()
    rows = []
    torch.manual_seed(0)
    m = Block(args.d, 8, 4 * args.d).cuda().to(torch.bfloat16).eval()
    diag = []
    for spec in filter(None, args.gemm_diag.split(",")):
        M, K, N = map(int, spec.split("x"))
        try:
            diag.append(gemm_diag(M, K, N, args.diag_act))
        except Exception as e:  # noqa: BLE001
            diag.append({"shape": [M, K, N], "error": _error(e)})
    for shape in [] if args.no_block else args.shapes.split(","):
        bsz, seq = map(int, shape.split("x"))
        x = torch.randn(bsz, seq, args.d, device="cuda", dtype=torch.bfloat16)
        row: dict[str, Any] = {"shape": [bsz, seq, args.d]}
        rows.append(row)
        with torch.no_grad():
            ref = m(x)
            row["eager_ms"] = eager = _time(m, x, args.reps)
            # Dynamo keeps compiled code on the code object of the frame it compiles, and its
            # guards pass for any module of the same structure: each side gets an entry
            # function with its own code object, so neither call can run the other's graph.
            m_stock, m_cf = _entry(m, "stock"), _entry(m, "cuteforge")
            ci.disable()
            try:
                stock, row["compile_s_stock"], row["picks_stock"] = _compiled(m_stock, x, reset=True)
                row["max_err_stock"] = (stock(x).float() - ref.float()).abs().max().item()
            except Exception as e:  # noqa: BLE001 - report it, keep benchmarking
                stock, row["error_stock"] = None, _error(e)
            assert ci.enable(), "cuteforge.inductor.enable() refused on this torch"
            ci.clear_choices_log()
            try:
                cf, row["compile_s_cuteforge"], row["picks_cuteforge"] = _compiled(m_cf, x, reset=False)
                row["max_err_cuteforge"] = (cf(x).float() - ref.float()).abs().max().item()
            except Exception as e:  # noqa: BLE001 - a failed selection is a result, not a crash
                cf, row["error_cuteforge"] = None, _error(e)
            log = ci.choices_log()
            ci.disable()
            # Interleaved rounds, the median of each side's round medians: both compiled graphs
            # side by side on the same inputs, drift shared.
            rounds: dict[str, list[float]] = {"stock": [], "cf": []}
            for _ in range(args.rounds):
                if stock is not None:
                    rounds["stock"].append(_time(stock, x, args.reps))
                if cf is not None:
                    rounds["cf"].append(_time(cf, x, args.reps))
            if rounds["stock"]:
                row["compiled_stock_ms"] = statistics.median(rounds["stock"])
            cf_ms = statistics.median(rounds["cf"]) if rounds["cf"] else None
            row["compiled_cuteforge_ms"] = cf_ms
            row["rounds_ms"] = rounds
        if cf_ms is not None and "compiled_stock_ms" in row:
            row["speedup_vs_stock"] = row["compiled_stock_ms"] / cf_ms
        row.update({"cuteforge_won": sum(e["cuteforge_won"] for e in log), "selections": len(log), "choices": log})
        print(f"{bsz}x{seq}x{args.d}: eager {eager:.3f} ms | compiled stock {row.get('compiled_stock_ms')} ms | "
              f"with cuteforge {cf_ms} ms | speed-up {row.get('speedup_vs_stock')} | cuteforge won "
              f"{row['cuteforge_won']}/{len(log)} | err {row.get('max_err_stock')}/{row.get('max_err_cuteforge')} | "
              f"compile {row.get('compile_s_stock')}/{row.get('compile_s_cuteforge')} s")
        for k in ("error_stock", "error_cuteforge"):
            if k in row:
                print(f"    {k}: {row[k][:500]}")
        same = {(p["op"], str(p["shapes"])): p["winner"] for p in row.get("picks_stock", [])}
        for p in row.get("picks_cuteforge", []):
            other = same.get((p["op"], str(p["shapes"])))
            if other is not None and other != p["winner"]:
                print(f"    pick differs: {p['op']} {p['shapes']}: stock {other}, with cuteforge enabled {p['winner']}")
        for e in log:
            print(f"    {e['op']:22s} {str(e['shapes']):34s} {'WON ' if e['cuteforge_won'] else 'lost'} "
                  f"cuteforge {e['cuteforge_best']} {e['cuteforge_best_ms']:.4f} ms vs inductor {e['inductor_best']} "
                  f"{e['inductor_best_ms']}")
    if args.out:
        write_results(args.out, {**results_header(), "gemm_diag": diag, "rows": rows})
    return 0


if __name__ == "__main__":
    sys.exit(main())
