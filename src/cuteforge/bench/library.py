"""Measuring library ops against torch (and quack where it has the op) on the GPU at hand:
`cuteforge library`, `cuteforge bench` and benchmarks/ share this one table of ops.

Bandwidth counts the bytes a kernel must move once (inputs read, outputs written) and is
compared with a device-to-device copy measured in the same run. A backward is timed
through autograd (`torch.autograd.grad` of a saved forward), the way training calls it.
"""

from __future__ import annotations

import statistics
import traceback
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

from ..timing import events as timing

REDUCTIONS = ("sum", "mean", "amax", "amin", "argmax")
OPS = (*REDUCTIONS, "softmax", "log_softmax", "rms_norm", "layer_norm", "cross_entropy")
WITH_BACKWARD = ("softmax", "log_softmax", "rms_norm", "layer_norm", "cross_entropy")

REDUCTION_SHAPES = [(32768, 4096), (16384, 16384), (4096, 65536), (32768, 256), (32768, 1024), (8, 262144)]
QUICK_SHAPES = [(32768, 4096), (16384, 16384), (4096, 65536)]

Fn = Callable[..., torch.Tensor]


def check_op(op: str) -> None:
    if op not in OPS:
        raise ValueError(f"unknown op {op!r}; known: {', '.join(OPS)}")


def inputs(op: str, m: int, n: int, dtype: torch.dtype) -> tuple[torch.Tensor, ...]:
    """The op's inputs: x (M, N), plus weight and bias (N,) for norms, targets for cross-entropy."""
    x = torch.randn(m, n, device="cuda", dtype=dtype)
    if op in ("rms_norm", "layer_norm"):
        return (x, torch.randn(n, device="cuda", dtype=dtype), torch.randn(n, device="cuda", dtype=dtype))
    if op == "cross_entropy":
        return (x, torch.randint(0, n, (m,), device="cuda"))
    return (x,)


def torch_fn(op: str) -> Fn:
    if op in REDUCTIONS:
        return lambda x: getattr(torch, op)(x, dim=-1)
    return {
        "softmax": lambda x: torch.softmax(x, -1),
        "log_softmax": lambda x: torch.log_softmax(x, -1),
        "rms_norm": lambda x, w, b: F.rms_norm(x, (x.shape[-1],), w, 1e-6),
        "layer_norm": lambda x, w, b: F.layer_norm(x, (x.shape[-1],), w, b, 1e-5),
        "cross_entropy": lambda x, t: F.cross_entropy(x, t),
    }[op]


def cuteforge_fn(op: str) -> Fn:
    import cuteforge.ops as ops

    f = getattr(ops, op)
    if op == "rms_norm":
        return lambda x, w, b: f(x, w, 1e-6)
    if op == "layer_norm":
        return lambda x, w, b: f(x, w, b, 1e-5)
    return f


def quack_fn(op: str) -> Fn | None:
    """quack's version of the op, where quack (0.6.5) has one with autograd, else None."""
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
    return None


def contenders(op: str, compiled: bool = True, with_quack: bool = True) -> dict[str, Fn]:
    """torch first (the reference), then cuteforge, torch.compile and quack."""
    out: dict[str, Fn] = {"torch": torch_fn(op), "cuteforge": cuteforge_fn(op)}
    if compiled:
        out["torch.compile"] = torch.compile(torch_fn(op), dynamic=False)
    q = quack_fn(op) if with_quack else None
    if q is not None:
        out["quack"] = q
    return out


def bytes_moved(op: str, ins: tuple[torch.Tensor, ...], backward: bool) -> int:
    x = ins[0]
    xb = x.numel() * x.element_size()
    m, n = x.shape
    if op in REDUCTIONS:
        return xb + m * (8 if op == "argmax" else x.element_size())
    if op == "cross_entropy":  # fwd: logits + targets in, loss and lse out; bwd: logits in, dlogits out
        return xb * (2 if backward else 1) + m * 8 * (1 if backward else 2)
    if op in ("rms_norm", "layer_norm"):  # fwd: x in, y out; bwd: x, dy in, dx out (+ small params)
        return xb * (3 if backward else 2) + n * x.element_size() * (2 if op == "layer_norm" else 1)
    return xb * (3 if backward else 2)  # softmax family: fwd x -> y; bwd y, dy -> dx


def _close(got: torch.Tensor, ref: torch.Tensor, op: str, dtype: torch.dtype, n: int) -> bool:
    if op == "argmax":
        return bool((got == ref).all())
    tol = 2e-2 if dtype != torch.float32 else 1e-3
    atol = tol * n**0.5 if op in ("sum", "mean") else tol  # fp32 sums over n drift like sqrt(n)
    return bool(torch.allclose(got.float(), ref.float(), rtol=tol, atol=atol))


TIMERS = ("event", "stream")


