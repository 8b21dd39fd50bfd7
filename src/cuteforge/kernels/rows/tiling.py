"""Host-side arithmetic the row families' configs share."""

from __future__ import annotations


def is_pow2(v: int) -> bool:
    """v is a positive int power of two."""
    return isinstance(v, int) and v > 0 and (v & (v - 1)) == 0


def pow2_ceil(v: int) -> int:
    """The smallest power of two >= v (1 for v <= 1)."""
    return 1 << max(0, (int(v) - 1).bit_length())


class RowTiling:
    """What the row configs (`RowReduceConfig`, `SoftmaxConfig`, `NormConfig`) share: a
    row is split over ``threads_per_row`` threads of a ``threads``-thread CTA and
    ``cluster_n`` CTAs. A mixin without fields, so the configs keep their own field
    order, defaults and repr (their repr is part of every compile key)."""

    threads: int
    threads_per_row: int
    cluster_n: int

    @property
    def rows_per_cta(self) -> int:
        return self.threads // self.threads_per_row

    def check_rows(self, n: int, dtype_bits: int) -> None:
        """Raise ValueError unless n is a row length, dtype_bits 16 or 32 and threads a CTA
        size the row kernels take."""
        t = self.threads
        if not isinstance(n, int) or n < 1:
            raise ValueError(f"n must be a positive int, got {n!r}")
        if dtype_bits not in (16, 32):
            raise ValueError(f"dtype_bits must be 16 or 32, got {dtype_bits}")
        if not isinstance(t, int) or t < 32 or t > 1024 or t % 32 != 0:
            raise ValueError(f"threads={t}: must be a multiple of 32 in [32, 1024]")
