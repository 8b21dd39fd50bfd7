"""Row staging through shared memory (the staged norm kernels, forward and backward): rows,
or each CTA's contiguous chunk of a row, brought in by ``cp.async.bulk`` global -> shared,
completing on an mbarrier per stage; the persistent grid's groups; launch bounds.

``make_chunk`` cuts a CTA's contiguous N / C chunk out of a row (the whole row without a
cluster); ``make_stage_issue`` is thread 0's refill of one stage: arm the stage's
mbarrier with the stage's bytes and bring the chunk of one row of each staged operand
into the stage's slots with ``cp.async.bulk`` global -> shared (completing on that
mbarrier). Row j of a CTA lives in stage j % S and is waited for with parity (j // S) % 2.
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int64
from cutlass.cute.nvgpu import cpasync


def launch_bounds(threads: int, ctas_per_sm: int) -> dict:
    """Launch keywords: ``threads`` per CTA and, with ctas_per_sm > 1, ptxas's register budget
    for that many CTAs per SM (nvvm.minctasm). ptxas then uses up to that budget, so it must
    be the occupancy wanted, not a bound above it. The carveout is given (the driver's
    default, -1) so that the DSL does not ask a device for one: it compiles without a GPU."""
    out: dict = {"max_number_threads": [threads, 1, 1]}
    if ctas_per_sm > 1:
        out.update(min_blocks_per_mp=ctas_per_sm, preferred_smem_carveout=-1)
    return out


def make_chunk(nc: int, c: int):
    """part(row, cta): this CTA's contiguous chunk [cta nc, (cta + 1) nc) of a row (the row
    itself when c == 1); a plain function, traced inline."""

    def part(row: cute.Tensor, cta):
        return cute.local_tile(row, (nc,), (cta,)) if c > 1 else row

    return part


def make_stage_issue(dtype, nc: int, c: int, n_rows: int):
    """@cute.jit issue(a, b, d, srows, full, row, stage, cta) for thread 0 of a staged kernel:
    arm mbarrier ``full + stage`` with n_rows chunks' bytes and bulk-copy this CTA's chunk
    (``make_chunk``) of row ``row`` of the first ``n_rows`` (1..3) of a, b, d into stage
    slots ``stage * n_rows + i`` of ``srows`` ((nc, S * n_rows) shared memory, 16-byte
    aligned chunks of a multiple of 16 bytes; unused operands are stand-ins, never read)."""
    if n_rows not in (1, 2, 3):
        raise ValueError(f"n_rows={n_rows}: 1..3 staged operands")
    part = make_chunk(nc, c)
    row_bytes = nc * dtype.width // 8
    tx_bytes = n_rows * row_bytes

    @cute.jit
    def issue(a: cute.Tensor, b: cute.Tensor, d: cute.Tensor, srows: cute.Tensor, full, row, stage, cta):
        atom = cute.make_copy_atom(cpasync.CopyBulkG2SOp(), dtype, num_bits_per_copy=row_bytes * 8)
        bar = full + stage
        cute.arch.mbarrier_arrive_and_expect_tx(bar, tx_bytes)
        cute.copy(atom, part(a[row, None], cta), srows[None, stage * n_rows], mbar_ptr=bar)
        if cutlass.const_expr(n_rows > 1):
            cute.copy(atom, part(b[row, None], cta), srows[None, stage * n_rows + 1], mbar_ptr=bar)
        if cutlass.const_expr(n_rows > 2):
            cute.copy(atom, part(d[row, None], cta), srows[None, stage * n_rows + 2], mbar_ptr=bar)

    return issue


def make_stage_start(x_dtype, w_dtype, nc: int, c: int, stages: int, n_rows: int, xtx: int, n_w: int,
                     w_smem: bool, n_xbar: int = 2):
    """(start, issue, refill) of a staged kernel. @cute.jit start(tidx, cta, q, n_q, m, a, b,
    d, w, bias, srows, full, xbar, sw, sb): the prologue once the shared memory is allocated
    (``staged_smem``): the mbarriers (``make_stage_barrier_init``); with ``w_smem`` thread 0
    bulk-copies this CTA's chunk of the weight (and, n_w == 2, the bias) into sw (sb),
    completing on mbarrier ``full + stages``; then it issues the CTA group's first
    ``stages`` rows (q, q + n_q, ...) of a, b, d into the stages with ``issue``
    (``make_stage_issue``), through which the kernel refills them too. @cute.jit
    refill(tidx, a, b, d, srows, full, blk, ahead, n_q, m, stage, cta): thread 0 brings the
    CTA group's row ``ahead`` (a Constexpr) rows past ``blk``, when there is one, into stage
    ``stage``. Stand-ins for what a kernel lacks (xbar without a cluster, sw / sb without
    ``w_smem``, bias with n_w == 1) are never touched.
    ``n_xbar``: the cluster's exchange mbarriers (2; 4 for the lagged LayerNorm forward)."""
    init = make_stage_barrier_init(stages + 1, c, xtx, n_xbar=n_xbar)
    issue = make_stage_issue(x_dtype, nc, c, n_rows)
    part = make_chunk(nc, c)
    w_bytes = nc * w_dtype.width // 8

    @cute.jit
    def start(tidx, cta, q, n_q, m, a: cute.Tensor, b: cute.Tensor, d: cute.Tensor, w: cute.Tensor,
              bias: cute.Tensor, srows: cute.Tensor, full, xbar, sw: cute.Tensor, sb: cute.Tensor):
        init(tidx, full, xbar)
        if cutlass.const_expr(w_smem):
            if tidx == 0:
                watom = cute.make_copy_atom(cpasync.CopyBulkG2SOp(), w_dtype, num_bits_per_copy=w_bytes * 8)
                cute.arch.mbarrier_arrive_and_expect_tx(full + stages, n_w * w_bytes)
                cute.copy(watom, part(w, cta), sw, mbar_ptr=full + stages)
                if cutlass.const_expr(n_w > 1):
                    cute.copy(watom, part(bias, cta), sb, mbar_ptr=full + stages)
        if tidx == 0:
            for i in cutlass.range_constexpr(stages):
                if q + i * n_q < m:
                    issue(a, b, d, srows, full, q + i * n_q, i, cta)

    @cute.jit
    def refill(tidx, a: cute.Tensor, b: cute.Tensor, d: cute.Tensor, srows: cute.Tensor, full, blk,
               ahead: cutlass.Constexpr, n_q, m, stage, cta):
        if tidx == 0:
            nr = blk + ahead * n_q
            if nr < m:
                issue(a, b, d, srows, full, nr, stage, cta)

    return start, issue, refill


