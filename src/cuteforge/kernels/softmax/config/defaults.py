"""The softmax kernels' default configs: the heuristic (one CTA per row while it holds
the row, then a cluster), the long-row paths it switches to, and the thresholds where it
does (H200, % of copy bandwidth, kernel alone)."""

from __future__ import annotations

from dataclasses import replace

from ...rows.tiling import pow2_ceil
from .knobs import SoftmaxConfig

# What the heuristic aims for (elements per thread per input), forward / backward.
TARGET_ELEMS = {False: 32, True: 16}

# Forward rows from here take the `async` path: 16-bit 91-97 % against regs' 68-85 at
# N = 32768..262144; fp32 only ahead at 262144 (96 against 94).
ASYNC_FWD_MIN_N = {16: 16385, 32: 131073}
ASYNC_FWD_THREADS = 256
# Its cluster leaves a thread at most this many elements (16-bit N = 50257 on 4 CTAs read
# 90 % against 78 on 8; the powers of two keep their clusters: 32768 c4, 65536 c8) ...
ASYNC_FWD_ELEMS = 56
ASYNC_FWD_CLUSTER_CAP = 8  # ... but no cluster over 8 CTAs unless a thread would hold > 64

# Backward rows from here take the `mbar` path: 16-bit 99-101 % against regs' 69-94 up to
# 262144; fp32 level up to 131072 and 92-101 against 85-97 past it.
MBAR_BWD_MIN_N = {16: 32768, 32: 32768}
MBAR_BWD_THREADS = 256
# fp32 rows past 16 CTAs x 256 threads x this many elements take 512-thread CTAs (the
# 256-thread ones fell to 79-92 % at 262143 / 262144).
MBAR_BWD_FP32_MAX_ELEMS = 50

# fp32 rows that do not start on 16 bytes take the long forward (held in registers:
# `realigned_forward`) from here, where the register path would split them over a
# cluster: 95-96 % against 84-92.
REALIGNED_FP32_LONG_MIN_N = 32769


