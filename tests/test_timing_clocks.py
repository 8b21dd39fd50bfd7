"""`cuteforge.timing.clocks`: nvidia-smi's samples parsed and summarized, and the sampler
run against a stand-in nvidia-smi (no GPU needed)."""

from __future__ import annotations

import os
import stat
import time
from pathlib import Path

import pytest

from cuteforge.timing import clocks


def test_parse_samples_keeps_whole_lines_only() -> None:
    text = "1980, 121.5, 700.00\n1545, 690.2, 700.00\n[N/A], 80.0, 700.00\n1455, 691\n\n"
    assert clocks.parse_samples(text) == [(1980.0, 121.5, 700.0), (1545.0, 690.2, 700.0)]


def test_summary_of_samples() -> None:
    s = clocks.summarize([(1980.0, 120.0, 700.0), (1500.0, 690.0, 700.0), (1600.0, 689.0, 700.0)])
    assert s == {"samples": 3, "sm_mhz_median": 1600.0, "sm_mhz_min": 1500.0, "sm_mhz_max": 1980.0,
                 "power_w_median": 689.0, "power_w_max": 690.0, "power_limit_w": 700.0}
    assert clocks.summarize([]) is None


def _stand_in(tmp_path: Path, body: str) -> None:
    exe = tmp_path / "nvidia-smi"
    exe.write_text("#!/bin/sh\n" + body)
    exe.chmod(exe.stat().st_mode | stat.S_IEXEC)


@pytest.mark.skipif(os.name != "posix", reason="a shell-script stand-in for nvidia-smi")
def test_sampler_reads_the_samples_written_while_it_ran(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # the stand-in records its arguments, then prints a sample every 10 ms until stopped
    _stand_in(tmp_path, f'echo "$@" > {tmp_path}/args\nwhile true; do echo "1500, 690.5, 700.00"; sleep 0.01; done\n')
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    with clocks.ClockSampler(interval_ms=10) as sampler:
        time.sleep(0.3)
    s = sampler.summary()
    assert s is not None and s["samples"] >= 2
    assert (s["sm_mhz_median"], s["power_w_median"], s["power_limit_w"]) == (1500.0, 690.5, 700.0)
    args = (tmp_path / "args").read_text()
    assert f"--query-gpu={clocks.QUERY}" in args and "--loop-ms=10" in args


@pytest.mark.skipif(os.name != "posix", reason="a shell-script stand-in for nvidia-smi")
def test_sampler_waits_for_the_first_sample(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # the stand-in takes 0.3 s to start; a phase shorter than that still gets its samples
    _stand_in(tmp_path, 'sleep 0.3\nwhile true; do echo "1980, 120.0, 700.00"; sleep 0.01; done\n')
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    with clocks.ClockSampler(interval_ms=10) as sampler:
        pass
    assert sampler.summary() is not None and sampler.error is None


def test_sampler_without_nvidia_smi_summarizes_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))  # an empty directory: no nvidia-smi
    with clocks.ClockSampler() as sampler:
        pass
    assert sampler.summary() is None and sampler.error == "nvidia-smi not found"


@pytest.mark.skipif(os.name != "posix", reason="a shell-script stand-in for nvidia-smi")
def test_sampler_says_why_nvidia_smi_gave_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _stand_in(tmp_path, 'echo "No devices were found" >&2\nexit 6\n')
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    with clocks.ClockSampler(first_sample_s=0.5) as sampler:
        time.sleep(0.1)
    assert sampler.summary() is None
    assert sampler.error == "nvidia-smi gave no samples (exit code 6): No devices were found"
