"""`NormConfig`: the knobs of the RMSNorm / LayerNorm kernels (forward and backward), the
resources a config takes (registers, shared memory, stages, ring slots) and `validate`.

Both kernels keep a row on chip: every thread holds its share of the row in registers,
E = ceil(N / (threads_per_row * cluster_n)) elements (see common.py for the exact
tiling), or, with ``stages``, in shared memory. The knobs trade that per-thread share
(registers, bytes in flight) against the number of threads that must agree on a row's
statistics (shuffle / shared-memory / cluster reductions):

threads:          CTA size (multiple of 32, <= 1024).
threads_per_row:  P, threads of one CTA that share a row (power of 2, >= 8 so that
                  the < 16-byte tail of any row fits one scalar per thread);
                  rows per CTA R = threads // P.
cluster_n:        CTAs of an sm_90 cluster that split one row (1, 2, 4, 8, 16; 16 is a
                  non-portable size that sm_90 allows and the DSL's launch opts into);
                  their partial sums meet in distributed shared memory.
ctas_per_sm:      backward: the persistent grid is sm_count * ctas_per_sm / cluster_n
                  CTA groups, each accumulating dweight/dbias partials over the rows it
                  visits (it must not exceed the real occupancy, else waves); everywhere
                  the register budget ptxas gets.
reload:           backward only: do not keep x and dy in registers across the row
                  reduction; read them again (from L2: the cluster just read them) for
                  dx. Frees registers for the dweight/dbias accumulators at huge N.
early_weight:     register kernels. Forward: load weight (and bias) together with x, before
                  the row reduction, instead of after it (shorter critical path, more
                  registers). Backward (not with reload): load the weight once, before the
                  row loop, and hold it across the CTA group's rows instead of reading it
                  again (from L1, on the path to the row sums) for every row.
prefetch:         backward only: issue the loads of the CTA group's next row block
                  before working on the current one (a second register set for x and
                  dy), so loads stay in flight across the reduction and the dx stores.
exchange:         with a cluster: how the CTAs of a row exchange partial sums.
                  "barrier": st.shared::cluster into every peer, then a full cluster
                  barrier (arrive.release / wait.acquire) per reduction;
                  "mbar": each warp's lanes l < cluster_n st.async the partial into CTA
                  l, counted on CTA l's mbarrier (one per reduction), and each CTA waits
                  on its own mbarrier only (softmax's exchange). The persistent backward
                  alternates two mbarriers over its rows.
stages:           0 keeps the row in registers (above); S >= 1 stages rows in shared
                  memory: thread 0 brings each row in with bulk asynchronous copies
                  (cp.async.bulk global -> shared, completing on the stage's mbarrier),
                  S rows ahead of the CTA. One row per CTA (threads_per_row == threads);
                  with a cluster (exchange "mbar") each CTA stages its N / cluster_n
                  chunk; chunks of a multiple of 16 bytes; the bytes in flight no longer
                  depend on registers. Backward: x and dy (and dsum when fused), read from
                  shared memory for the row sums and again for dx, only weight and the
                  dweight/dbias accumulators in registers; S x 2 rows (3 with dsum, fewer
                  stages if they would not fit; ``staged_stages``). Forward: x (and the
                  residual when fused), S x 1 row chunks (2 with the residual), each
                  thread's share read once into registers, the stage refilled after the
                  row's first reduction, y (and x + residual) written from registers;
                  persistent like the staged backward (``staged_fwd_groups``).
                  ``early_weight`` does not apply.
parts:            backward with stages only: 0 keeps whole-row stages; P >= 2 cuts each
                  CTA's staged chunk into P parts that travel through a ring of part-sized
                  slots (``ring_slots``: stages x P of them, fewer if they do not fit
                  beside the weight's chunk, which the ring keeps in shared memory; at
                  least P + 1, else the kernel builds whole-row stages), each with its own
                  "full" and "empty" mbarrier. A part's slot is refilled with the part a
                  ring ahead as soon as every warp has read it for dx, so the next row
                  streams in under this row's dx pass and exchange instead of waiting for
                  the whole row: a one-stage 1 MiB row has nothing in flight across it
                  otherwise. Chunks of whole rounds only (N / cluster_n a multiple of
                  threads x 16 bytes x P).
cp_async:         forward only, row in registers (stages = 0): 0 loads straight into
                  registers; 1 brings the thread's share of the row (and of the residual)
                  through shared memory with 16-byte cp.async copies issued at kernel
                  start, so no register is held by a load in flight; 2 also weight and bias
                  (a second commit group, waited for only before the output: their latency
                  is off the critical path, at the price of their shares' shared memory).
                  Each thread reads back only what it copied (no barrier). Rows of 16-byte
                  vectors only; other rows build the same config without it. With
                  ctas_per_sm > 1 ptxas gets the register budget of that many CTAs per SM
                  (else it reads the weight and bias shares back all at once).
lag:              staged LayerNorm forward over a cluster only: 0 finishes each row (its
                  statistics' exchange, then y) before reading the next; 1 sends a row's
                  (sum, M2) pairs, then finishes the row before it, reading its x again
                  from its stage (exchange.make_moments_lagged): the cluster round trip runs
                  under the next row's first pass, at the price of a second read of the
                  chunk from shared memory and a stage held one row longer (with a fused
                  residual, s = x + residual formed again there). Rows whose statistics
                  need two exchanges (padded chunks) build the same config without it.
short_chains:     staged forward over a cluster only: shorter dependent chains per row.
                  LayerNorm's moments in one shuffle chain (each thread centres its
                  squares on its own mean, the warp and the cluster fold merge the
                  (sum, M2) pairs pairwise, exchange.warp_merge_moments) instead of a warp
                  sum and then the centred squares' sum; for 16-bit x, y's normalisation
                  as one FFMA, (s * rstd - mean * rstd) * w; and the CTA's rows counted
                  instead of one integer division per row.
row_grid:         the backward without partials only (frozen weight and bias,
                  has_dw=False), row in registers, no cluster: one CTA per row block
                  (Q = M / rows per CTA) instead of the persistent grid, so each CTA runs
                  once and the block scheduler fills the SMs as CTAs finish, as torch's dx
                  kernel does. ctas_per_sm then only sets ptxas's register budget. The
                  kernel is the same (it loops over row blocks with a stride of its grid
                  size); the kernel with partials keeps the persistent grid (its Q partial
                  rows are summed afterwards).
"""

