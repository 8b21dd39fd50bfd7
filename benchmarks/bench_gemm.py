"""GEMM: cuteforge (sm_90a) vs cuBLAS (torch.matmul), cuBLAS + eager epilogue, and quack,
in one process on the same inputs. bf16 in, bf16 out, fp32 accumulate; A row-major
(M, K), B given as an nn.Linear weight (N, K) transposed (both K-major: "TN").

Writes benchmarks/results/<gpu>-gemm.json (or --out) with the command; the file is
rewritten after every shape so a run cut short still leaves its measurements.
torch.compile max-autotune (Inductor's Triton GEMM templates against cuBLAS, with the
epilogue fused into the template) is the "compile" set, at --compile-shapes only: its
autotuning takes about a minute per shape and graph.

    python benchmarks/bench_gemm.py [--set bar,square,skinny,epilogue,shortk,sweep] [--out FILE]
    python benchmarks/bench_gemm.py --set episweep --sweep-epilogue gelu --sweep-shapes 8192x8192x8192
    python benchmarks/bench_gemm.py --set raster --sweep-epilogue gelu --sweep-shapes 2048x14336x4096
    python benchmarks/bench_gemm.py --set defaults --sweep-epilogue gelu,silu --sweep-shapes 8192x8192x8192
    python benchmarks/bench_gemm.py --set fp8,fp8sweep --fp8-shapes 8192x8192x8192,4096x4096x4096
    python benchmarks/bench_gemm.py --set custom --shapes 65536x128x4096,1024x1024x1024
    python benchmarks/bench_gemm.py --set backward --out benchmarks/results/h200-gemm-backward.json
    python benchmarks/bench_gemm.py --set compile --compile-shapes 8192x8192x8192,4096x4096x4096
    python benchmarks/bench_gemm.py --out benchmarks/results/h200-gemm.json --plot benchmarks/results/h200-gemm.png

The epilogue set times cuBLAS's plain a @ b in the same rounds as cuBLAS + eager epilogue
and the fused kernel: `eager_epilogue_cost` (what the eager pass adds to cuBLAS) and
`cuteforge_vs_cublas_plain` (the fused kernel against a GEMM with no epilogue).

Autotuned configs: after `cuteforge tune gemm_sm90_tn --shapes ...` (and `gemm_sm90_tn_col
--param act=gelu` for the fused rows) `gemm()` runs the stored winner; those rows then
also time the untuned heuristic's config (`cuteforge_heuristic`) in the same run.

fp8 (not in the default sets): e4m3 x e4m3 with per-tensor scales (`--fp8-scaling
tensor`, the default) or rowwise ones (`rowwise`: scale_a (M, 1), scale_b (1, N)), bf16
out, against torch._scaled_mm (cuBLASLt fp8) with and without use_fast_accum (this kernel
accumulates like use_fast_accum=True: no periodic promotion out of the tensor core), plain
and with a fused bias + gelu (torch: _scaled_mm with its bias, then eager gelu). "fp8sweep"
times every fp8 candidate config at --fp8-shapes (per-tensor scales).

    python benchmarks/bench_gemm.py --set fp8 --fp8-scaling tensor,rowwise
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from cuteforge.bench.report import results_header, write_results  # noqa: E402
from cuteforge.kernels.gemm.sm90.config import SHORT_K, SHORT_K_NARROW, default_config, fit_swizzle
from cuteforge.ops.gemm import gemm
from cuteforge.timing import events as timing

BAR = [(8192, 8192, 8192), (4096, 4096, 4096), (16384, 16384, 1024), (2048, 8192, 28672)]
SQUARE = [(s, s, s) for s in (1024, 2048, 4096, 8192, 16384)]
# 8B-model feature sizes (K, N): attention out / MLP up / MLP down; M = tokens in flight.
SKINNY = [(m, n, k) for m in (16, 128, 2048) for k, n in ((4096, 4096), (4096, 14336), (14336, 4096))]
# 8192x28672x4096 (an 8B model's MLP up projection over 8192 tokens): a fused default that
# splits its last wave (stream-K), whose bias spilled in an earlier build
EPILOGUE = [(8192, 8192, 8192), (4096, 4096, 4096), (16384, 16384, 1024), (2048, 8192, 28672), (2048, 14336, 4096),
            (8192, 28672, 4096)]
# Short K on many tiles (the pingpong default's range; 4096^2 x 1024 keeps 128x128 tiles).
# An nn.Linear's backward (x (T, in), W (out, in), dY (T, out)): the weight gradient dW =
# dY^T @ x, M x N = out x in with K = T tokens (A M-major, B N-major), and dX = dY @ W (B
# N-major), M = T. dW rows: the issue-bar shapes and a hidden-1024 / 4096 model's
# projections over 4096 and 16384 tokens; dX rows: the model sizes over 4096 tokens.
BACKWARD_DW = [(1536, 1536, 12288), (4096, 4096, 16384), (1024, 2816, 16384), (2816, 1024, 16384),
               (1024, 1024, 4096), (2816, 1024, 4096), (1024, 2816, 4096), (4096, 14336, 4096), (14336, 4096, 4096)]
BACKWARD_DX = [(4096, 1024, 1024), (4096, 1024, 2816), (4096, 2816, 1024), (4096, 4096, 4096), (4096, 4096, 14336),
               (4096, 14336, 4096)]
SHORTK = [(8192, 8192, 512), (8192, 8192, 1024), (4096, 16384, 512), (16384, 4096, 1024), (4096, 4096, 1024)]


def _quack() -> Any:
    try:
        from quack import gemm_interface as q  # type: ignore[import-not-found]

        return q
    except Exception as e:  # noqa: BLE001 - any import failure means "no quack here"
        print("quack unavailable:", type(e).__name__, str(e)[:200])
        return None


ROUNDS = 4
BALANCED_UP_TO = 6  # contenders: up to this many, every one takes every position equally often


def measure(fns: dict[str, Any]) -> dict[str, float]:
    """Median ms of each contender over interleaved rounds (each round is a `timing.bench`
    median), so that clock and power drift hit every contender alike. Each round starts the
    list at a different contender: with a fixed order, a kernel read up to 3 % apart from an
    identical copy of itself listed elsewhere (docs/kernels/gemm.md). Up to BALANCED_UP_TO
    contenders, the rounds are a multiple of their count (at least ROUNDS) and round r
    starts at contender r, so each takes each position equally often; longer lists (config
    sweeps) get ROUNDS rounds starting at evenly spaced contenders."""
    import statistics

    rounds = ROUNDS
    names = list(fns)
    n = len(names)
    if n <= BALANCED_UP_TO:
        rounds = -(-rounds // n) * n
    times: dict[str, list[float]] = {k: [] for k in names}
    for r in range(rounds):
        start = r % n if n <= BALANCED_UP_TO else r * n // rounds
        for name in names[start:] + names[:start]:
            times[name].append(timing.bench(fns[name], warmup_ms=10.0, rep_ms=60.0))
    return {k: statistics.median(v) for k, v in times.items()}


def tflops(m: int, n: int, k: int, ms: float) -> float:
    return round(2 * m * n * k / (ms * 1e-3) / 1e12, 1)


def _inputs(m: int, n: int, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16)
    return a, w.t()


def _err(got: torch.Tensor, ref: torch.Tensor) -> float:
    return float((got.float() - ref.float()).abs().max() / ref.float().abs().max().clamp_min(1e-6))


# max |got - ref| / max |ref| above this (or NaN) is a wrong answer, not rounding: bf16 output
# rounding and accumulation order stay below ~5e-3 at every shape recorded so far
ERR_TOL = 2e-2


def flag_errors(result: dict) -> list[dict]:
    """Every recorded `*rel_err` above ERR_TOL, with the row that holds it."""
    flagged = []
    for section, rows in result.items():
        for row in rows if isinstance(rows, list) else ():
            for key, v in row.items() if isinstance(row, dict) else ():
                if key.endswith("rel_err") and isinstance(v, float) and not v <= ERR_TOL:
                    where = {f: row[f] for f in ("set", "M", "N", "K", "epilogue", "config") if f in row}
                    flagged.append({"section": section, **where, "contender": key.removesuffix("rel_err").rstrip("_") or "cuteforge",
                                    "rel_err": v})
    return flagged


def backward(kind: str, shapes: list[tuple[int, int, int]]) -> list[dict]:
    """Rows of the 'backward' set: cuteforge's default against cuBLAS (torch.mm) on the same
    views, `kind` "dW" (A = dY^T, M-major; B = x, N-major) or "dX" (A = dY; B = W, N-major)."""
    rows = []
    for m, n, k in shapes:
        if kind == "dW":
            a, b = torch.randn(k, m, device="cuda", dtype=torch.bfloat16).t(), torch.randn(k, n, device="cuda", dtype=torch.bfloat16)
        else:
            a, b = torch.randn(m, k, device="cuda", dtype=torch.bfloat16), torch.randn(k, n, device="cuda", dtype=torch.bfloat16)
        row: dict[str, Any] = {"set": "backward", "kind": kind, "M": m, "N": n, "K": k, "dtype": "bfloat16",
                               "cuteforge_config": repr(_default(m, n, k))}
        row["cuteforge_rel_err"] = _err(gemm(a, b), torch.mm(a, b))
        fns = {"cublas": lambda a=a, b=b: torch.mm(a, b), "cuteforge": lambda a=a, b=b: gemm(a, b)}
        for name, ms in measure(fns).items():
            row[f"{name}_TFLOPs"] = tflops(m, n, k, ms)
        row["vs_cublas"] = round(row["cuteforge_TFLOPs"] / row["cublas_TFLOPs"], 3)
        print(json.dumps(row), flush=True)
        rows.append(row)
    return rows


def plain(shapes: list[tuple[int, int, int]], q: Any, tag: str) -> list[dict]:
    rows = [plain_one(m, n, k, q, tag) for m, n, k in shapes]
    return rows


def plain_one(m: int, n: int, k: int, q: Any, tag: str) -> dict:
    a, b = _inputs(m, n, k)
    ref = torch.matmul(a, b)
    row: dict[str, Any] = {"set": tag, "M": m, "N": n, "K": k, "dtype": "bfloat16"}
    fns: dict[str, Any] = {"cublas": lambda: torch.matmul(a, b)}
    cfg = _default(m, n, k)
    row["cuteforge_config"] = repr(cfg)
    contenders: tuple[tuple[str, Any], ...] = (
        ("cuteforge", lambda: gemm(a, b)),
        ("cuteforge_pingpong", lambda: gemm(a, b, config=PINGPONG[0])),
        ("quack", lambda: q.gemm(a, b, tuned=False)),
    )
    tuned = _tuned("gemm_sm90_tn", m, n, k)
    if tuned is not None:  # gemm() runs the stored tuning result: time the heuristic's beside it
        row["cuteforge_config"] = repr(tuned)
        row["heuristic_config"] = repr(cfg)
        contenders += (("cuteforge_heuristic", lambda: gemm(a, b, config=cfg)),)
    if cfg.pingpong and cfg.tile_n == SHORT_K.tile_n:
        # The earlier short-K default: pingpong 128x128 (6 stages).
        narrow = fit_swizzle(SHORT_K_NARROW, m, n)
        row["pingpong128_config"] = repr(narrow)
        contenders += (("cuteforge_pingpong128", lambda: gemm(a, b, config=narrow)),)
    if cfg.swizzle != 8:
        # The default before its swizzle group was fitted to the problem (padding clusters).
        contenders += (("cuteforge_swizzle8", lambda: gemm(a, b, config=replace(cfg, swizzle=8))),)
    for name, fn in contenders:
        if name == "quack" and q is None:
            continue
        try:
            row[f"{name}_rel_err"] = _err(fn(), ref)
            fns[name] = fn
        except Exception as e:  # noqa: BLE001 - a failure is a finding, recorded
            row[f"{name}_error"] = f"{type(e).__name__}: {str(e)[:300]}"
    for name, ms in measure(fns).items():
        row[f"{name}_TFLOPs"] = tflops(m, n, k, ms)
    if "cuteforge_TFLOPs" in row:
        row["vs_cublas"] = round(row["cuteforge_TFLOPs"] / row["cublas_TFLOPs"], 3)
        if "quack_TFLOPs" in row:
            row["vs_quack"] = round(row["cuteforge_TFLOPs"] / row["quack_TFLOPs"], 3)
    for name, short in (("cuteforge_pingpong", "pingpong"), ("cuteforge_heuristic", "heuristic"),
                        ("cuteforge_pingpong128", "pingpong128")):
        if f"{name}_TFLOPs" in row:
            row[f"{short}_vs_cublas"] = round(row[f"{name}_TFLOPs"] / row["cublas_TFLOPs"], 3)
    print(json.dumps(row), flush=True)
    return row


def _fp8_inputs(m: int, n: int, k: int, rowwise: bool = False) -> tuple[torch.Tensor, ...]:
    """a (M, K) row-major, b = W.t() of an (N, K) weight, e4m3 with amax scales: per tensor
    (one element each), or rowwise (scale_a (M, 1), scale_b (1, N), as torch._scaled_mm)."""
    fp8 = torch.float8_e4m3fn
    out = []
    for rows in (m, n):
        x = torch.randn(rows, k, device="cuda")
        amax = x.abs().amax(dim=1, keepdim=True) if rowwise else x.abs().amax().reshape(1)
        s = (amax / torch.finfo(fp8).max).float()
        out += [(x / s).to(fp8), s]
    a, sa, w, sb = out
    return a, w.t(), sa, sb.t() if rowwise else sb


def _fp8_contenders(a: torch.Tensor, b: torch.Tensor, sa: torch.Tensor, sb: torch.Tensor, bias: torch.Tensor | None) -> tuple[dict, Any]:
    """torch._scaled_mm (default and fast accumulation; + eager gelu with a bias) and ours."""
    bf = torch.bfloat16

    def scaled(fast: bool) -> Any:
        if bias is None:
            return lambda: torch._scaled_mm(a, b, sa, sb, out_dtype=bf, use_fast_accum=fast)
        return lambda: F.gelu(torch._scaled_mm(a, b, sa, sb, bias=bias, out_dtype=bf, use_fast_accum=fast), approximate="tanh")

    if bias is None:
        ours = lambda: gemm(a, b, scale_a=sa, scale_b=sb)  # noqa: E731
    else:
        ours = lambda: gemm(a, b, scale_a=sa, scale_b=sb, bias=bias, epilogue="gelu")  # noqa: E731
    return {"scaled_mm": scaled(False), "scaled_mm_fast": scaled(True)}, ours


def fp8_rows(shapes: list[tuple[int, int, int]], scalings: list[str] = ["tensor"]) -> list[dict]:  # noqa: B006
    """cuteforge fp8 vs torch._scaled_mm (cuBLASLt), plain and bias + gelu, per scaling:
    "tensor" (one scale per operand) or "rowwise" (scale_a per row, scale_b per column)."""
    if not hasattr(torch, "_scaled_mm"):
        print("torch._scaled_mm unavailable: no fp8 rows")
        return []
    rows = []
    for (m, n, k), scaling in [(shape, sc) for shape in shapes for sc in scalings]:
        a, b, sa, sb = _fp8_inputs(m, n, k, rowwise=scaling == "rowwise")
        bias = torch.randn(n, device="cuda", dtype=torch.bfloat16)
        for ep in ("none", "bias+gelu"):
            row: dict[str, Any] = {"M": m, "N": n, "K": k, "dtype": "e4m3 x e4m3 -> bf16", "scaling": scaling, "epilogue": ep}
            torch_fns, ours = _fp8_contenders(a, b, sa, sb, None if ep == "none" else bias)
            fns: dict[str, Any] = {}
            ref = None
            for name, fn in torch_fns.items():
                try:
                    got = fn()
                    ref = got if ref is None else ref
                    fns[name] = fn
                except Exception as e:  # noqa: BLE001 - recorded
                    row[f"{name}_error"] = f"{type(e).__name__}: {str(e)[:300]}"
            try:
                got = ours()
                if ref is not None:
                    row["cuteforge_rel_err"] = _err(got, ref)
                fns["cuteforge"] = ours
                # the config the call runs: an epilogue (bias + gelu, or rowwise scales,
                # which ride as row / col operands) takes the fused default
                vectors = (2 if scaling == "rowwise" else 0) + (ep != "none")
                row["cuteforge_config"] = repr(_default(m, n, k, in_bytes=1, fused=vectors > 0, vector_operands=vectors,
                                                        scale_operands=2 if scaling == "rowwise" else 0))
            except Exception as e:  # noqa: BLE001
                row["cuteforge_error"] = f"{type(e).__name__}: {str(e)[:300]}"
            for name, ms in measure(fns).items():
                row[f"{name}_TFLOPs"] = tflops(m, n, k, ms)
            for name in torch_fns:
                if "cuteforge_TFLOPs" in row and f"{name}_TFLOPs" in row:
                    row[f"vs_{name}"] = round(row["cuteforge_TFLOPs"] / row[f"{name}_TFLOPs"], 3)
            print(json.dumps(row), flush=True)
            rows.append(row)
    return rows


def epilogues(shapes: list[tuple[int, int, int]], q: Any) -> list[dict]:
    return [r for m, n, k in shapes for r in epilogue_one(m, n, k, q)]


def epilogue_one(m: int, n: int, k: int, q: Any) -> list[dict]:
    rows = []
    a, b = _inputs(m, n, k)
    bias = torch.randn(n, device="cuda", dtype=torch.bfloat16)
    for act in ("gelu", "silu", "relu"):
        use_bias = act != "relu"  # relu(a @ b) is the no-bias case
        tf = {"gelu": lambda x: F.gelu(x, approximate="tanh"), "silu": F.silu, "relu": F.relu}[act]
        row: dict[str, Any] = {"M": m, "N": n, "K": k, "dtype": "bfloat16", "epilogue": ("bias+" if use_bias else "") + act}
        if use_bias:
            eager = lambda tf=tf: tf(torch.addmm(bias, a, b))  # noqa: E731 - cuBLASLt fuses the bias; act is a 2nd pass
            ours = lambda act=act: gemm(a, b, bias=bias, epilogue=act)  # noqa: E731
        else:
            eager = lambda tf=tf: tf(torch.matmul(a, b))  # noqa: E731
            ours = lambda act=act: gemm(a, b, epilogue=act)  # noqa: E731
        # cuBLAS's plain a @ b in the same rounds: what the eager epilogue adds to it, and
        # how the fused kernel stands against a GEMM with no epilogue at all (gemm.md,
        # at power-bound shapes the 1.05x bar asks for that)
        fns: dict[str, Any] = {"cublas_eager": eager, "cublas_plain": lambda: torch.matmul(a, b)}
        pp = lambda act=act, ub=use_bias: gemm(a, b, bias=bias if ub else None, epilogue=act, config=PINGPONG[0])  # noqa: E731
        contenders = [("cuteforge", ours), ("cuteforge_pingpong", pp)]
        heur = default_config(m, n, k, torch.cuda.get_device_properties(0).multi_processor_count, fused=True)
        row["cuteforge_config"] = repr(heur)
        tuned = _tuned("gemm_sm90_tn_col" if use_bias else "gemm_sm90_tn", m, n, k, act)
        if tuned is not None:  # gemm() runs the stored tuning result: time the heuristic's beside it
            row["cuteforge_config"], row["heuristic_config"] = repr(tuned), repr(heur)
            contenders.append(("cuteforge_heuristic", lambda act=act, ub=use_bias, c=heur: gemm(
                a, b, bias=bias if ub else None, epilogue=act, config=c)))
        if heur.pingpong and not _default(m, n, k).pingpong:
            # the cooperative 128x256 tile (64-wide subtiles): the default of a cheap epilogue
            coop = replace(_default(m, n, k), epi_n=64)
            row["cooperative_config"] = repr(coop)
            contenders.append(("cuteforge_cooperative", lambda act=act, ub=use_bias, c=coop: gemm(
                a, b, bias=bias if ub else None, epilogue=act, config=c)))
        for name, fn in contenders:
            try:
                row[f"{name}_rel_err"] = _err(fn(), eager())
                fns[name] = fn
            except Exception as e:  # noqa: BLE001
                row[f"{name}_error"] = f"{type(e).__name__}: {str(e)[:300]}"
        if q is not None:
            qa = {"gelu": "gelu_tanh_approx", "silu": "silu", "relu": "relu"}[act]
            fq = lambda qb=(bias if use_bias else None), qa=qa: q.gemm_act(a, b, bias=qb, activation=qa, store_preact=False, tuned=False)[1]  # noqa: E731
            try:
                row["quack_rel_err"] = _err(fq(), eager())
                fns["quack"] = fq
            except Exception as e:  # noqa: BLE001
                row["quack_error"] = f"{type(e).__name__}: {str(e)[:200]}"
        for name, ms in measure(fns).items():
            row[f"{name}_TFLOPs"] = tflops(m, n, k, ms)
        for name in ("cuteforge", "cuteforge_pingpong", "cuteforge_heuristic", "cuteforge_cooperative"):
            if f"{name}_TFLOPs" in row:
                row[f"{name}_vs_cublas_eager"] = round(row[f"{name}_TFLOPs"] / row["cublas_eager_TFLOPs"], 3)
        if "cuteforge_TFLOPs" in row:
            row["cuteforge_vs_cublas_plain"] = round(row["cuteforge_TFLOPs"] / row["cublas_plain_TFLOPs"], 3)
        row["eager_epilogue_cost"] = round(row["cublas_plain_TFLOPs"] / row["cublas_eager_TFLOPs"] - 1, 4)
        print(json.dumps(row), flush=True)
        rows.append(row)
    return rows


def compiled(shapes: list[tuple[int, int, int]]) -> list[dict]:
    """torch.compile(mode="max-autotune-no-cudagraphs") as a contender: a @ b against cuBLAS
    and cuteforge, and gelu(a @ b + bias) (Inductor fuses bias and gelu into its template's
    epilogue when a template wins) against cuBLAS addmm + eager gelu and cuteforge's fused
    epilogue. Each graph is compiled (and autotuned) once per shape before timing; the
    compile seconds are recorded."""
    return [compiled_one(m, n, k, epi) for m, n, k in shapes for epi in ("none", "bias+gelu")]


def _gelu(x: torch.Tensor) -> torch.Tensor:
    return F.gelu(x, approximate="tanh")


def compiled_one(m: int, n: int, k: int, epi: str) -> dict:
    a, b = _inputs(m, n, k)
    bias = torch.randn(n, device="cuda", dtype=torch.bfloat16)
    torch._dynamo.reset()
    row: dict[str, Any] = {"M": m, "N": n, "K": k, "dtype": "bfloat16", "epilogue": epi}
    if epi == "none":
        base, ref_fn, ours = "cublas", lambda: torch.matmul(a, b), lambda: gemm(a, b)
        graph = torch.compile(lambda a, b: a @ b, mode="max-autotune-no-cudagraphs", dynamic=False)
        comp = lambda: graph(a, b)  # noqa: E731
    else:
        base, ref_fn = "cublas_eager", lambda: _gelu(torch.addmm(bias, a, b))
        ours = lambda: gemm(a, b, bias=bias, epilogue="gelu")  # noqa: E731
        graph = torch.compile(lambda a, b, bias: _gelu(a @ b + bias), mode="max-autotune-no-cudagraphs", dynamic=False)
        comp = lambda: graph(a, b, bias)  # noqa: E731
    fns: dict[str, Any] = {base: ref_fn}
    ref = ref_fn()
    for name, fn in (("cuteforge", ours), ("compile_max_autotune", comp)):
        t = time.time()
        try:
            row[f"{name}_rel_err"] = _err(fn(), ref)  # the compile's first call also autotunes
            fns[name] = fn
        except Exception as e:  # noqa: BLE001 - a failure is a finding, recorded
            row[f"{name}_error"] = f"{type(e).__name__}: {str(e)[:300]}"
        row[f"{name}_first_call_seconds"] = round(time.time() - t, 1)
    for name, ms in measure(fns).items():
        row[f"{name}_TFLOPs"] = tflops(m, n, k, ms)
    for name in ("cuteforge", "compile_max_autotune"):
        if f"{name}_TFLOPs" in row:
            row[f"{name}_vs_{base}"] = round(row[f"{name}_TFLOPs"] / row[f"{base}_TFLOPs"], 3)
    if "cuteforge_TFLOPs" in row and "compile_max_autotune_TFLOPs" in row:
        row["cuteforge_vs_compile"] = round(row["cuteforge_TFLOPs"] / row["compile_max_autotune_TFLOPs"], 3)
    print(json.dumps(row), flush=True)
    return row


def sweep(shapes: list[tuple[int, int, int]], rows: list[dict], save: Any, fp8: bool = False,
          act: str | None = None, pick: Any = None) -> list[dict]:
    """Every candidate config at a few shapes: what the default and the tuner should pick.
    fp8: e4m3 inputs with per-tensor scales, against torch._scaled_mm(use_fast_accum=True).
    act: bf16 with a fused bias + act epilogue, against cuBLAS addmm + the eager act
    ("none": the bias alone, against addmm, which takes cuBLASLt's bias epilogue).
    pick(m, n, k, fused): the configs to time instead of the candidate lists."""
    from cuteforge.kernels.gemm.epilogue import GemmEpilogue
    from cuteforge.kernels.gemm.sm90.config import candidate_configs
    from cuteforge.kernels.gemm.spec import gemm_fp8_kernel, gemm_kernel

    epi = GemmEpilogue.preset(act, bias="col") if act else None
    kern = gemm_fp8_kernel() if fp8 else gemm_kernel(True, True, epi.kinds if epi else ())
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    params = (("sms", sms),) + ((("epilogue", epi.key),) if epi else ())
    for m, n, k in shapes:
        extra: tuple[torch.Tensor, ...] = ()
        if epi is not None:
            a, b = _inputs(m, n, k)
            bias = torch.randn(n, device="cuda", dtype=torch.bfloat16)
            extra = (bias,)
            tf = {"gelu": lambda x: F.gelu(x, approximate="tanh"), "silu": F.silu, "relu": F.relu,
                  "none": lambda x: x}[act]  # none: bias only, against cuBLASLt's bias epilogue
            cublas = lambda a=a, b=b, bias=bias, tf=tf: tf(torch.addmm(bias, a, b))  # noqa: E731
            cfgs = pick(m, n, k, True) if pick else candidate_configs(m, n) + EXTRA_CONFIGS + EPI_CONFIGS
        elif fp8:
            a, b, sa, sb = _fp8_inputs(m, n, k)
            extra = (sa, sb)
            cublas = lambda a=a, b=b, sa=sa, sb=sb: torch._scaled_mm(a, b, sa, sb, out_dtype=torch.bfloat16, use_fast_accum=True)  # noqa: E731
            cfgs = candidate_configs(m, n, in_bytes=1) + [replace(c, tile_k=128) for c in EXTRA_CONFIGS]
        else:
            a, b = _inputs(m, n, k)
            cublas = lambda a=a, b=b: torch.matmul(a, b)  # noqa: E731
            cfgs = pick(m, n, k, False) if pick else candidate_configs(m, n) + EXTRA_CONFIGS
        a3, b3 = a.unsqueeze(0), b.unsqueeze(0)
        out = torch.empty(1, m, n, device="cuda", dtype=torch.bfloat16)
        work = torch.zeros(sms * (128 * 256 + 1), dtype=torch.int32, device="cuda")  # any config's stream-K workspace
        key = kern.signature.bind((a3, b3, out, work, *extra))
        ref = cublas()
        fns: dict[str, Any] = {"cublas": cublas}
        errs: dict[str, Any] = {}
        for cfg in cfgs:
            try:
                fn = kern.get(key, tuple(sorted(params)), cfg)
                out.fill_(float("nan"))  # `out` is shared: a config that skips tiles must not inherit the last one's
                fn(a3, b3, out, work, *extra)
                errs[repr(cfg)] = _err(out[0], ref)
                fns[repr(cfg)] = lambda fn=fn, a3=a3, b3=b3, out=out, work=work, extra=extra: fn(a3, b3, out, work, *extra)
            except Exception as e:  # noqa: BLE001
                errs[repr(cfg)] = f"{type(e).__name__}: {str(e)[:300]}"
        ms = measure(fns)
        for name in [*fns, *[c for c in errs if c not in fns]]:
            row: dict[str, Any] = {"M": m, "N": n, "K": k, "config": name, "dtype": "e4m3" if fp8 else "bfloat16",
                                   "epilogue": f"bias+{act}" if act else None}
            if name in ms:
                row["TFLOPs"] = tflops(m, n, k, ms[name])
                row["vs_cublas"] = round(ms["cublas"] / ms[name], 3)
            if name in errs:
                row["rel_err" if isinstance(errs[name], float) else "error"] = errs[name]
            print(json.dumps(row), flush=True)
            rows.append(row)
        save()
    return rows


def _extra_configs() -> list[Any]:
    from cuteforge.kernels.gemm.sm90.config import GemmConfig

    return [
        GemmConfig(cluster_m=1, cluster_n=2, raster="n"),
        GemmConfig(tile_n=128, pingpong=True, raster="n"),
        GemmConfig(tile_n=128, pingpong=True, cluster_m=1, cluster_n=1),
        GemmConfig(tile_n=64, pingpong=True),
    ]


def _epi_configs() -> list[Any]:
    """Epilogue-heavy variants: sub-tile width and stage count change how long the
    non-overlapped epilogue of the cooperative kernel holds the SM."""
    from cuteforge.kernels.gemm.sm90.config import GemmConfig

    return [GemmConfig(epi_n=16), GemmConfig(epi_n=64), GemmConfig(stages=3), GemmConfig(stages=4),
            GemmConfig(tile_m=256, tile_n=128, epi_n=64), GemmConfig(tile_m=256, tile_n=128, cluster_m=1, cluster_n=2),
            GemmConfig(tile_m=128, tile_n=192), GemmConfig(tile_m=256, tile_n=192, cluster_m=1, cluster_n=2)]


EXTRA_CONFIGS: list[Any] = []
EPI_CONFIGS: list[Any] = []
PINGPONG: list[Any] = []  # the pingpong config measured next to the default


def _default(m: int, n: int, k: int, in_bytes: int = 2, fused: bool = False, vector_operands: int = 0,
             scale_operands: int = 0) -> Any:
    return default_config(m, n, k, torch.cuda.get_device_properties(0).multi_processor_count, in_bytes, fused=fused,
                          vector_operands=vector_operands, scale_operands=scale_operands)


def _tuned(kernel: str, m: int, n: int, k: int, act: str = "none") -> Any:
    """The config `gemm()` takes from the autotuner's store for this call (`cuteforge tune
    KERNEL --shapes MxNxK --param act=...` stored it), fitted as the op fits it; None when
    untuned (then it runs the heuristic's)."""
    from cuteforge.autotune import lookup
    from cuteforge.tune_cli import problem_factory

    p = problem_factory(kernel)((m, n, k), "bfloat16", {"act": act})
    best = lookup(kernel, p.key, p.params, p.dims)
    return None if best is None else fit_swizzle(best, m, n)


def _shapes(text: str) -> list[tuple[int, int, int]]:
    return [(int(m), int(n), int(k)) for m, n, k in (s.split("x") for s in text.split(",") if s)]


def plot(result: dict, path: Path) -> None:
    """Throughput relative to cuBLAS per shape, and fused epilogues vs cuBLAS + eager."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows, ep = result.get("plain", []), result.get("epilogue", [])
    fig, axes = plt.subplots(1, 2, figsize=(13, 4.6), gridspec_kw={"width_ratios": [3, 2]})
    ax = axes[0]
    names = (("cuteforge_TFLOPs", "cuteforge (default)"), ("cuteforge_pingpong_TFLOPs", "cuteforge pingpong 128x128"), ("quack_TFLOPs", "quack"))
    for i, (key, name) in enumerate(names):
        ax.bar([j + (i - 1) * 0.27 for j in range(len(rows))], [r.get(key, 0) / r["cublas_TFLOPs"] for r in rows], 0.27, label=name)
    ax.axhline(1.0, color="k", lw=0.8)
    ax.axhline(0.95, color="gray", lw=0.6, ls="--")
    ax.set_xticks(range(len(rows)))
    ax.set_xticklabels([f"{r['M']}x{r['N']}x{r['K']}" for r in rows], rotation=60, ha="right", fontsize=7)
    ax.set_ylabel("throughput / cuBLAS (same run)")
    ax.set_ylim(0.4, 1.15)
    ax.legend(fontsize=7, loc="lower right")
    ax.set_title(f"bf16 GEMM on {result.get('gpu')} (TN), vs torch.matmul", fontsize=9)
    ax = axes[1]
    ax.bar(range(len(ep)), [r.get("cuteforge_vs_cublas_eager", 0) for r in ep], 0.6)
    ax.axhline(1.0, color="k", lw=0.8)
    ax.axhline(1.05, color="gray", lw=0.6, ls="--")
    ax.set_xticks(range(len(ep)))
    ax.set_xticklabels([f"{r['M']}x{r['N']}x{r['K']}\n{r['epilogue']}" for r in ep], rotation=70, ha="right", fontsize=5.5)
    ax.set_ylim(0.8, 1.4)
    ax.set_title("fused epilogue vs cuBLAS + eager epilogue", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=90)


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--set", default="bar,square,skinny,epilogue")
    p.add_argument("--sweep-shapes", default="8192x8192x8192,4096x4096x4096,16384x16384x1024,2048x8192x28672")
    p.add_argument("--epilogue-shapes", default=",".join("x".join(map(str, s)) for s in EPILOGUE))
    p.add_argument("--shapes", default="", help="shapes of the 'custom' set (plain rows), e.g. 65536x128x4096")
    p.add_argument("--fp8-shapes", default="8192x8192x8192,4096x4096x4096", help="shapes of the fp8 and fp8sweep sets")
    p.add_argument("--fp8-scaling", default="tensor", help="the fp8 set's scalings: tensor, rowwise or both (comma-separated)")
    p.add_argument("--sweep-epilogue", default="gelu",
                   help="act of the 'episweep' set (bias + act fused): gelu, silu, relu, or none (bias only)")
    p.add_argument("--compile-shapes", default="8192x8192x8192,4096x4096x4096", help="shapes of the 'compile' set")
    p.add_argument("--out")
    p.add_argument("--plot", help="write a PNG of a results JSON (given as --out) and exit; no GPU needed")
    args = p.parse_args()
    if args.plot:
        plot(json.loads(Path(args.out).read_text()), Path(args.plot))
        return 0
    gpu = torch.cuda.get_device_name()
    name = gpu.lower().replace("nvidia ", "").replace(" ", "-")
    out = Path(args.out or Path(__file__).parent / "results" / f"{name}-gemm.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    q = _quack()
    EXTRA_CONFIGS[:] = _extra_configs()
    EPI_CONFIGS[:] = _epi_configs()
    from cuteforge.kernels.gemm.sm90.config import GemmConfig

    PINGPONG[:] = [GemmConfig(tile_n=128, pingpong=True)]
    result: dict[str, Any] = {
        **results_header(),
        "quack": getattr(sys.modules.get("quack"), "__version__", None),
        "layout": "A (M,K) row-major, B = W.t() with W (N,K): TN; bf16 in/out, fp32 accumulate",
        "timing": ("cuteforge.timing.events.bench: CUDA events, L2 flushed before each rep, median; the median of "
                   f"interleaved rounds (at least {ROUNDS}), each starting at a different contender; up to "
                   f"{BALANCED_UP_TO} contenders, each takes each position equally often"),
        "torch_compile": "the 'compile' set: torch.compile(mode='max-autotune-no-cudagraphs') at --compile-shapes",
    }
    t0 = time.time()
    sets = args.set.split(",")
    for tag, shapes in (("bar", BAR), ("square", SQUARE), ("skinny", SKINNY), ("shortk", SHORTK),
                        ("custom", _shapes(args.shapes))):
        if tag in sets:
            result.setdefault("plain", []).extend(plain([s for s in shapes if tag in ("bar", "custom") or s not in BAR], q, tag))
            write_results(out, result)
    if "backward" in sets:
        result["backward"] = backward("dW", BACKWARD_DW) + backward("dX", BACKWARD_DX)
        write_results(out, result)
    if "epilogue" in sets:
        result["epilogue"] = epilogues(_shapes(args.epilogue_shapes), q)
        write_results(out, result)
    if "sweep" in sets:
        result["config_sweep"] = []
        sweep(_shapes(args.sweep_shapes), result["config_sweep"], lambda: write_results(out, result, check=False))
    if "episweep" in sets:
        result["epilogue_config_sweep"] = []
        sweep(_shapes(args.sweep_shapes), result["epilogue_config_sweep"], lambda: write_results(out, result, check=False),
              act=args.sweep_epilogue)
    if "streamk" in sets:
        # the default config with and without the stream-K split, plain and fused, and
        # stream-K configs of other tiles (swizzle fitted to the problem, as defaults are)
        def pick(m: int, n: int, k: int, fused: bool) -> list[Any]:
            d = default_config(m, n, k, torch.cuda.get_device_properties(0).multi_processor_count, fused=fused)
            sk = GemmConfig(stream_k=True)
            tiles = [sk, replace(sk, cluster_m=1, cluster_n=2), replace(sk, tile_n=128),
                     replace(sk, tile_n=128, cluster_m=1, cluster_n=2)]
            if m <= 128:
                tiles += [replace(sk, tile_m=64, tile_n=128, cluster_m=1, cluster_n=2),
                          replace(sk, tile_m=64, tile_n=256, cluster_m=1, cluster_n=2)]
            twin = [replace(d, stream_k=not d.stream_k)] if not d.pingpong else []
            return list(dict.fromkeys([d, *twin, *[fit_swizzle(c, m, n) for c in tiles]]))

        result["streamk"] = []
        for act in [None, *[a for a in args.sweep_epilogue.split(",") if a]]:
            sweep(_shapes(args.sweep_shapes), result["streamk"], lambda: write_results(out, result, check=False),
                  act=act, pick=pick)
    if "raster" in sets or "defaults" in sets:
        sms = torch.cuda.get_device_properties(0).multi_processor_count

        def v44_default(m: int, n: int, k: int, fused: bool, heavy: bool) -> Any:
            """The earlier heuristic: stores not overlapped, and gelu / silu (`heavy`) with
            K <= 4096 on >= 4 waves of 128x128 tiles on pingpong 128x128 c1x2."""
            d = default_config(m, n, k, sms, fused=fused)
            if heavy and k <= 4096 and m > 128 and -(-m // 128) * -(-n // 128) >= 4 * sms:
                return fit_swizzle(GemmConfig(tile_n=128, pingpong=True, cluster_m=1, cluster_n=2), m, n)
            return replace(d, store_overlap=False)

        def pick_for(act: str | None):
            heavy = act in ("gelu", "silu")

            def pick(m: int, n: int, k: int, fused: bool) -> list[Any]:
                d = default_config(m, n, k, sms, fused=fused)
                if "defaults" in sets:
                    # today's default against the earlier one
                    return list(dict.fromkeys([d, v44_default(m, n, k, fused, heavy)]))
                # the default against its raster order flipped (swizzle fitted to the
                # problem), with and without stream-K, and the cooperative 128x256 2x1 tile
                out = []
                for c in (d, GemmConfig(), GemmConfig(stream_k=True)):
                    for r in ("m", "n"):
                        out += [fit_swizzle(replace(c, raster=r), m, n)]
                        if not c.pingpong:
                            out += [fit_swizzle(replace(c, raster=r, stream_k=not c.stream_k), m, n)]
                return list(dict.fromkeys([d, *out]))

            return pick

        tag = "defaults" if "defaults" in sets else "raster"
        result[tag] = []
        for act in [None, *[a for a in args.sweep_epilogue.split(",") if a]]:
            sweep(_shapes(args.sweep_shapes), result[tag], lambda: write_results(out, result, check=False),
                  act=act, pick=pick_for(act))
    if "compile" in sets:
        result["compile"] = compiled(_shapes(args.compile_shapes))
        write_results(out, result)
    if "fp8" in sets:
        result["fp8"] = fp8_rows(_shapes(args.fp8_shapes), args.fp8_scaling.split(","))
        write_results(out, result)
    if "fp8sweep" in sets and hasattr(torch, "_scaled_mm"):
        result["fp8_config_sweep"] = []
        sweep(_shapes(args.fp8_shapes), result["fp8_config_sweep"], lambda: write_results(out, result, check=False), fp8=True)
    result["seconds"] = round(time.time() - t0, 1)
    result["flagged"] = flag_errors(result)
    write_results(out, result)
    print("wrote", out)
    for f in result["flagged"]:
        print(f"WRONG RESULT (rel_err > {ERR_TOL}): {json.dumps(f)}", file=sys.stderr)
    return 1 if result["flagged"] else 0


if __name__ == "__main__":
    raise SystemExit(main())
