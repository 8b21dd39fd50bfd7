"""Drop-in modules on cuteforge's ops, with torch's constructor signatures and state_dicts.

Each module runs its cuteforge op for CUDA tensors of a supported dtype (fp32, bf16,
fp16) and the torch op it replaces otherwise (CPU tensors, fp64), so a model that holds
them still runs anywhere; under torch.compile the op is a registered custom op.
"""

from __future__ import annotations

import numbers
from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from .. import checks
from ..signature import FLOAT_DTYPES

__all__ = ["Embedding", "RMSNorm", "LayerNorm", "Linear", "CrossEntropyLoss", "SwiGLUMLP", "causal_lm_loss"]

_ACTIVATIONS = {None: lambda t: t, "relu": F.relu, "gelu": lambda t: F.gelu(t, approximate="tanh"), "silu": F.silu}


def _on_cuteforge(x: Any) -> bool:
    # anything else goes to torch's own function, which gives its own error for a non-tensor
    return isinstance(x, torch.Tensor) and x.is_cuda and x.dtype in FLOAT_DTYPES


def _last_dim(normalized_shape: int | Sequence[int], what: str) -> tuple[int]:
    where = f"cuteforge.nn.{what}"
    if isinstance(normalized_shape, (numbers.Integral, torch.Size, tuple, list)):
        shape = (normalized_shape,) if isinstance(normalized_shape, numbers.Integral) else tuple(normalized_shape)
    else:
        raise TypeError(f"{where}: argument 'normalized_shape' must be an int or a sequence of one int, got "
                        f"{type(normalized_shape).__name__}")
    if len(shape) != 1:
        raise ValueError(f"{where}: normalizes over the last dim only; normalized_shape must have one "
                         f"entry, got {shape}")
    if checks.integer(where, "normalized_shape", shape[0]) < 1:
        raise ValueError(f"{where}: argument 'normalized_shape' must be positive, got {shape[0]}")
    return (int(shape[0]),)


class _RowNorm(nn.Module):
    """What RMSNorm and LayerNorm hold as torch's modules do: the last-dim shape, eps and,
    with elementwise_affine, a weight of ones (else a weight registered as None)."""

    def __init__(self, what: str, normalized_shape: int | Sequence[int], eps: float | None, elementwise_affine: bool,
                 device: Any, dtype: torch.dtype | None, under_compile: str) -> None:
        super().__init__()
        if under_compile not in ("auto", "inductor", "cuteforge"):
            raise ValueError(f"cuteforge.nn.{what}: under_compile must be 'auto', 'inductor' or 'cuteforge', got "
                             f"{under_compile!r}")
        self.under_compile = under_compile
        self.normalized_shape = _last_dim(normalized_shape, what)
        if eps is not None and not checks.real(f"cuteforge.nn.{what}", "eps", eps) >= 0:  # NaN too
            raise ValueError(f"cuteforge.nn.{what}: argument 'eps' must be a non-negative number, got {eps}")
        self.eps = eps
        self.elementwise_affine = elementwise_affine
        if elementwise_affine:
            self.weight = nn.Parameter(torch.ones(self.normalized_shape, device=device, dtype=dtype))
        else:
            self.register_parameter("weight", None)

    def _to_inductor(self, x: torch.Tensor, residual: torch.Tensor | None = None) -> bool:
        """Under torch.compile, whether this call lowers to torch's norm (``under_compile``:
        "auto" does for calls without a gradient, where Inductor fuses the norm with its
        neighbours and the opaque custom op would fence it off)."""
        if self.under_compile == "cuteforge" or not torch.compiler.is_compiling():
            return False
        wants_grad = torch.is_grad_enabled() and (x.requires_grad or any(p.requires_grad for p in self.parameters())
                                                  or (residual is not None and residual.requires_grad))
        return self.under_compile == "inductor" or not wants_grad

    def _fuses(self, x: torch.Tensor, residual: torch.Tensor) -> bool:
        """Whether the op takes ``residual`` with x (same dtype, shape and device, on the op's
        tensors, not lowered to Inductor's norm); otherwise the sum is torch's add (its type
        promotion and broadcasting), normalized as any other input."""
        return (_on_cuteforge(x) and isinstance(residual, torch.Tensor) and residual.dtype == x.dtype
                and residual.shape == x.shape and residual.device == x.device and not self._to_inductor(x, residual))

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None) -> Any:
        """The norm of x, or with ``residual`` (norm(x + residual), x + residual)."""
        if residual is not None and not self._fuses(x, residual):
            s = x + residual
            return self._norm(s, None), s
        return self._norm(x, residual)

    def _norm(self, x: torch.Tensor, residual: torch.Tensor | None) -> Any:
        raise NotImplementedError  # each norm's own

    def extra_repr(self) -> str:
        return f"{self.normalized_shape}, eps={self.eps}, elementwise_affine={self.elementwise_affine}"


