"""`cuteforge.ops.rotary_embedding(q, k, cos, sin, unsqueeze_dim=1)`: transformers'
``apply_rotary_pos_emb`` (``x * cos + rotate_half(x) * sin`` on the queries and the keys)
as one kernel over both, forward and backward.

torch runs it as about ten kernels forward (the halves, a negation, a concatenation, two
products and a sum, for q and for k) and as many backward. Here one launch reads q, k,
cos and sin once and writes both outputs; the backward is one launch too.

q (B, Hq, S, D) and k (B, Hk, S, D) with ``unsqueeze_dim=1`` (transformers' default), or
(B, S, H, D) with ``unsqueeze_dim=2``; cos and sin (B, S, D) or (1, S, D), the rotation
of every head. One dtype (fp32, bf16, fp16), one CUDA device; D even and at most 1024.
The strided views attention layers hand over (q and k transposed from (B, S, H, D)) are
read in place; outputs take q's and k's layouts. cos and sin take no gradient (a
``requires_grad`` cos or sin is computed by torch). Under torch.compile the op traces as
transformers' expression, which Inductor fuses itself.

Eager calls whose q and k are the attention layers' views (transposed from contiguous
(B, S, H, D)) run from C (`native.launch`, `native.backward`): the forward allocates
the outputs in that layout and launches in one C call, and its backward is a C++
autograd node that writes the gradients in it too, so no copy appears around the op.
Under forward-mode AD the op is transformers' expression, which carries the tangents.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.autograd.function import once_differentiable

from .. import checks
from ..kernels.pointwise import rotary_embedding as kernel
from ..kernels.pointwise.spec import MAX_HEAD_DIM
from ..native import backward as native
from ..native import build as native_build
from ..native import launch as native_launch
from ..native.args import arg, strided_arg
from ..signature import FLOAT_DTYPES
from .memo import EagerPath, remember

__all__ = ["rotary_embedding"]

_WHERE = "cuteforge.ops.rotary_embedding"
_MAX_TOKENS = 2**31 - 1  # the grid's x extent


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def _torch(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
           unsqueeze_dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    cos, sin = cos.unsqueeze(unsqueeze_dim), sin.unsqueeze(unsqueeze_dim)
    return q * cos + _rotate_half(q) * sin, k * cos + _rotate_half(k) * sin


def _unit_last(t: torch.Tensor) -> torch.Tensor:
    return t if t.stride(-1) == 1 else t.contiguous()


def _launch(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
            backward: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """One launch over (B, H, S, D) views q, k and (B, S, D) cos, sin; returns the outputs
    in q's and k's layouts."""
    q, k = _unit_last(q), _unit_last(k)
    q_out, k_out = torch.empty_like(q), torch.empty_like(k)
    b, s = q.shape[0], q.shape[2]
    if q_out.numel() or k_out.numel():
        cos = _unit_last(cos).expand(b, s, cos.shape[-1])
        sin = _unit_last(sin).expand(b, s, sin.shape[-1])
        kernel(q, k, cos, sin, q_out, k_out, backward=backward)
    return q_out, k_out


class _Rotary(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor,
                sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        ctx.save_for_backward(cos, sin)
        ctx.set_materialize_grads(False)
        ctx.like = (q.shape, k.shape, q.dtype, q.device)  # for a gradient left None
        return _launch(q, k, cos, sin, backward=False)

    @staticmethod
    @once_differentiable  # no double backward: a clear error rather than gradients taken as constants
    def backward(ctx: Any, gq: torch.Tensor | None, gk: torch.Tensor | None) -> tuple[Any, ...]:
        cos, sin = ctx.saved_tensors
        q_shape, k_shape, dtype, device = ctx.like
        gq = torch.zeros(q_shape, dtype=dtype, device=device) if gq is None else gq
        gk = torch.zeros(k_shape, dtype=dtype, device=device) if gk is None else gk
        dq, dk = _launch(gq, gk, cos, sin, backward=True)
        return dq, dk, None, None


def _check(q: Any, k: Any, cos: Any, sin: Any, unsqueeze_dim: Any) -> None:
    checks.tensor(_WHERE, "q", q, FLOAT_DTYPES)
    for name, t in (("k", k), ("cos", cos), ("sin", sin)):
        checks.tensor(_WHERE, name, t)
        checks.same_device(_WHERE, name, t, "q", q)
        checks.same_dtype(_WHERE, name, t, "q", q)
    unsqueeze_dim = checks.integer(_WHERE, "unsqueeze_dim", unsqueeze_dim)
    if unsqueeze_dim not in (1, 2):
        raise ValueError(f"{_WHERE}: argument 'unsqueeze_dim' must be 1 ((B, H, S, D) q and k) or 2 ((B, S, H, D)), "
                         f"got {unsqueeze_dim}")
    for name, t in (("q", q), ("k", k)):
        if t.dim() != 4:
            raise ValueError(f"{_WHERE}: argument {name!r} must be 4-D, got shape {tuple(t.shape)}")
    seq = 3 - unsqueeze_dim  # the sequence dim of q and k
    d = q.shape[-1]
    if d % 2 or d > MAX_HEAD_DIM:
        raise ValueError(f"{_WHERE}: argument 'q' has head dim {d}; it must be even and at most {MAX_HEAD_DIM}")
    if k.shape[0] != q.shape[0] or k.shape[seq] != q.shape[seq] or k.shape[-1] != d:
        raise ValueError(f"{_WHERE}: argument 'k' has shape {tuple(k.shape)}, which does not match q's "
                         f"{tuple(q.shape)} in batch, sequence and head dim")
    for name, t in (("cos", cos), ("sin", sin)):
        if t.dim() != 3 or t.shape[0] not in (1, q.shape[0]) or t.shape[1] != q.shape[seq] or t.shape[2] != d:
            raise ValueError(f"{_WHERE}: argument {name!r} must have shape ({q.shape[0]} or 1, {q.shape[seq]}, {d}), "
                             f"got {tuple(t.shape)}")


def _torch_backward(gq: torch.Tensor, gk: torch.Tensor, cos: torch.Tensor,
                    sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The transpose of the rotation for (B, H, S, D) gradients, as torch expressions
    (differentiable: the C++ node's backward under ``create_graph=True``)."""
    cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)

    def transposed(g: torch.Tensor) -> torch.Tensor:
        half = g.shape[-1] // 2
        gs = g * sin
        return g * cos + torch.cat((gs[..., half:], -gs[..., :half]), dim=-1)

    return transposed(gq), transposed(gk)


