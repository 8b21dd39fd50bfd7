"""`Epilogue` and `Prologue`: pointwise functions captured once, fused into a kernel.

    ep = Epilogue.from_fn(lambda acc, bias, res: relu(acc + bias) + res, bias="col", res="full")
    ep.key                  # canonical text: expression + operand kinds (compile keys)
    ep.operands             # (("bias", "col"), ("res", "full"))
    ep.apply(acc, b, r)     # inside @cute.jit code, on fp32 TensorSSA values
    ep.source("acc", ["b", "r"])   # the same computation as CuTe DSL source text

Operand kinds: `row` (one value per output row, index m), `col` (per column, index n),
`full` (the output's shape), `scalar` (a Python number, compile-time constant: its
value must be part of the compile key; `bind(name=value)` folds it into the expression
and so into `key`). A `Prologue` is the same for one input as it is loaded: its first
argument is the loaded value.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

from . import expr

KINDS = ("scalar", "row", "col", "full")
OPS_ALIAS = "cf_ops"
SOURCE_IMPORT = f"from cuteforge.fusion import cute_ops as {OPS_ALIAS}"


class Pointwise:
    """Shared by Epilogue and Prologue: a traced expression over a value and operands."""

    role = "pointwise"

    def __init__(self, node: expr.Node, value_name: str, operands: tuple[tuple[str, str], ...]) -> None:
        for name, kind in operands:
            if kind not in KINDS:
                raise ValueError(f"{self.role} operand {name!r}: kind {kind!r} is not one of {KINDS}")
        self.node = node
        self.value_name = value_name
        self.operands = tuple(operands)
        kinds = ",".join(k for _, k in self.operands)
        self.key = f"{self.role}:{expr.to_key(node)}|{kinds}"

    @classmethod
    def from_fn(cls, fn: Callable[..., Any], **kinds: str) -> Pointwise:
        """Trace `fn(value, *operands)`. Each operand parameter needs a kind keyword
        (`bias="col"`); unknown or missing kinds raise ValueError naming the parameter."""
        try:
            params = list(inspect.signature(fn).parameters.values())
        except (TypeError, ValueError):
            raise TypeError(f"{cls.role} needs a Python function, got {fn!r}") from None
        for p in params:
            if p.kind not in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD):
                raise TypeError(f"{cls.role} function parameters must be plain positional names; {p.name!r} is {p.kind.description}")
        if not params:
            raise TypeError(f"{cls.role} function must take the {'accumulator' if cls is Epilogue else 'loaded value'} as its first argument")
        names = [p.name for p in params]
        extra = set(kinds) - set(names[1:])
        if extra:
            raise ValueError(f"{cls.role}: kinds given for {sorted(extra)}, which are not operands of the function ({names[1:]})")
        missing = [n for n in names[1:] if n not in kinds]
        if missing:
            raise ValueError(f"{cls.role}: operand(s) {missing} need a kind: one of {KINDS}, e.g. {missing[0]}='row'")
        node = expr.trace(fn, len(names))
        return cls(node, names[0], tuple((n, kinds[n]) for n in names[1:]))

    @classmethod
    def from_key(cls, key: str, names: list[str] | None = None) -> Pointwise:
        """Rebuild from `key` (operand names are not part of it: defaults op0, op1, ...)."""
        role, _, rest = key.partition(":")
        if role != cls.role:
            raise ValueError(f"{key!r} is not a {cls.role} key")
        text, _, kinds = rest.rpartition("|")
        ks = [k for k in kinds.split(",") if k]
        names = names or [f"op{i}" for i in range(len(ks))]
        return cls(expr.parse_key(text), "value", tuple(zip(names, ks)))

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.source(self.value_name, [n for n, _ in self.operands])}; {dict(self.operands)})"

    def __eq__(self, other: object) -> bool:
        return type(other) is type(self) and other.key == self.key  # type: ignore[attr-defined]

    def __hash__(self) -> int:
        return hash(self.key)

    @property
    def tensor_operands(self) -> tuple[tuple[str, str], ...]:
        return tuple((n, k) for n, k in self.operands if k != "scalar")

    def bind(self, **values: float) -> Pointwise:
        """A copy with scalar operands replaced by constants (their values enter `key`)."""
        idx = {n: i + 1 for i, (n, _) in enumerate(self.operands)}
        mapping: dict[int, expr.Node] = {}
        for name, v in values.items():
            if name not in idx:
                raise ValueError(f"{self.role} has no operand {name!r}; operands: {[n for n, _ in self.operands]}")
            if dict(self.operands)[name] != "scalar":
                raise ValueError(f"{self.role} operand {name!r} is a {dict(self.operands)[name]} operand, not a scalar")
            if isinstance(v, bool) or not isinstance(v, (int, float)):
                raise TypeError(f"{self.role} scalar {name!r} must be a Python number, got {type(v).__name__}")
            mapping[idx[name]] = ("const", float(v))
        keep = [(n, k) for n, k in self.operands if n not in values]
        for new, (n, _) in enumerate(keep, start=1):
            mapping[idx[n]] = ("in", new)
        node = expr.substitute(self.node, mapping)
        return type(self)(node, self.value_name, tuple(keep))

    def apply(self, value: Any, *operand_values: Any) -> Any:
        """Compute on fp32 TensorSSA values inside traced CuTe code; returns a TensorSSA."""
        if len(operand_values) != len(self.operands):
            raise TypeError(f"{self.role} takes {len(self.operands)} operand value(s) ({[n for n, _ in self.operands]}), got {len(operand_values)}")
        from . import cute_ops

        out = expr.evaluate(self.node, [value, *operand_values], cute_ops)
        if isinstance(out, (int, float)):  # the function ignored its input: broadcast
            import cutlass
            import cutlass.cute as cute

            out = cute.full_like(value, float(out), cutlass.Float32)
        return out

    def source(self, value_name: str, operand_names: list[str] | tuple[str, ...] = ()) -> str:
        """The computation as CuTe DSL source text over the named variables. Needs
        `SOURCE_IMPORT` (`from cuteforge.fusion import cute_ops as cf_ops`) in the module."""
        if len(operand_names) != len(self.operands):
            raise TypeError(f"{self.role}.source needs {len(self.operands)} operand name(s) ({[n for n, _ in self.operands]}), got {len(operand_names)}")
        text = expr.source(self.node, [value_name, *operand_names], OPS_ALIAS)
        if self.node[0] == "const":  # a constant function still yields a tensor
            text = f"cute.full_like({value_name}, {text}, cutlass.Float32)"
        return text

    def reference(self, value: Any, *operand_values: Any) -> Any:
        """The same function on torch tensors (for tests: the unfused expression)."""
        from . import torch_ops

        return expr.evaluate(self.node, [value, *operand_values], torch_ops)


class Epilogue(Pointwise):
    """Applied to the accumulator before the store; see the module docstring."""

    role = "epilogue"


class Prologue(Pointwise):
    """Applied to an input's elements as they are loaded; see the module docstring."""

    role = "prologue"


