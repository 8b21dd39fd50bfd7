"""Candidate configs the autotuner times for the softmax kernels: the default first, the
long-row paths and cluster sizes, then shapes around the default."""

from __future__ import annotations

from ...rows.tiling import pow2_ceil
from .defaults import TARGET_ELEMS, default_config, shape_for
from .knobs import SoftmaxConfig

LONGROW_BWD_MIN_N = 32768


def candidate_configs(n: int, dtype_bits: int, backward: bool = False) -> list[SoftmaxConfig]:
    """A few distinct valid configs around the heuristic (the first one) for autotuning."""
    base = default_config(n, dtype_bits, backward)
    out = [base]
    if base.path != "regs" and not backward:  # long forward rows: the other paths / cluster sizes first
        out += [c for c in longrow_candidates(n, dtype_bits) if c != base][:4]
    if backward:  # long backward rows: the mbar exchange (empty below LONGROW_BWD_MIN_N)
        out += [c for c in longrow_bwd_candidates(n, dtype_bits) if c != base][:4]
    e0 = TARGET_ELEMS[backward]
    for elems, p_max, c_max in (
        (e0 * 2, 256, 16),
        (e0 // 2, 256, 16),
        (e0, 512, 16),
        (e0 * 2, 512, 16),
        (e0, 128, 16),
        (e0 * 4, 1024, 1),
        (e0, 256, 8),
    ):
        c = shape_for(n, dtype_bits, max(1, elems), p_max, c_max)
        for cand in (c, SoftmaxConfig(max(256, c.threads), c.threads_per_row, c.cluster_n)):
            try:
                cand.validate(n, dtype_bits, backward)
            except ValueError:
                continue
            if cand not in out:
                out.append(cand)
    return out[:8]


def longrow_candidates(n: int, dtype_bits: int) -> list[SoftmaxConfig]:
    """Forward configs of the long-row paths (benchmarks/bench_longrow.py sweeps
    them against the default): for each CTA size, the cluster sizes that give a thread
    16..128 elements (mbar / async: 32..64, the register budget; smem: up to 256, as
    far as shared memory allows), all valid for (n, dtype_bits) on sm_90."""
    trial = []
    for path, threads, elems in (
        ("mbar", 256, (64, 32)),
        ("mbar", 512, (64,)),
        ("async", 256, (64, 32)),
        ("async", 512, (64,)),
        ("smem", 256, (128, 64, 32)),
        ("smem", 512, (64,)),
    ):
        for e in elems:
            c = pow2_ceil(-(-n // (threads * e)))
            if c <= 16:
                trial.append(SoftmaxConfig(threads, threads, max(1, c), path))
    return _valid_on_sm90(trial, n, dtype_bits, False)


def longrow_bwd_candidates(n: int, dtype_bits: int) -> list[SoftmaxConfig]:
    """Backward configs of the `mbar` path for long rows (n >= 32768; empty below), which
    benchmarks/bench_softmax_bwd.py sweeps against the default: 256- and 512-thread CTAs
    whose cluster (2..16) gives a thread 16 or 32 elements of each input; where even 32
    needs more than 16 CTAs, the 16-CTA config (up to 64 per input) instead. All valid
    for (n, dtype_bits) on sm_90."""
    if n < LONGROW_BWD_MIN_N:
        return []
    trial = []
    for threads in (256, 512):
        cs = [pow2_ceil(-(-n // (threads * e))) for e in (16, 32)]
        if all(c > 16 for c in cs):
            cs = [16]
        trial += [SoftmaxConfig(threads, threads, c, "mbar") for c in cs if 2 <= c <= 16]
    return _valid_on_sm90(trial, n, dtype_bits, True)


def _valid_on_sm90(trial: list[SoftmaxConfig], n: int, dtype_bits: int, backward: bool) -> list[SoftmaxConfig]:
    """The configs of ``trial`` valid for (n, dtype_bits) on sm_90, duplicates dropped, in order."""
    from ....arch import limits_for

    lim = limits_for("sm_90a")
    out: list[SoftmaxConfig] = []
    for cfg in trial:
        try:
            cfg.validate(n, dtype_bits, backward, lim)
        except ValueError:
            continue
        if cfg not in out:
            out.append(cfg)
    return out
