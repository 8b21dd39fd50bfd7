"""A stand-in kernel key for the trust tests: `KernelCache.get_bytes` with a compile that
returns bytes, so the cache's whole protocol runs in milliseconds."""

from __future__ import annotations

import os
import warnings

from cuteforge import compiler
from cuteforge.cache import DEFAULT_CACHE

ARCH = "sm_90a"
KERNEL = "trust_stand_in"
IS_ROOT = hasattr(os, "geteuid") and os.geteuid() == 0


def get(key: str, payload: bytes | None = None, ptx: str | None = None) -> tuple[bytes, int, list[str]]:
    """(bytes served, compiles, warnings) for one stand-in kernel key."""
    calls = []

    def compile_fn(keep: bool) -> compiler.CompileResult:
        calls.append(key)
        return compiler.CompileResult(payload if payload is not None else key.encode(), None, ptx, None)

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = DEFAULT_CACHE.get_bytes(kernel=KERNEL, key_repr=key, arch=ARCH, compile_fn=compile_fn)
    return out, len(calls), [str(w.message) for w in caught]
