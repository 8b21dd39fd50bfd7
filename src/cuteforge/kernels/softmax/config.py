"""Launch/tiling knobs of the softmax kernels and the heuristic that picks them.

The row stays in registers: each of the ``threads_per_row * cluster_n`` threads that
share a row holds about ``n / (threads_per_row * cluster_n)`` elements of it (of each
input: one for the forward, two for the backward) as fp32. That count is what a config
trades: more elements per thread means fewer threads and CTAs per row (cheaper
reductions, no cluster) but more registers per thread, hence fewer CTAs resident per SM
to overlap one CTA's reduction with another's loads.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from ...arch import DeviceLimits

__all__ = ["MODES", "PATHS", "SoftmaxConfig", "default_config", "candidate_configs", "longrow_candidates", "longrow_bwd_candidates", "is_backward"]

MODES = ("softmax", "log_softmax", "softmax_bwd", "log_softmax_bwd")
# Forward kernel variants (docs/kernels/softmax.md, v2):
#   regs   the v1 kernel (device.py): rows interleaved over the cluster, loads straight
#          into registers, full cluster barrier for the DSMEM exchange
#   mbar   chunked.py: each CTA owns a contiguous chunk of the row, loads into registers,
#          the (max, sum) exchange is st.async + an mbarrier's transaction count
#   async  as mbar, but the chunk arrives through cp.async into shared memory (quack's
#          scheme) and is then converted into registers
#   smem   as async, but the row is never held in registers: max, sum and the output
#          are three passes over shared memory (exponentials recomputed), so registers
#          stay free and the CTAs per SM are limited by shared memory instead
#   The backward has regs and mbar (chunked.make_softmax_chunked_bwd: one fp32 sum per
#   warp and row over st.async; cluster_n >= 2, threads_per_row a multiple of 32).
PATHS = ("regs", "mbar", "async", "smem")
STAGED_PATHS = ("async", "smem")
_SMEM_PER_SM = 227 * 1024
CLUSTER_SIZES = (1, 2, 4, 8, 16)  # 16 is non-portable; the DSL marks kernels to allow it
_REGS_PER_SM = 65536
_MAX_REGS_PER_THREAD = 255
_OVERHEAD_REGS = 32  # addressing, reduction temporaries, predicates
# Elements of one input a thread may hold (fp32 registers): above this ptxas spills.
MAX_ELEMS = {False: 128, True: 64}
# What the heuristic aims for (elements per thread per input), forward / backward.
TARGET_ELEMS = {False: 32, True: 16}


def is_backward(mode: str) -> bool:
    if mode not in MODES:
        raise ValueError(f"unknown softmax mode {mode!r}; expected one of {MODES}")
    return mode.endswith("_bwd")


def _is_pow2(v: int) -> bool:
    return isinstance(v, int) and v > 0 and (v & (v - 1)) == 0


def _pow2_ceil(v: int) -> int:
    return 1 << max(0, (int(v) - 1).bit_length())


@dataclass(frozen=True)
class SoftmaxConfig:
    """threads:          CTA size (multiple of 32, <= 1024).
    threads_per_row:  threads of one CTA sharing a row (power of 2 dividing threads);
                      rows per CTA = threads // threads_per_row.
    cluster_n:        CTAs sharing a row (1 = none; 2..16 an sm_90 thread-block
                      cluster, partial reductions exchanged through DSMEM).
    path:             kernel variant, one of PATHS (module comment above); anything but
                      "regs" is sm_90+; "async" / "smem" are forward-only, the backward
                      has "regs" and "mbar" (the latter with a cluster, chunked.py).
    """

    threads: int = 128
    threads_per_row: int = 128
    cluster_n: int = 1
    path: str = "regs"

    @property
    def rows_per_cta(self) -> int:
        return self.threads // self.threads_per_row

    def elems_per_thread(self, n: int) -> int:
        """Upper bound on one input's elements a thread holds (any vector width)."""
        return -(-n // (self.threads_per_row * self.cluster_n))

    def est_regs_per_thread(self, n: int, backward: bool) -> int:
        if self.path == "smem":
            return _OVERHEAD_REGS + 16  # one 16-byte vector at a time, converted
        return self.elems_per_thread(n) * (2 if backward else 1) + _OVERHEAD_REGS

    def stage_bytes(self, n: int, dtype_bits: int) -> int:
        """Shared memory of the staged paths: each CTA's rows chunk (at 16-byte vectors)."""
        if self.path not in STAGED_PATHS:
            return 0
        vec = 128 // dtype_bits
        nv = -(-n // vec)
        rounds = -(-nv // (self.threads_per_row * self.cluster_n))
        return self.rows_per_cta * rounds * self.threads_per_row * 16

    def smem_bytes(self, n: int = 0, dtype_bits: int = 32) -> int:
        warps_per_row = max(self.threads_per_row // 32, 1)
        red = self.rows_per_cta * warps_per_row * self.cluster_n * 8  # (max, sum) fp32 pairs
        return red + 16 + (self.stage_bytes(n, dtype_bits) if n else 0)

    def validate(self, n: int, dtype_bits: int, backward: bool = False, limits: DeviceLimits | None = None) -> None:
        """Raise ValueError if this config cannot run rows of n elements of dtype_bits bits."""
        t, p, c = self.threads, self.threads_per_row, self.cluster_n
        if not isinstance(n, int) or n < 1:
            raise ValueError(f"n must be a positive int, got {n!r}")
        if dtype_bits not in (16, 32):
            raise ValueError(f"dtype_bits must be 16 or 32, got {dtype_bits}")
        if not isinstance(t, int) or t < 32 or t > 1024 or t % 32 != 0:
            raise ValueError(f"threads={t}: must be a multiple of 32 in [32, 1024]")
        if not _is_pow2(p) or p > t or t % p != 0:
            raise ValueError(f"threads_per_row={p}: must be a power of 2 dividing threads={t}")
        if c not in CLUSTER_SIZES:
            raise ValueError(f"cluster_n={c}: must be one of {CLUSTER_SIZES}")
        if self.path not in PATHS:
            raise ValueError(f"path={self.path!r}: must be one of {PATHS}")
        if self.path != "regs":
            if backward and self.path != "mbar":
                raise ValueError(f"path={self.path!r} is forward-only; the backward has paths 'regs' and 'mbar'")
            if backward and c < 2:
                raise ValueError(f"path='mbar' backward needs a cluster (cluster_n >= 2), got cluster_n={c}; use path='regs'")
            if c > 1 and p % 32:
                raise ValueError(f"path={self.path!r} with a cluster needs threads_per_row a multiple of 32, got {p}")
            if self.path in STAGED_PATHS and self.smem_bytes(n, dtype_bits) > _SMEM_PER_SM:
                raise ValueError(
                    f"path={self.path!r}: {self.smem_bytes(n, dtype_bits)} B of shared memory per CTA > {_SMEM_PER_SM} B; "
                    "use a larger cluster_n or fewer rows per CTA"
                )
        if c > 1:
            need = c * p * (128 // dtype_bits)
            if n < need:
                raise ValueError(
                    f"cluster_n={c} with threads_per_row={p} needs n >= {need} "
                    f"(one 16-byte vector per thread of the cluster); got n={n}"
                )
        e = self.elems_per_thread(n)
        if e > MAX_ELEMS[backward] and self.path != "smem":
            raise ValueError(
                f"{e} elements per thread > {MAX_ELEMS[backward]} (registers would spill); "
                "use more threads_per_row or a larger cluster_n"
            )
        regs = self.est_regs_per_thread(n, backward)
        if regs > _MAX_REGS_PER_THREAD or regs * t > _REGS_PER_SM:
            raise ValueError(f"~{regs} registers/thread x {t} threads > {_REGS_PER_SM} per SM; use fewer threads")
        if limits is not None:
            if t > limits.threads_per_block:
                raise ValueError(f"threads={t} > {limits.threads_per_block} per block on sm_{limits.sm}")
            if c > 1 and limits.max_cluster_size <= 1:
                raise ValueError(f"cluster_n={c}: sm_{limits.sm} has no thread-block clusters")
            if self.path != "regs" and limits.sm < 90:
                raise ValueError(f"path={self.path!r} needs sm_90 (mbarrier transaction counts, st.async); got sm_{limits.sm}")
            if self.smem_bytes(n, dtype_bits) > limits.smem_per_block:
                raise ValueError(f"shared memory {self.smem_bytes(n, dtype_bits)} B > {limits.smem_per_block} B on sm_{limits.sm}")


def _shape(n: int, dtype_bits: int, elems: int, p_max: int, c_max: int) -> SoftmaxConfig:
    """Threads per row (over the cluster) for ~`elems` elements per thread; rows up to
    p_max threads stay in one CTA, longer ones split over up to c_max CTAs."""
    vec = 128 // dtype_bits
    total = _pow2_ceil(-(-n // elems))
    total = max(1, min(total, _pow2_ceil(-(-n // vec))))  # no thread without a vector
    if total <= p_max:
        p, c = total, 1
    else:
        c = min(c_max, total // p_max)
        p = min(1024, total // c)
        while c > 1 and n < c * p * vec:
            c //= 2
    return SoftmaxConfig(threads=max(p, 128), threads_per_row=p, cluster_n=c)


# Forward rows longer than this go to the v2 "async" path (h200-longrow.json: bf16
# regs 84.7 / 77.2 / 70.9 / 68.0 % of copy at N = 32768..262144, async 256-thread CTAs
# 96.6 / 96.9 / 96.3 / 91.4; fp32 regs 93.6 vs async 96.2 only at 262144).
V2_FWD_MIN_N = {16: 16385, 32: 131073}
_V2_THREADS = 256
# aim: <= this many elements per thread (56: 16-bit N = 50257 on 4 CTAs, 49 a thread,
# read 89.7 % of copy against 78.3 on 8, h200-softmax-longrow-s28.json; the powers of two
# keep their clusters: 32768 c4, 65536 c8) ...
_V2_ELEMS = 56
_V2_CLUSTER_CAP = 8  # ... but no cluster over 8 CTAs unless a thread would hold > 64


def _body_elems(n: int, dtype_bits: int, realigned: bool) -> int:
    """Elements in the row's whole 16-byte vectors, as the kernels split it (`row_split`):
    a realigned row (or N not a multiple of the vector) has (N - vec + 1) // vec of them."""
    vec = 128 // dtype_bits
    return max((n - vec + 1) // vec if realigned or n % vec else n // vec, 1) * vec


def _v2_forward(n: int, dtype_bits: int = 16, realigned: bool = False) -> SoftmaxConfig:
    """The v2 forward default for a long row: `async`, 256-thread CTAs, the smallest
    cluster that leaves a thread <= 56 elements, capped at 8 CTAs while a thread holds
    <= 64 (then 16). Measured (bf16, elements per thread): 32768 c4 (32) 96.6 % > c2 (64)
    95.1; 65536 c8 (32) 96.9 > c4 (64) 95.7; 131072 c8 (64) 96.3 > c16 (32) 93.4;
    262144 c16 (64) 91.4; fp32 262144 c16 (64) 96.2.

    A thread's share counts the row's whole 16-byte vectors: a row that does not start on
    16 bytes (``realigned``, or N not a multiple of the vector) is realigned (`row_split`):
    (N - vec + 1) // vec vectors from its first boundary, its fewer than two vectors' worth
    of head and tail element by element on top, so N = 131073 takes 131072's cluster (c8),
    not c16."""
    body = _body_elems(n, dtype_bits, realigned)
    c = 1
    while c < _V2_CLUSTER_CAP and -(-body // (_V2_THREADS * c)) > _V2_ELEMS:
        c *= 2
    if -(-body // (_V2_THREADS * c)) > 64:
        c = 16
    return SoftmaxConfig(_V2_THREADS, _V2_THREADS, c, "async")


# 16-bit backward rows of at least this many elements take the `mbar` path with
# 256-thread CTAs (`_v2_backward`). H200, % of copy, softmax_bwd / log_softmax_bwd,
# benchmarks/results/h200-softmax-bwd-mbar-defaults.json (copy 4278 GB/s; regs = the v1
# default, mbar = 256 threads at 32 elements per input, 64 at 262144):
#   N        bf16 regs     bf16 mbar256    fp16 regs     fp16 mbar256
#   32768    91.1 / 99.3   100.6 / 100.3   94.1 / 99.2   101.1 / 100.5   (c4)
#   65536    90.6 / 97.9   101.0 / 100.4   91.6 / 98.3   101.1 / 100.9   (c8)
#   131072   86.6 / 96.0   101.1 / 100.8   88.0 / 96.6   100.7 / 101.0   (c16)
#   262144   69.2 / 92.9    99.4 / 100.4   70.6 / 93.5    75.1 /  98.8   (c16)
# (h200-softmax-bwd-mbar.json, the first run, agrees for bf16 within 0.3.) 512-thread
# CTAs matched these for bf16 but not fp16 softmax_bwd (87.1 at 65536 c4, 84.0 at
# 131072 c8): fp16 inputs are widened to fp32 registers (only bf16 stays packed, see
# chunked.py), 78 registers per thread at 32 per input, so one 512-thread CTA per SM.
# fp32 kept `regs` until session 28 (below): mbar was level there (101-102 % up to
# 131072 either way; 262144 regs 93.8 / 93.4, mbar(512,c16) 93.0 / 96.2). Rows of
# 16385..32767 were not measured and keep `regs`.
V2_BWD_MIN_N = {16: 32768, 32: 32768}
# fp32 rows too since session 28 (v2.x had found mbar level with regs at 32768..131072 and
# kept regs). Kernel alone, softmax_bwd / log_softmax_bwd, % of copy:
#   h200-softmax-bwd-s28.json: 50257 regs 97.3 / 79.8, mbar(256, c8) 101.6 / 101.6;
#     151937 regs 90.5 / 89.0, mbar(256, c16) 92.1 / 99.8; 151936 92.9 / 100.1 against
#     100.8 / 101.4;
#   benchmarks/probes/softmax_s28e.py (regs512 / mbar512 / mbar256, all c16): 163841
#     91.0 / 101.0 / 101.0 and 99.7 / 101.5 / 101.5; 200001 84.6 / 88.6 / 100.8 and
#     85.6 / 92.3 / 100.8; 262143 92.2 / 91.5 / 88.8 and 78.4 / 94.7 / 78.7; 262144
#     94.1 / 93.2 / 91.8 and 93.1 / 96.4 / 78.6.
# So 256-thread CTAs while 16 of them give a thread <= 50 fp32 elements of each input,
# 512-thread ones past that.
_V2_BWD_THREADS = 256
_V2_BWD_FP32_MAX_ELEMS = 50


def _v2_backward(n: int, dtype_bits: int = 16) -> SoftmaxConfig:
    """The long-row backward default: `mbar`, 256-thread CTAs, the smallest cluster that
    gives a thread <= 32 elements of each input, at most 16 CTAs (16-bit rows past 131072:
    33..64 per input; fp32 rows past 16 x 256 x 50 elements take 512-thread CTAs)."""
    c = max(2, _pow2_ceil(-(-n // (_V2_BWD_THREADS * 32))))
    if dtype_bits == 32 and n > 16 * _V2_BWD_THREADS * _V2_BWD_FP32_MAX_ELEMS:
        return SoftmaxConfig(2 * _V2_BWD_THREADS, 2 * _V2_BWD_THREADS, 16, "mbar")
    return SoftmaxConfig(_V2_BWD_THREADS, _V2_BWD_THREADS, min(c, 16), "mbar")


# fp32 rows that do not start on 16 bytes take the v2 forward (held: `_realigned_forward`)
# from here, where the register path would split them over a cluster
REALIGNED_FP32_V2_MIN_N = 32769


def _heuristic(n: int, dtype_bits: int, backward: bool, realigned: bool = False) -> SoftmaxConfig:
    """What the H200 sweep (docs/kernels/softmax.md) favours: one CTA per row as long as
    it can hold the row (32 elements per thread up to 512 threads, then up to 64 forward;
    16 per input for short rows backward), and only then a cluster, of CTAs that each
    hold as much of the row as the registers allow (64 elements per thread forward, 32
    per input backward). Cluster barriers and small per-CTA chunks cost more than fewer
    resident CTAs. Long forward rows (n >= V2_FWD_MIN_N: 16-bit past 16384, fp32 past
    131072; ``realigned`` fp32 rows, which do not start on 16 bytes, from
    REALIGNED_FP32_V2_MIN_N) take the v2 `async` path instead (`_v2_forward`), long
    backward rows (n >= 32768) the `mbar` path (`_v2_backward`)."""
    if not backward and n >= V2_FWD_MIN_N[dtype_bits]:
        return _v2_forward(n, dtype_bits, realigned)
    if not backward and realigned and dtype_bits == 32 and n >= REALIGNED_FP32_V2_MIN_N:
        return _v2_forward(n, dtype_bits, realigned)
    if backward and V2_BWD_MIN_N[dtype_bits] is not None and n >= V2_BWD_MIN_N[dtype_bits]:
        return _v2_backward(n, dtype_bits)
    return _heuristic_regs(n, dtype_bits, backward)


def _heuristic_regs(n: int, dtype_bits: int, backward: bool) -> SoftmaxConfig:
    """The v1 (`regs`) heuristic (see `_heuristic`)."""
    vec = 128 // dtype_bits
    cap = _pow2_ceil(-(-n // vec))  # no thread without a vector
    if backward and _pow2_ceil(-(-n // 16)) <= 256:  # short rows: 16 per input measured best
        p = max(1, min(_pow2_ceil(-(-n // 16)), cap))
        return SoftmaxConfig(threads=max(p, 128), threads_per_row=p, cluster_n=1)
    total = max(1, min(_pow2_ceil(-(-n // 32)), cap))
    p_max = 256 if backward and dtype_bits == 16 else 512
    if total <= p_max:
        return SoftmaxConfig(threads=max(total, 128), threads_per_row=total, cluster_n=1)
    e_max = 32 if backward else 64
    p = p_max
    c = _pow2_ceil(-(-n // (p * e_max)))
    if c > 16:
        c = 16
        p = min(1024, _pow2_ceil(-(-n // (c * e_max))))
    while c > 1 and n < c * p * vec:
        c //= 2
    return SoftmaxConfig(threads=p, threads_per_row=p, cluster_n=c)


def _realigned_forward(cfg: SoftmaxConfig, n: int, dtype_bits: int, mode: str | None) -> SoftmaxConfig:
    """The long-row forward of rows that do not start on 16 bytes: `mbar` (the row held in
    registers) instead of `async` (staged through shared memory by cp.async), except
    16-bit log_softmax at <= 32 elements a thread. Kernel alone, % of copy, async / mbar (softmax;
    log_softmax), benchmarks/results/h200-softmax-s29a.json (the async forward with its
    3-CTA register budget): bf16 131073 90.4 / 92.7, 90.6 / 94.1; 151937 85.2 / 88.0,
    82.8 / 87.3; 200001 80.3 / 83.1, 78.5 / 82.8; 262143 86.4 / 86.9, 85.9 / 89.6 (fp16
    86.0 / 89.8, 88.1 / 92.1). Session 28 (softmax_s28c.py): softmax +1.3-3.2 points at every
    such N from 24577; log_softmax -2 to -8 at 32001 and 65537 (32 a thread), though an H100
    read mbar ahead there too (h100-softmax-s29a-32.json: +1.4 / +1.2). fp32, H100 only
    (h100-softmax-s29a-fp32-run1.json, -fp32.json): 131073 96.6 / 98.4, 96.2 / 97.5; 200001
    95.8 / 98.6, 95.8 / 98.5; 262143 94.4 / 98.4-98.5, 95.0-95.1 / 97.9.

    fp32 rows of REALIGNED_FP32_V2_MIN_N..131072, which the register path splits over a
    cluster, take the same held forward on `_v2_forward`'s cluster. H200, kernel alone,
    h200-softmax-s29b.json, regs default / mbar (softmax; log_softmax): 50257 91.5 / 95.4,
    94.3 / 95.3 (c4); 65537 84.2 / 96.2, 88.3 / 96.1 (c8); 100001 86.4 / 96.1, 89.2 / 95.6
    (c8). The aligned 65536 stays on regs (96.8 / 97.2 against 96.6 / 96.4)."""
    if cfg.path != "async":
        return cfg
    body = _body_elems(n, dtype_bits, True)
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
    (`_v2_forward`), fp32 rows from REALIGNED_FP32_V2_MIN_N leave the register path, and
    the long forward's path (`_realigned_forward`).
    """
    cfg = _heuristic(n, dtype_bits, backward, realigned) if cluster else _shape(n, dtype_bits, TARGET_ELEMS[backward], 256, 1)
    if cluster and m is not None and cfg.threads_per_row >= 128:
        # fewer than ~2 CTAs per SM: halve the work per CTA while that is possible
        while m * cfg.cluster_n < 264 and cfg.cluster_n < 16 and n >= 2 * cfg.cluster_n * cfg.threads_per_row * (128 // dtype_bits):
            cfg = replace(cfg, cluster_n=cfg.cluster_n * 2)
    if realigned and not backward:
        cfg = _realigned_forward(cfg, n, dtype_bits, mode)
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


def candidate_configs(n: int, dtype_bits: int, backward: bool = False) -> list[SoftmaxConfig]:
    """A few distinct valid configs around the heuristic (the first one) for autotuning."""
    base = default_config(n, dtype_bits, backward)
    out = [base]
    if base.path != "regs" and not backward:  # long forward rows: the other v2 paths / cluster sizes first
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
        c = _shape(n, dtype_bits, max(1, elems), p_max, c_max)
        for cand in (c, SoftmaxConfig(max(256, c.threads), c.threads_per_row, c.cluster_n)):
            try:
                cand.validate(n, dtype_bits, backward)
            except ValueError:
                continue
            if cand not in out:
                out.append(cand)
    return out[:8]


def longrow_candidates(n: int, dtype_bits: int) -> list[SoftmaxConfig]:
    """Forward configs of the v2 paths for long rows (benchmarks/bench_longrow.py sweeps
    them against the default): for each CTA size, the cluster sizes that give a thread
    16..128 elements (mbar / async: 32..64, the register budget; smem: up to 256, as
    far as shared memory allows), all valid for (n, dtype_bits) on sm_90."""
    from ...arch import limits_for

    lim = limits_for("sm_90a")
    out: list[SoftmaxConfig] = []
    for path, threads, elems in (
        ("mbar", 256, (64, 32)),
        ("mbar", 512, (64,)),
        ("async", 256, (64, 32)),
        ("async", 512, (64,)),
        ("smem", 256, (128, 64, 32)),
        ("smem", 512, (64,)),
    ):
        for e in elems:
            c = _pow2_ceil(-(-n // (threads * e)))
            if c > 16:
                continue
            cfg = SoftmaxConfig(threads, threads, max(1, c), path)
            try:
                cfg.validate(n, dtype_bits, False, lim)
            except ValueError:
                continue
            if cfg not in out:
                out.append(cfg)
    return out


LONGROW_BWD_MIN_N = 32768


def longrow_bwd_candidates(n: int, dtype_bits: int) -> list[SoftmaxConfig]:
    """Backward configs of the `mbar` path for long rows (n >= 32768; empty below), which
    benchmarks/bench_softmax_bwd.py sweeps against the default: 256- and 512-thread CTAs
    whose cluster (2..16) gives a thread 16 or 32 elements of each input; where even 32
    needs more than 16 CTAs, the 16-CTA config (up to 64 per input) instead. All valid
    for (n, dtype_bits) on sm_90."""
    from ...arch import limits_for

    if n < LONGROW_BWD_MIN_N:
        return []
    lim = limits_for("sm_90a")
    out: list[SoftmaxConfig] = []
    for threads in (256, 512):
        cs = [_pow2_ceil(-(-n // (threads * e))) for e in (16, 32)]
        if all(c > 16 for c in cs):
            cs = [16]
        for c in cs:
            if c > 16 or c < 2:
                continue
            cfg = SoftmaxConfig(threads, threads, c, "mbar")
            try:
                cfg.validate(n, dtype_bits, True, lim)
            except ValueError:
                continue
            if cfg not in out:
                out.append(cfg)
    return out
