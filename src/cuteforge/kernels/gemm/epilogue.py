"""GEMM epilogues: what is computed on the fp32 accumulator before the store.

A `GemmEpilogue` is hashable text plus its tensor operands' kinds; `fn()` gives the
elementwise hook the kernel calls on fp32 TensorSSA fragments (accumulator first, then
one fragment per operand, in the accumulator's thread-value layout). Two sources:

- presets: `GemmEpilogue.preset(act, bias=..., c=..., residual=..., alpha=, beta=)`
  computes  act(alpha * acc + beta * C + bias) + residual  with act in
  {none, relu, gelu (tanh form), silu};
- `cuteforge.fusion.Epilogue` objects: `GemmEpilogue.from_fusion(ep)` (scalar operands
  bound first with `ep.bind`); builders rebuild the expression from its key, so a
  compile in another process needs nothing but the key;
- either (or none) behind fp8's per-row / per-column dequantization scales:
  `GemmEpilogue.with_scales(inner, row=, col=)` multiplies the accumulator by a "row"
  operand (scale_a) and / or a "col" operand (scale_b) first, as torch._scaled_mm's
  rowwise mode, then applies `inner`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

ACTIVATIONS = ("none", "relu", "gelu", "silu")
TENSOR_KINDS = ("row", "col", "full")

_GELU_K0 = 0.7978845608028654  # sqrt(2 / pi)
_GELU_K1 = 0.044715


def activation(name: str, x: Any) -> Any:
    """`name` applied to an fp32 TensorSSA (inside @cute.jit code)."""
    import cutlass.cute as cute

    if name == "none":
        return x
    if name == "relu":
        return cute.where(x > 0.0, x, cute.full_like(x, 0.0))
    if name in HALF_FORM:
        return activation_of_half(name, 0.5 * x)
    raise ValueError(f"unknown activation {name!r}; known: {ACTIVATIONS}")


# Activations computed from h = x / 2: the caller can fold the halving into the FMA that
# forms x (acc * alpha / 2 + bias / 2: bias / 2 is formed once per distinct bias value),
# one instruction per element fewer on an epilogue the cooperative tile does not overlap.
HALF_FORM = ("gelu", "silu")


def activation_of_half(name: str, h: Any) -> Any:
    """gelu or silu of x = 2 h, from h (an fp32 TensorSSA inside @cute.jit code). Every
    scaling is by a power of two, so folding the halving into the terms of x gives the same
    h, bit for bit, as halving x once it is formed. The output is h + h * tanh(u), one
    rounding, where the plain form 0.5 x (1 + t) rounds twice."""
    import cutlass.cute as cute

    if name == "gelu":
        # x/2 (1 + tanh(k0 (x + k1 x^3))) = h + h tanh(u), u = h (2 k0 + 8 k0 k1 h^2)
        u = h * ((2.0 * _GELU_K0) + (8.0 * _GELU_K0 * _GELU_K1) * (h * h))
        return h + h * cute.math.tanh(u, fastmath=True)
    if name == "silu":
        # x sigmoid(x) with sigmoid(x) = (1 + tanh(x / 2)) / 2: one MUFU tanh, no divide
        # (a full-precision fp32 divide per element cost 15% of a large GEMM).
        return h + h * cute.math.tanh(h, fastmath=True)
    raise ValueError(f"{name!r} has no half form; those that do: {HALF_FORM}")


def activation_torch(name: str, x: Any) -> Any:
    """The same activation in torch (references, fallbacks)."""
    import torch.nn.functional as F

    if name == "none":
        return x
    if name == "relu":
        return F.relu(x)
    if name == "gelu":
        return F.gelu(x, approximate="tanh")
    if name == "silu":
        return F.silu(x)
    raise ValueError(f"unknown activation {name!r}; known: {ACTIVATIONS}")


# Gated GEMMs (gate(a @ b_gate) * (a @ b_up)): the gates they fuse.
GATES = ("silu", "gelu")


def gate_function(name: str) -> Callable[[Any, Any], Any]:
    """The gated GEMM's epilogue: `name`(gate) * up on fp32 TensorSSA fragments."""
    if name not in GATES:
        raise ValueError(f"gate must be one of {GATES}, got {name!r}")

    def gate_mul(gate: Any, up: Any) -> Any:
        return activation_of_half(name, 0.5 * gate) * up

    return gate_mul


