"""Cross-entropy: cuteforge vs torch eager, torch.compile and quack, same run, same inputs.

Per shape (M x N, bf16 and fp32, tensors <= 4 GiB) and contender:
  fwd        per-row loss (reduction="none", no grad): bytes = logits + target + loss
  fwd_mean   the mean loss, no grad: the op; "cuteforge_reduced": the one launch that
             reduces, forced; "cuteforge_rowwise": the per-row kernel then torch's sum /
             count: bytes = logits + target
  bwd        the backward kernel alone (cuteforge, quack): bytes = logits read + dlogits written
  fwd+bwd    a training step: loss = ce(x, t) (mean), loss.backward(); ideal bytes = 3 x logits
% of copy is against a device-to-device copy measured in the same run (L2 flushed).

Run on a GPU machine:  python benchmarks/bench_cross_entropy.py [--out FILE] [--no-compile]
Config sweep, kernels alone (quack's forward first, at the same shape):
  python benchmarks/bench_cross_entropy.py --ns "" --sweep-ns 4096,32768 --sweep-dtypes bfloat16,float32
                                           [--sweep-grid] [--sweep-phases fwd,bwd] [--flush zero|read]
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch
import torch.nn.functional as F

import cuteforge.ops as ops
from cuteforge.bench.report import results_header, write_results  # noqa: E402
from cuteforge.kernels.cross_entropy.device import work_words
from cuteforge.timing import events as timing

NS = [4096, 16384, 65536, 262144]
MAX_BYTES = 4 << 30


def _quack() -> dict:
    try:
        from quack.cross_entropy import cross_entropy, cross_entropy_bwd, cross_entropy_fwd
    except Exception as e:  # not installed: say so in the JSON
        return {"error": f"{type(e).__name__}: {e}"}
    return {"ce": cross_entropy, "fwd": cross_entropy_fwd, "bwd": cross_entropy_bwd}


def measure(m: int, n: int, dtype: torch.dtype, copy_bps: float, compiled: bool, quack: dict) -> dict:
    import importlib

    ce_mod = importlib.import_module("cuteforge.ops.cross_entropy")
    launch = importlib.import_module("cuteforge.ops.cross_entropy_launch")
    torch._dynamo.reset()
    x = torch.randn(m, n, device="cuda", dtype=dtype)
    t = torch.randint(0, n, (m,), device="cuda")
    e = x.element_size()
    row: dict = {"M": m, "N": n, "dtype": str(dtype).removeprefix("torch.")}
    loss, lse = launch._fwd(x, t, -100)
    ref = F.cross_entropy(x.float() if m * n < 2**30 else x, t, reduction="none").float()
    row["fwd_correct"] = bool(torch.allclose(loss, ref, rtol=1e-2, atol=2e-2))
    gscale = torch.full((m,), 1.0 / m, device="cuda")
    dx = launch._bwd(x, t, lse, gscale, -100)
    p = torch.softmax(x[:64].float(), -1)
    p[torch.arange(64, device="cuda"), t[:64]] -= 1
    row["bwd_correct"] = bool(torch.allclose(dx[:64].float(), p / m, rtol=2e-2, atol=1e-3 / m))
    del dx, p, ref

    fwd = {"cuteforge": lambda: launch._fwd(x, t, -100), "torch": lambda: F.cross_entropy(x, t, reduction="none")}
    bwd = {"cuteforge": lambda: launch._bwd(x, t, lse, gscale, -100)}
    xg = x.clone().requires_grad_(True)

    def step(fn):
        def run():
            xg.grad = None
            fn(xg, t).backward()
        return run

    train = {"cuteforge": step(lambda a, b: ops.cross_entropy(a, b)), "torch": step(lambda a, b: F.cross_entropy(a, b))}

    def rowwise_mean() -> torch.Tensor:  # v1's composition: the per-row kernel, then torch reduces
        per_row, _ = launch._fwd(x, t, -100)
        return per_row.sum() / t.ne(-100).sum()

    # the reduced kernel itself, launched directly (the op's own host path aside; before
    # earlier the op took the composition below for 16-bit rows past 16384)
    red_out, red_unused = x.new_empty(1), torch.empty(1, device="cuda")
    red_work = ce_mod._work(x.get_device(), work_words(m))  # >= the grid's: one row a CTA at most

    red: list = []  # the kernel, looked up at the first (untimed, warm-up) call

    def reduced_mean() -> torch.Tensor:
        if not red:
            red.append(launch._red_get(launch._red_key(x, t, x.dtype), launch._row_config(x, t, -100), -100, True, False))
        red[0](x, t, red_out, red_unused, red_work)
        return red_out

    # the no-grad mean loss: the op (one launch that also reduces where its grid fits),
    # the reduced kernel forced, and v1's composition
    fwd_mean = {"cuteforge": lambda: ops.cross_entropy(x, t), "cuteforge_reduced": reduced_mean,
                "cuteforge_rowwise": rowwise_mean, "torch": lambda: F.cross_entropy(x, t)}
    if compiled:
        c_fwd = torch.compile(lambda a, b: F.cross_entropy(a, b, reduction="none"), dynamic=False)
        c_train = torch.compile(lambda a, b: F.cross_entropy(a, b), dynamic=False)

        def c_fwd_call():
            with torch.no_grad():
                return c_fwd(x, t)

        fwd["torch.compile"] = c_fwd_call
        train["torch.compile"] = step(c_train)
    if "fwd" in quack:
        fwd["quack"] = lambda: quack["fwd"](x, t, return_lse=True)
        q_loss, q_lse = quack["fwd"](x, t, return_lse=True)
        bwd["quack"] = lambda: quack["bwd"](x, t, gscale, q_lse)
        train["quack"] = step(lambda a, b: quack["ce"](a, b, reduction="mean"))
        fwd_mean["quack"] = lambda: quack["ce"](x, t, reduction="mean")
    nb = {"fwd": m * n * e + m * 16, "fwd_mean": m * n * e + m * 8, "bwd": 2 * m * n * e + m * 16, "fwd+bwd": 3 * m * n * e}
    for phase, group in (("fwd", fwd), ("fwd_mean", fwd_mean), ("bwd", bwd), ("fwd+bwd", train)):
        for name, fn in group.items():
            try:
                with torch.no_grad() if phase != "fwd+bwd" else torch.enable_grad():
                    ms = timing.bench(fn)
            except Exception as ex:  # a contender failing is a finding, not a crash
                row[f"{phase}_{name}_error"] = f"{type(ex).__name__}: {str(ex)[:200]}"
                continue
            bps = nb[phase] / (ms * 1e-3)
            row[f"{phase}_{name}_us"] = round(ms * 1e3, 1)
            row[f"{phase}_{name}_GBps"] = round(bps / 1e9, 1)
            row[f"{phase}_{name}_pct_copy"] = round(100 * bps / copy_bps, 1)
    return row


def sweep_grid(n: int, dtype: torch.dtype) -> list:
    """--sweep-grid: one row per CTA of 128..1024 threads x 4 / 8 / 16 vectors in flight (those
    that fit the row), beside the kernel's own candidates."""
    from cuteforge.kernels.reduce.row import RowReduceConfig

    nv = n // (16 // torch.tensor([], dtype=dtype).element_size())
    return [RowReduceConfig(t, t, u) for t in (128, 256, 512, 1024) for u in (4, 8, 16) if nv // t >= u]


def config_sweep(n: int, dtype: torch.dtype, copy_bps: float, grid: bool = False, quack: dict | None = None,
                 phases: tuple[str, ...] = ("fwd", "bwd")) -> list[dict]:
    """Kernel bandwidth of every candidate config at one shape (compiled in parallel first);
    with quack, its forward at the same shape as the row before them."""
    from cuteforge.arch import target_arch
    from cuteforge.autotune.pool import CompileJob, compile_all
    from cuteforge.kernels.cross_entropy.spec import cross_entropy_bwd, cross_entropy_fwd

    m = min(32768, MAX_BYTES // (n * torch.tensor([], dtype=dtype).element_size()))
    x = torch.randn(m, n, device="cuda", dtype=dtype)
    t = torch.randint(0, n, (m,), device="cuda")
    loss = torch.empty(m, device="cuda")
    lse = torch.empty(m, device="cuda")
    g = torch.full((m,), 1.0 / m, device="cuda")
    dx = torch.empty_like(x)
    e = x.element_size()
    rows = []
    params = (("ignore_index", -100),)
    if quack and "fwd" in quack and "fwd" in phases:
        try:
            ms = timing.bench(lambda: quack["fwd"](x, t, return_lse=True))
            rows.append({"phase": "fwd", "M": m, "N": n, "dtype": str(dtype)[6:], "config": "quack", "default": False,
                         "us": round(ms * 1e3, 1), "pct_copy": round(100 * m * n * e / (ms * 1e-3) / copy_bps, 1)})
        except Exception as ex:  # quack's kernels need N a multiple of its vector (odd N fail to build)
            rows.append({"phase": "fwd", "N": n, "config": "quack", "error": f"{type(ex).__name__}: {str(ex)[:200]}"})
    todo = [(ph, k, a, nb) for ph, k, a, nb in (("fwd", cross_entropy_fwd, (x, t, loss, lse), m * n * e),
                                               ("bwd", cross_entropy_bwd, (x, t, lse, g, dx), 2 * m * n * e))
            if ph in phases]
    for phase, k, args, nbytes in todo:
        key = k.signature.bind(args)
        spec = k.spec(key, params)
        cfgs = list(k.configs(spec))
        if grid:
            cfgs += [c for c in sweep_grid(n, dtype) if c not in cfgs]
        compile_all([CompileJob.of(k, key, params, c, target_arch()) for c in cfgs])
        for cfg in cfgs:
            try:
                fn = k.get(key, params, cfg)
                ms = timing.bench(lambda fn=fn, args=args: fn(*args))
                rows.append({"phase": phase, "M": m, "N": n, "dtype": str(dtype)[6:], "config": repr(cfg),
                             "default": cfg == spec.config, "us": round(ms * 1e3, 1),
                             "pct_copy": round(100 * nbytes / (ms * 1e-3) / copy_bps, 1)})
            except Exception as ex:  # a failing config is a finding, not a crash
                rows.append({"phase": phase, "N": n, "config": repr(cfg), "error": f"{type(ex).__name__}: {str(ex)[:200]}"})
    return rows


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out")
    p.add_argument("--no-compile", action="store_true")
    p.add_argument("--ns", default=",".join(map(str, NS)))
    p.add_argument("--compile-ns", default="", help="N values that get the torch.compile contender (default: all)")
    p.add_argument("--sweep-ns", default="", help="N values whose kernel configs are swept")
    p.add_argument("--sweep-dtypes", default="bfloat16", help="dtypes of the config sweep")
    p.add_argument("--sweep-grid", action="store_true", help="also sweep threads x vectors in flight (sweep_grid)")
    p.add_argument("--sweep-phases", default="fwd,bwd", help="kernels of the config sweep: fwd, bwd")
    p.add_argument("--flush", default="zero", choices=timing.FLUSH_MODES, help="L2 flush before each timed call")
    args = p.parse_args()
    t0 = time.time()
    timing.set_flush_mode(args.flush)
    copy_bps = timing.copy_bandwidth()
    quack = _quack()
    result = {
        **results_header(),
        "quack": quack.get("error", "quack-kernels"),
        "copy_GBps": round(copy_bps / 1e9, 1),
        "flush": args.flush,
        "rows": [],
    }
    for dtype in (torch.bfloat16, torch.float32):
        for n in [int(v) for v in args.ns.split(",") if v]:
            m = min(32768, MAX_BYTES // (n * torch.tensor([], dtype=dtype).element_size()))
            with_compile = not args.no_compile and (not args.compile_ns or str(n) in args.compile_ns.split(","))
            row = measure(m, n, dtype, copy_bps, with_compile, quack)
            result["rows"].append(row)
            print(row, flush=True)
            torch.cuda.empty_cache()
    result["config_sweep"] = []
    for dt in [getattr(torch, d) for d in args.sweep_dtypes.split(",") if d]:
        for n in [int(v) for v in args.sweep_ns.split(",") if v]:
            result["config_sweep"] += config_sweep(n, dt, copy_bps, args.sweep_grid, quack,
                                                   tuple(args.sweep_phases.split(",")))
            torch.cuda.empty_cache()
    for r in result["config_sweep"]:
        print("sweep", r, flush=True)
    result["seconds"] = round(time.time() - t0, 1)
    out = Path(args.out or Path(__file__).parent / "results" / "h200-cross-entropy.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    write_results(out, result)
    print("wrote", out, "in", result["seconds"], "s")


if __name__ == "__main__":
    main()
