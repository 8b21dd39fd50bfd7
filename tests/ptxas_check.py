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


def sass_or_skip(cubin: bytes) -> str:
    """The SASS of a cubin (`compiler.sass`), skipping the test where the machine has no
    disassembler (nvdisasm / cuobjdump, or the nvidia-cuda-nvdisasm wheel)."""
    from cuteforge import compiler

    try:
        return compiler.sass(cubin)
    except RuntimeError as e:
        pytest.skip(str(e))


def loop_loads(sass: str) -> tuple[int, int] | None:
    """(late, all): the global vector loads (64 / 128-bit) of the SASS loop that has the most
    of them (a loop: from the label a later branch jumps back to, to that branch), and how
    many of them come after the loop's first FP32 / packed-half multiply: loads ptxas put in
    a second batch, issued once registers of the first batch's data are free (5
    of 12 in the fp32 8192 RMSNorm backward without partials, which ran at 87 % of copy
    against 98 %). None when there is no loop."""
    import re

    lines = [ln for ln in sass.splitlines() if ";" in ln or ln.strip().startswith(".L_x")]
    labels = {ln.strip().rstrip(":"): i for i, ln in enumerate(lines) if ln.strip().startswith(".L_x")}
    best = None
    for i, ln in enumerate(lines):
        m = re.search(r"BRA `?\(?(\.L_x_\d+)", ln)
        if m and labels.get(m.group(1), i) < i:
            body = lines[labels[m.group(1)]:i]
            first = next((k for k, b in enumerate(body) if re.search(r"\b(FMUL|FFMA|HMUL2|HFMA2)\b(?!\.MMA)", b)),
                         len(body))
            loads = [k for k, b in enumerate(body) if re.search(r"LDG\.E\.(64|128)", b)]
            if best is None or len(loads) > best[1]:  # the row loop: the one with the most loads
                best = (sum(k > first for k in loads), len(loads))
    return best
