"""The pointwise ops of a Llama layer: cuteforge vs torch eager, torch.compile and
Liger-Kernel, same run, same inputs.

  silu_mul           F.silu(gate) * up over (tokens, intermediate) rows
  rotary_embedding   transformers' apply_rotary_pos_emb on q (B, Hq, S, D) and k (B, Hk, S, D),
                     (B, S, H, D) projections transposed as attention layers hand them over;
                     rows M = B x S tokens of N = (Hq + Hk) x D elements

Per shape, dtype bf16, and contender: ``fwd`` (no grad) and ``fwd+bwd`` (the forward with
grad, then the backward of given output gradients). Bytes are the ideal traffic (each
input read and each output written once: silu_mul 3 and 8 rows-worth, rotary 2 and 4 of
q + k, with cos and sin); % of copy is against a device-to-device copy measured in the
same run (L2 flushed before every timed call).

Run on a GPU machine:  python benchmarks/bench_pointwise.py [--out FILE] [--no-compile]
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from cuteforge import ops
from cuteforge.bench.report import results_header, write_results
from cuteforge.timing import events as timing

# (tokens, intermediate) of the model benchmark's two sizes and of Llama-3-8B at 8192 tokens
SILU_MUL_SHAPES = [(4096, 2816), (4096, 14336), (8192, 14336)]
# (B, S, Hq, Hk, D): the model benchmark's small and large sizes, Llama-3-8B at 8192 tokens
ROTARY_SHAPES = [(2, 2048, 16, 8, 64), (2, 2048, 32, 8, 128), (4, 2048, 32, 8, 128)]


def _liger() -> dict[str, Any]:
    try:
        from liger_kernel.ops.rope import LigerRopeFunction
        from liger_kernel.ops.swiglu import LigerSiLUMulFunction
    except Exception as e:  # not installed: say so in the JSON
        return {"error": f"{type(e).__name__}: {e}"}
    return {"silu_mul": LigerSiLUMulFunction.apply, "rotary": lambda q, k, c, s: LigerRopeFunction.apply(q, k, c, s)}


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def torch_rotary(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> tuple[torch.Tensor, ...]:
    cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
    return q * cos + _rotate_half(q) * sin, k * cos + _rotate_half(k) * sin


def torch_silu_mul(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    return F.silu(gate) * up


def _time(row: dict[str, Any], phase: str, name: str, fn: Callable[[], Any], nbytes: int, copy_bps: float) -> None:
    try:
        with torch.no_grad() if phase == "fwd" else torch.enable_grad():
            ms = timing.bench(fn)
    except Exception as ex:  # a contender failing is a finding, not a crash
        row[f"{phase}_{name}_error"] = f"{type(ex).__name__}: {str(ex)[:200]}"
        return
    bps = nbytes / (ms * 1e-3)
    row[f"{phase}_{name}_us"] = round(ms * 1e3, 1)
    row[f"{phase}_{name}_GBps"] = round(bps / 1e9, 1)
    row[f"{phase}_{name}_pct_copy"] = round(100 * bps / copy_bps, 1)


def _contenders(torch_fn: Callable[..., Any], ours: Callable[..., Any], liger: Callable[..., Any] | None,
                compiled: bool) -> dict[str, Callable[..., Any]]:
    out = {"torch": torch_fn, "cuteforge": ours}
    if compiled:
        torch._dynamo.reset()
        out["torch.compile"] = torch.compile(torch_fn, dynamic=False)
    if liger is not None:
        out["liger"] = liger
    return out


def _outputs(result: Any) -> tuple[torch.Tensor, ...]:
    return result if isinstance(result, tuple) else (result,)


def measure(op: str, shape: tuple[int, ...], copy_bps: float, compiled: bool, liger: dict[str, Any]) -> dict[str, Any]:
    torch.manual_seed(0)
    dtype = torch.bfloat16
    if op == "silu_mul":
        m, n = shape
        inputs = [torch.randn(m, n, device="cuda", dtype=dtype) for _ in range(2)]
        extra: tuple[torch.Tensor, ...] = ()
        contenders = _contenders(torch_silu_mul, ops.silu_mul, liger.get("silu_mul"), compiled)
        row: dict[str, Any] = {"op": op, "M": m, "N": n}
        io = m * n * 2
        nbytes = {"fwd": 3 * io, "fwd+bwd": 8 * io}
    else:
        b, s, hq, hk, d = shape
        inputs = [torch.randn(b, s, h, d, device="cuda", dtype=dtype).transpose(1, 2) for h in (hq, hk)]
        pos = torch.arange(s, device="cuda", dtype=torch.float32)
        freqs = torch.outer(pos, 1.0 / 10000 ** (torch.arange(0, d, 2, device="cuda") / d))
        emb = torch.cat((freqs, freqs), -1)[None].expand(b, s, d)
        extra = (emb.cos().to(dtype).contiguous(), emb.sin().to(dtype).contiguous())
        contenders = _contenders(torch_rotary, ops.rotary_embedding, liger.get("rotary"), compiled)
        row = {"op": op, "M": b * s, "N": (hq + hk) * d, "B": b, "S": s, "Hq": hq, "Hk": hk, "D": d}
        io = (hq + hk) * b * s * d * 2
        nbytes = {"fwd": 2 * io + 2 * b * s * d * 2, "fwd+bwd": 4 * io + 2 * b * s * d * 2}
    row["dtype"] = "bfloat16"
    ref = _outputs(torch_silu_mul(*inputs) if op == "silu_mul" else torch_rotary(*inputs, *extra))
    leaves = [t.detach().clone().requires_grad_() for t in inputs]
    grads = [torch.randn_like(r) for r in ref]
    for name, fn in contenders.items():
        got = _outputs(fn(*[t.clone() if name == "liger" else t for t in inputs], *extra))  # liger rotates in place
        row[f"{name}_max_err"] = max(float((g.float() - r.float()).abs().max()) for g, r in zip(got, ref))

        def forward(fn: Callable[..., Any] = fn) -> Any:
            return fn(*inputs, *extra)

        def train(fn: Callable[..., Any] = fn) -> None:
            for t in leaves:
                t.grad = None
            torch.autograd.backward(_outputs(fn(*leaves, *extra)), grads)

        _time(row, "fwd", name, forward, nbytes["fwd"], copy_bps)
        _time(row, "fwd+bwd", name, train, nbytes["fwd+bwd"], copy_bps)
    for phase in ("fwd", "fwd+bwd"):
        ours = row.get(f"{phase}_cuteforge_us")
        for name in contenders:
            theirs = row.get(f"{phase}_{name}_us")
            if ours and theirs and name != "cuteforge":
                row[f"{phase}_speedup_vs_{name}"] = round(theirs / ours, 2)
    return row


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out")
    p.add_argument("--no-compile", action="store_true")
    args = p.parse_args()
    t0 = time.time()
    copy_bps = timing.copy_bandwidth()
    liger = _liger()
    result: dict[str, Any] = {**results_header(), "liger": liger.get("error", "liger-kernel"),
                              "copy_GBps": round(copy_bps / 1e9, 1)}
    for op, shapes in (("silu_mul", SILU_MUL_SHAPES), ("rotary_embedding", ROTARY_SHAPES)):
        result[op] = []
        for shape in shapes:
            row = measure(op, shape, copy_bps, not args.no_compile, liger)
            result[op].append(row)
            print(row, flush=True)
            torch.cuda.empty_cache()
    result["seconds"] = round(time.time() - t0, 1)
    out = Path(args.out or Path(__file__).parent / "results" / "h200-pointwise.json")
    write_results(out, result)
    print("wrote", out, "in", result["seconds"], "s")


if __name__ == "__main__":
    main()
