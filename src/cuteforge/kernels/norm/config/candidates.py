"""Candidate configs the autotuner times for the norm kernels: the default first, then
the other paths (cp_async, staged, cluster, part ring, row grid) and the configs one step
from it. The long-row lists are also what the benchmarks sweep."""

from __future__ import annotations

from dataclasses import replace

from . import shapes
from .defaults import (
    LAGGED_FWD_ALTERNATIVES,
    default_config,
    default_register_config,
    default_register_fwd_config,
    staged_table_config,
    unlagged_default,
)
from .knobs import REGS_PER_SM, SMEM_CTA_RESERVED, SMEM_PER_SM, NormConfig


def candidate_configs(n: int, dtype_bits: int, backward: bool = False, kind: str = "rms",
                      residual: bool = False) -> list[NormConfig]:
    """A few (<= 8) distinct valid configs around the heuristic; the first is the default.
    ``kind`` and ``residual`` shape the forward's (the long-row defaults differ by both)."""
    base = default_config(n, dtype_bits, backward, kind, residual)
    if not backward and (base.stages or base.cp_async):
        # a long-row default: the cp_async and staged shapes that measured close, then the
        # register path and the candidates around it
        out = [base]
        reg = default_register_fwd_config(n, dtype_bits, kind)
        # a lagged default next to STAGED_FWD's unlagged shape for n (the residual's
        # entries skipped): the H100 and the H200 ranked them differently
        alts = [unlagged_default(n, dtype_bits, kind)] if base.lag else []
        if base.short_chains:  # measured on the H200 only
            alts.append(replace(base, short_chains=False))
        if not residual:  # LAGGED_FWD_ALTERNATIVES's shapes were measured without one
            alts.append(staged_table_config(LAGGED_FWD_ALTERNATIVES.get((kind, dtype_bits), ()), n, dtype_bits))
        alts += async_fwd_candidates(n, dtype_bits)[:3]
        alts += [shapes.staged_fwd_config(n, dtype_bits, t, s) for t, s in ((256, 4), (512, 4), (1024, 4), (256, 6))]
        for cfg in alts + [reg] + candidate_configs_around(reg, n, dtype_bits, False):
            if cfg is not None and cfg not in out:
                out.append(cfg)
        return out[:8]
    out = [base]
    if not backward and n >= 32768:
        # the other forward paths (cp_async; rows staged, fewer stages where 4 do not fit)
        st = next((c for s in (4, 3, 2) if (c := shapes.staged_fwd_config(n, dtype_bits, 256, s)) is not None), None)
        for cfg in async_fwd_candidates(n, dtype_bits)[:1] + [st]:
            if cfg is not None and cfg not in out:
                out.append(cfg)
    for cfg in candidate_configs_around(base, n, dtype_bits, backward):
        if cfg not in out:
            out.append(cfg)
    return out[:8]


