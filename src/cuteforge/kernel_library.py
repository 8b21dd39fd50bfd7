"""A cached kernel's shared library, opened and called without importing tvm-ffi's Python
package.

A process's first call of a cached kernel would otherwise import `tvm_ffi` (27-37 ms on
an H200 host) only to wrap one C symbol. The library (`compiler.link_shared`) exports
that symbol, `__tvm_ffi_<entry>`, with TVM-FFI's safe-call ABI; `TVMFFIFunctionCreate`
(from libtvm_ffi, a dependency of the library, so looked up through it) turns it into a
TVM-FFI function handle, which is all the C++ launch path (`cuteforge.native.launch`)
needs. Called from Python (an op's Python launch, a user kernel), the kernel goes through
the C++ extension's `call_function` (`native/ffi_call.cpp`: torch tensors and scalars
packed in C, the call on torch's current stream) where the extension is loaded or built;
else, or for an argument that call does not pack, it imports `tvm_ffi` then, once, and
calls through a `tvm_ffi.Function` of the same symbol. Where `tvm_ffi` is imported
already, the library's function is that `tvm_ffi.Function` itself (`open_function`).
"""

from __future__ import annotations

import ctypes
import functools
import os
import sys
from collections.abc import Callable
from typing import Any

from . import runtime_libraries

_SAFE_CALL = ctypes.c_void_p  # int (*)(void* self, const TVMFFIAny* args, int32_t n, TVMFFIAny* result)


def open_function(path: str, symbol: str) -> Any:
    """The TVM-FFI function `symbol` of the shared library at `path`: a `tvm_ffi.Function`
    where `tvm_ffi` is imported already (no wrapper on later Python calls), else a
    `LinkedKernel`, which imports it only if called from Python."""
    kernel = LinkedKernel(path, symbol)
    return kernel.function() if "tvm_ffi" in sys.modules else kernel


class LinkedKernel:
    """The TVM-FFI function `symbol` of the shared library at `path`: ``__chandle__()`` for
    the C launch, callable like a `tvm_ffi.Function`. The library stays loaded for the
    life of the process, as tvm-ffi keeps the modules it loads."""

    __slots__ = ("path", "_lib", "_address", "_handle", "_function", "_native")

    def __init__(self, path: str, symbol: str) -> None:
        self.path = path
        runtime_libraries.open_kernel_runtime()  # its libtvm_ffi and DSL runtime: this environment's
        # RTLD_LOCAL: kernels' libraries define the same internal names; none may serve another
        self._lib = ctypes.CDLL(path, mode=os.RTLD_NOW | os.RTLD_LOCAL)
        self._address: int = ctypes.cast(getattr(self._lib, f"__tvm_ffi_{symbol}"), ctypes.c_void_p).value  # type: ignore[assignment]
        self._handle: int | None = None
        self._function: Any = None
        # the C++ extension's call of this kernel: None until the first Python call, then
        # the call or False (no extension: tvm_ffi's)
        self._native: Callable[..., Any] | bool | None = None

    def __chandle__(self) -> int:
        """A TVM-FFI function handle of the symbol (made once; its one reference is held for
        the life of the process)."""
        if self._handle is None:
            create = self._lib.TVMFFIFunctionCreate  # found in the library's dependency libtvm_ffi
            create.restype = ctypes.c_int
            create.argtypes = [ctypes.c_void_p, _SAFE_CALL, ctypes.c_void_p, ctypes.POINTER(ctypes.c_void_p)]
            handle = ctypes.c_void_p()
            if create(None, self._address, None, ctypes.byref(handle)) != 0 or not handle.value:
                raise RuntimeError(f"TVMFFIFunctionCreate failed for the kernel in {self.path}")
            self._handle = handle.value
        return self._handle

    def function(self) -> Any:
        """The symbol as a `tvm_ffi.Function` (imports `tvm_ffi`), made once."""
        if self._function is None:
            import tvm_ffi

            self._function = tvm_ffi.Function.__from_extern_c__(self._address, keep_alive_object=self._lib)
        return self._function

    def __call__(self, *args: Any) -> Any:
        native = self._native
        if native is None:
            native = self._native = _native_call(self) or False
        if native:
            result = native(*args)  # type: ignore[operator]
            if result is not NotImplemented:
                return result
        return (self._function or self.function())(*args)

    def __repr__(self) -> str:
        return f"<cuteforge.LinkedKernel {self.path}>"


def _native_call(kernel: LinkedKernel) -> Callable[..., Any] | None:
    """``call(*args)`` through the C++ extension's `call_function` for `kernel`, or None
    where the extension is neither loaded nor built (no build is started here) or the C
    launch is off (`CUTEFORGE_NATIVE_LAUNCH=0`)."""
    from .native import build, launch

    if not launch.enabled():
        return None
    mod = build.ready()
    if mod is None or not hasattr(mod, "call_function"):
        return None
    return functools.partial(mod.call_function, kernel.__chandle__())