def _record_or_compute(op: str, *args: Any) -> Any:
    if any(isinstance(a, expr.Sym) for a in args):
        return expr.apply_op(op, *args)
    if all(isinstance(a, (int, float)) and not isinstance(a, bool) for a in args):
        from . import cute_ops  # plain-number paths need no GPU and no tracing

        return getattr(cute_ops, op)(*args)
    kinds = ", ".join(type(a).__name__ for a in args)
    raise expr.UnsupportedFusionError(f"cuteforge.fusion.{op} works on traced values and numbers inside an epilogue/prologue function, got ({kinds})")


def _function(op: str) -> Callable[..., Any]:
    """The fusion function `op` (cuteforge.fusion.relu, ...): records the node on traced
    values, computes on plain numbers."""

    if expr.OPS[op] == 1:
        def f(x: Any) -> Any:
            return _record_or_compute(op, x)
    else:
        def f(a: Any, b: Any) -> Any:  # type: ignore[misc]
            return _record_or_compute(op, a, b)

    f.__name__ = f.__qualname__ = op
    f.__doc__ = f"cuteforge.fusion.{op}: on traced values inside an epilogue/prologue function, or on numbers."
    return f


relu, silu, sigmoid, tanh, exp = (_function(op) for op in ("relu", "silu", "sigmoid", "tanh", "exp"))
sqrt, rsqrt, log, neg = (_function(op) for op in ("sqrt", "rsqrt", "log", "neg"))
abs = _function("abs")  # noqa: A001 - the fusion op's name
minimum, maximum = _function("minimum"), _function("maximum")


def gelu(x: Any, approximate: str = "none") -> Any:
    """torch.nn.functional.gelu: exact (erf) or approximate='tanh'."""
    if approximate not in ("none", "tanh"):
        raise ValueError(f"gelu: approximate must be 'none' or 'tanh', got {approximate!r}")
    return _record_or_compute("gelu" if approximate == "none" else "gelu_tanh", x)


def where(cond: Any, a: Any, b: Any) -> Any:
    if not isinstance(cond, expr.Sym):
        raise expr.UnsupportedFusionError("where() needs a traced comparison as its condition (e.g. acc > 0); a constant condition needs no where()")
    return expr.apply_op("where", cond, a, b)


def clamp(x: Any, lo: Any = None, hi: Any = None) -> Any:
    """torch.clamp: maximum with `lo`, then minimum with `hi` (either may be None)."""
    if lo is not None:
        x = maximum(x, lo)
    if hi is not None:
        x = minimum(x, hi)
    return x
