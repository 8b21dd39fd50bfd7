"""Launch configs of the RMSNorm / LayerNorm kernels (forward and backward).

Both kernels keep a row on chip: every thread holds its share of the row in
registers, E = ceil(N / (threads_per_row * cluster_n)) elements (see common.py
for the exact tiling). The knobs trade that per-thread share (registers, bytes in
flight) against the number of threads that must agree on a row's statistics
(shuffle / shared-memory / cluster reductions):

threads:          CTA size (multiple of 32, <= 1024).
threads_per_row:  P, threads of one CTA that share a row (power of 2, >= 8 so that
                  the < 16-byte tail of any row fits one scalar per thread);
                  rows per CTA R = threads // P.
cluster_n:        CTAs of an sm_90 cluster that split one row (1, 2, 4, 8, 16; 16 is a
                  non-portable size that sm_90 allows and the DSL's launch opts into);
                  their partial sums meet in distributed shared memory.
ctas_per_sm:      backward only: the persistent grid is sm_count * ctas_per_sm / cluster_n
                  CTA groups, each accumulating dweight/dbias partials over the rows it
                  visits. It must not exceed the real occupancy (else waves).
reload:           backward only: do not keep x and dy in registers across the row
                  reduction; read them again (from L2: the cluster just read them) for
                  dx. Frees registers for the dweight/dbias accumulators at huge N.
early_weight:     register kernels. Forward: load weight (and bias) together with x, before
                  the row reduction, instead of after it (shorter critical path, more
                  registers). Backward (v2.22, not with reload): load the weight once,
                  before the row loop, and hold it across the CTA group's rows instead of
                  reading it again (from L1, on the path to the row sums) for every row.
prefetch:         backward only: issue the loads of the CTA group's next row block
                  before working on the current one (a second register set for x and
                  dy), so loads stay in flight across the reduction and the dx stores.
                  The default for 16-bit rows of 1024..16384 (where it measured faster).
exchange:         with a cluster (forward, and backward since v2.1): how the CTAs of a
                  row exchange partial sums.
                  "barrier" (v1): st.shared::cluster into every peer, then a full
                  cluster barrier (arrive.release / wait.acquire) per reduction;
                  "mbar": each warp's lanes l < cluster_n st.async the partial into CTA
                  l, counted on CTA l's mbarrier (one per reduction), and each CTA waits
                  on its own mbarrier only (softmax's v2 exchange, docs/kernels/softmax.md).
                  The persistent backward alternates two mbarriers over its rows.
stages:           backward (v2.4) and forward (v2.6): 0 keeps the row in registers (above); S >= 1
                  stages rows of x and dy (and dsum when fused) in shared memory: thread 0
                  brings each row in with bulk asynchronous copies (cp.async.bulk
                  global -> shared, completing on the stage's mbarrier), S rows ahead of
                  the CTA, and the threads read x/dy from shared memory for the row sums
                  and again for dx, holding only weight and the dweight/dbias accumulators
                  in registers. One row per CTA (threads_per_row == threads); with a
                  cluster (v2.5, exchange "mbar") each CTA stages its N / cluster_n chunk;
                  chunks of a multiple of 16 bytes; the bytes in flight no
                  longer depend on registers. Shared memory: S x 2 rows (3 with dsum, with
                  fewer stages if they would not fit; ``staged_stages``).
                  Forward (v2.6; the default for long rows since v2.7, ``STAGED_FWD``):
                  the same staging for x (and the residual when fused): S x 1 row chunks
                  (2 with the residual, fewer stages if they would not fit), each thread's
                  share read once into registers, the stage refilled after the row's first
                  reduction, y (and x + residual) written from registers; persistent like
                  the staged backward (``staged_fwd_groups``). ``early_weight`` does not
                  apply.
parts:            backward with stages only (v2.12): 0 keeps whole-row stages; P >= 2
                  cuts each CTA's staged chunk into P parts that travel through a ring of
                  part-sized slots (``ring_slots``: stages x P of them, fewer if they do not
                  fit beside the weight's chunk, which the ring keeps in shared memory; at
                  least P + 1, else the kernel builds whole-row stages), each with its own
                  "full" and "empty" mbarrier. A
                  part's slot is refilled with the part a ring ahead as soon as every warp
                  has read it for dx, so the next row streams in under this row's dx pass
                  and exchange instead of waiting for the whole row to be done: the one-stage
                  1 MiB fp32 rows (N = 262144) had nothing in flight across them. Chunks of
                  whole rounds only (N / cluster_n a multiple of threads x 16 bytes x P).
cp_async:         forward only, row in registers (stages = 0; v2.8): 0 loads straight into
                  registers; 1 brings the thread's share of the row (and of the residual)
                  through shared memory with 16-byte cp.async copies issued at kernel
                  start, so no register is held by a load in flight; 2 also weight and bias
                  (a second commit group, waited for only before the output: their latency
                  is off the critical path, at the price of their shares' shared memory).
                  Each thread reads back only what it copied (no barrier). Rows of 16-byte
                  vectors only; other rows build the same config without it. With
                  ctas_per_sm > 1 ptxas gets the register budget of that many CTAs per SM
                  (else it reads the weight and bias shares back all at once: LayerNorm
                  63 registers where 48 do).
lag:              staged LayerNorm forward over a cluster only (v2.17): 0 finishes each row
                  (its statistics' exchange, then y) before reading the next; 1 sends a
                  row's (sum, M2) pairs, then finishes the row before it, reading its x
                  again from its stage (common.make_moments_lagged): the cluster round trip
                  runs under the next row's first pass, at the price of a second read of
                  the chunk from shared memory and a stage held one row longer (with a
                  fused residual, s = x + residual formed again there). Rows whose
                  statistics need two exchanges (padded chunks) build the same config
                  without it.
short_chains:     staged forward over a cluster only (session 31): shorter dependent
                  chains per row. LayerNorm's moments in one shuffle chain (each thread
                  centres its squares on its own mean, the warp and the cluster fold merge
                  the (sum, M2) pairs pairwise, common.warp_merge_moments) instead of a
                  warp sum and then the centred squares' sum; for 16-bit x, y's
                  normalisation as one FFMA, (s * rstd - mean * rstd) * w; and the CTA's
                  rows counted instead of one integer division per row. The default
                  sets it only at 16-bit N = 262144 (``SHORT_CHAINS_FWD``); the tuner
                  also times that default without it.
row_grid:         the backward without partials only (frozen weight and bias, has_dw=False;
                  v2.24), row in registers, no cluster: one CTA per row block (Q = M /
                  rows per CTA) instead of the persistent grid, so each CTA runs once and
                  the block scheduler fills the SMs as CTAs finish, as torch's dx kernel
                  does. ctas_per_sm then only sets ptxas's register budget. The kernel is
                  the same (it loops over row blocks with a stride of its grid size); the
                  kernel with partials keeps the persistent grid (its Q partial rows are
                  summed afterwards).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from ...arch import DeviceLimits

__all__ = [
    "NormConfig",
    "default_config",
    "candidate_configs",
    "elems_per_thread",
    "longrow_candidates",
    "longrow_bwd_candidates",
    "v2_backward_config",
    "EXCHANGES",
    "SMEM_PER_SM",
    "staged_stages",
    "staged_config",
    "cluster_staged_config",
    "longrow_staged_candidates",
    "staged_rows",
    "staged_fwd_groups",
    "staged_fwd_config",
    "default_register_fwd_config",
    "longrow_staged_fwd_candidates",
    "async_fwd_candidates",
    "async_fwd_config",
    "ring_slots",
    "ring_config",
]

EXCHANGES = ("barrier", "mbar")
LAG_SLOTS = 4  # the lagged forward's exchange slots (common.make_moments_lagged says why four)

_REGS_PER_SM = 65536
_MAX_REGS = 255
# fp32 registers of row data a thread should hold: forward (x, plus transient weight)
# and backward (x, dy, dweight and dbias accumulators) differ by ~4x in live arrays.
_TARGET_E = {False: 32, True: 16}
_MAX_P = 512
# sm_90: a block may opt in to 227 KiB of shared memory, an SM holds 228 KiB (each
# resident CTA also reserves 1 KiB for the system).
SMEM_PER_BLOCK = 227 * 1024
SMEM_PER_SM = 228 * 1024
_SMEM_CTA_RESERVED = 1024


def _pow2_ceil(v: int) -> int:
    return 1 << max(0, (int(v) - 1).bit_length())


def _is_pow2(v: int) -> bool:
    return isinstance(v, int) and v > 0 and (v & (v - 1)) == 0


def elems_per_thread(n: int, threads_per_row: int, cluster_n: int) -> int:
    return -(-n // (threads_per_row * cluster_n))


def _row_bytes(n: int, dtype_bits: int) -> int:
    return n * dtype_bits // 8


def staged_rows(backward: bool, fused: bool) -> int:
    """Row chunks per stage of a staged kernel: backward x, dy (+ dsum); forward x (+ the
    residual)."""
    return (2 if backward else 1) + (1 if fused else 0)


def staged_stages(cfg: NormConfig, n: int, dtype_bits: int, has_dsum: bool, backward: bool = True) -> int:
    """Row stages a staged kernel (``cfg.stages`` > 0) allocates. Unfused (backward without
    dsum, forward without residual): cfg.stages (``staged_rows`` chunks each). Fused (the
    backward's dsum: three chunks a stage, the forward's residual: two): as many as fit in
    the shared memory an SM has for each of ``cfg.ctas_per_sm`` CTAs (never more than
    cfg.stages, at least 1), so the occupancy validated unfused still holds."""
    if not cfg.stages:
        return 0
    if not has_dsum:
        return cfg.stages
    row = _row_bytes(n // cfg.cluster_n, dtype_bits)  # the CTA's chunk of the row
    budget = min(SMEM_PER_BLOCK, SMEM_PER_SM // cfg.ctas_per_sm - _SMEM_CTA_RESERVED) - 4096  # reduce buffers, mbarriers
    return max(1, min(cfg.stages, budget // (staged_rows(backward, True) * row)))


def ring_slots(cfg: NormConfig, n: int, dtype_bits: int, has_dsum: bool, reserve: int = 0) -> int:
    """Part slots of the part-ring backward (``cfg.parts`` >= 2): cfg.stages x cfg.parts
    parts of ``staged_rows`` chunks each, or as many as fit the shared memory an SM has
    for each of ``cfg.ctas_per_sm`` CTAs beside ``reserve`` bytes (the weight's chunk, when
    the kernel stages it); 0 when not even parts + 1 fit (validate says so)."""
    part = staged_rows(True, has_dsum) * _row_bytes(n // cfg.cluster_n, dtype_bits) // cfg.parts
    budget = min(SMEM_PER_BLOCK, SMEM_PER_SM // cfg.ctas_per_sm - _SMEM_CTA_RESERVED) - 4096 - reserve
    slots = min(cfg.stages * cfg.parts, budget // part)
    return slots if slots > cfg.parts else 0


@dataclass(frozen=True)
class NormConfig:
    threads: int = 256
    threads_per_row: int = 128
    cluster_n: int = 1
    ctas_per_sm: int = 2
    reload: bool = False
    prefetch: bool = False
    early_weight: bool = False
    exchange: str = "barrier"
    stages: int = 0
    cp_async: int = 0
    parts: int = 0
    lag: int = 0
    row_grid: bool = False
    short_chains: bool = False

    @property
    def rows_per_cta(self) -> int:
        return self.threads // self.threads_per_row

    def est_regs_per_thread(self, n: int, dtype_bits: int, backward: bool) -> int:
        """Rough registers per thread (checked against ptxas -v on sm_90a builds)."""
        e = elems_per_thread(n, self.threads_per_row, self.cluster_n)
        held = -(-e * dtype_bits // 32)  # registers of one row share in the input dtype
        if backward and self.stages:
            # dweight + dbias accumulators, the weight (in shared memory when it fits,
            # else registers), one vector of x / dy / dx at a time from shared memory,
            # addressing (ptxas -v, sm_90a: 54-64 at 16 elements per thread, no spill)
            return 28 + 2 * e + held // 2
        if not backward and self.stages:
            # the row share read once from shared memory and held across the reduction
            # (v2.7), one vector of weight / bias / y at a time, the row sums' chains,
            # addressing (ptxas 13, sm_90a, the v2.7 defaults: 31-64 at <= 32 elements per
            # thread, 86-128 for 16-bit LayerNorm at 48-64; no spill)
            return 48 + held
        if not backward and self.cp_async:
            # the least it runs in: the input-dtype row and addressing (ptxas 13, sm_90a, no
            # spill: 47-48 at 32 16-bit elements per thread, 64 at 64 under a 4-CTA budget)
            return 32 + held
        if not backward:
            # the input-dtype row, one round of weight/output (or all of it), addressing
            return 40 + held + (held if self.early_weight else e // 2)
        if self.reload:
            # dweight + dbias accumulators, one round of x/dy/weight in flight
            return 48 + 2 * e
        # x, dy, weight across the reduction, two fp32 accumulators (+ the next x, dy)
        return 40 + 4 * e + (2 * held if self.prefetch else 0)

    def smem_bytes(self, n: int, backward: bool, dtype_bits: int = 32, has_dsum: bool = False) -> int:
        slots = max(self.threads_per_row // 32, 1) * self.cluster_n
        n_slots = LAG_SLOTS if self.lag else 2  # exchange slots (the lagged forward: 4)
        red = n_slots * 2 * self.rows_per_cta * slots * 4
        acc = 2 * self.rows_per_cta * n * 4 if backward and self.rows_per_cta > 1 else 0
        staged = 0
        c_ = self.cluster_n
        if self.stages and self.parts:
            slots = ring_slots(self, n, dtype_bits, has_dsum)
            part = staged_rows(True, has_dsum) * _row_bytes(n // c_, dtype_bits) // self.parts
            staged = slots * part + 16 * slots + 128  # + full and empty mbarriers, alignment
        elif self.stages:
            s = staged_stages(self, n, dtype_bits, has_dsum, backward)
            rows = staged_rows(backward, has_dsum)
            # each CTA of a cluster stages its own contiguous N / cluster_n chunk of the row
            staged = s * rows * _row_bytes(n // c_, dtype_bits) + 8 * s + 128  # + mbarriers, alignment
        shares = 0
        if self.cp_async:
            # x (with has_dsum the residual too; cp_async 2: weight and bias too): each
            # thread's whole share of its row, in 16-byte vectors
            vec_e = 128 // dtype_bits
            rounds = -(-elems_per_thread(n, self.threads_per_row, self.cluster_n) // vec_e)
            arrays = (2 if has_dsum else 1) + (2 if self.cp_async == 2 else 0)
            shares = arrays * self.threads * rounds * 16
        return red + acc + (8 * n_slots if self.exchange == "mbar" else 0) + staged + shares

    def validate(self, n: int, dtype_bits: int, limits: DeviceLimits | None = None, backward: bool = False) -> None:
        """Raise ValueError if this config cannot run rows of n elements."""
        t, p, c = self.threads, self.threads_per_row, self.cluster_n
        if not isinstance(n, int) or n < 1:
            raise ValueError(f"n must be a positive int, got {n!r}")
        if dtype_bits not in (16, 32):
            raise ValueError(f"dtype_bits must be 16 or 32, got {dtype_bits}")
        if not isinstance(t, int) or t < 32 or t > 1024 or t % 32:
            raise ValueError(f"threads={t}: must be a multiple of 32 in [32, 1024]")
        if not _is_pow2(p) or p < 8 or p > t:
            raise ValueError(f"threads_per_row={p}: must be a power of 2 in [8, threads={t}]")
        if c not in (1, 2, 4, 8, 16):
            raise ValueError(f"cluster_n={c}: must be 1, 2, 4, 8 or 16")
        if c > 1 and p != t:
            raise ValueError(f"cluster_n={c} needs one row per CTA (threads_per_row == threads), got {p} != {t}")
        if (self.reload or self.prefetch) and not backward:
            raise ValueError("reload and prefetch are backward-only knobs")
        if self.exchange not in EXCHANGES:
            raise ValueError(f"exchange={self.exchange!r}: must be one of {EXCHANGES}")
        if self.exchange == "mbar" and c == 1:
            raise ValueError("exchange='mbar' needs a cluster (cluster_n > 1)")
        if self.early_weight and backward and self.reload:
            raise ValueError("early_weight holds the weight across rows; reload is for when the registers do not fit")
        if self.early_weight and self.stages:
            raise ValueError("early_weight is a knob of the register kernels; the staged ones read the weight per column")
        if self.cp_async not in (0, 1, 2) or isinstance(self.cp_async, bool):
            raise ValueError(f"cp_async={self.cp_async!r}: 0 (off), 1 (the row) or 2 (the row, weight and bias)")
        if self.cp_async and (backward or self.stages or self.early_weight):
            raise ValueError("cp_async is a knob of the register forward (not the backward, the staged "
                             "forward or early_weight, which it replaces)")
        if self.reload and self.prefetch:
            raise ValueError("prefetch keeps the next rows in registers; reload is for when they do not fit")
        if not isinstance(self.ctas_per_sm, int) or not 1 <= self.ctas_per_sm <= 32:
            raise ValueError(f"ctas_per_sm={self.ctas_per_sm}: must be in [1, 32]")
        if not isinstance(self.stages, int) or not 0 <= self.stages <= 8:
            raise ValueError(f"stages={self.stages}: must be an int in [0, 8] (0: rows in registers)")
        if self.short_chains and (backward or not self.stages or c == 1):
            raise ValueError("short_chains is a knob of the staged forward over a cluster (stages >= 1, cluster_n > 1)")
        if self.stages:
            if p != t:
                raise ValueError(f"stages needs one row per CTA (threads_per_row == threads), got {self}")
            if c > 1 and self.exchange != "mbar":
                raise ValueError(f"stages with a cluster needs exchange='mbar' (the row sums' mbarrier exchange), got {self}")
            if self.reload or self.prefetch:
                raise ValueError("stages replaces reload / prefetch: the rows come from shared memory")
            if n % c or _row_bytes(n // c, dtype_bits) % 16:
                raise ValueError(
                    f"stages needs rows (with a cluster: each CTA's N / cluster_n chunk) of a multiple of 16 bytes "
                    f"(bulk copies), got n={n} x {dtype_bits} bits over {c} CTAs"
                )
            per_cta = self.smem_bytes(n, backward, dtype_bits)
            sm_smem = limits.smem_per_sm if limits is not None else SMEM_PER_SM
            if (per_cta + _SMEM_CTA_RESERVED) * self.ctas_per_sm > sm_smem:
                raise ValueError(
                    f"stages={self.stages}: {self.ctas_per_sm} CTAs x {per_cta} B of shared memory exceed "
                    f"the SM's {sm_smem} B; fewer stages or ctas_per_sm"
                )
        if self.row_grid and (not backward or self.stages or c > 1):
            raise ValueError("row_grid is a knob of the register backward without a cluster (stages = 0, "
                             "cluster_n = 1)")
        if self.lag not in (0, 1) or isinstance(self.lag, bool):
            raise ValueError(f"lag={self.lag!r}: 0 or 1")
        if self.lag and (backward or self.stages < 2 or c == 1):
            # one stage cannot hold row j - 1 (finished late) while row j comes in
            raise ValueError("lag is a knob of the staged forward over a cluster (stages >= 2, cluster_n > 1)")
        if self.parts:
            if not isinstance(self.parts, int) or self.parts not in (2, 4, 8, 16) or not backward or not self.stages:
                raise ValueError(f"parts={self.parts!r}: 2, 4, 8 or 16, a knob of the staged backward (stages >= 1)")
            if n % c or (n // c) % (t * (128 // dtype_bits) * self.parts):
                raise ValueError(
                    f"parts={self.parts} needs each CTA's chunk (n / cluster_n = {n / c:g}) to be a multiple of "
                    f"threads x 16 bytes x parts ({t} x {128 // dtype_bits} x {self.parts} elements)"
                )
            if not ring_slots(self, n, dtype_bits, False):
                raise ValueError(f"parts={self.parts}: not even {self.parts + 1} part slots fit the shared memory ({self})")
        if c > 1 and n < p * c * (128 // dtype_bits):
            raise ValueError(f"cluster_n={c} with threads_per_row={p} needs n >= {p * c * (128 // dtype_bits)}, got {n}")
        regs = self.est_regs_per_thread(n, dtype_bits, backward)
        if regs > _MAX_REGS or regs * t > _REGS_PER_SM:
            raise ValueError(
                f"~{regs} registers/thread x {t} threads exceed the register file "
                f"({elems_per_thread(n, p, c)} elements of the row per thread); use more threads per row or a cluster"
            )
        smem = self.smem_bytes(n, backward, dtype_bits)
        if limits is not None:
            if t > limits.threads_per_block:
                raise ValueError(f"threads={t} > {limits.threads_per_block} per block on sm_{limits.sm}")
            if c > (16 if limits.sm in (90, 100) else limits.max_cluster_size):
                raise ValueError(f"cluster_n={c}: sm_{limits.sm} allows clusters of at most {limits.max_cluster_size}")
            if smem > limits.smem_per_block:
                raise ValueError(f"shared memory {smem} B > {limits.smem_per_block} B")
        elif smem > (SMEM_PER_BLOCK if self.stages or self.cp_async else 48 * 1024):
            raise ValueError(f"shared memory {smem} B > {'227' if self.stages or self.cp_async else '48'} KiB")


# Long-row forward with the mbarrier exchange (v2, docs/kernels/norm.md): which N take
# it by default, per dtype bits, and the CTA size and elements per thread it aims for,
# per (kind, dtype bits). From the H200 sweep (benchmarks/results/h200-longrow-v2.json,
# N = 32768..262144): mbar beat the barrier exchange at every shape; the shapes below
# were best or within ~1 % of best across N for each kind and dtype class.
V2_FWD_MIN_N: dict[int, int | None] = {16: 16385, 32: 16385}
V2_FWD_THREADS = 256
V2_FWD_ELEMS = 32
V2_FWD_SHAPE: dict[tuple[str, int], tuple[int, int]] = {
    ("rms", 16): (256, 32),
    ("rms", 32): (256, 64),
    ("layer", 16): (512, 32),
    ("layer", 32): (256, 32),
}


def v2_forward_config(n: int, dtype_bits: int, threads: int = V2_FWD_THREADS, elems: int = V2_FWD_ELEMS) -> NormConfig | None:
    """The mbar-exchange forward config for a long row: `threads`-thread CTAs (one row
    each), the smallest cluster (2..16) that leaves a thread <= `elems` elements (or 16
    CTAs), None when no cluster config is valid for n."""
    c = 2
    while c < 16 and elems_per_thread(n, threads, c) > elems:
        c *= 2
    while c >= 2:
        cfg = NormConfig(threads, threads, c, 1, exchange="mbar")
        try:
            cfg.validate(n, dtype_bits)
            return cfg
        except ValueError:
            c //= 2  # too short for this many CTAs (or too long for the registers: then none fits)
    return None


def longrow_candidates(n: int, dtype_bits: int) -> list[NormConfig]:
    """Forward configs worth timing against the default at long N (bench_longrow.py):
    the mbar exchange with 256-thread CTAs at 16 / 32 / 64 elements per thread and with
    512-thread CTAs at 32, plus the v1 barrier exchange with 256-thread CTAs at 32 (what
    the CTA shape alone changes)."""
    out: list[NormConfig] = []
    for threads, elems, ex in ((256, 32, "mbar"), (256, 16, "mbar"), (256, 64, "mbar"), (512, 32, "mbar"), (256, 32, "barrier")):
        cfg = v2_forward_config(n, dtype_bits, threads, elems)
        if cfg is None:
            continue
        if ex == "barrier":
            cfg = NormConfig(cfg.threads, cfg.threads_per_row, cfg.cluster_n, 1)
        if cfg not in out:
            out.append(cfg)
    return out


def async_fwd_config(n: int, dtype_bits: int, threads: int = 256, elems: int = 32, level: int = 2,
                     ctas_per_sm: int = 1) -> NormConfig | None:
    """The cp_async forward (v2.8) on ``v2_forward_config``'s shape (``threads``-thread
    CTAs, the smallest cluster leaving <= ``elems`` elements per thread), ``cp_async =
    level``, ``ctas_per_sm`` the register budget (1: none; ptxas fills whatever budget it
    gets, so a loose one costs occupancy: rms bf16 N = 262144 82 % of copy under a
    2-CTA budget, 96 % with none). None when it does not fit, or for rows that are not of
    16-byte vectors."""
    if n % (128 // dtype_bits):
        return None
    cfg = v2_forward_config(n, dtype_bits, threads, elems)
    if cfg is None:
        return None
    cfg = replace(cfg, cp_async=level, ctas_per_sm=ctas_per_sm)
    try:
        cfg.validate(n, dtype_bits)
    except ValueError:
        return None
    return cfg


def async_fwd_candidates(n: int, dtype_bits: int) -> list[NormConfig]:
    """cp_async forward configs (v2.8) worth timing at long N (bench_norm_staged.py --fwd
    --cp-async): ``async_fwd_config`` at level 2 with 256-thread CTAs at <= 32 / 64 / 16
    elements per thread and 512-thread CTAs at <= 32, no register budget; the 256 / 32 and
    512 / 32 shapes at levels 2 and 1 under the budget of as many CTAs as the shares'
    shared memory (unfused, with a bias) and the least registers the row takes
    (``est_regs_per_thread``) leave room for; duplicates collapse."""
    out: list[NormConfig] = []
    shapes = ((256, 32), (256, 64), (256, 16), (512, 32))
    tries = [(t, e, 2, 1) for t, e in shapes]
    for t, e in ((256, 32), (512, 32)):
        for level in (2, 1):
            probe = async_fwd_config(n, dtype_bits, t, e, level)
            if probe is not None:
                per_cta = probe.smem_bytes(n, False, dtype_bits) + _SMEM_CTA_RESERVED
                regs = probe.est_regs_per_thread(n, dtype_bits, False)
                occ = min(8, 2048 // t, SMEM_PER_SM // per_cta, _REGS_PER_SM // (regs * t))
                tries.append((t, e, level, max(1, occ)))
    for t, e, level, occ in tries:
        cfg = async_fwd_config(n, dtype_bits, t, e, level, occ)
        if cfg is not None and cfg not in out:
            out.append(cfg)
    return out


# The backward without partials (frozen weight and bias, `has_dw=False`) runs on the row grid
# (`row_grid`, v2.24) at N in [lo, hi] per dtype bits: one CTA per row block, the block
# scheduler filling the SMs as CTAs finish. Its shape: each thread holds FROZEN_ROW_BYTES of
# its row (fp32 at N >= 2048: twice that), threads_per_row the power of two that gives it
# (16..512), CTAs of at least 128 threads, and a register budget of 128 per thread (512 /
# threads CTAs per SM). H200, M = 32768, back to back / L2 flushed, % of copy, this rule's
# shape against the persistent default it replaces (h200-norm-s24a-row-grid-sweep.json):
# fp32 N = 256..4096 RMSNorm 87.8 / 80.1 vs 85.8 / 76.0, 95.0 / 89.6 vs 91.2 / 85.2, 98.0 /
# 95.0 vs 95.6 / 93.4, 99.4 / 98.6 vs 92.8 / 95.2, 101.2 / 100.4 vs 94.9 / 96.5 (LayerNorm
# alike); bf16 N = 256..8192 +1 to +8 points, e.g. 1024: 95.8 / 88.4 vs 89.6 / 83.2 (the
# weight held across rows, v2.22-v2.23, and the v2.21-v2.23 fp32 1024 picks are superseded).
# fp32 N = 8192 stays persistent (RMSNorm 85.1 on the row grid vs 87.5); longer rows and
# rows under 256 were not measured on the row grid. 16-bit rows of 4097..8191 left it in
# v2.26: through autograd (h200-membound-norm-v2.26-bf16-rowgrid.json) bf16 4608 / 5120 / 6144 read
# RMSNorm 78.9 / 83.6 / 91.0 and LayerNorm 70.8 / 76.5 / 86.2 % on it (512 threads for
# 576..768 vectors: a second, mostly idle round), where the row-staged shape without
# partials read 92.8-96.5 % kernel alone (h200-norm-s26-bf16-5120.json).
FROZEN_ROW_GRID_N = {32: ((256, 4096),), 16: ((256, 4096), (8192, 8192))}
FROZEN_ROW_BYTES = 32


def frozen_row_grid_config(n: int, dtype_bits: int) -> NormConfig | None:
    """The row-grid shape of the backward without partials for rows of n, None outside
    ``FROZEN_ROW_GRID_N`` (see there)."""
    if not any(lo <= n <= hi for lo, hi in FROZEN_ROW_GRID_N.get(dtype_bits, ())):
        return None
    e = FROZEN_ROW_BYTES * 8 // dtype_bits * (2 if dtype_bits == 32 and n >= 2048 else 1)
    return _row_grid_shape(min(512, max(16, _pow2_ceil(-(-n // e)))))


def _row_grid_shape(p: int) -> NormConfig:
    """A row-grid config of p threads per row: CTAs of at least 128 threads (several rows
    each when p is smaller), a register budget of 128 per thread (512 / threads CTAs)."""
    t = max(128, p)
    return NormConfig(t, p, 1, max(1, 512 // t), row_grid=True)


def row_grid_candidates(base: NormConfig, n: int, dtype_bits: int) -> list[NormConfig]:
    """Valid row-grid configs one step from ``base`` (threads per row halved or doubled,
    CTA size, register budget), ``base`` excluded: the tuner's neighbours for the backward
    without partials."""
    t, p, o = base.threads, base.threads_per_row, base.ctas_per_sm
    trial = [_row_grid_shape(2 * p), _row_grid_shape(p // 2),
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


# Row-staged backward (v2.4, NormConfig.stages) as the default: per dtype bits, the N
# ranges (inclusive) that take it with their (elements per thread, stages). From the
# H200 sweep (benchmarks/results/h200-norm-staged.json, M = min(32768, 2^28 / N), % of copy
# through ops/norm.py's _backward): 16-bit N = 8192 at 2 stages (256 threads, 2 CTAs/SM)
# 89-94 % vs the register default 85-92 %; N = 16384 at 3 stages (512 threads) 87-97 % vs
# 62-72 % (the register default needs a 2-CTA cluster there); fp32 N = 16384 (one stage
# of 128 KiB fits) 95-96 % vs 91-94 %. N = 4096 (16-bit and fp32) and fp32 N = 8192 stay in
# registers: the default was 1-4 points faster there. fp32 N = 4097..8191 (norm v2.26,
# h200-norm-s26-fp32-5120.json, kernel alone, M = 32768, N = 4608 / 5120 / 5632 / 6144):
# 256 threads, 3 stages read 97.3-101.4 % with partials and 97.3-98.2 % without, where the
# register default (512 threads, one CTA per SM) read 67.6-91.6 % (RMSNorm) / 81.7-90.7 %
# with partials and 61.0-91.8 % without (ptxas issued part of its loads late, v2.25).
# 16-bit N = 5633..8191 with partials (h200-norm-s26-bf16-5120.json, bf16 6144 / 7168):
# 256 threads, 2 stages (3 CTAs per SM at 6144, 2 at 7168) read 94.2 / 95.8 (RMSNorm) and
# 92.5 / 94.0 % (LayerNorm) against the register default's 84.2 / 90.3 and 76.7 / 84.1 %.
# Not below: at 4608 / 5120 the same
# shape read 93.4 / 94.4 % for RMSNorm but 46.0 / 48.8 % for LayerNorm (register default
# 75.9 / 79.0 and 62.7 / 68.4 %; one rule serves both): that shape ran 3 CTAs per SM, and
# under their 80-register budget LayerNorm's kernel with partials spills 164 bytes (ptxas;
# also at 5640 / 5888 / 6400, and 8 bytes for fp16 RMSNorm), so 5633..8191 are held to 2
# CTAs per SM (the 7168 reading's shape). A fifth field caps the CTAs per SM. Without
# partials 16-bit rows of 4097..8191 take FROZEN_STAGED_BWD before this table.
# v2.27 (H200, M = 32768, through _backward / kernel alone, % of copy, one run each):
# - 16-bit 4097..5632 on 256 threads, 3 stages, 2 CTAs per SM (h200-norm-bwd-16bit-4608-6400.json,
#   bf16 / fp16 4608 / 5120 / 5632): RMSNorm 87.5-88.7 / 92.3-93.3, LayerNorm 76.4-85.6 /
#   82.9-92.6, against the register default's 73.9-79.9 / 76.0-82.1 and 59.6-70.2 / 62.8-73.5.
#   The cap measured at 5888..6400 (2 stages): level with 3 stages through _backward.
# - 16-bit 2049..3584 on 128 threads, 4 CTAs per SM (h200-norm-bwd-2k-sweep.json, bf16 2304 /
#   2560 / 2816 / 3072 / 3584; 3 stages up to 3071, 2 from 3072, the better of the two at
#   each but 2816): RMSNorm 80.3 / 79.8 / 79.9 / 84.2 / 86.5 and LayerNorm 67.9 / 72.6 /
#   71.5 / 76.4 / 79.5 against the register default's 64.5 / 69.7 / 72.7 / 77.9 / 84.4 and
#   31.1 / 33.5 / 35.8 / 64.0 / 70.0 (kernel alone 86.5-94.2 against 34.5-88.7). At 1536,
#   2048 and 4096 the register default was level or ahead. What _backward adds to the
#   kernel alone here (the allocation and the sums of a Q that 4 CTAs per SM double) was
#   not timed apart.
STAGED_BWD: dict[int, tuple[tuple[int, ...], ...]] = {
    16: ((2049, 3071, 32, 3), (3072, 3584, 32, 2), (4097, 5632, 32, 3, 2), (5633, 8191, 32, 2, 2),
         (8192, 8192, 32, 2), (8193, 16384, 32, 3)),
    32: ((4097, 8191, 32, 3), (8193, 16384, 32, 3)),
}

# LayerNorm's register backward with partials holds more per thread than RMSNorm's (the
# dbias accumulators, the mean), which the heuristic's register estimate does not know:
# at N = 2049..3071 it gives 256-thread CTAs 3 per SM (80 registers), and ptxas spilled
# LayerNorm's kernel 212 bytes (bf16) / 96 (fp32); RMSNorm's fits. Per the norm, (lowest N,
# highest N, CTAs per SM at most) for the register backward. H200, fp32, M = 32768,
# through _backward (h200-norm-bwd-2560.json): 2 CTAs per SM read 80.7 / 83.8 / 87.4 % of
# copy at 2304 / 2560 / 2816 against 66.5 / 69.7 / 72.0 % on 3, while RMSNorm on 2 read
# 83.7-90.8 against 90.8-92.4 % on 3. 16-bit rows of these N take STAGED_BWD where their
# rows are 16-byte aligned; this holds the others.
# v2.27, 1025..1408 (both norms; the heuristic's 128 threads a row at 9-11 elements each
# land on the same 3 CTAs per SM; measured at 1280): at 1280 (h200-norm-bwd-small-hidden.json,
# through _backward) 2 CTAs per SM with prefetch read LayerNorm 52.2 / 83.5 % (bf16 /
# fp32) and RMSNorm 64.0 / 89.2 % against 33.4 / 76.1 and 54.0 / 87.2 % on 3. A capped
# config prefetches the next row where that validates (the cap frees the registers; at
# fp32 2304..2816 LayerNorm read level with and without).
REGISTER_BWD_MAX_CTAS: dict[str, tuple[tuple[int, int, int], ...]] = {
    "layer": ((1025, 1408, 2), (2049, 3071, 2)),
    "rms": ((1025, 1408, 2),),
}


# Cluster-staged backward (v2.5) as the default for long rows: per dtype bits, the N ranges
# (inclusive) with (elements per thread, stages, twice the smallest cluster). From the H200
# sweep (benchmarks/results/h200-norm-staged-longrow.json, M = 2^28 / N, % of copy through
# _backward; register default 24-57 %): 16-bit N = 32768 on 2 CTAs of 512 threads, 3 stages
# (rms 97.3, layer 90.3); 65536..131072 on 256-thread CTAs at 2 per SM (rms 92.0-93.6,
# layer 84.0-92.1); 262144 on 16 CTAs of 512 (92.5 / 78.0); fp32 at <= 16 elements per
# thread, 3 stages (96-99.9 % at N <= 131072; one stage of 64 KiB chunks at 262144: 78.9 / 62.2).
# Rows whose chunks leave the cluster-staged backward one whole stage (fp32 N = 262144)
# take the part ring (v2.12) in this many parts.
RING_PARTS = 8
STAGED_BWD_CLUSTER: dict[int, tuple[tuple[int, int, int, int, bool], ...]] = {
    16: ((16385, 32768, 32, 3, False), (32769, 131072, 32, 3, True), (131073, 262144, 32, 3, False)),
    32: ((16385, 262144, 16, 3, False),),
}


# The backward without partials (frozen weight and bias) where the heuristic's shape ran
# well below itself with partials: per dtype bits, (lowest N, highest N, the fields that
# replace the heuristic's), taken where the result validates (else the heuristic). At fp32
# 8192 the cause is in the SASS: without partials ptxas issues 5 of the row loop's 12
# 128-bit loads after the row's first multiply, in a second batch that waits for the first
# (benchmarks/probes/norm_s25d.py; with partials all 12 come first). At bf16 262144 (the
# staged kernel, rows from shared memory) it was not found. H200, kernel alone, % of copy.
# - 16-bit 131073..262144: a ring of 4 parts and 2 stages on 256 threads, on the
#   heuristic's cluster. At 1024 x 262144 the heuristic (16 CTAs of 512 threads, 3
#   whole-row stages) without partials read RMSNorm bf16 86.4 against 94.0 with partials,
#   LayerNorm bf16 77.6 against 88.9 (fp16 80.4 / 77.1), three runs each
#   (h200-norm-s25b-retime-{1,2,3}.json). Of the 47 shapes of the cluster sweep
#   (h200-norm-s25b-frozen-262144.json) this one was the best for both norms at once:
#   RMSNorm 93.4 (fp16 94.5), LayerNorm 88.7 (fp16 88.5). Single shapes read higher for
#   one norm and far lower for the other (512 threads, 2 stages of 2 parts: RMSNorm 95.3,
#   LayerNorm 54.0). At 131072 the heuristic without partials was level with it with
#   partials (94.8 / 93.6 against 94.9 / 92.0, h200-norm-bwd-longrow-frozen.json).
# - fp32 8192 (the one N measured): 2-CTA clusters of 128 threads, 2 stages of the row's
#   halves, 2 CTAs per SM. At 32768 x 8192 the heuristic (one 512-thread CTA per SM, row in registers)
#   without partials read RMSNorm 87.3 against 98.3 with partials (LayerNorm 98.2 / 97.8);
#   this shape read 98.7 / 98.4, the best of 44 shapes for RMSNorm and within 0.1 of the
#   best for LayerNorm (h200-norm-s25c-fp32-8192-frozen.json).
FROZEN_BWD_SHAPES: dict[int, tuple[tuple[int, int, dict[str, Any]], ...]] = {
    16: ((131073, 262144, {"threads": 256, "threads_per_row": 256, "ctas_per_sm": 1, "stages": 2, "parts": 4}),),
    32: ((8192, 8192, {"threads": 128, "threads_per_row": 128, "cluster_n": 2, "ctas_per_sm": 2, "exchange": "mbar",
                       "stages": 2}),),
}


# The row-staged backward without partials (v2.26), as staged_config(n, bits, elems,
# stages) with its own CTAs per SM: 16-bit 4097..8191 (h200-norm-s26-bf16-5120.json, kernel
# alone, bf16 4608 / 5120 / 6144 / 7168: RMSNorm 94.4 / 95.1 / 94.9 / 96.5 and LayerNorm
# 92.8 / 94.7 / 94.6 / 95.1 % on 256 threads, 2 stages, 3 CTAs per SM up to 6143, 2 at
# 7168; the row grid read 70.8-97.4 % there through autograd). No spill (ptxas).
FROZEN_STAGED_BWD: dict[int, tuple[tuple[int, int, int, int], ...]] = {
    16: ((4097, 8191, 32, 2),),
}


# Staged forward (v2.7) as the default for long rows: per (kind, dtype bits), the N ranges
# (inclusive) with (threads per CTA, stages); the cluster is the smallest that cuts the row
# into chunks of <= 32 KiB, 16 at most (``staged_fwd_config``). From the H200 sweep of the
# v2.7 kernel (benchmarks/results/h200-norm-staged-fwd-deep-v2.7.json, M = 2^28 / N,
# kernel alone, % of copy; the register default in brackets; quack's rms):
#   rms 16-bit 65536 / 131072 / 262144, 512 threads, 4 stages: 89.2 / 92.3 / 94.3
#     (86.1 / 82.1 / 74.2 in the v2.6 sweep; quack 94.8 / 95.2 / 90.5);
#   rms fp32 >= 131073 (16 CTAs of 64 KiB chunks), 1024 threads, 2 stages: 262144 93.6
#     (79.4; quack 90.2) -- 3 stages leave no room for the weight in shared memory: 79.2;
#   layer 16-bit 32768 on 1024 threads 92.6, 65536 on 512 93.1, 131072 / 262144 on 256
#     93.0 / 80.1, 4 stages (81.6 / 76.5 / 71.4 / 62.9); bf16 262144 84.7 since v2.9's integer
#     widening (norm.md); 65536 on 6 stages since v2.15 (H200, kernel alone, five runs:
#     89.7-90.6 against 4 stages' 88.1-89.0; h200-norm-fwd-layer-deep-hoist.json,
#     -bf16-65536-stages.json, -bf16-65536-ab.json);
#   layer fp32 65536 / 131072, 256 threads, 4 stages: 93.1 / 92.3 (87.4 / 77.7).
# rms fp32 <= 131072 and layer fp32 at 32768 stay in registers (within a point, or faster).
# layer fp32 above 131072 (v2.15): 16 CTAs of 512 threads, 2 stages of the 64 KiB chunks,
# weight and bias held in registers across rows (they have no room in shared memory beside
# the stages; read per row from L2 this shape measured 51-60 %): 262144 93.3 / 93.1 in two
# runs against the cp_async register default's 73.4 / 73.8
# (benchmarks/results/h200-norm-fwd-layer-fp32-hoist.json, h200-norm-fwd-layer-deep-hoist.json).
# Entries with (lag, CTAs per SM) after the stages are the lagged form (v2.17: LayerNorm's
# statistics finished one row late), taken where it is built (chunks of whole vector rounds);
# a fused residual takes STAGED_FWD_RESIDUAL's entries first, and these only after them. H100, kernel alone,
# % of copy, against the unlagged default in the same process:
#   16-bit 262144, 256 threads, 3 stages, 1 CTA per SM: 95.3-95.6 against 92.3-93.4 (A B A in
#     two processes, h100-norm-fwd-lag-ab-1.json, -2.json);
#   fp32 131072, the same shape: 96.1 / 96.2 against 94.2-94.8 (ibid.);
#   16-bit 32768..131072, 512 threads, 2 stages, 3 CTAs per SM (the 32 KiB chunks of three
#     rows' clusters share an SM; 40 registers, no spill): 65536 93.1-93.6 against 89.4-90.6
#     in three processes, bf16 and fp16 (h100-norm-fwd-layer-65536-lag2-1.json, -2.json,
#     h100-norm-fwd-layer-lag-occ.json); 32768 94.6 against 92.6, 131072 93.6 against 92.1
#     (-lag-occ.json). Lagged on one CTA per SM 32768-131072 measured level (-lag-ab).
# fp32 65536 (94.5 against 93.9) and 262144 (lagged 96.7 / 96.8 against 97.2-97.4) keep the
# unlagged form.
# v2.18: the H100's picks ranked differently on the H200, where the bars are set (kernel
# alone, % of copy, every staged shape of >= 2 stages lagged and not, same process:
# h200-norm-fwd-layer-deep-lag.json, -32768-deep-lag.json, -fp32-deep-lag.json), so the
# table now holds the H200's: 16-bit 32768 1024 threads, 3 stages, unlagged 93.8 (the H100's
# 512-thread lagged pick 86.7); 65536 lagged on 16 KiB chunks, 256 threads, 3 stages, 2 CTAs
# per SM 92.1 (the H100's 84.1; v2.16's 90.2-90.6); 131072 v2.16's unlagged 256 threads, 4
# stages 92.8 (the H100's lagged 512 threads 83.5); 262144 lagged 256 threads, 4 stages
# 90.1-90.3 (3 stages 89.4-89.6, unlagged 86.9-87.0); fp32 131072 lagged 512 threads, 6
# stages 94.9 (the H100's 91.5). On the H100 the H200's picks measured up to 3 points under
# its own (65536: a 4-stage form of the new shape 90.3 against 93.1-93.6; 262144 on 4
# stages 94.6-94.7 against 95.3-95.6; h100-norm-fwd-*.json), still above 90.
STAGED_FWD: dict[tuple[str, int], tuple[tuple[int, ...], ...]] = {
    ("rms", 32): ((131073, 262144, 1024, 2),),
    ("layer", 16): ((32769, 65536, 256, 3, 1, 2, 16), (131073, 262144, 256, 4, 1, 1),  # lagged
                    (32768, 32768, 1024, 3), (32769, 65536, 512, 6), (65537, 262144, 256, 4)),
    ("layer", 32): ((65537, 131072, 512, 6, 1, 1),  # lagged
                    (65536, 131072, 256, 4), (131073, 262144, 512, 2)),
}
# N ranges whose staged forward default (without a residual) takes `short_chains`: LayerNorm
# 16-bit 262144 (lagged on 256 threads, 16-CTA clusters), the bar cell (90 % of copy) and
# its largest gain. H200, kernel alone, % of copy (norm.md sessions 30-31): bf16 89.2-90.4
# without -> 90.2-90.9 with, fp16 89.0-90.1 -> 90.4-90.9. The same changes read about half
# a point ahead at bf16 65536 / 131072 (one run each, not taken) and 2.5-5.7 points behind
# at bf16 / fp16 32768 and fp32 131072, so they stay off elsewhere.
SHORT_CHAINS_FWD: dict[tuple[str, int], tuple[tuple[int, int], ...]] = {
    ("layer", 16): ((262144, 262144),),
}

# With a fused residual (x and the residual staged: two rows per stage, so fewer stages fit),
# ahead of STAGED_FWD: LayerNorm 16-bit; a 7th entry is the chunk target in KiB (32 if not
# given). H100, kernel alone, the residual's bytes counted, one process each, bf16 / fp16
# (h100-norm-fwd-lag-residual-ab.json, h100-norm-fwd-residual-defaults-v2.17.json), against
# v2.16's defaults: 32768 lagged 1024 threads 94.9-95.0 / 94.7 against 93.1-93.4 / 93.3;
# 65536 and 131072 unlagged 256 threads on 16 KiB chunks (8 / 16 CTAs) 94.1 / 94.1 and
# 95.2 / 95.3 against 87.7-87.9 / 89.3 and 72.7-73.8 / 74.4 (lagged 512 threads measured
# 92.3-92.7 and 92.0-92.1 there); 262144 lagged 256 threads, 2 stages, 93.4-93.5 / 95.3
# against 69.1-71.8 / 69.4. fp32 measured level with lag (94.8-97.1 against 95.0-97.2) and
# keeps v2.16's shapes. v2.18, H200 (h200-norm-fwd-layer-residual-*deep-lag.json,
# -residual-32768-v2.18.json): 32768 lagged on 16 KiB chunks, 256 threads, 3 stages 92.5-92.8
# (the H100's 1024-thread pick 88.1-88.7); 65536 / 131072 as chosen on the H100 (92.6 /
# 92.5, the best of the sweep); 262144 1024 threads, 2 stages, unlagged 87.7-88.2 (bf16; fp16
# 84.6) against the H100's lagged 256-thread pick 78.1.
STAGED_FWD_RESIDUAL: dict[tuple[str, int], tuple[tuple[int, ...], ...]] = {
    ("layer", 16): ((32768, 32768, 256, 3, 1, 1, 16), (32769, 131072, 256, 4, 0, 1, 16), (131073, 262144, 1024, 2)),
    ("layer", 32): ((65536, 131072, 256, 4),),  # unlagged
}

# The H100's lagged picks (v2.17, table as STAGED_FWD), no longer defaults since v2.18 (the
# H200 read them at 83.5-91.5 % of copy, under its own picks) but still tuner candidates: on
# the H100 they measured 93.1-96.2 % (STAGED_FWD's comment).
H100_LAGGED_FWD: dict[tuple[str, int], tuple[tuple[int, ...], ...]] = {
    ("layer", 16): ((32768, 131072, 512, 2, 1, 3), (131073, 262144, 256, 3, 1, 1)),
    ("layer", 32): ((65537, 131072, 256, 3, 1, 1),),
}

# cp_async register forward (v2.8) as the default, ahead of STAGED_FWD: per (kind, dtype
# bits), the N ranges (inclusive) with (threads per CTA, elements per thread, cp_async level,
# ctas_per_sm register budget) for ``async_fwd_config``. From the H200 sweeps
# (benchmarks/results/h200-norm-async-fwd.json: level 2 with no budget, where cp_async=True
# is today's level 2; -v3.json: levels 1 and 2 under budgets; M = 2^28 / N, kernel alone,
# % of copy; the previous default in brackets; quack):
#   rms 16-bit 32768 / 65536 / 131072 / 262144, 256 threads, <= 32 elements (4 / 8 / 16 / 16
#     CTAs): 96.7 / 97.0 / 96.2 / 96.0 (90.7 / 89.4 / 92.1 / 94.2; quack 95.9 / 94.8 / 95.6 /
#     90.9); the same shapes loading straight into registers: 90.7 / 86.1 / 81.6 / 73.2;
#   rms fp32 65536 / 131072, 256 threads, <= 32 elements (8 / 16 CTAs): 96.8 / 97.3 (95.0 /
#     92.2; quack 96.1 / 93.5);
#   layer fp32 32768, 256 threads (4 CTAs, 32 elements), level 2: 93.8 / 93.5 (91.0 / 91.2) in
#     h200-norm-async-fwd.json / -layer.json;
#   layer fp32 262144, 512 threads (16 CTAs, 32 elements), level 1 under a 2-CTA budget:
#     73.5 (66.6); level 2 there 58.8 (the default until v2.15 took the staged forward).
# rms fp32 at 32768 keeps its register default (97.7, cp_async 97.4) and at 262144 the staged
# one (90.8-92.7; cp_async at 64 elements per thread 74). LayerNorm otherwise keeps the staged
# forward (92.8-93.6 vs 86-92 at best with cp_async: its weight and bias shares take shared
# memory and registers, 4 CTAs per SM where RMSNorm runs 5; level 1 puts the weight's
# latency back after the statistics: 55-82; staging the weight but reading the bias after
# the statistics measured no better than level 1, -layer.json).
ASYNC_FWD: dict[tuple[str, int], tuple[tuple[int, int, int, int, int, int], ...]] = {
    ("rms", 16): ((32768, 262144, 256, 32, 2, 1),),
    ("rms", 32): ((32769, 131072, 256, 32, 2, 1),),
    ("layer", 32): ((32768, 32768, 256, 32, 2, 1),),
}


def staged_fwd_config(n: int, dtype_bits: int, threads: int, stages: int,
                      chunk_bytes: int = 32 * 1024) -> NormConfig | None:
    """The staged forward with ``threads``-thread CTAs and ``stages`` stages on the smallest
    cluster (1..16) whose chunks hold <= ``chunk_bytes`` (16 CTAs at most: fp32 N = 262144
    has 64 KiB chunks), as many CTAs per SM as fit; None when it is not valid for n (N not
    cut into 16-byte multiples, too many elements per thread, the stages do not fit)."""
    c = 1
    while c < 16 and _row_bytes(n, dtype_bits) > c * chunk_bytes:
        c *= 2
    cfg = staged_config(n, dtype_bits, 1 << 30, stages, threads=threads, cluster_n=c, backward=False)
    if cfg is None or cfg.stages != stages:
        return None
    return cfg


def default_config(n: int, dtype_bits: int, backward: bool = False, kind: str = "rms",
                   residual: bool = False) -> NormConfig:
    """Heuristic: long forward rows (V2_FWD_MIN_N) take the mbar exchange shaped by
    V2_FWD_SHAPE; backward rows in STAGED_BWD's range the row-staged backward; otherwise
    ~_TARGET_E elements per thread; rows longer than 512 threads' worth split over a
    cluster (up to 16 CTAs); then, if the registers do not fit, the backward reloads x/dy
    and finally gives each thread a larger share. ``residual``: the forward fuses a
    residual add (``STAGED_FWD_RESIDUAL``'s shapes come first)."""
    if backward:
        for lo, hi, elems, stages, *cap in STAGED_BWD.get(dtype_bits, ()):
            if lo <= n <= hi:
                cfg = staged_config(n, dtype_bits, elems, stages)
                if cfg is not None:
                    return replace(cfg, ctas_per_sm=min(cfg.ctas_per_sm, *cap)) if cap else cfg
        for lo, hi, elems, stages, more in STAGED_BWD_CLUSTER.get(dtype_bits, ()):
            if lo <= n <= hi:
                cfg = cluster_staged_config(n, dtype_bits, elems, stages)
                if cfg is not None and more and cfg.cluster_n < 16:
                    cfg = cluster_staged_config(n, dtype_bits, elems, stages, min_cluster=2 * cfg.cluster_n) or cfg
                if cfg is None:
                    cfg = cluster_staged_config(n, dtype_bits)
                if cfg is not None and cfg.stages == 1:
                    # one whole-row stage: the part ring instead (v2.12, fp32 N = 262144 on
                    # the H100: rms 96.7 / 96.9 % of copy vs 94.6 / 94.8, layer 95.9 / 95.9
                    # vs 90.8 / 92.5, h100-norm-ring-{1,2}.json)
                    cfg = ring_config(cfg, n, dtype_bits, RING_PARTS) or cfg
                if cfg is not None:
                    return cfg
        cfg = default_register_config(n, dtype_bits)
        for lo, hi, cap in REGISTER_BWD_MAX_CTAS.get(kind, ()):
            if lo <= n <= hi and cfg.ctas_per_sm > cap and not cfg.reload:
                cfg = replace(cfg, ctas_per_sm=cap)
                try:
                    replace(cfg, prefetch=True).validate(n, dtype_bits, backward=True)
                    cfg = replace(cfg, prefetch=True)
                except ValueError:
                    pass
        return cfg
    for lo, hi, threads, elems, level, occ in ASYNC_FWD.get((kind, dtype_bits), ()):
        if lo <= n <= hi:
            cfg = async_fwd_config(n, dtype_bits, threads, elems, level, occ)
            if cfg is not None:
                return cfg
    table = STAGED_FWD.get((kind, dtype_bits), ())
    if residual:
        table = STAGED_FWD_RESIDUAL.get((kind, dtype_bits), ()) + table
    cfg = _staged_table_config(table, n, dtype_bits)
    if cfg is None:
        return default_register_fwd_config(n, dtype_bits, kind)
    for lo, hi in SHORT_CHAINS_FWD.get((kind, dtype_bits), ()) if not residual else ():
        if lo <= n <= hi and cfg.stages and cfg.cluster_n > 1:
            cfg = replace(cfg, short_chains=True)
    return cfg


def _staged_table_config(table: tuple[tuple[int, ...], ...], n: int, dtype_bits: int) -> NormConfig | None:
    """The first entry of a ``STAGED_FWD``-style table whose N range holds n and that builds
    for it (lagged entries only where the lagged form is built), or None."""
    for lo, hi, threads, stages, *extra in table:
        if lo <= n <= hi:
            lag, ctas, chunk_kib = (*extra, *(0, 0, 32)[len(extra):])  # (lag, CTAs per SM, chunk KiB)
            cfg = staged_fwd_config(n, dtype_bits, threads, stages, chunk_kib * 1024)
            if cfg is not None and (lag or ctas):
                cfg = _fitted_fwd_config(cfg, n, dtype_bits, lag, ctas)
            if cfg is not None:
                return cfg
    return None


def _unlagged_default(n: int, dtype_bits: int, kind: str) -> NormConfig:
    """The forward default that STAGED_FWD's first unlagged entry for n gives (v2.16's)."""
    plain = tuple(e for e in STAGED_FWD.get((kind, dtype_bits), ()) if len(e) == 4)  # no (lag, CTAs, chunk)
    return _staged_table_config(plain, n, dtype_bits) or default_register_fwd_config(n, dtype_bits, kind)


def _fitted_fwd_config(cfg: NormConfig, n: int, dtype_bits: int, lag: int, ctas_per_sm: int) -> NormConfig | None:
    """``cfg`` with ``lag`` at ``ctas_per_sm`` CTAs per SM (0: as it is), or None where that
    occupancy does not fit or the lagged form would not be built (a chunk that leaves a warp
    part of a vector round: the statistics then take two exchanges)."""
    vec = 128 // dtype_bits
    if lag and (cfg.cluster_n < 2 or (n // cfg.cluster_n) % (cfg.threads * vec)):
        return None
    out = replace(cfg, lag=lag, ctas_per_sm=ctas_per_sm or cfg.ctas_per_sm)
    try:
        out.validate(n, dtype_bits)
    except ValueError:
        return None
    return out


def default_register_fwd_config(n: int, dtype_bits: int, kind: str = "rms") -> NormConfig:
    """The forward default with the row in registers (stages = 0): what a staged config
    falls back to when its rows are not 16-byte aligned."""
    return _heuristic_config(n, dtype_bits, False, kind)


def default_bwd_config(n: int, dtype_bits: int, has_dw: bool = True, kind: str = "rms") -> NormConfig:
    """The backward's default: ``default_config(backward=True, kind=kind)``; for the kernel
    without partials (``has_dw=False``) the row grid's shape where it was measured faster
    (``frozen_row_grid_config``), the row-staged shapes of ``FROZEN_STAGED_BWD`` and the
    shapes of ``FROZEN_BWD_SHAPES`` (one rule for RMSNorm and LayerNorm each time)."""
    cfg = default_config(n, dtype_bits, backward=True, kind=kind)
    if has_dw:
        return cfg
    row = frozen_row_grid_config(n, dtype_bits)
    if row is not None:
        return row
    for lo, hi, elems, stages in FROZEN_STAGED_BWD.get(dtype_bits, ()):
        if lo <= n <= hi:
            staged = staged_config(n, dtype_bits, elems, stages)
            if staged is not None:
                return staged
    for lo, hi, fields in FROZEN_BWD_SHAPES.get(dtype_bits, ()):
        if lo <= n <= hi:
            shape = replace(cfg, **fields)
            try:
                shape.validate(n, dtype_bits, backward=True)
                return shape
            except ValueError:
                pass  # rows whose chunks the shape cannot cut: the default
    return cfg


def default_register_config(n: int, dtype_bits: int) -> NormConfig:
    """The backward default with the row in registers (stages = 0): what a staged config
    falls back to when its rows are not 16-byte aligned."""
    return _heuristic_config(n, dtype_bits, True, "rms")


# LayerNorm's 16-bit register forward between powers of two: threads per row the power of
# two nearest N / 32 (in log scale) instead of the next one up, which left 2.25-2.5 16-byte
# vectors a thread (a last round mostly idle). H200, kernel alone, M = 32768, bf16, % of copy
# (bench_norm_staged.py --fwd --defaults-only --configs ..., h200-norm-fwd-hidden-sizes.json):
# 2560 on 64 threads a row 90.8 against 85.3 (128), 4608 / 5120 on 128 95.1 / 94.3 against
# 84.0 / 89.2 (256); at 3072 / 3584 / 6144 / 7168 the rule gives the default's P (92.4 /
# 90.8 / 96.5 / 94.6), at the powers of two both agree. RMSNorm's forward read 92.7-96.6 %
# on the old rule at every N there, and is left on it.
# v2.27 also 1280 (h200-norm-fwd-small-hidden.json): 32 threads a row 82.9 against 78.5 %
# (64); at 768 / 1024 / 1536 the rule gives the default's P.
LAYER_FWD_NEAREST_P = {16: (1025, 8191)}


def _pow2_nearest(v: float) -> int:
    """The power of two nearest v in log scale (ties go up)."""
    lo = 1 << max(0, int(v).bit_length() - 1)
    return lo if v * v < 2 * lo * lo else 2 * lo


def _heuristic_config(n: int, dtype_bits: int, backward: bool, kind: str) -> NormConfig:
    lo = V2_FWD_MIN_N.get(dtype_bits)
    if not backward and lo is not None and n >= lo:
        threads, elems = V2_FWD_SHAPE.get((kind, dtype_bits), (V2_FWD_THREADS, V2_FWD_ELEMS))
        if threads < 512 and elems_per_thread(n, threads, 16) > elems and (kind, dtype_bits) != ("layer", 32):
            # even 16 CTAs leave too much per thread: larger CTAs measured faster (N = 262144);
            # not fp32 LayerNorm since its one-exchange statistics (v2.7): 256 threads 67.3 %
            # of copy vs 512 57.3 % (h200-norm-staged-fwd-deep.json)
            threads = 512
        v2 = v2_forward_config(n, dtype_bits, threads, elems)
        if v2 is not None:
            return v2
    e = _TARGET_E[backward]
    p = max(8, _pow2_ceil(-(-n // e)))
    near_lo, near_hi = LAYER_FWD_NEAREST_P.get(dtype_bits, (1, 0))
    if not backward and kind == "layer" and near_lo <= n <= near_hi:
        p = _pow2_nearest(n / e)
    c = 1
    while p > _MAX_P and c < 16:
        c *= 2
        p = max(8, _pow2_ceil(-(-n // (e * c))))
    p = min(p, 1024)
    tries = [(p, False), (p, True), (p // 2, True), (p // 4, True)] if backward else [(p, False), (p // 2, False)]
    err: ValueError | None = None
    for pt, reload in tries:
        if pt < 8:
            continue
        t = pt if (pt >= 256 or c > 1) else 256
        probe = NormConfig(t, pt, c, 1, reload)
        regs = probe.est_regs_per_thread(n, dtype_bits, backward)
        occ = max(1, min(4, _REGS_PER_SM // (regs * t), 2048 // t))
        cfg = NormConfig(t, pt, c, occ, reload)
        try:
            cfg.validate(n, dtype_bits, backward=backward)
        except ValueError as exc:
            err = exc
            continue
        return _with_prefetch(cfg, n, dtype_bits) if backward else cfg
    raise ValueError(f"no norm config fits n={n}, {dtype_bits}-bit: {err}")


# Backward prefetch measured on the H200 (M = 32768, kernel alone; docs/kernels/norm.md v3):
# 16-bit rows gain 6-9 % at N = 1024..16384, lose 4-13 % at N = 256; fp32 rows lose up
# to 13 % at N = 1024 (fewer resident CTAs or a second register set that does not pay).
# v2.27: bf16 768 gains too, through _backward RMSNorm 51.4 -> 59.6 %, LayerNorm 43.6 ->
# 46.9 % (h200-norm-bwd-small-hidden.json).
_PREFETCH_N = (768, 16384)


def _with_prefetch(cfg: NormConfig, n: int, dtype_bits: int) -> NormConfig:
    """The backward default with `prefetch` where it measured faster, if it fits."""
    if dtype_bits != 16 or cfg.reload or not _PREFETCH_N[0] <= n <= _PREFETCH_N[1]:
        return cfg
    pf = NormConfig(cfg.threads, cfg.threads_per_row, cfg.cluster_n, cfg.ctas_per_sm, False, True)
    if pf.est_regs_per_thread(n, dtype_bits, True) * pf.threads * pf.ctas_per_sm > _REGS_PER_SM:
        return cfg  # the second register set would cost resident CTAs
    try:
        pf.validate(n, dtype_bits, backward=True)
    except ValueError:
        return cfg
    return pf


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
        # entries skipped): the cards ranked them differently (v2.17 on the H100, v2.18)
        alts = [_unlagged_default(n, dtype_bits, kind)] if base.lag else []
        if base.short_chains:  # measured on the H200 only (norm.md session 31)
            alts.append(replace(base, short_chains=False))
        if not residual:  # H100_LAGGED_FWD's shapes were measured without one
            alts.append(_staged_table_config(H100_LAGGED_FWD.get((kind, dtype_bits), ()), n, dtype_bits))
        alts += async_fwd_candidates(n, dtype_bits)[:3]
        alts += [staged_fwd_config(n, dtype_bits, t, s) for t, s in ((256, 4), (512, 4), (1024, 4), (256, 6))]
        for cfg in alts + [reg] + candidate_configs_around(reg, n, dtype_bits, False):
            if cfg is not None and cfg not in out:
                out.append(cfg)
        return out[:8]
    out = [base]
    if not backward and n >= 32768:
        # the other forward paths (cp_async; rows staged, fewer stages where 4 do not fit)
        st = next((c for s in (4, 3, 2) if (c := staged_fwd_config(n, dtype_bits, 256, s)) is not None), None)
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
        else:  # one CTA per row where it fits, else the row split over a cluster (v2.5)
            st = staged_config(n, dtype_bits) or cluster_staged_config(n, dtype_bits)
        if st is not None:
            trial.insert(0, st)  # the other backward path (row staged in shared memory / in registers)
    if backward and base.prefetch:
        trial.insert(0, NormConfig(t, p, c, o, False, False))  # the same without prefetch
    elif backward:
        # fp32 rows double the prefetch registers: halve the occupancy target there
        trial.insert(0, NormConfig(t, p, c, o if dtype_bits == 16 else max(1, o // 2), False, True))
    if backward:
        if not rl and not base.stages:  # the weight held across rows, or read every row (v2.22)
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


# --------------------------------------------------------------------------- v2.1 backward


def v2_backward_config(
    n: int, dtype_bits: int, threads: int = 256, elems: int = 16, exchange: str = "mbar", prefetch: bool = False
) -> NormConfig | None:
    """A long-row backward config: `threads`-thread CTAs (one row each), the smallest
    cluster (2..16) leaving a thread <= `elems` elements (else 16), `reload` when x and dy
    do not fit in registers beside the accumulators, and as many persistent CTAs per SM
    (1..4) as the register estimate allows. None when nothing valid fits."""
    c = 2
    while c < 16 and elems_per_thread(n, threads, c) > elems:
        c *= 2
    while c >= 2:
        for reload in (False, True):
            if reload and prefetch:
                continue
            probe = NormConfig(threads, threads, c, 1, reload, prefetch, exchange=exchange)
            regs = probe.est_regs_per_thread(n, dtype_bits, True)
            occ = max(1, min(4, _REGS_PER_SM // (regs * threads), 2048 // threads))
            cfg = NormConfig(threads, threads, c, occ, reload, prefetch, exchange=exchange)
            try:
                cfg.validate(n, dtype_bits, backward=True)
                return cfg
            except ValueError:
                continue
        c //= 2
    return None


def longrow_bwd_candidates(n: int, dtype_bits: int) -> list[NormConfig]:
    """Backward configs worth timing against the default at long N (bench_longrow.py
    --ops rms_norm_bwd,layer_norm_bwd): the mbar exchange with 256-thread CTAs at <= 16
    and <= 32 elements per thread (and <= 32 with prefetch), with 512-thread CTAs at
    <= 16, plus the v1 barrier with 256-thread CTAs at <= 16 (the CTA shape alone)."""
    out: list[NormConfig] = []
    for threads, elems, ex, pf in (
        (256, 16, "mbar", False),
        (256, 32, "mbar", False),
        (256, 32, "mbar", True),
        (512, 16, "mbar", False),
        (256, 16, "barrier", False),
    ):
        cfg = v2_backward_config(n, dtype_bits, threads, elems, ex, pf)
        if cfg is not None and cfg not in out:
            out.append(cfg)
    return out


# --------------------------------------------------------------------------- v2.4 staged backward


def staged_config(n: int, dtype_bits: int, elems: int = 32, stages: int = 3, threads: int | None = None,
                  cluster_n: int = 1, backward: bool = True) -> NormConfig | None:
    """A row-staged backward config (``NormConfig.stages``): one row per CTA of
    ``threads`` (default: the power of 2 leaving a thread <= ``elems`` elements of its
    chunk, 128..1024), ``stages`` rows in shared memory (fewer if they do not fit one CTA),
    and as many persistent CTAs per SM (1..4) as registers, shared memory and 2048 threads
    allow. With ``cluster_n`` > 1 (v2.5) the row is split over a cluster: each CTA stages
    its contiguous N / cluster_n chunk, the row sums meet through the mbarrier exchange.
    None when no such config is valid for n (chunks of a multiple of 16 bytes only).
    ``backward=False``: the staged forward's (v2.6) config of the same shape."""
    c = cluster_n
    if n % c or _row_bytes(n // c, dtype_bits) % 16:
        return None
    nc = n // c
    ex = "mbar" if c > 1 else "barrier"
    t = threads or min(1024, max(128, _pow2_ceil(-(-nc // elems))))
    for s in range(stages, 0, -1):
        probe = NormConfig(t, t, c, 1, stages=s, exchange=ex)
        regs = probe.est_regs_per_thread(n, dtype_bits, backward)
        per_cta = probe.smem_bytes(n, backward, dtype_bits) + _SMEM_CTA_RESERVED
        occ = max(1, min(4, _REGS_PER_SM // (regs * t), 2048 // t, SMEM_PER_SM // per_cta))
        cfg = NormConfig(t, t, c, occ, stages=s, exchange=ex)
        try:
            cfg.validate(n, dtype_bits, backward=backward)
            return cfg
        except ValueError:
            continue
    return None


def staged_candidates(n: int, dtype_bits: int) -> list[NormConfig]:
    """Staged backward configs worth timing against the default (bench_norm_staged.py):
    <= 32 and <= 16 elements per thread, 2 and 3 stages (duplicates collapse)."""
    out: list[NormConfig] = []
    for elems, stages in ((32, 3), (32, 2), (16, 3), (16, 2)):
        cfg = staged_config(n, dtype_bits, elems, stages)
        if cfg is not None and cfg not in out:
            out.append(cfg)
    return out


# --------------------------------------------------------------------------- v2.5 cluster-staged backward


def cluster_staged_config(n: int, dtype_bits: int, elems: int = 32, stages: int = 3, min_cluster: int = 2,
                          backward: bool = True) -> NormConfig | None:
    """The staged backward for a row split over a cluster (v2.5): the smallest cluster
    (>= ``min_cluster``, 2..16) whose CTAs can stage ``stages`` chunks of x / dy with
    <= ``elems`` elements per thread; if no cluster holds that many stages, the 16-CTA
    config with as many as fit. None when nothing valid fits (N not a multiple of
    cluster_n x 16 bytes' worth)."""
    best = None
    c = max(2, min_cluster)
    while c <= 16:
        cfg = staged_config(n, dtype_bits, elems, stages, cluster_n=c, backward=backward)
        if cfg is not None and -(-(n // c) // cfg.threads) <= elems:
            if cfg.stages == stages:
                return cfg
            if best is None or cfg.stages > best.stages:
                best = cfg
        c *= 2
    return best


def ring_config(base: NormConfig | None, n: int, dtype_bits: int, parts: int, stages: int = 2) -> NormConfig | None:
    """``base`` (a staged backward config) as the part-ring backward (v2.12): its rows cut
    into ``parts`` parts in a ring of up to stages x parts slots; None when that is not
    valid for n (chunks not of whole rounds) or when, with a weight of x's dtype, fewer than
    parts + 1 slots fit beside the weight's chunk (the ring keeps it in shared memory;
    ring.py ``ring_fit``; the kernel would build whole-row stages instead)."""
    if base is None or not base.stages:
        return None
    cfg = replace(base, stages=stages, parts=parts)
    try:
        cfg.validate(n, dtype_bits, backward=True)
    except ValueError:
        return None
    if not ring_slots(cfg, n, dtype_bits, False, reserve=_row_bytes(n // cfg.cluster_n, dtype_bits) + 256):
        return None
    return cfg


def longrow_staged_candidates(n: int, dtype_bits: int) -> list[NormConfig]:
    """Cluster-staged backward configs worth timing at long N (bench_norm_staged.py):
    <= 32 elements per thread at 3 and 2 stages, <= 16 at 3, and the 32 / 3 shape on twice
    the cluster (smaller chunks: more CTAs per SM); where the chunks leave room for one
    whole stage only, that shape as the part ring (v2.12) at 2, 4 and 8 parts; duplicates
    collapse."""
    out: list[NormConfig] = []
    for elems, stages, more in ((32, 3, False), (32, 2, False), (16, 3, False), (32, 3, True)):
        cfg = cluster_staged_config(n, dtype_bits, elems, stages)
        if cfg is not None and more:
            cfg = cluster_staged_config(n, dtype_bits, elems, stages, min_cluster=2 * cfg.cluster_n) if cfg.cluster_n < 16 else None
        if cfg is not None and cfg not in out:
            out.append(cfg)
    one = [c for c in out if c.stages == 1]
    for parts in (2, 4, 8):
        for cfg in one:
            ring = ring_config(cfg, n, dtype_bits, parts)
            if ring is not None and ring not in out:
                out.append(ring)
    return out


# --------------------------------------------------------------------------- v2.6 staged forward


def staged_fwd_groups(cfg: NormConfig, sm_count: int, max_clusters: int | None = None) -> int:
    """The persistent staged forward's CTA groups (clusters) at most (the grid is this or
    the row count, whichever is smaller): sm_count x ctas_per_sm / cluster_n, and with a
    cluster at most the clusters the device runs at once x ctas_per_sm (as
    ``ops.norm.bwd_groups`` caps the staged backward: a group that does not fit would run
    as a second wave)."""
    q = max(1, sm_count * cfg.ctas_per_sm // cfg.cluster_n)
    if cfg.cluster_n > 1 and max_clusters:
        q = max(1, min(q, max_clusters * cfg.ctas_per_sm))
    return q


def longrow_staged_fwd_candidates(n: int, dtype_bits: int) -> list[NormConfig]:
    """Staged forward configs (v2.6) worth timing against the forward default at N >= 4096
    (bench_norm_staged.py --fwd): one CTA per row where the row fits (<= 32 elements per
    thread, 3 and 2 stages), else and at long N the row split over a cluster: <= 32
    elements per thread at 3 and 2 stages, <= 16 at 3, and the 32 / 3 and 16 / 3 shapes on
    twice the cluster (smaller chunks: more stages of x + residual fit, more CTAs per SM);
    duplicates collapse. The defaults (``STAGED_FWD``) come from a wider sweep
    (bench_norm_staged.py --fwd --deep)."""
    out: list[NormConfig] = []
    if n <= 16384:
        for elems, stages in ((32, 3), (32, 2)):
            cfg = staged_config(n, dtype_bits, elems, stages, backward=False)
            if cfg is not None and cfg not in out:
                out.append(cfg)
    for elems, stages, more in ((32, 3, False), (32, 2, False), (16, 3, False), (32, 3, True), (16, 3, True)):
        cfg = cluster_staged_config(n, dtype_bits, elems, stages, backward=False)
        if cfg is not None and more:
            cfg = (cluster_staged_config(n, dtype_bits, elems, stages, min_cluster=2 * cfg.cluster_n, backward=False)
                   if cfg.cluster_n < 16 else None)
        if cfg is not None and cfg not in out:
            out.append(cfg)
    return out
