"""The GPU's SM clock and board power over a region of a benchmark, sampled by nvidia-smi.

A long run of large GEMMs holds an H200 at its power limit, where the SM clock drops
well below its boost clock, while a short burst after an idle spell may not reach that
limit. Kernel times profiled in such bursts can then add up to less than the sustained
steps take. Recording the clock and the power next to the timed rounds says which
regime they ran in.

    with ClockSampler() as clocks:
        ...timed rounds...
    row["gpu_clocks"] = clocks.summary()  # None where nvidia-smi is not there
"""

from __future__ import annotations

import os
import shutil
import statistics
import subprocess
import tempfile
import time
from typing import Any

import torch

QUERY = "clocks.sm,power.draw,power.limit"


def parse_samples(text: str) -> list[tuple[float, float, float]]:
    """(SM MHz, board W, power limit W) per line of ``nvidia-smi --query-gpu=QUERY
    --format=csv,noheader,nounits``; lines with a field it could not read ("[N/A]") are left out."""
    out = []
    for line in text.splitlines():
        fields = [f.strip() for f in line.split(",")]
        if len(fields) != 3:
            continue
        try:
            out.append((float(fields[0]), float(fields[1]), float(fields[2])))
        except ValueError:
            continue
    return out


def summarize(samples: list[tuple[float, float, float]]) -> dict[str, Any] | None:
    """Median and extreme SM clock and board power of the samples, with the power limit."""
    if not samples:
        return None
    mhz, watts, limit = zip(*samples)
    return {"samples": len(samples), "sm_mhz_median": statistics.median(mhz), "sm_mhz_min": min(mhz),
            "sm_mhz_max": max(mhz), "power_w_median": round(statistics.median(watts), 1),
            "power_w_max": round(max(watts), 1), "power_limit_w": round(max(limit), 1)}


class ClockSampler:
    """Samples a CUDA device's (default: the current one's) SM clock and board power every
    ``interval_ms`` (an nvidia-smi process in the background) between ``__enter__`` and
    ``__exit__``; ``__enter__`` returns once the first sample is in (at most
    ``first_sample_s``), so a short phase is not missed while nvidia-smi starts. The
    sampling process polls from another core. ``summary()`` is None where nvidia-smi is
    missing or gave no samples, and ``error`` then says why: the benchmark runs on either
    way."""

    def __init__(self, interval_ms: int = 100, device: int | None = None, first_sample_s: float = 2.0) -> None:
        self.interval_ms = interval_ms
        self.device = device
        self.first_sample_s = first_sample_s
        self.error: str | None = None
        self._proc: subprocess.Popen[bytes] | None = None
        self._out: Any = None
        self._err: Any = None
        self._samples: list[tuple[float, float, float]] = []

    def _select(self) -> list[str]:
        # nvidia-smi numbers GPUs by PCI order whatever CUDA_VISIBLE_DEVICES says: pick by UUID
        if not torch.cuda.is_available():
            return []
        device = torch.cuda.current_device() if self.device is None else self.device
        uuid = str(getattr(torch.cuda.get_device_properties(device), "uuid", "") or "")
        if not uuid:
            return []
        return ["-i", uuid if uuid.startswith(("GPU-", "MIG-")) else f"GPU-{uuid}"]

    def __enter__(self) -> ClockSampler:
        exe = shutil.which("nvidia-smi")
        if exe is None:
            self.error = "nvidia-smi not found"
            return self
        # files, not pipes: a pipe nobody reads would stall the sampling once full
        self._out, self._err = tempfile.TemporaryFile(), tempfile.TemporaryFile()
        try:
            cmd = [exe, *self._select(), f"--query-gpu={QUERY}", "--format=csv,noheader,nounits",
                   f"--loop-ms={self.interval_ms}"]
            self._proc = subprocess.Popen(cmd, stdout=self._out, stderr=self._err)
        except (OSError, RuntimeError) as e:
            self.error = f"nvidia-smi did not start: {e}"
            self._close_files()
            return self
        deadline = time.monotonic() + self.first_sample_s
        while time.monotonic() < deadline and self._proc.poll() is None and not os.fstat(self._out.fileno()).st_size:
            time.sleep(0.01)
        return self

    def __exit__(self, *exc: object) -> None:
        if self._proc is None:
            return
        exited = self._proc.poll()  # None: still sampling, as it should be
        self._proc.terminate()
        try:
            self._proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()
        self._out.seek(0)
        self._samples = parse_samples(self._out.read().decode(errors="replace"))
        if not self._samples:
            self._err.seek(0)
            why = self._err.read().decode(errors="replace").strip()[-300:]
            code = "" if exited is None else f" (exit code {exited})"
            self.error = f"nvidia-smi gave no samples{code}" + (f": {why}" if why else "")
        self._close_files()
        self._proc = None

    def _close_files(self) -> None:
        for f in (self._out, self._err):
            if f is not None:
                f.close()
        self._out = self._err = None

    def summary(self) -> dict[str, Any] | None:
        return summarize(self._samples)