@dataclass(frozen=True)
class GemmEpilogue:
    """Canonical text (`key`, goes into compile keys) + the kinds of its tensor operands."""

    key: str
    kinds: tuple[str, ...]

    @staticmethod
    def preset(act: str = "none", *, bias: str | None = None, c: bool = False, residual: bool = False,
               alpha: float = 1.0, beta: float = 1.0) -> GemmEpilogue | None:
        """None when nothing is fused (the plain GEMM kernel)."""
        if act not in ACTIVATIONS:
            raise ValueError(f"epilogue must be one of {ACTIVATIONS} or a cuteforge.fusion.Epilogue, got {act!r}")
        if bias not in (None, "row", "col"):
            raise ValueError(f"bias kind must be 'row' or 'col', got {bias!r}")
        if act == "none" and bias is None and not c and not residual and alpha == 1.0:
            return None
        kinds = tuple(k for k, on in ((bias, bias is not None), ("full", c), ("full", residual)) if on)
        key = f"preset:act={act},bias={bias},c={c},res={residual},alpha={float(alpha)!r},beta={float(beta)!r}"
        return GemmEpilogue(key, kinds)

    @staticmethod
    def from_fusion(ep: Any) -> GemmEpilogue:
        """A fusion Epilogue whose scalar operands are already bound (`ep.bind(name=v)`)."""
        for name, kind in ep.operands:
            if kind == "scalar":
                raise ValueError(f"epilogue scalar operand {name!r} must be bound first: pass its value in epilogue_args")
            if kind not in TENSOR_KINDS:
                raise ValueError(f"epilogue operand {name!r}: kind {kind!r} is not supported by the GEMM (row, col, full)")
        return GemmEpilogue("fusion:" + str(ep.key), tuple(kind for _, kind in ep.operands))

    @staticmethod
    def with_scales(inner: GemmEpilogue | None, *, row: bool, col: bool) -> GemmEpilogue | None:
        """`inner` (a preset, a fusion epilogue or None) applied to acc * scale_a[m] *
        scale_b[n]: fp8's per-row and / or per-column scales become the first tensor
        operands ("row" for scale_a, then "col" for scale_b). None when neither is given and
        there is no inner epilogue."""
        if not (row or col):
            return inner
        head = ("row",) * row + ("col",) * col
        key = f"scaled:row={row},col={col}|{inner.key if inner is not None else ''}"
        return GemmEpilogue(key, head + (inner.kinds if inner is not None else ()))

    @property
    def scale_operands(self) -> int:
        """How many of the operands are fp8 per-row / per-column scales (`with_scales`)."""
        return self._scaled_parts()[0] if self.key.startswith("scaled:") else 0

    def _scaled_parts(self) -> tuple[int, tuple[str, ...], GemmEpilogue | None]:
        """(number of scale operands, their names, the inner epilogue) of a `with_scales` key."""
        header, inner_key = self.key.removeprefix("scaled:").split("|", 1)
        f = dict(part.split("=", 1) for part in header.split(","))
        names = tuple(n for n, on in (("scale_a", f["row"] == "True"), ("scale_b", f["col"] == "True")) if on)
        inner = GemmEpilogue(inner_key, self.kinds[len(names):]) if inner_key else None
        return len(names), names, inner

    def _fusion(self) -> Any:
        from ...fusion import Epilogue

        return Epilogue.from_key(self.key.removeprefix("fusion:"))

    def preset_fields(self) -> tuple[str, bool, bool, bool, float, float] | None:
        """(activation, bias, c, residual, alpha, beta) of a preset epilogue; None for a
        fusion Epilogue or fp8 scales."""
        return self._preset_fields() if self.key.startswith("preset:") else None

    def _preset_fields(self) -> tuple[str, bool, bool, bool, float, float]:
        f = dict(part.split("=", 1) for part in self.key.removeprefix("preset:").split(","))
        return f["act"], f["bias"] != "None", f["c"] == "True", f["res"] == "True", float(f["alpha"]), float(f["beta"])

    def operand_names(self) -> tuple[str, ...]:
        """Names of the tensor operands for error messages: bias/c/residual for a preset,
        op0, op1, ... for a fusion Epilogue (its names are not part of the key), scale_a /
        scale_b first for per-row / per-column fp8 scales."""
        if self.key.startswith("scaled:"):
            _, names, inner = self._scaled_parts()
            return names + (inner.operand_names() if inner is not None else ())
        if self.key.startswith("fusion:"):
            return tuple(f"epilogue operand {i}" for i in range(len(self.kinds)))
        _, bias, c, res, _, _ = self._preset_fields()
        return tuple(n for n, on in (("bias", bias), ("c", c), ("residual", res)) if on)

    def reference(self, acc: Any, *ops: Any) -> Any:
        """The same epilogue in torch on fp32 tensors (operands already broadcastable)."""
        if self.key.startswith("scaled:"):
            n, _, inner = self._scaled_parts()
            for s in ops[:n]:
                acc = acc * s
            return inner.reference(acc, *ops[n:]) if inner is not None else acc
        if self.key.startswith("fusion:"):
            return self._fusion().reference(acc, *ops)
        act, bias, c, res, alpha, beta = self._preset_fields()
        it = iter(ops)
        x = acc * alpha
        b = next(it) if bias else None
        if c:
            x = x + beta * next(it)
        if b is not None:
            x = x + b
        x = activation_torch(act, x)
        if res:
            x = x + next(it)
        return x

    def fn(self) -> Callable[..., Any]:
        """The elementwise hook: fn(acc, *tensor_operand_fragments) -> fp32 TensorSSA."""
        if self.key.startswith("scaled:"):
            n, _, inner = self._scaled_parts()
            inner_fn = inner.fn() if inner is not None else None

            def scaled(acc: Any, *frags: Any) -> Any:
                for s in frags[:n]:
                    acc = acc * s
                return inner_fn(acc, *frags[n:]) if inner_fn is not None else acc

            return scaled
        if self.key.startswith("fusion:"):
            return self._fusion().apply
        act, bias, c, res, alpha, beta = self._preset_fields()

        # gelu / silu take x / 2: every term of x is scaled by 1/2 as it is formed
        k = 0.5 if act in HALF_FORM else 1.0

        def preset(acc: Any, *frags: Any) -> Any:
            it = iter(frags)
            x = acc * (alpha * k) if alpha * k != 1.0 else acc
            if bias:
                b = next(it)
            if c:
                x = x + (next(it) * (beta * k) if beta * k != 1.0 else next(it))
            if bias:
                x = x + (b * k if k != 1.0 else b)
            x = activation_of_half(act, x) if act in HALF_FORM else activation(act, x)
            if res:
                x = x + next(it)
            return x

        return preset
