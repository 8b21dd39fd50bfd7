"""cuteforge: compile-once CuTe DSL kernels for PyTorch.

    import cuteforge
    cuteforge.ops.sum(x)                       # library kernels as torch ops
    @cuteforge.kernel(signature=...)           # your own kernels, same machinery

Importing cuteforge is cheap: the CuTe DSL (~2 s to import) loads on first compile or
cache load, and `cuteforge.ops` on first use.
"""

from __future__ import annotations

from typing import Any

from .arch import ArchError, target_arch
from .bundle import use_bundle
from .cache import STATS, CompileAfterWarmupError, end_warmup
from .compiler import compile_only
from .kernel import REGISTRY, CompileSpec, Kernel, kernel
from .signature import FLOAT_DTYPES, BoundKey, Signature, TensorArg

__version__ = "0.1.0"

__all__ = [
    "ArchError",
    "BoundKey",
    "CompileAfterWarmupError",
    "CompileSpec",
    "FLOAT_DTYPES",
    "Kernel",
    "REGISTRY",
    "STATS",
    "Signature",
    "TensorArg",
    "Template",
    "cache_stats",
    "compile_only",
    "end_warmup",
    "kernel",
    "nn",
    "ops",
    "patch",
    "target_arch",
    "unpatch",
    "use_bundle",
]


def cache_stats() -> dict[str, float]:
    """This process's cache counters: L1 hits, L2 loads, compiles, compile/load ms."""
    return STATS.as_dict()


def __getattr__(name: str) -> Any:
    if name in ("ops", "nn"):
        import importlib

        return importlib.import_module(f".{name}", __name__)
    if name in ("patch", "unpatch"):
        from . import nn

        return getattr(nn, name)
    if name == "Template":
        from .templates import Template

        return Template
    raise AttributeError(f"module 'cuteforge' has no attribute {name!r}")