class RMSNorm(_RowNorm):
    """`torch.nn.RMSNorm` over the last dim on `cuteforge.ops.rms_norm` (fp32 math).

    ``norm(x, residual=r)`` returns ``(norm(x + r), x + r)``: where r is x's dtype, shape
    and device, one kernel reads x and r and writes the sum and its norm, and in the
    backward the norm's kernel adds the sum's incoming gradient to its own (a pre-norm
    block's residual add, fused); otherwise torch adds them and the sum is normalized.

    Under torch.compile, ``under_compile`` picks the kernel: "auto" (the default) lowers a
    call without a gradient to ``F.rms_norm``, which Inductor fuses with its neighbours
    (the opaque custom op cost compiled inference 1-8 %), and keeps cuteforge's op when a
    gradient is wanted (one kernel forward and one backward: Inductor's decomposed backward
    cost the host-bound compiled training step up to 7 %, docs/nn.md); "inductor" and
    "cuteforge" always take the one."""

    def __init__(self, normalized_shape: int | Sequence[int], eps: float | None = None, elementwise_affine: bool = True,
                 device: Any = None, dtype: torch.dtype | None = None, under_compile: str = "auto") -> None:
        super().__init__("RMSNorm", normalized_shape, eps, elementwise_affine, device, dtype, under_compile)

    def _norm(self, x: torch.Tensor, residual: torch.Tensor | None) -> Any:
        """The norm of x, or of x + residual where `_fuses` said so."""
        if not _on_cuteforge(x) or self._to_inductor(x, residual):
            return F.rms_norm(x, self.normalized_shape, self.weight, self.eps)  # None: torch's default, as below
        eps = self.eps if self.eps is not None else torch.finfo(x.dtype).eps
        from .. import ops

        weight = self.weight if self.weight is not None else x.new_ones(self.normalized_shape)
        return ops.rms_norm(x, weight, eps, residual=residual)


class LayerNorm(_RowNorm):
    """`torch.nn.LayerNorm` over the last dim on `cuteforge.ops.layer_norm` (fp32 math);
    ``residual`` and ``under_compile`` as in `RMSNorm`."""

    def __init__(self, normalized_shape: int | Sequence[int], eps: float = 1e-5, elementwise_affine: bool = True,
                 bias: bool = True, device: Any = None, dtype: torch.dtype | None = None,
                 under_compile: str = "auto") -> None:
        super().__init__("LayerNorm", normalized_shape, eps, elementwise_affine, device, dtype, under_compile)
        if elementwise_affine:
            self.bias = nn.Parameter(torch.zeros(self.normalized_shape, device=device, dtype=dtype)) if bias else None
        else:
            self.register_parameter("bias", None)

    def _norm(self, x: torch.Tensor, residual: torch.Tensor | None) -> Any:
        """The norm of x, or of x + residual where `_fuses` said so."""
        if not _on_cuteforge(x) or self._to_inductor(x, residual):
            return F.layer_norm(x, self.normalized_shape, self.weight, self.bias, self.eps)
        from .. import ops

        weight = self.weight if self.weight is not None else x.new_ones(self.normalized_shape)
        return ops.layer_norm(x, weight, self.bias, self.eps, residual=residual)