def measure(op: str, m: int, n: int, dtype: torch.dtype, fns: dict[str, Fn], copy_bps: float, backward: bool = False,
            warmup_ms: float = 25.0, rep_ms: float = 100.0, timer: str = "event",
            train_params: bool = False, repeat: int = 1) -> dict[str, Any]:
    """One row: per contender us, GB/s, % of copy; `correct` compares cuteforge with torch.
    ``timer``: "event" (`timing.bench`, L2 flushed, each contender in turn) or "stream"
    (`timing.stream`, back-to-back calls, contenders interleaved: for host-bound small
    shapes). ``train_params``: a norm's weight and bias require grad, and the backward
    returns their gradients too (training; without it they are frozen, and both torch
    and cuteforge skip dweight / dbias); `correct` still compares dx only. ``repeat``: that
    many timing runs (stream: `timing.stream` runs; event: each contender timed once per
    run, the order rotated by one each run so that no contender always goes first); each
    contender's time is its median over them, and the row keeps each run's torch /
    cuteforge and quack / cuteforge ratios (`cuteforge_over_torch_reps`,
    `cuteforge_over_quack_reps`), to tell a real gap from one run's noise."""
    if timer not in TIMERS:
        raise ValueError(f"timer={timer!r}: expected one of {TIMERS}")
    ins = inputs(op, m, n, dtype)
    row: dict[str, Any] = {"op": op + ("_bwd" if backward else ""), "M": m, "N": n,
                           "dtype": str(dtype).removeprefix("torch.")}
    train = backward and train_params and op in ("rms_norm", "layer_norm")
    if train:
        row["train_params"] = True
    if timer != "event":
        row["timer"] = timer
    nbytes = bytes_moved(op, ins, backward)
    ref = None
    dys: list[torch.Tensor] = []  # one upstream gradient, shared by every contender
    calls: dict[str, Callable[[], Any]] = {}
    times: dict[str, float] = {}  # ms per call
    for name, fn in fns.items():
        try:
            if backward:
                # x, and with train_params the norm's weight and bias (the rms contenders
                # ignore their bias: it gets no gradient, allow_unused)
                leaves = [t.detach().requires_grad_(i == 0 or train) for i, t in enumerate(ins)]
                wrt = leaves if train else leaves[:1]
                y = fn(*leaves)
                if not dys:
                    dys.append(torch.randn_like(y))
                dy = dys[0]
                out = torch.autograd.grad(y, wrt, dy, retain_graph=True, allow_unused=True)[0]

                def call(y: torch.Tensor = y, wrt: list[torch.Tensor] = wrt, dy: torch.Tensor = dy) -> Any:
                    return torch.autograd.grad(y, wrt, dy, retain_graph=True, allow_unused=True)
            else:
                out = fn(*ins)

                def call(fn: Fn = fn) -> Any:
                    return fn(*ins)

            if name == "torch":
                ref = out
            elif ref is not None:
                row[f"{name}_correct"] = _close(out, ref, op, dtype, n)
            calls[name] = call  # timed below; kept alive (with its autograd graph) until then
        except Exception as e:  # record and go on: one failing contender must not end a sweep
            row[f"{name}_error"] = f"{type(e).__name__}: {(str(e).splitlines() or [''])[0][:200]}"
            traceback.print_exc(limit=2)
    errors: dict[str, BaseException] = {}
    if timer == "stream":
        reps = [timing.stream({k: c for k, c in calls.items() if k not in errors}, errors=errors)
                for _ in range(max(1, repeat))]
    else:
        reps = [_event_run(calls, i, errors, warmup_ms, rep_ms) for i in range(max(1, repeat))]
    times = {k: statistics.median(r[k] for r in reps) for k in calls if k not in errors}
    for other in ("torch", "quack"):
        if repeat > 1 and other in times and "cuteforge" in times:
            row[f"cuteforge_over_{other}_reps"] = [round(r[other] / r["cuteforge"], 3) for r in reps]
    for name, e in errors.items():  # that contender dropped, the others timed
        row[f"{name}_error"] = f"{type(e).__name__}: {(str(e).splitlines() or [''])[0][:200]}"
    for name, ms in times.items():
        row[f"{name}_us"] = round(ms * 1e3, 2)
        row[f"{name}_GBps"] = round(nbytes / (ms * 1e-3) / 1e9, 1)
        row[f"{name}_pct_copy"] = round(100 * nbytes / (ms * 1e-3) / copy_bps, 1)
    row["correct"] = row.get("cuteforge_correct")
    for other in ("quack", "torch"):
        # from the unrounded times: at a few rows the GB/s fields round to 0.0-0.3
        if times.get("cuteforge") and times.get(other):
            row[f"cuteforge_over_{other}"] = round(times[other] / times["cuteforge"], 3)
    return row


def _event_run(calls: dict[str, Callable[[], Any]], run: int, errors: dict[str, BaseException],
               warmup_ms: float, rep_ms: float) -> dict[str, float]:
    """One run of the event timer: each contender not yet failed timed once (`timing.bench`,
    L2 flushed), starting with the `run`-th (mod their number) so that over runs each
    takes each place in the order. A contender that raises is put in `errors` and dropped."""
    names = [k for k in calls if k not in errors]
    first = run % len(names) if names else 0
    times: dict[str, float] = {}
    for name in names[first:] + names[:first]:
        try:
            times[name] = timing.bench(calls[name], warmup_ms=warmup_ms, rep_ms=rep_ms)
        except Exception as e:
            errors[name] = e
            traceback.print_exc(limit=2)
    return times


def measure_shapes(op: str, shapes: list[tuple[int, int]], dtype: torch.dtype, copy_bps: float, compiled: bool = True,
                   backward: bool = False, with_quack: bool = True) -> list[dict[str, Any]]:
    """Rows for `op` over `shapes` (a fresh torch.compile per shape, after a reset:
    dynamo's recompile limit would otherwise run later shapes eagerly)."""
    rows = []
    for m, n in shapes:
        torch._dynamo.reset()
        rows.append(measure(op, m, n, dtype, contenders(op, compiled, with_quack), copy_bps, backward))
        torch.cuda.empty_cache()
    return rows
