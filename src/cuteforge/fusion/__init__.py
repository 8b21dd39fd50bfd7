"""Epilogue / prologue fusion: pointwise Python functions traced into CuTe TensorSSA code.

    from cuteforge.fusion import Epilogue, relu
    ep = Epilogue.from_fn(lambda acc, bias, res: relu(acc + bias) + res, bias="col", res="full")

See `pointwise.py` for the interface (`key`, `operands`, `apply`, `source`, `bind`) and
`expr.py` for how functions are captured (tracing with symbolic placeholders).
"""

from .expr import UnsupportedFusionError
from .pointwise import (
    KINDS,
    OPS_ALIAS,
    SOURCE_IMPORT,
    Epilogue,
    Pointwise,
    Prologue,
    abs,  # noqa: A004 - the fusion op's name
    clamp,
    exp,
    gelu,
    log,
    maximum,
    minimum,
    neg,
    relu,
    rsqrt,
    sigmoid,
    silu,
    sqrt,
    tanh,
    where,
)

min = minimum  # noqa: A001 - the issue's names; minimum/maximum avoid shadowing builtins
max = maximum  # noqa: A001

__all__ = [
    "KINDS",
    "OPS_ALIAS",
    "SOURCE_IMPORT",
    "Epilogue",
    "Pointwise",
    "Prologue",
    "UnsupportedFusionError",
    "abs",
    "clamp",
    "exp",
    "gelu",
    "log",
    "max",
    "maximum",
    "min",
    "minimum",
    "neg",
    "relu",
    "rsqrt",
    "sigmoid",
    "silu",
    "sqrt",
    "tanh",
    "where",
]
