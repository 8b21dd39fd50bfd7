"""ptxas on generated PTX, for the CPU compile tests that check registers and spills."""

from __future__ import annotations

import os
import subprocess
import tempfile

import pytest


def ptxas_report(ptx: str) -> str:
    """ptxas -v's report on ptx for sm_90a, asserting it assembles (the test skips where
    ptxas is not installed)."""
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "k.ptx")
        with open(path, "w") as f:
            f.write(ptx)
        try:
            out = subprocess.run(["ptxas", "-arch=sm_90a", "-v", path, "-o", os.path.join(d, "k.cubin")],
                                 capture_output=True, text=True, timeout=120)
        except FileNotFoundError:
            pytest.skip("ptxas not installed")
    assert out.returncode == 0, out.stderr[-2000:]
    return out.stderr


def ptxas_no_spill(ptx: str) -> str:
    """``ptxas_report``, asserting no spills."""
    info = ptxas_report(ptx)
    assert "0 bytes spill stores" in info, info[-600:]
    return info
