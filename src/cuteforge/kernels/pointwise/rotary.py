"""Rotary position embedding of the queries and keys, forward and backward, in one launch.

transformers' ``apply_rotary_pos_emb`` on q (B, Hq, S, D) and k (B, Hk, S, D) with cos
and sin (B, S, D): x * cos + rotate_half(x) * sin, where rotate_half(x) = cat(-x2, x1)
of x's halves x1, x2. With c1, c2 and s1, s2 the halves of cos and sin:

    forward:   out1 = x1 c1 - x2 s1      out2 = x2 c2 + x1 s2
    backward:  dx1  = g1 c1 + g2 s2      dx2  = g2 c2 - g1 s1

Every extent and stride but the unit-stride head dim D (static) is dynamic, so the
strided views a model hands over (q and k transposed from (B, S, H, D)) are read in
place. One CTA per token (b, s): thread t takes vector slot t % slots of the half head
(``slots = D / 2 / vec``) for heads t // slots, t // slots + threads / slots, ... of q and
then of k, so it loads its slot of cos and sin once. The math is fp32, rounded once.
"""

from __future__ import annotations

from typing import Any

import cutlass
import cutlass.cute as cute

from .vectors import load_f32, store_f32, vector_copy, vector_view


class Rotary:
    """One launch over (q, k, cos, sin, q_out, k_out); ``backward`` applies the transpose
    (q and k then hold the outputs' gradients, q_out and k_out receive the inputs')."""

    def __init__(self, dtype: Any, head_dim: int, vec: int, backward: bool) -> None:
        if head_dim % (2 * vec):
            raise ValueError(f"rotary: head dim {head_dim} is not a multiple of 2 x vec={vec}")
        self.dtype, self.vec, self.backward = dtype, vec, backward
        self.slots = head_dim // 2 // vec  # vectors in half a head
        self.threads = self.slots * max(1, 128 // self.slots)  # a multiple of slots
        self.heads_per_pass = self.threads // self.slots

    def __call__(self, q: cute.Tensor, k: cute.Tensor, cos: cute.Tensor, sin: cute.Tensor, q_out: cute.Tensor,
                 k_out: cute.Tensor, stream: Any) -> None:
        tokens = q.shape[0] * q.shape[2]
        self.kernel(q, k, cos, sin, q_out, k_out).launch(grid=(tokens, 1, 1), block=(self.threads, 1, 1),
                                                         stream=stream)

    @cute.jit
    def heads(self, x: cute.Tensor, out: cute.Tensor, b: Any, s: Any, first: Any, slot: Any, c1: Any, c2: Any,
              s1: Any, s2: Any) -> None:
        """Heads first, first + heads_per_pass, ... of x's token (b, s): this thread's slot of each."""
        vec, slots = self.vec, self.slots
        atom = vector_copy(self.dtype, vec)
        for h in cutlass.range(first, x.shape[1], self.heads_per_pass, unroll=1):
            src = vector_view(x[b, h, s, None], vec, 2 * slots)
            dst = vector_view(out[b, h, s, None], vec, 2 * slots)
            x1 = load_f32(atom, src[None, slot], vec)
            x2 = load_f32(atom, src[None, slot + slots], vec)
            if cutlass.const_expr(self.backward):
                store_f32(atom, x1 * c1 + x2 * s2, dst[None, slot], vec)
                store_f32(atom, x2 * c2 - x1 * s1, dst[None, slot + slots], vec)
            else:
                store_f32(atom, x1 * c1 - x2 * s1, dst[None, slot], vec)
                store_f32(atom, x2 * c2 + x1 * s2, dst[None, slot + slots], vec)

    @cute.kernel
    def kernel(self, q: cute.Tensor, k: cute.Tensor, cos: cute.Tensor, sin: cute.Tensor, q_out: cute.Tensor,
               k_out: cute.Tensor) -> None:
        vec, slots = self.vec, self.slots
        tidx, _, _ = cute.arch.thread_idx()
        token, _, _ = cute.arch.block_idx()
        b = token // q.shape[2]
        s = token - b * q.shape[2]
        slot = tidx % slots
        first = tidx // slots
        atom = vector_copy(self.dtype, vec)
        cos_row = vector_view(cos[b, s, None], vec, 2 * slots)
        sin_row = vector_view(sin[b, s, None], vec, 2 * slots)
        c1 = load_f32(atom, cos_row[None, slot], vec)
        c2 = load_f32(atom, cos_row[None, slot + slots], vec)
        s1 = load_f32(atom, sin_row[None, slot], vec)
        s2 = load_f32(atom, sin_row[None, slot + slots], vec)
        self.heads(q, q_out, b, s, first, slot, c1, c2, s1, s2)
        self.heads(k, k_out, b, s, first, slot, c1, c2, s1, s2)


def make_rotary(dtype: Any, head_dim: int, vec: int, backward: bool) -> Any:
    """A @cute.jit f(q, k, cos, sin, q_out, k_out, stream) over (B, H, S, D) q / k and
    their outputs and (B, S, D) cos / sin, D the unit-stride dim."""
    rotary = Rotary(dtype, head_dim, vec, backward)

    @cute.jit
    def rotary_embedding(q: cute.Tensor, k: cute.Tensor, cos: cute.Tensor, sin: cute.Tensor, q_out: cute.Tensor,
                         k_out: cute.Tensor, stream: Any) -> None:
        rotary(q, k, cos, sin, q_out, k_out, stream)

    return rotary_embedding
