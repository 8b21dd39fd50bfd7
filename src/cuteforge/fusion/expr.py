"""Pointwise expressions captured by tracing a Python function with symbolic placeholders.

`trace(fn, n)` calls `fn` with `n` `Sym` objects. Every operator and every fusion
function (`relu`, `where`, ...) applied to a `Sym` returns a new `Sym` recording a node,
so what comes back is an expression tree, built without reading any source text. What
a placeholder cannot stand for (Python `if`, `float()`, `math.exp`, `torch.relu`,
`//`, indexing, methods) raises `UnsupportedFusionError` naming the operation.

A node is a tuple: `("in", i)` (the i-th argument), `("const", value)`, or
`(op, child, ...)`. `to_key` prints a tree as canonical S-expression text and `parse_key`
reads it back, which is how a compile worker process rebuilds an epilogue from its key.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from typing import Any

Node = tuple[Any, ...]

# op -> (arity, result is boolean)
UNARY = ("neg", "abs", "exp", "tanh", "sigmoid", "relu", "gelu", "gelu_tanh", "silu", "sqrt", "rsqrt", "log")
BINARY = ("add", "sub", "mul", "div", "minimum", "maximum")
COMPARE = ("lt", "le", "gt", "ge", "eq", "ne")
OPS: dict[str, int] = {**dict.fromkeys(UNARY, 1), **dict.fromkeys(BINARY, 2), **dict.fromkeys(COMPARE, 2), "where": 3}
INFIX = {"add": "+", "sub": "-", "mul": "*", "div": "/", "lt": "<", "le": "<=", "gt": ">", "ge": ">=", "eq": "==", "ne": "!="}


SUPPORTED = (
    "Epilogue/prologue functions support + - * / unary -, abs(), ** (small int powers), "
    "< <= > >= == != (as where()'s condition), Python numbers, and cuteforge.fusion's "
    "relu/gelu/silu/sigmoid/tanh/exp/sqrt/rsqrt/log/abs/neg/where/minimum/maximum/clamp"
)


class UnsupportedFusionError(TypeError):
    """An epilogue/prologue function used an operation that cannot be fused."""


def _unsupported(what: str, hint: str = "") -> UnsupportedFusionError:
    msg = f"cannot fuse {what}" + (f" ({hint})" if hint else "")
    return UnsupportedFusionError(msg + ". " + SUPPORTED)


def is_bool(node: Node) -> bool:
    return node[0] in COMPARE


def _operator(op: str, reflected: bool = False) -> Callable[[Sym, Any], Sym]:
    """A `Sym` operator method recording the binary node `op` over (self, other), or with
    `reflected` (the `__r*__` methods) over (other, self)."""
    if reflected:
        def method(self: Sym, o: Any) -> Sym:
            return _binary(op, o, self)
    else:
        def method(self: Sym, o: Any) -> Sym:
            return _binary(op, self, o)
    return method


def _refused(what: str, hint: str = "") -> Callable[..., Any]:
    """A `Sym` method for an operation a traced value cannot do: raises
    UnsupportedFusionError naming it (`_unsupported`)."""

    def method(self: Sym, *args: Any, **kwargs: Any) -> Any:
        raise _unsupported(what, hint)

    return method


class Sym:
    """A symbolic value standing for a tensor of fp32 elements while a function is traced."""

    __slots__ = ("node",)
    __hash__ = object.__hash__  # == builds a comparison node, so hash by identity

    def __init__(self, node: Node) -> None:
        object.__setattr__(self, "node", node)

    def __repr__(self) -> str:
        return f"Sym({to_key(self.node)})"

    # arithmetic ------------------------------------------------------------------
    __add__, __radd__ = _operator("add"), _operator("add", reflected=True)
    __sub__, __rsub__ = _operator("sub"), _operator("sub", reflected=True)
    __mul__, __rmul__ = _operator("mul"), _operator("mul", reflected=True)
    __truediv__, __rtruediv__ = _operator("div"), _operator("div", reflected=True)

    def __neg__(self) -> Sym:
        return apply_op("neg", self)

    def __pos__(self) -> Sym:
        return self

    def __abs__(self) -> Sym:
        return apply_op("abs", self)

    def __pow__(self, p: Any) -> Sym:
        if isinstance(p, bool) or not isinstance(p, (int, float)) or float(p) not in (1.0, 2.0, 3.0, 4.0, 0.5, -0.5):
            raise _unsupported(f"the power x ** {p!r}", "only constant exponents 1, 2, 3, 4, 0.5 and -0.5")
        if p == 0.5:
            return apply_op("sqrt", self)
        if p == -0.5:
            return apply_op("rsqrt", self)
        out = self
        for _ in range(int(p) - 1):
            out = _binary("mul", out, self)
        return out

    # comparisons: boolean values, usable only as the condition of where() -------------
    __lt__, __le__, __gt__ = _operator("lt"), _operator("le"), _operator("gt")
    __ge__, __eq__, __ne__ = _operator("ge"), _operator("eq"), _operator("ne")

    # what a traced value cannot do ---------------------------------------------------
    __bool__ = _refused("Python control flow on a traced value (if / and / or / not / bool())", "use where(cond, a, b)")
    __float__ = _refused("float() of a traced value", "math.* functions are not traceable; use cuteforge.fusion's functions")
    __int__ = _refused("int() of a traced value")
    __index__ = _refused("using a traced value as an index")
    __floordiv__ = __rfloordiv__ = _refused("floor division (//)")
    __mod__ = __rmod__ = _refused("modulo (%)")
    __matmul__ = __rmatmul__ = _refused("matrix multiplication (@)", "epilogues are elementwise")
    __and__ = __rand__ = _refused("bitwise and (&)")
    __or__ = __ror__ = _refused("bitwise or (|)")
    __xor__ = _refused("bitwise xor (^)")
    __invert__ = _refused("bitwise not (~)")

    def __rpow__(self, o: Any) -> Sym:
        raise _unsupported(f"the power {o!r} ** x", "use exp()")

    __getitem__ = _refused("indexing a traced value", "epilogues are elementwise")
    __iter__ = _refused("iterating over a traced value")
    __len__ = _refused("len() of a traced value")
    __call__ = _refused("calling a traced value")

    def __setattr__(self, name: str, value: Any) -> None:
        raise _unsupported(f"setting attribute .{name} on a traced value")

    def __getattr__(self, name: str) -> Any:
        raise _unsupported(f"the method or attribute .{name}", "use cuteforge.fusion functions, e.g. relu(x) rather than x.relu()")

    @classmethod
    def __torch_function__(cls, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        name = getattr(func, "__name__", repr(func))
        raise _unsupported(f"the torch function torch.{name}", f"use cuteforge.fusion.{name} where it exists")

    def __array_ufunc__(self, ufunc: Any, method: str, *inputs: Any, **kwargs: Any) -> Any:
        raise _unsupported(f"the numpy function numpy.{ufunc.__name__}")


def _lift(x: Any, op: str) -> Node:
    if isinstance(x, Sym):
        return x.node
    if isinstance(x, bool) or not isinstance(x, (int, float)):
        raise _unsupported(f"{op} with an operand of type {type(x).__name__}", "operands must be traced values or Python numbers")
    return ("const", float(x))


def _binary(op: str, a: Any, b: Any) -> Sym:
    return apply_op(op, a, b)


def apply_op(op: str, *args: Any) -> Sym:
    """Record `op(*args)`; checks arity and that booleans appear only as where()'s condition."""
    if op not in OPS:
        raise _unsupported(f"the operation {op!r}")
    if len(args) != OPS[op]:
        raise TypeError(f"{op} takes {OPS[op]} arguments, got {len(args)}")
    nodes = tuple(_lift(a, op) for a in args)
    for i, n in enumerate(nodes):
        cond_slot = op == "where" and i == 0
        if is_bool(n) and not cond_slot:
            raise _unsupported(f"{op} on a comparison result", "comparisons are only usable as where()'s condition")
        if cond_slot and not is_bool(n):
            raise UnsupportedFusionError(f"where() needs a comparison as its condition (e.g. x > 0), got {to_key(n)}")
    return Sym((op, *nodes))