class Linear(nn.Linear):
    """`torch.nn.Linear` with an optional activation (None, "relu", "gelu" (tanh), "silu")
    on `cuteforge.ops.gemm` for 16-bit CUDA inputs on sm_90 (torch's linear elsewhere).
    Without a gradient the activation is fused into the GEMM's epilogue; with one the GEMM
    fuses the bias, the activation runs in torch on the saved pre-activation (as torch's
    own layers do: recomputing it would cost the backward a GEMM), and the backward's dX
    and dW GEMMs run on cuteforge's kernels."""

    def __init__(self, in_features: int, out_features: int, bias: bool = True, activation: str | None = None,
                 device: Any = None, dtype: torch.dtype | None = None) -> None:
        if not (activation is None or isinstance(activation, str)) or activation not in _ACTIVATIONS:
            raise ValueError(f"cuteforge.nn.Linear: activation must be one of {sorted(map(str, _ACTIVATIONS))}, "
                             f"got {activation!r}")
        super().__init__(in_features, out_features, bias, device, dtype)
        self.activation = activation

    def _gemm_applies(self, x: torch.Tensor) -> bool:
        return _gemm_applies(self, x)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self._gemm_applies(x):
            return _ACTIVATIONS[self.activation](F.linear(x, self.weight, self.bias))
        from .. import ops

        x2 = x.reshape(-1, self.in_features)
        wants_grad = torch.is_grad_enabled() and (x.requires_grad or self.weight.requires_grad)
        if wants_grad and self.activation is not None:
            y = _ACTIVATIONS[self.activation](ops.gemm(x2, self.weight.t(), bias=self.bias, out_dtype=x.dtype))
        else:
            y = ops.gemm(x2, self.weight.t(), bias=self.bias, epilogue=self.activation, out_dtype=x.dtype)
        return y.view(*x.shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        return super().extra_repr() + (f", activation={self.activation!r}" if self.activation else "")


class Embedding(nn.Embedding):
    """`torch.nn.Embedding` whose weight gradient stays in the weight's dtype under
    torch.compile (`cuteforge.ops.embedding`: Inductor would accumulate it in an fp32 copy
    of the whole table). Eager calls, calls without a gradient (where Inductor's gather
    fuses into its consumer), and ``max_norm`` / ``scale_grad_by_freq`` / ``sparse`` run
    torch's own embedding."""

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        if (not torch.compiler.is_compiling() or not (torch.is_grad_enabled() and self.weight.requires_grad)
                or self.max_norm is not None or self.scale_grad_by_freq or self.sparse):
            return super().forward(ids)
        from .. import ops

        return ops.embedding(ids, self.weight, self.padding_idx)


class CrossEntropyLoss(nn.Module):
    """`torch.nn.CrossEntropyLoss` for class-index targets (no class weights, no label
    smoothing) on `cuteforge.ops.cross_entropy`: one pass forward, one backward, the
    softmax never materialized.

    Layouts: torch's, logits (C,), (N, C) or (N, C, d1, ...) with target (), (N,) or
    (N, d1, ...), and a language model's, logits (..., C) with target (...) (classes
    last). The target's shape says which; where both fit (C equal to d1 in a 3-D call),
    torch's wins, as a drop-in must."""

    def __init__(self, ignore_index: int = -100, reduction: str = "mean") -> None:
        super().__init__()
        if reduction not in ("mean", "sum", "none"):
            raise ValueError(f"cuteforge.nn.CrossEntropyLoss: reduction must be 'mean', 'sum' or 'none', got {reduction!r}")
        self.ignore_index = ignore_index
        self.reduction = reduction

    def forward(self, logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        logits = _classes_last(logits, target)
        if not _on_cuteforge(logits) or target.dtype != torch.int64:
            loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), target.reshape(-1),
                                   ignore_index=self.ignore_index, reduction=self.reduction)
        else:
            from .. import ops

            loss = ops.cross_entropy(logits.reshape(-1, logits.shape[-1]), target.reshape(-1),
                                     reduction=self.reduction, ignore_index=self.ignore_index)
        return loss.view(target.shape) if self.reduction == "none" else loss