def persistent_coords(c: int, x: cute.Tensor):
    """(tidx, cta, q, n_q, m) of the calling thread in a persistent grid of CTA groups (one
    cluster of c CTAs per group when c > 1) over the m rows of x: its index in its CTA, its
    CTA's rank in the cluster, its group, and the number of groups; group q visits rows q,
    q + n_q, ... A plain function, traced inline by the staged kernels."""
    tidx, _, _ = cute.arch.thread_idx()
    bidx, _, _ = cute.arch.block_idx()
    gdim, _, _ = cute.arch.grid_dim()
    if c > 1:
        return tidx, cute.arch.block_idx_in_cluster(), bidx // c, gdim // c, x.shape[0]
    return tidx, 0, bidx, gdim, x.shape[0]


def staged_smem(dtype, nc: int, slots: int, n_smem: int, n_full: int, c: int, n_xbar: int = 2):
    """The staged kernels' shared memory: its allocator (for what a kernel adds after), then
    in allocation order the stage slots ((nc, slots)
    of dtype, 128-byte aligned for the bulk copies), the fp32 reduction buffer (n_smem),
    n_full "full" mbarriers (one per stage, plus the weight's) and, with a cluster, the
    ``n_xbar`` mbarriers of the row sums' exchange (else None)."""
    smem = cutlass.memory.SmemAllocator()
    srows = smem.allocate_tensor(dtype, cute.make_layout((nc, slots), stride=(1, nc)), byte_alignment=128)
    buf = smem.allocate_tensor(Float32, cute.make_layout((n_smem,)), byte_alignment=16)
    full = smem.allocate_array(Int64, n_full, byte_alignment=8)
    xbar = smem.allocate_array(Int64, n_xbar, byte_alignment=8) if c > 1 else None
    return smem, srows, buf, full, xbar


def make_stage_barrier_init(n_full: int, c: int, xtx: int, n_empty: int = 0, empty_count: int = 1, n_xbar: int = 2):
    """@cute.jit init(tidx, full, xbar) for the staged kernels' prologue: thread 0
    initialises the n_full "full" mbarriers (one arrival each: the expect_tx of the thread
    issuing the copies), then ``n_empty`` "empty" mbarriers right after them (``full +
    n_full + i``, ``empty_count`` arrivals each: the part-ring backward's per-warp releases)
    and, with a cluster (c > 1), the ``n_xbar`` exchange mbarriers, armed for
    their first rows' xtx bytes; then the init fence, the relaxed cluster arrive whose wait
    (before the row loop) precedes the first remote st.async, and a CTA barrier. Without a
    cluster xbar is a stand-in, never touched."""

    @cute.jit
    def init(tidx, full, xbar):
        if tidx == 0:
            for i in cutlass.range_constexpr(n_full):
                cute.arch.mbarrier_init(full + i, 1)
            for i in cutlass.range_constexpr(n_empty):
                cute.arch.mbarrier_init(full + n_full + i, empty_count)
            if cutlass.const_expr(c > 1):
                for i in cutlass.range_constexpr(n_xbar):
                    cute.arch.mbarrier_init(xbar + i, 1)
        cute.arch.mbarrier_init_fence()
        if cutlass.const_expr(c > 1):
            if tidx == 0:
                for i in cutlass.range_constexpr(n_xbar):
                    cute.arch.mbarrier_arrive_and_expect_tx(xbar + i, xtx)
            cute.arch.cluster_arrive_relaxed()
        cute.arch.sync_threads()

    return init
