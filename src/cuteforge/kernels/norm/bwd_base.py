"""The backward kernels' host launch, and the part the two staged backwards share.

``NormBackwardLaunch``: the ``__call__`` of every backward (register, row-staged, part
ring): one CTA group of ``cluster_n`` CTAs (a cluster when > 1) of ``threads`` threads per
row of the dweight partials (the persistent grid's Q groups), launching the subclass's
``kernel`` with its launch ``bounds``.

``StagedBackward``: the row-staged (bwd.py) and part-ring (ring.py) backwards' common
setup (the CTA's chunk of a row, the chunk's reduction, the column math of
``common.make_bwd_columns``) and the device pieces both kernels run around their row
loop: the registers, the rows' statistics one row ahead, the partial rows at the end.
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass import Float32

from ..rows.staging import launch_bounds, make_chunk
from .common import Tile, bwd_chains, make_bwd_columns, make_row_io
from .config import NormConfig, staged_rows
from .exchange import make_chunk_allreduce


class NormBackwardLaunch:
    """A backward's host side; the subclass sets ``threads``, ``cluster_n`` and ``bounds``
    and defines the device ``kernel`` over the nine tensors."""

    threads: int
    cluster_n: int
    bounds: dict

    @cute.jit
    def __call__(self, x: cute.Tensor, w: cute.Tensor, dy: cute.Tensor, dsum: cute.Tensor, mean_in: cute.Tensor,
                 rstd_in: cute.Tensor, dx: cute.Tensor, dwp: cute.Tensor, dbp: cute.Tensor, stream):
        T, C = self.threads, self.cluster_n
        n_q = dwp.shape[0]
        if cutlass.const_expr(C > 1):
            self.kernel(x, w, dy, dsum, mean_in, rstd_in, dx, dwp, dbp).launch(
                grid=(n_q * C, 1, 1), block=(T, 1, 1), cluster=(C, 1, 1), stream=stream, **self.bounds
            )
        else:
            self.kernel(x, w, dy, dsum, mean_in, rstd_in, dx, dwp, dbp).launch(
                grid=(n_q, 1, 1), block=(T, 1, 1), stream=stream, **self.bounds
            )


class StagedBackward(NormBackwardLaunch):
    """The staged backwards' shared setup for the CTA's tile ``tile`` (its N / cluster_n
    chunk of a row over its threads) and their shared device pieces (traced inline)."""

    def __init__(self, kind: str, x_dtype, w_dtype, n: int, config: NormConfig, has_bias: bool, has_dsum: bool,
                 has_dw: bool, tile: Tile) -> None:
        self.x_dtype, self.w_dtype = x_dtype, w_dtype
        self.has_bias, self.has_dsum, self.has_dw = has_bias, has_dsum, has_dw
        self.threads, self.cluster_n = T, C = config.threads, config.cluster_n
        self.tile = tile
        self.chunk_n = n // C  # this CTA's chunk of the row
        _, _, self.store_scalar, self.load_col, self.store_col = make_row_io(tile)
        self.is_ln = is_ln = kind == "layer"
        self.inv_n = 1.0 / n
        self.reduce_row, self.xtx, self.n_smem = make_chunk_allreduce(tile, n, C, 2 if is_ln else 1)
        self.n_rows = staged_rows(True, has_dsum)  # x, dy (, dsum) per stage or slot
        # the column math (common.make_bwd_columns): one copy, so the two kernels cannot
        # compute differently
        self.sums_col, self.row_sums, self.dx_col = make_bwd_columns(tile, x_dtype, w_dtype, is_ln, has_bias, has_dsum)
        self.bounds = launch_bounds(T, config.ctas_per_sm)
        self.chunk = make_chunk(self.chunk_n, C)  # this CTA's chunk of a row (the whole row without a cluster)

    def fragments(self):
        """The registers (a plain method, traced inline): (vec, KT1) fragments for the
        dweight and dbias accumulators (zeroed), the weight, x, dy, dsum and dx columns in
        their dtypes, the fp32 columns (x, dy, weight) widened from them per use
        (``make_bwd_columns``), and the row sums' chains (acc1, acc2)."""
        tile = self.tile
        dwa, dba = tile.fragments(Float32, Float32)
        dwa.fill(0.0)
        dba.fill(0.0)
        wr, xc, dyc, dsc, oc = tile.fragments(self.w_dtype, self.x_dtype, self.x_dtype, self.x_dtype, self.x_dtype)
        f = tile.fragments(Float32, Float32, Float32)
        acc = tuple(cute.make_rmem_tensor(cute.make_layout((bwd_chains(tile),)), Float32) for _ in range(2))
        return dwa, dba, wr, xc, dyc, dsc, oc, f, acc

    def first_row_stats(self, rstd_in: cute.Tensor, mean_in: cute.Tensor, q):
        """(st, stn) for the row loop (traced inline): st holds the current row's (rstd,
        mean), starting with row q's; stn receives the next row's one row ahead
        (``next_row_stats``). mean stays 0 for RMSNorm."""
        st = cute.make_rmem_tensor(cute.make_layout((2,)), Float32)
        stn = cute.make_rmem_tensor(cute.make_layout((2,)), Float32)
        st.fill(0.0)
        stn.fill(0.0)
        st[0] = rstd_in[q]
        if self.is_ln:
            st[1] = mean_in[q]
        return st, stn

    @cute.jit
    def next_row_stats(self, st: cute.Tensor, stn: cute.Tensor, rstd_in: cute.Tensor, mean_in: cute.Tensor, nb, m):
        """This row's (rstd, mean) from st, with row nb's (the CTA's next, when nb < m) loaded
        into stn meanwhile, so that no global load lies on the path to the row sums."""
        if nb < m:
            stn[0] = rstd_in[nb]
            if cutlass.const_expr(self.is_ln):
                stn[1] = mean_in[nb]
        return st[0], st[1]

    @staticmethod
    def advance_row_stats(st: cute.Tensor, stn: cute.Tensor):
        """At a row's end: the next row's (rstd, mean) become the current ones (traced inline)."""
        st[0] = stn[0]
        st[1] = stn[1]

    def store_partials(self, dwa: cute.Tensor, dba: cute.Tensor, dwp: cute.Tensor, dbp: cute.Tensor, q, cta, g):
        """The kernel's end (traced inline): this CTA's chunk of row q of the fp32 dweight
        (and dbias) partials from the accumulators dwa (dba); nothing without ``has_dw``."""
        if self.has_dw:
            self.store_scalar(dwa, self.chunk(dwp[q, None], cta), g)
            if self.has_bias:
                self.store_scalar(dba, self.chunk(dbp[q, None], cta), g)