def _classes_last(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """logits with the class dim last, for `CrossEntropyLoss`'s layouts."""
    where = "cuteforge.nn.CrossEntropyLoss"
    if not isinstance(logits, torch.Tensor) or not isinstance(target, torch.Tensor):
        raise TypeError(f"{where}: logits and target must be torch.Tensors, got {type(logits).__name__} and "
                        f"{type(target).__name__}")
    if logits.dim() >= 3 and target.shape == (logits.shape[0], *logits.shape[2:]):
        return logits.movedim(1, -1)  # torch's class dim 1
    if logits.dim() >= 1 and target.shape == logits.shape[:-1]:
        return logits
    raise ValueError(f"{where}: target of shape {tuple(target.shape)} fits neither layout of logits "
                     f"{tuple(logits.shape)}: torch's (N, C, d1, ...) with target (N, d1, ...), or classes last, "
                     f"(..., C) with target (...)")


class SwiGLUMLP(nn.Module):
    """The SwiGLU feed-forward block of Llama-family models, ``down(silu(gate(x)) * up(x))``,
    with the same submodules (gate_proj, up_proj, down_proj) and state_dict keys.

    ``gemm=True``: the projections are `Linear` (cuteforge's GEMM, the gate's silu fused
    into its epilogue); ``gemm=False``: torch's ``nn.Linear``, with ``silu(gate) * up`` as
    one cuteforge kernel forward and one backward (`cuteforge.ops.silu_mul`), which saves
    neither silu(gate) nor the product's inputs twice.

    Without grad, the gate and up projections run as one gated GEMM
    (`cuteforge.ops.gated_gemm`: its epilogue writes ``silu(gate) * up``, neither product
    reaches memory) wherever it applies: sm_90, 16-bit, no biases, widths a multiple of 8,
    projections of exactly these classes without hooks. ``recompute=True`` runs it with
    grad too: the backward recomputes both products (two more GEMMs), so the two (tokens x
    intermediate) activations are not kept for it. Under torch.compile the gated GEMM is
    one opaque op (its backward traced); the other paths are torch's expressions around
    the projections, which Inductor fuses."""

    def __init__(self, hidden_size: int, intermediate_size: int, bias: bool = False, device: Any = None,
                 dtype: torch.dtype | None = None, gemm: bool = True, recompute: bool = False) -> None:
        super().__init__()
        self.gemm = checks.boolean("cuteforge.nn.SwiGLUMLP", "gemm", gemm)
        self.recompute = checks.boolean("cuteforge.nn.SwiGLUMLP", "recompute", recompute)
        linear = Linear if self.gemm else nn.Linear
        gate_kw = {"activation": "silu"} if self.gemm else {}
        self.gate_proj = linear(hidden_size, intermediate_size, bias, device=device, dtype=dtype, **gate_kw)
        self.up_proj = linear(hidden_size, intermediate_size, bias, device=device, dtype=dtype)
        self.down_proj = linear(intermediate_size, hidden_size, bias, device=device, dtype=dtype)

    def _gated_applies(self, x: torch.Tensor) -> bool:
        gate, up = self.gate_proj, self.up_proj
        # plain weights only: a tensor subclass (quantized, sharded) is the module's to run;
        # under autocast the module's own F.linear computes in the autocast dtype
        plain = all(type(m.weight) in (torch.Tensor, nn.Parameter) for m in (gate, up))
        return (type(gate) is type(up) and type(gate) in (Linear, nn.Linear) and _hookless(gate) and _hookless(up)
                and plain and gate.bias is None and up.bias is None and up.weight.dtype == gate.weight.dtype
                and not torch.is_autocast_enabled("cuda") and _gemm_applies(gate, x))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        wants_grad = torch.is_grad_enabled() and (x.requires_grad or self.gate_proj.weight.requires_grad
                                                  or self.up_proj.weight.requires_grad)
        if (self.recompute or not wants_grad) and self._gated_applies(x):
            from .. import ops

            return self.down_proj(ops.gated_gemm(x, self.gate_proj.weight.t(), self.up_proj.weight.t()))
        if self.gemm:
            return self.down_proj(self.gate_proj(x) * self.up_proj(x))
        gate, up = self.gate_proj(x), self.up_proj(x)
        if _on_cuteforge(gate):
            from .. import ops

            return self.down_proj(ops.silu_mul(gate, up))
        return self.down_proj(F.silu(gate) * up)

    def extra_repr(self) -> str:
        return f"gemm={self.gemm}, recompute={self.recompute}"


def _gemm_applies(linear: nn.Linear, x: Any) -> bool:
    """Whether cuteforge's sm_90a GEMM runs `linear` (cuteforge's or torch's) on `x`."""
    return (isinstance(x, torch.Tensor) and x.is_cuda and x.dtype in (torch.bfloat16, torch.float16)
            and linear.weight.dtype == x.dtype and torch.cuda.get_device_capability(x.device) == (9, 0)
            and linear.in_features % 8 == 0 and linear.out_features % 8 == 0)


def _hookless(m: nn.Module) -> bool:
    """Whether calling `m` runs its forward alone (no module hooks that a direct use of its
    weight would skip)."""
    return not (m._forward_hooks or m._forward_pre_hooks or m._backward_hooks or m._backward_pre_hooks)


def causal_lm_loss(logits: torch.Tensor, labels: torch.Tensor, vocab_size: int, num_items_in_batch: Any = None,
                   ignore_index: int = -100, shift_labels: torch.Tensor | None = None, **_: Any) -> torch.Tensor:
    """The next-token loss of a causal LM with transformers' loss-function signature: the
    labels shift left by one (padded with ``ignore_index``), so the logits are read as
    they are (no slice, no copy, no fp32 upcast: the kernel accumulates in fp32); a
    sum over ``num_items_in_batch`` when given (gradient accumulation), else the mean;
    an fp32 loss, as transformers'."""
    if shift_labels is None:
        shift_labels = F.pad(labels, (0, 1), value=ignore_index)[..., 1:]
    rows = logits.reshape(-1, vocab_size)
    target = shift_labels.reshape(-1).to(rows.device)
    if not _on_cuteforge(rows):
        loss = F.cross_entropy(rows.float(), target, ignore_index=ignore_index,
                               reduction="sum" if num_items_in_batch is not None else "mean")
    else:
        from .. import ops

        loss = ops.cross_entropy(rows, target, ignore_index=ignore_index, out_dtype=torch.float32,
                                 reduction="sum" if num_items_in_batch is not None else "mean")
    if num_items_in_batch is not None:
        if torch.is_tensor(num_items_in_batch):
            num_items_in_batch = num_items_in_batch.to(loss.device)
        loss = loss / num_items_in_batch
    return loss
