"""A cached kernel's shared library, opened without importing tvm-ffi's Python package.

A process's first call of a cached kernel would otherwise import `tvm_ffi` (27-37 ms on
an H200 host) only to wrap one C symbol. The library (`compiler.link_shared`) exports
that symbol, `__tvm_ffi_<entry>`, with TVM-FFI's safe-call ABI; `TVMFFIFunctionCreate`
(from libtvm_ffi, a dependency of the library, so looked up through it) turns it into a
TVM-FFI function handle, which is all the C++ launch path (`cuteforge.native.launch`)
needs. Called from Python, the kernel imports `tvm_ffi` then, once, and calls through
a `tvm_ffi.Function` of the same symbol; where `tvm_ffi` is imported already, the
library's function is that `tvm_ffi.Function` itself (`open_function`).
"""

from __future__ import annotations

import ctypes
import os
import sys
from typing import Any

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

    __slots__ = ("path", "_lib", "_address", "_handle", "_function")

    def __init__(self, path: str, symbol: str) -> None:
        self.path = path
        # RTLD_LOCAL: kernels' libraries define the same internal names; none may serve another
        self._lib = ctypes.CDLL(path, mode=os.RTLD_NOW | os.RTLD_LOCAL)
        self._address: int = ctypes.cast(getattr(self._lib, f"__tvm_ffi_{symbol}"), ctypes.c_void_p).value  # type: ignore[assignment]
        self._handle: int | None = None
        self._function: Any = None

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
        return (self._function or self.function())(*args)

    def __repr__(self) -> str:
        return f"<cuteforge.LinkedKernel {self.path}>"