# The eager calls' memo: layout (q's, k's, cos's and sin's dtype, shape, strides, 16-byte
# alignment and device) -> its `EagerPath`, or None for a layout without one (those take the
# Python path, which checks them). A hit with an `EagerPath` also stands for "already checked".
_C_PATHS: dict[tuple[Any, ...], EagerPath | None] = {}
native_build.when_ready(_C_PATHS.clear)  # layouts met while the extension built had no C path


def _layout(t: torch.Tensor) -> tuple[Any, ...]:
    # rotary_embedding builds the same tuples inline
    return (t.dtype, t.shape, t.stride(), t.data_ptr() & 15, t.get_device())


def _c_path(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> EagerPath | None:
    """For (B, H, S, D) q and k transposed from contiguous (B, S, H, D) (what attention
    layers hand over) and cos, sin with a unit last stride: the layout's `EagerPath`, which
    runs on the (B, S, H, D) tensors (`rotary_embedding` gives them and takes them back
    transposed) and allocates its outputs, and the node its gradients, contiguous in that
    order; None for other layouts, nothing to launch, or without the extension."""
    qt, kt = q.transpose(1, 2), k.transpose(1, 2)
    if (not qt.is_contiguous() or not kt.is_contiguous() or cos.stride(-1) != 1 or sin.stride(-1) != 1
            or q.numel() == 0 or k.numel() == 0 or native.module() is None):
        return None
    b, s, d = q.shape[0], q.shape[2], q.shape[3]
    cos_e, sin_e = cos.expand(b, s, d), sin.expand(b, s, d)
    q_out, k_out = torch.empty_like(qt).transpose(1, 2), torch.empty_like(kt).transpose(1, 2)
    IN, OUT = native_launch.INPUT, native_launch.OUTPUT
    outs = [(tuple(qt.shape), q.dtype), (tuple(kt.shape), k.dtype)]
    # the kernel reads the (B, H, S, D) views of the (B, S, H, D) inputs and outputs
    views = [strided_arg(OUT, 0, q.shape, q.stride()), strided_arg(OUT, 1, k.shape, k.stride())]
    fwd = kernel.launcher((q, k, cos_e, sin_e, q_out, k_out), backward=False)
    run = native_launch.runner(_WHERE, fwd, q.device, 4, outs,
                               [arg(IN, 0, q), arg(IN, 1, k), arg(IN, 2, cos_e), arg(IN, 3, sin_e), *views], [0, 1])
    return EagerPath(run, _node_plan)


def _python_forward(qt: torch.Tensor, kt: torch.Tensor, cos: torch.Tensor,
                    sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """What an `EagerPath`'s run returns, launched from Python (the C launch turned off)."""
    q_out, k_out = torch.empty_like(qt), torch.empty_like(kt)
    b, s, d = qt.shape[0], qt.shape[1], qt.shape[3]
    kernel(qt.transpose(1, 2), kt.transpose(1, 2), cos.expand(b, s, d), sin.expand(b, s, d),
           q_out.transpose(1, 2), k_out.transpose(1, 2), backward=False)
    return q_out, k_out


def _node_plan(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> Any:
    """The C++ node's plan for an `EagerPath` layout: inputs and outputs the (B, S, H, D)
    tensors, saved cos and sin; the kernel reads the gradients' and writes the buffers'
    (B, H, S, D) views, so the gradients come back in q's and k's layout."""
    qt, kt = q.transpose(1, 2), k.transpose(1, 2)
    b, s, d = q.shape[0], q.shape[2], q.shape[3]
    cos_e, sin_e = cos.expand(b, s, d), sin.expand(b, s, d)
    g_q, g_k = torch.empty_like(qt).transpose(1, 2), torch.empty_like(kt).transpose(1, 2)
    bwd = kernel.launcher((g_q, g_k, cos_e, sin_e, g_q, g_k), backward=True)
    SAVED, GRAD, BUFFER = native.SAVED, native.GRAD, native.BUFFER
    q_shape, k_shape = tuple(qt.shape), tuple(kt.shape)

    def fallback(grads: list[Any], saved: list[Any]) -> list[Any]:
        gq = torch.zeros(q_shape, dtype=saved[0].dtype, device=saved[0].device) if grads[0] is None else grads[0]
        gk = torch.zeros(k_shape, dtype=saved[0].dtype, device=saved[0].device) if grads[1] is None else grads[1]
        gq, gk = gq.transpose(1, 2), gk.transpose(1, 2)
        if torch.is_grad_enabled():
            dq, dk = _torch_backward(gq, gk, saved[0], saved[1])
        else:
            dq, dk = _launch(gq, gk, saved[0], saved[1], backward=True)
        return [dq.transpose(1, 2), dk.transpose(1, 2)]

    return native.make_plan(
        "CuteforgeRotaryBackward", bwd, q.device,
        [native.grad_as_is(qt), native.grad_as_is(kt)], [(q_shape, q.dtype), (k_shape, k.dtype)],
        [strided_arg(GRAD, 0, q.shape, q.stride()), strided_arg(GRAD, 1, k.shape, k.stride()),
         arg(SAVED, 0, cos_e), arg(SAVED, 1, sin_e),
         strided_arg(BUFFER, 0, q.shape, q.stride()), strided_arg(BUFFER, 1, k.shape, k.stride())],
        [(native.BUFFER_OUT, 0), (native.BUFFER_OUT, 1)], fallback)


def _checked_c_path(q: Any, k: Any, cos: Any, sin: Any) -> EagerPath | None:
    """A memo miss (unsqueeze_dim 1): the checks, then the layout's C path (None off CUDA
    and beyond the grid's tokens: the Python path decides those, with their errors)."""
    _check(q, k, cos, sin, 1)
    takes = q.is_cuda and q.shape[0] * q.shape[2] <= _MAX_TOKENS
    return remember(_C_PATHS, (_layout(q), _layout(k), _layout(cos), _layout(sin)),
                    _c_path(q, k, cos, sin) if takes else None)


def _check_tokens(q: torch.Tensor, unsqueeze_dim: int) -> None:
    if q.shape[0] * q.shape[3 - unsqueeze_dim] > _MAX_TOKENS:
        raise ValueError(f"{_WHERE}: {q.shape[0]} x {q.shape[3 - unsqueeze_dim]} tokens are more than the "
                         "kernel's grid covers")


def rotary_embedding(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                     unsqueeze_dim: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    """(q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin), cos and sin
    unsqueezed at ``unsqueeze_dim``, in one kernel (and its backward in one)."""
    if (type(unsqueeze_dim) is int and unsqueeze_dim == 1 and not torch.compiler.is_compiling()
            and not native.forward_ad_active()):  # dual tensors: torch's expression (below) carries them
        try:
            c_path = _C_PATHS[((q.dtype, q.shape, q.stride(), q.data_ptr() & 15, q.get_device()),
                               (k.dtype, k.shape, k.stride(), k.data_ptr() & 15, k.get_device()),
                               (cos.dtype, cos.shape, cos.stride(), cos.data_ptr() & 15, cos.get_device()),
                               (sin.dtype, sin.shape, sin.stride(), sin.data_ptr() & 15, sin.get_device()))]
        except (AttributeError, KeyError, TypeError, RuntimeError):  # not a dense tensor: the checks say so
            c_path = _checked_c_path(q, k, cos, sin)
        grad = torch.is_grad_enabled()
        if c_path is not None and not (grad and (cos.requires_grad or sin.requires_grad)):
            qt, kt = q.transpose(1, 2), k.transpose(1, 2)
            run = c_path.run if c_path.run is not None else _python_forward
            q_out, k_out = run(qt, kt, cos, sin)
            if grad and (q.requires_grad or k.requires_grad):
                native.attach(c_path.plan(q, k, cos, sin), [qt, kt], [q_out, k_out], [cos, sin])
            return q_out.transpose(1, 2), k_out.transpose(1, 2)
    _check(q, k, cos, sin, unsqueeze_dim)
    if (torch.compiler.is_compiling() or native.forward_ad_active()
            or (torch.is_grad_enabled() and (cos.requires_grad or sin.requires_grad))):
        return _torch(q, k, cos, sin, unsqueeze_dim)
    checks.on_cuda(_WHERE, "q", q)
    _check_tokens(q, unsqueeze_dim)
    if unsqueeze_dim == 2:  # (B, S, H, D) -> the kernel's (B, H, S, D) views, and back
        q_out, k_out = rotary_embedding(q.transpose(1, 2), k.transpose(1, 2), cos, sin, 1)
        return q_out.transpose(1, 2), k_out.transpose(1, 2)
    if torch.is_grad_enabled() and (q.requires_grad or k.requires_grad):
        return _Rotary.apply(q, k, cos, sin)
    return _launch(q, k, cos, sin, backward=False)
