"""Rows that do not start on 16 bytes: the realigned split shared by the row kernels
(reduce, cross-entropy, softmax).

A row of N elements whose start is not 16-byte aligned (an odd N such as 50257, or a
view) is read as NV vectors of BV = 16 bytes from the row's first 16-byte boundary on,
through a pointer realigned at run time, plus TAIL = N - NV * BV leftover elements read
one by one: the h < BV elements before that boundary (the head) and those after the
vectors (the tail). NV is the count every row has whatever its h, so it is known when
tracing, and so is TAIL. Leftover slot i in [0, TAIL) is element i when i < h (head),
else element NV * BV + i (tail): one slot numbering for every row.
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass import Int32

__all__ = ["row_vectors", "split", "realigned", "leftover_index", "operand", "move", "load_left", "store_left"]


def row_vectors(n: int, vec: int, dtype_bits: int) -> tuple[int, int]:
    """(BV, NV): a row's loop runs NV vectors of BV elements. Rows whose starts are not
    16-byte aligned (vec below 16 bytes) are realigned (BV > vec, see the module
    comment) when at least one whole vector fits every row; otherwise BV = vec and
    NV = n // vec."""
    vw = 128 // dtype_bits
    body = (n - (vw - 1)) // vw
    if vec < vw and body >= 1:
        return vw, body
    return vec, n // vec


def realigned(row, elem_bytes: int):
    """(body, h) for a row tensor (device code): the row's first 16-byte aligned element
    as a pointer that says so, and how many elements precede it (0 <= h < 16 /
    elem_bytes)."""
    body = row.iterator.align(16)
    return body, Int32((body.toint() - row.iterator.toint()) // elem_bytes)


def leftover_index(i, h, body_elems: int):
    """The element of leftover slot i (device code): i in the head, else past the
    body_elems = NV * BV elements of the vectors."""
    return Int32(cutlass.select_(i < h, i, i + body_elems))


def split(n: int, vec: int, dtype_bits: int, owners: int) -> tuple[int, int, int, int]:
    """(BV, NV, TAIL, LC) of a row (`row_vectors`): NV vectors of BV elements, TAIL
    leftover elements (0 unless realigned, as then n % vec == 0), LC leftover slots for
    each of `owners` threads."""
    bv, nv = row_vectors(n, vec, dtype_bits)
    tail = n - nv * bv
    return bv, nv, tail, -(-tail // owners)


def operand(row, h, elem_bytes: int):
    """(vectors, elements, same) for another operand's row (device code), to be read or
    written through the reference row's split (head h): its realigned pointer for 16-byte
    vectors, valid where its head is h too (`same`, a run-time value), else the pointer
    at element h for element-by-element accesses (`move(by_elem=True)`) of the same
    slots."""
    body, h_own = realigned(row, elem_bytes)
    return body, row.iterator + h, h_own == h


@cute.jit
def move(atom, src: cute.Tensor, dst: cute.Tensor, by_elem: cutlass.Constexpr, width: cutlass.Constexpr):
    """One vector of `width` elements: with the vector atom, or (by_elem) element by
    element, for an operand whose rows have another head than the reference's. Kernels
    choose between the two once per row around a whole loop of these: a run-time branch
    around each vector cost the 16-bit softmax backward at N = 151937 a quarter of its
    bandwidth (61 % of copy against 84-87 % without the fallback)."""
    if cutlass.const_expr(by_elem):
        for v in cutlass.range_constexpr(width):
            dst[v] = src[v]
    else:
        cute.copy(atom, src, dst)


@cute.jit
def load_left(
    row: cute.Tensor, h, dst: cute.Tensor, who, pad: cutlass.Constexpr, count: cutlass.Constexpr,
    stride: cutlass.Constexpr, tail: cutlass.Constexpr, body_elems: cutlass.Constexpr,
):
    """The leftover slots who, who + stride, ... (count of them; `pad` past `tail`) of a
    realigned row into dst. A thread that owns none passes who >= tail."""
    for c in cutlass.range_constexpr(count):
        i = who + c * stride
        dst[c] = dst.element_type(pad)
        if i < tail:
            dst[c] = row[leftover_index(i, h, body_elems)]


@cute.jit
def store_left(
    src: cute.Tensor, row: cute.Tensor, h, who, count: cutlass.Constexpr, stride: cutlass.Constexpr,
    tail: cutlass.Constexpr, body_elems: cutlass.Constexpr,
):
    """The inverse of `load_left`: src's slots to the row's leftover elements."""
    for c in cutlass.range_constexpr(count):
        i = who + c * stride
        if i < tail:
            row[leftover_index(i, h, body_elems)] = src[c]