def candidate_configs_around(base: NormConfig, n: int, dtype_bits: int, backward: bool) -> list[NormConfig]:
    """Valid configs one step from ``base`` (threads, cluster, occupancy, and the backward's
    reload / prefetch / staged alternatives), ``base`` excluded."""
    out = [base]
    p, c, t, o, rl = base.threads_per_row, base.cluster_n, base.threads, base.ctas_per_sm, base.reload
    trial = [
        NormConfig(max(t, 2 * p), 2 * p, c, o, rl) if c == 1 else NormConfig(2 * t, 2 * p, c, 1, rl),
        NormConfig(max(256, p // 2) if c == 1 else p // 2, p // 2, c, o, rl),
        NormConfig(p // 2, p // 2, 2 * c, o, rl) if p >= 256 else NormConfig(512, p, 1, o, rl),
        NormConfig(128, p, 1, o, rl) if c == 1 and p <= 128 else NormConfig(p // 2 if c > 1 else t, p // 2 if c > 1 else p, c, o, rl),
    ]
    if not backward:
        trial.insert(0, NormConfig(t, p, c, o, early_weight=True))
    if backward:
        if base.stages:
            st = default_register_config(n, dtype_bits)
        else:  # one CTA per row where it fits, else the row split over a cluster
            st = shapes.staged_config(n, dtype_bits) or shapes.cluster_staged_config(n, dtype_bits)
        if st is not None:
            trial.insert(0, st)  # the other backward path (row staged in shared memory / in registers)
    if backward and base.prefetch:
        trial.insert(0, NormConfig(t, p, c, o, False, False))  # the same without prefetch
    elif backward:
        # fp32 rows double the prefetch registers: halve the occupancy target there
        trial.insert(0, NormConfig(t, p, c, o if dtype_bits == 16 else max(1, o // 2), False, True))
    if backward:
        if not rl and not base.stages:  # the weight held across rows, or read every row
            trial.insert(1, replace(base, early_weight=not base.early_weight))
        trial += [NormConfig(t, p, c, max(1, o // 2), rl), NormConfig(t, p, c, o * 2, rl), NormConfig(t, p, c, o, not rl)]
    for cfg in trial:
        try:
            cfg.validate(n, dtype_bits, backward=backward)
        except ValueError:
            continue
        if cfg not in out:
            out.append(cfg)
    return out[1:]


def longrow_candidates(n: int, dtype_bits: int) -> list[NormConfig]:
    """Forward configs worth timing against the default at long N (bench_longrow.py):
    the mbar exchange with 256-thread CTAs at 16 / 32 / 64 elements per thread and with
    512-thread CTAs at 32, plus the barrier exchange with 256-thread CTAs at 32 (what
    the CTA shape alone changes)."""
    out: list[NormConfig] = []
    for threads, elems, ex in ((256, 32, "mbar"), (256, 16, "mbar"), (256, 64, "mbar"), (512, 32, "mbar"), (256, 32, "barrier")):
        cfg = shapes.cluster_fwd_config(n, dtype_bits, threads, elems)
        if cfg is None:
            continue
        if ex == "barrier":
            cfg = NormConfig(cfg.threads, cfg.threads_per_row, cfg.cluster_n, 1)
        if cfg not in out:
            out.append(cfg)
    return out


def async_fwd_candidates(n: int, dtype_bits: int) -> list[NormConfig]:
    """cp_async forward configs worth timing at long N (bench_norm_staged.py --fwd
    --cp-async): ``async_fwd_config`` at level 2 with 256-thread CTAs at <= 32 / 64 / 16
    elements per thread and 512-thread CTAs at <= 32, no register budget; the 256 / 32 and
    512 / 32 shapes at levels 2 and 1 under the budget of as many CTAs as the shares'
    shared memory (unfused, with a bias) and the least registers the row takes
    (``est_regs_per_thread``) leave room for; duplicates collapse."""
    out: list[NormConfig] = []
    forms = ((256, 32), (256, 64), (256, 16), (512, 32))
    tries = [(t, e, 2, 1) for t, e in forms]
    for t, e in ((256, 32), (512, 32)):
        for level in (2, 1):
            probe = shapes.async_fwd_config(n, dtype_bits, t, e, level)
            if probe is not None:
                per_cta = probe.smem_bytes(n, False, dtype_bits) + SMEM_CTA_RESERVED
                regs = probe.est_regs_per_thread(n, dtype_bits, False)
                occ = min(8, 2048 // t, SMEM_PER_SM // per_cta, REGS_PER_SM // (regs * t))
                tries.append((t, e, level, max(1, occ)))
    for t, e, level, occ in tries:
        cfg = shapes.async_fwd_config(n, dtype_bits, t, e, level, occ)
        if cfg is not None and cfg not in out:
            out.append(cfg)
    return out


def row_grid_candidates(base: NormConfig, n: int, dtype_bits: int) -> list[NormConfig]:
    """Valid row-grid configs one step from ``base`` (threads per row halved or doubled,
    CTA size, register budget), ``base`` excluded: the tuner's neighbours for the backward
    without partials."""
    t, p, o = base.threads, base.threads_per_row, base.ctas_per_sm
    trial = [shapes.row_grid_shape(2 * p), shapes.row_grid_shape(p // 2),
             replace(base, threads=2 * t, ctas_per_sm=max(1, o // 2)), replace(base, ctas_per_sm=2 * o)]
    out: list[NormConfig] = []
    for cfg in trial:
        try:
            cfg.validate(n, dtype_bits, backward=True)
        except ValueError:
            continue
        if cfg != base and cfg not in out:
            out.append(cfg)
    return out


def longrow_bwd_candidates(n: int, dtype_bits: int) -> list[NormConfig]:
    """Backward configs worth timing against the default at long N (bench_longrow.py
    --ops rms_norm_bwd,layer_norm_bwd): the mbar exchange with 256-thread CTAs at <= 16
    and <= 32 elements per thread (and <= 32 with prefetch), with 512-thread CTAs at
    <= 16, plus the barrier exchange with 256-thread CTAs at <= 16 (the CTA shape alone)."""
    out: list[NormConfig] = []
    for threads, elems, ex, pf in (
        (256, 16, "mbar", False),
        (256, 32, "mbar", False),
        (256, 32, "mbar", True),
        (512, 16, "mbar", False),
        (256, 16, "barrier", False),
    ):
        cfg = shapes.cluster_bwd_config(n, dtype_bits, threads, elems, ex, pf)
        if cfg is not None and cfg not in out:
            out.append(cfg)
    return out


def staged_candidates(n: int, dtype_bits: int) -> list[NormConfig]:
    """Staged backward configs worth timing against the default (bench_norm_staged.py):
    <= 32 and <= 16 elements per thread, 2 and 3 stages (duplicates collapse)."""
    out: list[NormConfig] = []
    for elems, stages in ((32, 3), (32, 2), (16, 3), (16, 2)):
        cfg = shapes.staged_config(n, dtype_bits, elems, stages)
        if cfg is not None and cfg not in out:
            out.append(cfg)
    return out


def longrow_staged_candidates(n: int, dtype_bits: int) -> list[NormConfig]:
    """Cluster-staged backward configs worth timing at long N (bench_norm_staged.py):
    <= 32 elements per thread at 3 and 2 stages, <= 16 at 3, and the 32 / 3 shape on twice
    the cluster (smaller chunks: more CTAs per SM); where the chunks leave room for one
    whole stage only, that shape as the part ring at 2, 4 and 8 parts; duplicates
    collapse."""
    out: list[NormConfig] = []
    for elems, stages, more in ((32, 3, False), (32, 2, False), (16, 3, False), (32, 3, True)):
        cfg = shapes.cluster_staged_config(n, dtype_bits, elems, stages)
        if cfg is not None and more:
            cfg = shapes.cluster_staged_config(n, dtype_bits, elems, stages, min_cluster=2 * cfg.cluster_n) if cfg.cluster_n < 16 else None
        if cfg is not None and cfg not in out:
            out.append(cfg)
    one = [c for c in out if c.stages == 1]
    for parts in (2, 4, 8):
        for cfg in one:
            ring = shapes.ring_config(cfg, n, dtype_bits, parts)
            if ring is not None and ring not in out:
                out.append(ring)
    return out


def longrow_staged_fwd_candidates(n: int, dtype_bits: int) -> list[NormConfig]:
    """Staged forward configs worth timing against the forward default at N >= 4096
    (bench_norm_staged.py --fwd): one CTA per row where the row fits (<= 32 elements per
    thread, 3 and 2 stages), else and at long N the row split over a cluster: <= 32
    elements per thread at 3 and 2 stages, <= 16 at 3, and the 32 / 3 and 16 / 3 shapes on
    twice the cluster (smaller chunks: more stages of x + residual fit, more CTAs per SM);
    duplicates collapse. The defaults (``STAGED_FWD``) come from a wider sweep
    (bench_norm_staged.py --fwd --deep)."""
    out: list[NormConfig] = []
    if n <= 16384:
        for elems, stages in ((32, 3), (32, 2)):
            cfg = shapes.staged_config(n, dtype_bits, elems, stages, backward=False)
            if cfg is not None and cfg not in out:
                out.append(cfg)
    for elems, stages, more in ((32, 3, False), (32, 2, False), (16, 3, False), (32, 3, True), (16, 3, True)):
        cfg = shapes.cluster_staged_config(n, dtype_bits, elems, stages, backward=False)
        if cfg is not None and more:
            cfg = (shapes.cluster_staged_config(n, dtype_bits, elems, stages, min_cluster=2 * cfg.cluster_n, backward=False)
                   if cfg.cluster_n < 16 else None)
        if cfg is not None and cfg not in out:
            out.append(cfg)
    return out