def trace(fn: Callable[..., Any], n_args: int) -> Node:
    """The expression tree `fn` computes from `n_args` placeholders."""
    try:
        out = fn(*(Sym(("in", i)) for i in range(n_args)))
    except UnsupportedFusionError:
        raise
    except TypeError as e:
        # e.g. math.exp(x) asks for __float__ (handled above); anything else that a
        # placeholder could not stand for surfaces here with the original message.
        raise UnsupportedFusionError(f"cannot fuse this function: {e}") from e
    if isinstance(out, (tuple, list)):
        raise _unsupported("returning several values", "an epilogue returns one value")
    node = _lift(out, "the returned value")
    if is_bool(node):
        raise _unsupported("returning a comparison result", "wrap it: where(cond, 1.0, 0.0)")
    return node


# --- canonical text -----------------------------------------------------------------


def _const_text(v: float) -> str:
    return repr(float(v))  # 'inf', 'nan', '1e-05', '2.0': float() reads each back


def to_key(node: Node) -> str:
    if node[0] == "in":
        return f"${node[1]}"
    if node[0] == "const":
        return _const_text(node[1])
    return "(" + " ".join([node[0], *(to_key(c) for c in node[1:])]) + ")"


_TOKEN = re.compile(r"\(|\)|[^\s()]+")