def shape_for(n: int, dtype_bits: int, elems: int, p_max: int, c_max: int) -> SoftmaxConfig:
    """Threads per row (over the cluster) for ~`elems` elements per thread; rows up to
    p_max threads stay in one CTA, longer ones split over up to c_max CTAs."""
    vec = 128 // dtype_bits
    total = pow2_ceil(-(-n // elems))
    total = max(1, min(total, pow2_ceil(-(-n // vec))))  # no thread without a vector
    if total <= p_max:
        p, c = total, 1
    else:
        c = min(c_max, total // p_max)
        p = min(1024, total // c)
        while c > 1 and n < c * p * vec:
            c //= 2
    return SoftmaxConfig(threads=max(p, 128), threads_per_row=p, cluster_n=c)


def body_elems(n: int, dtype_bits: int, realigned: bool) -> int:
    """Elements in the row's whole 16-byte vectors, as the kernels split it (`rows.split`):
    a realigned row (or N not a multiple of the vector) has (N - vec + 1) // vec of them."""
    vec = 128 // dtype_bits
    return max((n - vec + 1) // vec if realigned or n % vec else n // vec, 1) * vec


def long_forward(n: int, dtype_bits: int = 16, realigned: bool = False) -> SoftmaxConfig:
    """The long forward default: `async`, 256-thread CTAs, the smallest cluster that
    leaves a thread <= 56 elements, capped at 8 CTAs while a thread holds <= 64 (then 16).

    A thread's share counts the row's whole 16-byte vectors: a row that does not start on
    16 bytes (``realigned``, or N not a multiple of the vector) is realigned (`rows.split`):
    (N - vec + 1) // vec vectors from its first boundary, its fewer than two vectors' worth
    of head and tail element by element on top, so N = 131073 takes 131072's cluster (c8),
    not c16."""
    body = body_elems(n, dtype_bits, realigned)
    c = 1
    while c < ASYNC_FWD_CLUSTER_CAP and -(-body // (ASYNC_FWD_THREADS * c)) > ASYNC_FWD_ELEMS:
        c *= 2
    if -(-body // (ASYNC_FWD_THREADS * c)) > 64:
        c = 16
    return SoftmaxConfig(ASYNC_FWD_THREADS, ASYNC_FWD_THREADS, c, "async")


def long_backward(n: int, dtype_bits: int = 16) -> SoftmaxConfig:
    """The long-row backward default: `mbar`, 256-thread CTAs, the smallest cluster that
    gives a thread <= 32 elements of each input, at most 16 CTAs (16-bit rows past 131072:
    33..64 per input; fp32 rows past 16 x 256 x 50 elements take 512-thread CTAs)."""
    c = max(2, pow2_ceil(-(-n // (MBAR_BWD_THREADS * 32))))
    if dtype_bits == 32 and n > 16 * MBAR_BWD_THREADS * MBAR_BWD_FP32_MAX_ELEMS:
        return SoftmaxConfig(2 * MBAR_BWD_THREADS, 2 * MBAR_BWD_THREADS, 16, "mbar")
    return SoftmaxConfig(MBAR_BWD_THREADS, MBAR_BWD_THREADS, min(c, 16), "mbar")


def heuristic(n: int, dtype_bits: int, backward: bool, realigned: bool = False) -> SoftmaxConfig:
    """What the H200 sweep (docs/kernels/softmax.md) favours: one CTA per row as long as
    it can hold the row (32 elements per thread up to 512 threads, then up to 64 forward;
    16 per input for short rows backward), and only then a cluster, of CTAs that each
    hold as much of the row as the registers allow (64 elements per thread forward, 32
    per input backward). Cluster barriers and small per-CTA chunks cost more than fewer
    resident CTAs. Long forward rows (n >= ASYNC_FWD_MIN_N: 16-bit past 16384, fp32 past
    131072; ``realigned`` fp32 rows, which do not start on 16 bytes, from
    REALIGNED_FP32_LONG_MIN_N) take the `async` path instead (`long_forward`), long
    backward rows (n >= 32768) the `mbar` path (`long_backward`)."""
    if not backward and n >= ASYNC_FWD_MIN_N[dtype_bits]:
        return long_forward(n, dtype_bits, realigned)
    if not backward and realigned and dtype_bits == 32 and n >= REALIGNED_FP32_LONG_MIN_N:
        return long_forward(n, dtype_bits, realigned)
    if backward and MBAR_BWD_MIN_N[dtype_bits] is not None and n >= MBAR_BWD_MIN_N[dtype_bits]:
        return long_backward(n, dtype_bits)
    return heuristic_regs(n, dtype_bits, backward)


def heuristic_regs(n: int, dtype_bits: int, backward: bool) -> SoftmaxConfig:
    """The register (`regs`) path's heuristic (see `heuristic`)."""
    vec = 128 // dtype_bits
    cap = pow2_ceil(-(-n // vec))  # no thread without a vector
    if backward and pow2_ceil(-(-n // 16)) <= 256:  # short rows: 16 per input measured best
        p = max(1, min(pow2_ceil(-(-n // 16)), cap))
        return SoftmaxConfig(threads=max(p, 128), threads_per_row=p, cluster_n=1)
    total = max(1, min(pow2_ceil(-(-n // 32)), cap))
    p_max = 256 if backward and dtype_bits == 16 else 512
    if total <= p_max:
        return SoftmaxConfig(threads=max(total, 128), threads_per_row=total, cluster_n=1)
    e_max = 32 if backward else 64
    p = p_max
    c = pow2_ceil(-(-n // (p * e_max)))
    if c > 16:
        c = 16
        p = min(1024, pow2_ceil(-(-n // (c * e_max))))
    while c > 1 and n < c * p * vec:
        c //= 2
    return SoftmaxConfig(threads=p, threads_per_row=p, cluster_n=c)


def realigned_forward(cfg: SoftmaxConfig, n: int, dtype_bits: int, mode: str | None) -> SoftmaxConfig:
    """The long-row forward of rows that do not start on 16 bytes: `mbar` (the row held in
    registers) instead of `async` (staged through shared memory by cp.async), +1 to +5
    points of copy, except 16-bit log_softmax at <= 32 elements a thread (2-8 behind
    there). fp32 rows of REALIGNED_FP32_LONG_MIN_N..131072, which the register path splits
    over a cluster, take the same held forward on `long_forward`'s cluster."""
    if cfg.path != "async":
        return cfg
    body = body_elems(n, dtype_bits, True)
    if mode == "log_softmax" and dtype_bits == 16 and -(-body // (cfg.threads_per_row * cfg.cluster_n)) <= 32:
        return cfg
    held = replace(cfg, path="mbar")
    try:
        held.validate(n, dtype_bits, False)
    except ValueError:
        return cfg
    return held


def default_config(n: int, dtype_bits: int, backward: bool = False, m: int | None = None, cluster: bool = True,
                   mode: str | None = None, realigned: bool = False) -> SoftmaxConfig:
    """The heuristic config for rows of n elements (``cluster=False`` on pre-sm_90 GPUs).

    ``m`` (rows, optional): few long rows cannot fill the GPU with one CTA (or cluster)
    per row, so they are split over more CTAs (before the path is picked: with few rows,
    16-bit log_softmax at 131073 gets 16 CTAs at 32 elements a thread and stays `async`,
    a case no probe timed). ``mode`` and ``realigned`` (the rows do not start on 16 bytes,
    so the kernels realign them): the forward's cluster counts their whole vectors
    (`long_forward`), fp32 rows from REALIGNED_FP32_LONG_MIN_N leave the register path, and
    the long forward's path (`realigned_forward`).
    """
    cfg = heuristic(n, dtype_bits, backward, realigned) if cluster else shape_for(n, dtype_bits, TARGET_ELEMS[backward], 256, 1)
    if cluster and m is not None and cfg.threads_per_row >= 128:
        # fewer than ~2 CTAs per SM: halve the work per CTA while that is possible
        while m * cfg.cluster_n < 264 and cfg.cluster_n < 16 and n >= 2 * cfg.cluster_n * cfg.threads_per_row * (128 // dtype_bits):
            cfg = replace(cfg, cluster_n=cfg.cluster_n * 2)
    if realigned and not backward:
        cfg = realigned_forward(cfg, n, dtype_bits, mode)
    if not cluster:
        # no clusters (pre-sm_90): one CTA per row, as wide as the registers need
        while cfg.threads_per_row < 1024:
            try:
                cfg.validate(n, dtype_bits, backward)
                break
            except ValueError:
                p = cfg.threads_per_row * 2
                cfg = SoftmaxConfig(max(p, 128), p, 1)
        try:
            cfg.validate(n, dtype_bits, backward)
        except ValueError as e:
            raise ValueError(
                f"rows of n={n} do not fit the registers of one CTA ({e}); "
                "longer rows need thread-block clusters (sm_90 or newer)"
            ) from None
    cfg.validate(n, dtype_bits, backward)
    return cfg