from __future__ import annotations

from dataclasses import dataclass

from ....arch import DeviceLimits
from ...rows.tiling import RowTiling, is_pow2

EXCHANGES = ("barrier", "mbar")
LAG_SLOTS = 4  # the lagged forward's exchange slots (exchange.make_moments_lagged says why four)

REGS_PER_SM = 65536
MAX_REGS = 255
# sm_90: a block may opt in to 227 KiB of shared memory, an SM holds 228 KiB (each
# resident CTA also reserves 1 KiB for the system).
SMEM_PER_BLOCK = 227 * 1024
SMEM_PER_SM = 228 * 1024
SMEM_CTA_RESERVED = 1024


def elems_per_thread(n: int, threads_per_row: int, cluster_n: int) -> int:
    return -(-n // (threads_per_row * cluster_n))


def row_bytes(n: int, dtype_bits: int) -> int:
    return n * dtype_bits // 8


def staged_rows(backward: bool, fused: bool) -> int:
    """Row chunks per stage of a staged kernel: backward x, dy (+ dsum); forward x (+ the
    residual)."""
    return (2 if backward else 1) + (1 if fused else 0)


def stage_budget(cfg: NormConfig) -> int:
    """Shared memory a staged CTA has for its stages: what one of ``cfg.ctas_per_sm`` CTAs
    gets of the SM (at most a block's opt-in), less the reduce buffers and mbarriers."""
    return min(SMEM_PER_BLOCK, SMEM_PER_SM // cfg.ctas_per_sm - SMEM_CTA_RESERVED) - 4096


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
    row = row_bytes(n // cfg.cluster_n, dtype_bits)  # the CTA's chunk of the row
    budget = stage_budget(cfg)
    return max(1, min(cfg.stages, budget // (staged_rows(backward, True) * row)))


def ring_slots(cfg: NormConfig, n: int, dtype_bits: int, has_dsum: bool, reserve: int = 0) -> int:
    """Part slots of the part-ring backward (``cfg.parts`` >= 2): cfg.stages x cfg.parts
    parts of ``staged_rows`` chunks each, or as many as fit the shared memory an SM has
    for each of ``cfg.ctas_per_sm`` CTAs beside ``reserve`` bytes (the weight's chunk, when
    the kernel stages it); 0 when not even parts + 1 fit (validate says so)."""
    part = staged_rows(True, has_dsum) * row_bytes(n // cfg.cluster_n, dtype_bits) // cfg.parts
    budget = stage_budget(cfg) - reserve
    slots = min(cfg.stages * cfg.parts, budget // part)
    return slots if slots > cfg.parts else 0


@dataclass(frozen=True)
class NormConfig(RowTiling):
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
            # the row share read once from shared memory and held across the reduction,
            # one vector of weight / bias / y at a time, the row sums' chains, addressing
            # (ptxas, sm_90a: 31-64 at <= 32 elements per thread, 86-128 for 16-bit
            # LayerNorm at 48-64; no spill)
            return 48 + held
        if not backward and self.cp_async:
            # the least it runs in: the input-dtype row and addressing (ptxas, sm_90a, no
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
            part = staged_rows(True, has_dsum) * row_bytes(n // c_, dtype_bits) // self.parts
            staged = slots * part + 16 * slots + 128  # + full and empty mbarriers, alignment
        elif self.stages:
            s = staged_stages(self, n, dtype_bits, has_dsum, backward)
            rows = staged_rows(backward, has_dsum)
            # each CTA of a cluster stages its own contiguous N / cluster_n chunk of the row
            staged = s * rows * row_bytes(n // c_, dtype_bits) + 8 * s + 128  # + mbarriers, alignment
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
        self.check_rows(n, dtype_bits)
        if not is_pow2(p) or p < 8 or p > t:
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
            if n % c or row_bytes(n // c, dtype_bits) % 16:
                raise ValueError(
                    f"stages needs rows (with a cluster: each CTA's N / cluster_n chunk) of a multiple of 16 bytes "
                    f"(bulk copies), got n={n} x {dtype_bits} bits over {c} CTAs"
                )
            per_cta = self.smem_bytes(n, backward, dtype_bits)
            sm_smem = limits.smem_per_sm if limits is not None else SMEM_PER_SM
            if (per_cta + SMEM_CTA_RESERVED) * self.ctas_per_sm > sm_smem:
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
        if regs > MAX_REGS or regs * t > REGS_PER_SM:
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