def parse_key(text: str) -> Node:
    """Inverse of `to_key`."""
    tokens = _TOKEN.findall(text)
    pos = 0

    def read() -> Node:
        nonlocal pos
        if pos >= len(tokens):
            raise ValueError(f"truncated expression key {text!r}")
        tok = tokens[pos]
        pos += 1
        if tok == "(":
            op = tokens[pos]
            pos += 1
            if op not in OPS:
                raise ValueError(f"unknown operation {op!r} in expression key {text!r}")
            kids = []
            while tokens[pos] != ")":
                kids.append(read())
            pos += 1
            return (op, *kids)
        if tok.startswith("$"):
            return ("in", int(tok[1:]))
        return ("const", float(tok))

    node = read()
    if pos != len(tokens):
        raise ValueError(f"trailing text in expression key {text!r}")
    return node


def substitute(node: Node, mapping: dict[int, Node]) -> Node:
    """Replace argument leaves: `mapping[i]` for ("in", i)."""
    if node[0] == "in":
        return mapping.get(node[1], node)
    if node[0] == "const":
        return node
    return (node[0], *(substitute(c, mapping) for c in node[1:]))


def used_args(node: Node) -> set[int]:
    if node[0] == "in":
        return {node[1]}
    if node[0] == "const":
        return set()
    out: set[int] = set()
    for c in node[1:]:
        out |= used_args(c)
    return out


# --- evaluation (host numbers) and code generation ------------------------------------


def source(node: Node, names: list[str], ops_alias: str = "cf_ops") -> str:
    """CuTe DSL source for `node`: infix arithmetic, everything else through the
    `cuteforge.fusion.cute_ops` helpers (imported as `ops_alias`), which are the very
    functions `evaluate` calls, so rendered and traced epilogues compute the same thing."""
    if node[0] == "in":
        return names[node[1]]
    if node[0] == "const":
        v = node[1]
        return f'float("{_const_text(v)}")' if math.isinf(v) or math.isnan(v) else _const_text(v)
    kids = [source(c, names, ops_alias) for c in node[1:]]
    op = node[0]
    if op in ("add", "sub", "mul", "div"):
        return f"({kids[0]} {INFIX[op]} {kids[1]})"
    return f"{ops_alias}.{op}({', '.join(kids)})"


def evaluate(node: Node, values: list[Any], ops: Any) -> Any:
    """Compute `node` with `values` for its arguments through an ops namespace
    (`cute_ops` inside a kernel)."""
    if node[0] == "in":
        return values[node[1]]
    if node[0] == "const":
        return node[1]
    kids = [evaluate(c, values, ops) for c in node[1:]]
    op = node[0]
    if op == "add":
        return kids[0] + kids[1]
    if op == "sub":
        return kids[0] - kids[1]
    if op == "mul":
        return kids[0] * kids[1]
    if op == "div":
        return kids[0] / kids[1]
    return getattr(ops, op)(*kids)
