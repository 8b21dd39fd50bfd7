"""Shared by probes. The session-29 softmax probes: time one forward kernel on (x, y) and
write the rows as JSON with the command, the GPU and the copy bandwidth (bytes/s). The
session-34 GEMM probe: `PowerSamples` (SM clock and board power from nvidia-smi) and
`energy_mj` (NVML's board energy counter). The GEMM config probes (sessions 34, 36):
`shapes_arg`, `probe_args`, `add_row`, `ends_contenders`."""

from __future__ import annotations

import ctypes
import json
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import torch

from cuteforge import timing


def time_forward(fn: Callable[..., Any], x: torch.Tensor, y: torch.Tensor, ref: torch.Tensor, copy: float) -> dict:
    """fn(x, y) once into a NaN-filled y (an unwritten element shows as a NaN error), then
    its median time (L2 flushed): us, % of `copy` (x read, y written), max error."""
    y.fill_(float("nan"))
    fn(x, y)
    err = (y.float() - ref).abs().max().item()
    ms = timing.bench(lambda: fn(x, y))
    pct = 100 * 2 * x.numel() * x.element_size() / (ms * 1e-3) / copy
    return {"us": round(ms * 1e3, 1), "pct_copy": round(pct, 1), "max_err": err}


def dump(path: str | None, copy: float, rows: list[dict]) -> None:
    if path:
        with open(path, "w") as f:
            json.dump({"command": "python " + " ".join(sys.argv), "gpu": torch.cuda.get_device_name(),
                       "copy_Bps": copy, "rows": rows}, f, indent=1)


class PowerSamples:
    """`nvidia-smi -lms 50` in the background: (host time, SM MHz, W) samples, and their
    medians over the middle 60 % of a window."""

    def __init__(self) -> None:
        self.samples: list[tuple[float, float, float]] = []
        self.proc = subprocess.Popen(["nvidia-smi", "--query-gpu=clocks.sm,power.draw", "--format=csv,noheader,nounits",
                                      "-lms", "50"], stdout=subprocess.PIPE, text=True)
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.proc.stdout:  # type: ignore[union-attr]
            try:
                mhz, w = (float(x) for x in line.split(","))
            except ValueError:
                continue
            self.samples.append((time.perf_counter(), mhz, w))

    def window(self, t0: float, t1: float) -> dict:
        lo, hi = t0 + 0.2 * (t1 - t0), t0 + 0.8 * (t1 - t0)
        mid = [s for s in self.samples if lo <= s[0] <= hi]
        return {"sm_mhz": statistics.median(s[1] for s in mid) if mid else None,
                "watts": statistics.median(s[2] for s in mid) if mid else None, "samples": len(mid)}

    def stop(self) -> None:
        self.proc.terminate()


_NVML: list[Any] = []


def energy_mj(index: int = 0) -> int:
    """The board's energy counter (mJ since the driver loaded), NVML through ctypes."""
    if not _NVML:
        nvml = ctypes.CDLL("libnvidia-ml.so.1")
        assert nvml.nvmlInit_v2() == 0
        handle = ctypes.c_void_p()
        assert nvml.nvmlDeviceGetHandleByIndex_v2(index, ctypes.byref(handle)) == 0
        _NVML[:] = [nvml, handle]
    nvml, handle = _NVML
    e = ctypes.c_ulonglong()
    assert nvml.nvmlDeviceGetTotalEnergyConsumption(handle, ctypes.byref(e)) == 0
    return e.value


def back_to_back(fn: Callable[[], Any], seconds: float) -> dict:
    """fn called back to back for `seconds` (the host kept within 16 calls of the GPU):
    calls, ms per call (CUDA events over the loop), mJ per call (NVML), and the window's
    host times t0 / t1."""
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    j0 = energy_mj()
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    calls = 0
    e0.record()
    while time.perf_counter() - t0 < seconds:
        for _ in range(4):
            fn()
        calls += 4
        if calls % 16 == 0:
            torch.cuda.synchronize()
    e1.record()
    torch.cuda.synchronize()
    j1 = energy_mj()
    return {"calls": calls, "ms": round(e0.elapsed_time(e1) / calls, 4), "mJ_per_call": round((j1 - j0) / calls, 2),
            "t0": t0, "t1": time.perf_counter()}


def power_rounds(fns: dict[str, Callable[[], Any]], seconds: float, power: PowerSamples, **labels: Any) -> list[dict]:
    """Each of `fns` warmed up, then timed `back_to_back` in two rounds, the second in the
    opposite order (0.5 s apart): one row per window with `labels`, the clock and power."""
    for f in fns.values():
        f()
    rows = []
    names = list(fns)
    for rnd, order in enumerate((names, names[::-1])):
        for name in order:
            time.sleep(0.5)
            w = back_to_back(fns[name], seconds)
            rows.append({**labels, "name": name, "round": rnd, "calls": w["calls"], "ms": w["ms"],
                         "mJ_per_call": w["mJ_per_call"], **power.window(w["t0"], w["t1"])})
    return rows


def ends_contenders(gemm: Callable[..., Any], a: torch.Tensor, b: torch.Tensor, bias: torch.Tensor, cfg: Any, ends: Any,
                    fused: bool, cublas: Callable[[], Any]) -> dict[str, Callable[[], Any]]:
    """cuBLAS (`cublas`: the plain or the fused eager reference), `cfg` and `ends`; fused:
    bias + gelu, and `ends` also in the fused stream-K default's form ("ends32": 32-wide
    subtiles, operands loaded late)."""
    if not fused:
        return {"cublas": cublas, "default": lambda: gemm(a, b, config=cfg), "ends": lambda: gemm(a, b, config=ends)}
    ends32 = replace(ends, epi_n=32, early_operands=False)
    return {"cublas": cublas,
            "default": lambda: gemm(a, b, bias=bias, epilogue="gelu", config=cfg),
            "ends": lambda: gemm(a, b, bias=bias, epilogue="gelu", config=ends),
            "ends32": lambda: gemm(a, b, bias=bias, epilogue="gelu", config=ends32)}


def shapes_arg(i: int, shapes: list[tuple[int, ...]]) -> list[tuple[int, ...]]:
    """argv[i] as shapes (AxBxC,...), else the given defaults."""
    if len(sys.argv) > i:
        return [tuple(int(x) for x in s.split("x")) for s in sys.argv[i].split(",")]
    return shapes


def probe_args(script: str, passes: int, shapes: list[tuple[int, ...]]) -> tuple[int, list[tuple[int, ...]], dict]:
    """`script OUT.json [passes [shapes]]` (shapes as AxBxC,...; else the given defaults):
    (passes, shapes, the output dict with the command and the GPU, rows to come)."""
    if len(sys.argv) > 2:
        passes = int(sys.argv[2])
    shapes = shapes_arg(3, shapes)
    out = {"command": f"python benchmarks/probes/{script} OUT.json " + " ".join(sys.argv[2:]),
           "gpu": torch.cuda.get_device_name(), "rows": []}
    return passes, shapes, out


def add_row(out: dict, row: dict) -> None:
    """Print the row and rewrite argv[1] with it added (a run cut short keeps its rows)."""
    out["rows"].append(row)
    print(json.dumps(row), flush=True)
    with open(sys.argv[1], "w") as f:
        json.dump(out, f, indent=1)
