"""GEMM: cuteforge (sm_90a) vs cuBLAS (torch.matmul), cuBLAS + eager epilogue, and quack,
in one process on the same inputs. bf16 in, bf16 out, fp32 accumulate; A row-major
(M, K), B given as an nn.Linear weight (N, K) transposed (both K-major: "TN").

Writes benchmarks/results/<gpu>-gemm.json (or --out) with the command; the file is
rewritten after every shape so a run cut short still leaves its measurements.
torch.compile max-autotune is not a contender here: its per-shape autotuning takes
minutes, more than the GPU time this benchmark gets.

    python benchmarks/bench_gemm.py [--set bar,square,skinny,epilogue,sweep] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from cuteforge import timing
from cuteforge.ops.gemm import gemm

BAR = [(8192, 8192, 8192), (4096, 4096, 4096), (16384, 16384, 1024), (2048, 8192, 28672)]
SQUARE = [(s, s, s) for s in (1024, 2048, 4096, 8192, 16384)]
# 8B-model feature sizes (K, N): attention out / MLP up / MLP down; M = tokens in flight.
SKINNY = [(m, n, k) for m in (16, 128, 2048) for k, n in ((4096, 4096), (4096, 14336), (14336, 4096))]
EPILOGUE = [(8192, 8192, 8192), (4096, 4096, 4096), (16384, 16384, 1024), (2048, 8192, 28672), (2048, 14336, 4096)]


def _quack() -> Any:
    try:
        from quack import gemm_interface as q  # type: ignore[import-not-found]

        return q
    except Exception as e:  # noqa: BLE001 - any import failure means "no quack here"
        print("quack unavailable:", type(e).__name__, str(e)[:200])
        return None


def tflops(m: int, n: int, k: int, ms: float) -> float:
    return round(2 * m * n * k / (ms * 1e-3) / 1e12, 1)


def _inputs(m: int, n: int, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16)
    return a, w.t()


def _err(got: torch.Tensor, ref: torch.Tensor) -> float:
    return float((got.float() - ref.float()).abs().max() / ref.float().abs().max().clamp_min(1e-6))


def plain(shapes: list[tuple[int, int, int]], q: Any, tag: str) -> list[dict]:
    rows = [plain_one(m, n, k, q, tag) for m, n, k in shapes]
    return rows


def plain_one(m: int, n: int, k: int, q: Any, tag: str) -> dict:
    a, b = _inputs(m, n, k)
    ref = torch.matmul(a, b)
    row: dict[str, Any] = {"set": tag, "M": m, "N": n, "K": k}
    try:
        row["cuteforge_rel_err"] = _err(gemm(a, b), ref)
        row["cuteforge_TFLOPs"] = tflops(m, n, k, timing.bench(lambda: gemm(a, b)))
    except Exception as e:  # noqa: BLE001 - a failure is a finding, recorded
        row["cuteforge_error"] = f"{type(e).__name__}: {str(e)[:300]}"
    row["cublas_TFLOPs"] = tflops(m, n, k, timing.bench(lambda: torch.matmul(a, b)))
    if q is not None:
        try:
            row["quack_rel_err"] = _err(q.gemm(a, b, tuned=False), ref)
            row["quack_TFLOPs"] = tflops(m, n, k, timing.bench(lambda: q.gemm(a, b, tuned=False)))
        except Exception as e:  # noqa: BLE001
            row["quack_error"] = f"{type(e).__name__}: {str(e)[:200]}"
    if "cuteforge_TFLOPs" in row:
        row["vs_cublas"] = round(row["cuteforge_TFLOPs"] / row["cublas_TFLOPs"], 3)
        if "quack_TFLOPs" in row:
            row["vs_quack"] = round(row["cuteforge_TFLOPs"] / row["quack_TFLOPs"], 3)
    print(json.dumps(row), flush=True)
    return row


def epilogues(shapes: list[tuple[int, int, int]], q: Any) -> list[dict]:
    return [r for m, n, k in shapes for r in epilogue_one(m, n, k, q)]


def epilogue_one(m: int, n: int, k: int, q: Any) -> list[dict]:
    rows = []
    a, b = _inputs(m, n, k)
    bias = torch.randn(n, device="cuda", dtype=torch.bfloat16)
    for act in ("gelu", "silu", "relu"):
        use_bias = act != "relu"  # relu(a @ b) is the no-bias case
        tf = {"gelu": lambda x: F.gelu(x, approximate="tanh"), "silu": F.silu, "relu": F.relu}[act]
        row: dict[str, Any] = {"M": m, "N": n, "K": k, "epilogue": ("bias+" if use_bias else "") + act}
        if use_bias:
            eager = lambda tf=tf: tf(torch.addmm(bias, a, b))  # noqa: E731 - cuBLASLt fuses the bias; act is a 2nd pass
            ours = lambda act=act: gemm(a, b, bias=bias, epilogue=act)  # noqa: E731
        else:
            eager = lambda tf=tf: tf(torch.matmul(a, b))  # noqa: E731
            ours = lambda act=act: gemm(a, b, epilogue=act)  # noqa: E731
        try:
            row["cuteforge_rel_err"] = _err(ours(), eager())
            row["cuteforge_TFLOPs"] = tflops(m, n, k, timing.bench(ours))
        except Exception as e:  # noqa: BLE001
            row["cuteforge_error"] = f"{type(e).__name__}: {str(e)[:300]}"
        row["cublas_eager_TFLOPs"] = tflops(m, n, k, timing.bench(eager))
        if q is not None and act in ("gelu", "silu", "relu"):
            qa = {"gelu": "gelu_tanh_approx", "silu": "silu", "relu": "relu"}[act]
            try:
                fq = lambda qb=(bias if use_bias else None), qa=qa: q.gemm_act(a, b, bias=qb, activation=qa, store_preact=False, tuned=False)[1]  # noqa: E731
                row["quack_rel_err"] = _err(fq(), eager())
                row["quack_TFLOPs"] = tflops(m, n, k, timing.bench(fq))
            except Exception as e:  # noqa: BLE001
                row["quack_error"] = f"{type(e).__name__}: {str(e)[:200]}"
        if "cuteforge_TFLOPs" in row:
            row["vs_cublas_eager"] = round(row["cuteforge_TFLOPs"] / row["cublas_eager_TFLOPs"], 3)
        print(json.dumps(row), flush=True)
        rows.append(row)
    return rows


def sweep(shapes: list[tuple[int, int, int]]) -> list[dict]:
    """Every candidate config at a few shapes: what the default and the tuner should pick."""
    from cuteforge.kernels.gemm.sm90.config import candidate_configs
    from cuteforge.kernels.gemm.spec import gemm_kernel

    kern = gemm_kernel(True, True)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    rows = []
    for m, n, k in shapes:
        a, b = _inputs(m, n, k)
        a3, b3 = a.unsqueeze(0), b.unsqueeze(0)
        out = torch.empty(1, m, n, device="cuda", dtype=torch.bfloat16)
        key = kern.signature.bind((a3, b3, out))
        ref = torch.matmul(a, b)
        for cfg in candidate_configs(m, n):
            row: dict[str, Any] = {"M": m, "N": n, "K": k, "config": repr(cfg)}
            try:
                fn = kern.get(key, (("sms", sms),), cfg)
                fn(a3, b3, out)
                row["rel_err"] = _err(out[0], ref)
                row["TFLOPs"] = tflops(m, n, k, timing.bench(lambda fn=fn, a3=a3, b3=b3, out=out: fn(a3, b3, out)))
            except Exception as e:  # noqa: BLE001
                row["error"] = f"{type(e).__name__}: {str(e)[:300]}"
            print(json.dumps(row), flush=True)
            rows.append(row)
    return rows


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--set", default="bar,square,skinny,epilogue")
    p.add_argument("--sweep-shapes", default="8192x8192x8192,4096x4096x4096,16384x16384x1024,2048x8192x28672")
    p.add_argument("--out")
    args = p.parse_args()
    gpu = torch.cuda.get_device_name()
    name = gpu.lower().replace("nvidia ", "").replace(" ", "-")
    out = Path(args.out or Path(__file__).parent / "results" / f"{name}-gemm.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    q = _quack()
    result: dict[str, Any] = {
        "command": "python benchmarks/bench_gemm.py " + " ".join(sys.argv[1:]),
        "gpu": gpu,
        "torch": torch.__version__,
        "quack": getattr(sys.modules.get("quack"), "__version__", None),
        "layout": "A (M,K) row-major, B = W.t() with W (N,K): TN; bf16 in/out, fp32 accumulate",
        "timing": "cuteforge.timing.bench: CUDA events, L2 flushed before each rep, median",
        "torch_compile": "not measured (max-autotune tuning per shape exceeds this run's GPU time)",
    }
    t0 = time.time()
    sets = args.set.split(",")
    for tag, shapes in (("bar", BAR), ("square", SQUARE), ("skinny", SKINNY)):
        if tag in sets:
            result.setdefault("plain", []).extend(plain([s for s in shapes if tag == "bar" or s not in BAR], q, tag))
            out.write_text(json.dumps(result, indent=1))
    if "epilogue" in sets:
        result["epilogue"] = epilogues(EPILOGUE, q)
        out.write_text(json.dumps(result, indent=1))
    if "sweep" in sets:
        shapes = [tuple(int(v) for v in s.split("x")) for s in args.sweep_shapes.split(",")]
        result["config_sweep"] = sweep(shapes)  # type: ignore[arg-type]
    result["seconds"] = round(time.time() - t0, 1)
    out.write_text(json.dumps(result, indent=1))
    print("wrote", out)


if __name__ == "__main__":
    main()
