"""GPU timing shared by benchmarks, the `cuteforge` command and the autotuner.

`bench`: medians of CUDA-event measurements after a warm-up. Between repetitions a
buffer larger than L2 is rewritten, so each measurement starts with a cold cache, as a
kernel inside a real model would. `stream`: wall time per call of calls made back to back,
for calls bound by host time (small M / small N through autograd), where one event pair
around one call reads the host's jitter.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from typing import Any

import torch

_FLUSH: dict[int, torch.Tensor] = {}

# How `bench` evicts L2 before each timed call: "zero" writes a buffer 4x the L2 (as
# triton's do_bench), which leaves the L2 full of dirty lines that are written back to DRAM
# while the *timed* kernel runs (~9-11 us on the H200, measurable on a ~60 us memory-bound
# kernel); "read" streams the same buffer through a reduction, which evicts the L2 (and
# writes back the previous call's output, untimed) but leaves only clean lines.
FLUSH_MODES = ("zero", "read")
_flush_mode = "zero"


def set_flush_mode(mode: str) -> None:
    """Choose how `bench` flushes L2 (FLUSH_MODES); benchmark scripts expose it as --flush."""
    global _flush_mode
    if mode not in FLUSH_MODES:
        raise ValueError(f"flush mode {mode!r}: expected one of {FLUSH_MODES}")
    _flush_mode = mode


def _flush_buffer(device: int) -> torch.Tensor:
    if device not in _FLUSH:
        l2 = getattr(torch.cuda.get_device_properties(device), "L2_cache_size", 64 << 20)
        _FLUSH[device] = torch.empty(max(4 * l2, 256 << 20) // 4, dtype=torch.int32, device=device)
    return _FLUSH[device]


def bench(fn: Callable[[], Any], *, warmup_ms: float = 25.0, rep_ms: float = 100.0, flush_l2: bool = True) -> float:
    """Median milliseconds per call of `fn` on the current stream."""
    device = torch.cuda.current_device()
    flush = _flush_buffer(device) if flush_l2 else None
    fn()
    torch.cuda.synchronize()
    # Estimate a single call to size the warm-up and the repetitions.
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(5):
        fn()
    end.record()
    torch.cuda.synchronize()
    est = max(start.elapsed_time(end) / 5, 1e-3)
    for _ in range(max(1, int(warmup_ms / est))):
        fn()
    n = min(max(5, int(rep_ms / est)), 2000)
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(n)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(n)]
    for i in range(n):
        if flush is not None:
            if _flush_mode == "zero":
                flush.zero_()
            else:
                flush.sum()
        starts[i].record()
        fn()
        ends[i].record()
    torch.cuda.synchronize()
    return statistics.median(s.elapsed_time(e) for s, e in zip(starts, ends))


def stream(fns: dict[str, Callable[[], Any]], *, calls: int = 50, rounds: int = 15, warmup: int = 100,
           errors: dict[str, BaseException] | None = None) -> dict[str, float]:
    """Median milliseconds per call of each of ``fns`` called back to back: wall time of
    ``calls`` calls and the synchronize after them, divided by ``calls``; ``rounds`` rounds,
    each timing every contender once, starting at a different one each round.

    For calls too short for `bench`'s CUDA events: where the host takes longer per call
    than the GPU (a tiny backward through autograd: tens of us of host time for a few us of
    kernel), an event pair around one call after an L2 flush reads whichever of the two
    ends last, with the host's jitter. Back to back, a call costs what it costs a loop that
    makes it repeatedly, host or GPU, whichever is slower. No L2 flush: small inputs stay
    in L2 as they do in such a loop. ``calls`` is small enough that the launch queue does
    not fill for the tiny calls this is for. A contender that raises is dropped, the others
    timed on; its exception goes to ``errors`` when given, else it propagates.
    """
    import time

    if calls < 1 or rounds < 1:
        raise ValueError(f"calls={calls}, rounds={rounds}: both must be >= 1")
    names: list[str] = []

    def failed(name: str, e: BaseException) -> None:
        if errors is None:
            raise e
        errors[name] = e

    for name, fn in fns.items():
        try:
            for _ in range(warmup):
                fn()
            names.append(name)
        except Exception as e:  # noqa: BLE001 - reported through `errors`
            failed(name, e)
    torch.cuda.synchronize()
    samples: dict[str, list[float]] = {k: [] for k in names}
    for r in range(rounds):
        live = [k for k in names if k in samples]
        if not live:
            break
        for name in live[r % len(live):] + live[:r % len(live)]:
            fn = fns[name]
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            try:
                for _ in range(calls):
                    fn()
            except Exception as e:  # noqa: BLE001 - reported through `errors`
                del samples[name]
                failed(name, e)
                continue
            torch.cuda.synchronize()
            samples[name].append((time.perf_counter() - t0) / calls * 1e3)
    return {k: statistics.median(v) for k, v in samples.items()}


def host_us(fn: Callable[[], Any], calls: int = 200, loops: int = 50) -> float:
    """Median host microseconds per call over `loops` loops of `calls` calls.

    The GPU is synchronized between loops and a loop is short enough that the launch
    queue never fills: a full queue would block the host and measure the GPU instead.
    """
    return host_us_interleaved({"fn": fn}, calls, loops)["fn"]


def host_us_interleaved(fns: dict[str, Callable[[], Any]], calls: int = 200, loops: int = 50) -> dict[str, float]:
    """`host_us` of each of ``fns``, their loops interleaved (loop i times every function
    once, starting at a different one each loop): contenders compared in one call share
    the host's drift, which moves a separately measured median by 1-2 us. Each function is
    called 200 times first (warm-up)."""
    import time

    names = list(fns)
    for name in names:
        for _ in range(200):
            fns[name]()
    samples: dict[str, list[float]] = {k: [] for k in names}
    for i in range(loops):
        for name in names[i % len(names):] + names[:i % len(names)]:
            fn = fns[name]
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            for _ in range(calls):
                fn()
            samples[name].append((time.perf_counter() - t0) / calls * 1e6)
    torch.cuda.synchronize()
    return {k: statistics.median(v) for k, v in samples.items()}


def copy_bandwidth(nbytes: int = 2 << 30) -> float:
    """Device-to-device copy bandwidth in bytes/s (bytes read + bytes written)."""
    src = torch.empty(nbytes // 4, dtype=torch.float32, device="cuda").uniform_()
    dst = torch.empty_like(src)
    ms = bench(lambda: dst.copy_(src), flush_l2=False)
    return 2 * nbytes / (ms * 1e-3)
