"""What the pointwise kernels share (device code, traced inline): a row's `vec`-element
vectors as a (vec, vectors) view whose column offsets the compiler knows to be multiples
of `vec` (so every copy of a column is one aligned vector access), and fp32 fragments."""

from __future__ import annotations

from typing import Any

import cutlass
import cutlass.cute as cute


def vector_view(row: cute.Tensor, vec: int, count: Any) -> cute.Tensor:
    """``row`` (unit stride) as (vec, count) : (1, vec): column j is elements j*vec .. j*vec+vec-1."""
    return cute.make_tensor(row.iterator, cute.make_layout((vec, count), stride=(1, vec)))


def vector_copy(dtype: Any, vec: int) -> Any:
    """The copy atom of one `vec`-element vector of `dtype` (16 bytes at the widest)."""
    return cute.make_copy_atom(cute.nvgpu.CopyUniversalOp(), dtype, num_bits_per_copy=vec * dtype.width)


@cute.jit
def load_f32(atom: Any, src: cute.Tensor, vec: cutlass.Constexpr) -> Any:
    """One vector of ``src`` (a (vec,) slice) into registers, as an fp32 TensorSSA."""
    frag = cute.make_rmem_tensor(cute.make_layout((vec,)), src.element_type)
    cute.copy(atom, src, frag)
    return frag.load().to(cutlass.Float32)


@cute.jit
def store_f32(atom: Any, value: Any, dst: cute.Tensor, vec: cutlass.Constexpr) -> None:
    """An fp32 TensorSSA of `vec` elements into ``dst`` (a (vec,) slice), rounded once to its dtype."""
    frag = cute.make_rmem_tensor(cute.make_layout((vec,)), dst.element_type)
    frag.store(value.to(dst.element_type))
    cute.copy(atom, frag, dst)
