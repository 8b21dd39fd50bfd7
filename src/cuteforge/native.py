"""Native dispatch: allocate an op's output and launch its kernel in one TVM-FFI call.

From Python, `torch.empty` alone costs about 40% of a `torch.mul` (argument parsing and
the dispatcher, then a second Python -> C++ crossing for the launch). Here one small C++
function, built once per machine with tvm-ffi's `load_inline`, allocates the output
through the caller's allocator (tvm-ffi installs torch's caching allocator for calls that
carry torch tensors, CUDA-graph pools included), calls the compiled kernel (another
TVM-FFI function) with the same environment stream, and returns the output as a
`torch.Tensor`.

Where no C++ compiler is available the build fails once, is reported once, and the ops
keep their Python allocation path: `launcher()` returns None. The same happens where
torch tensors lack the DLPack C exchange API (torch < 2.10 without torch-c-dlpack-ext):
tvm-ffi then installs no allocator for the call. `CUTEFORGE_NATIVE=0` turns it off.
"""

from __future__ import annotations

import functools
import hashlib
import os
import tempfile
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

_SOURCE = r"""
#include <tvm/ffi/container/shape.h>
#include <tvm/ffi/container/tensor.h>
#include <tvm/ffi/extra/c_env_api.h>
#include <tvm/ffi/function.h>

namespace ffi = tvm::ffi;

// out = empty((m,), dtype) on x's device; fn(x, out); return out.  (row reductions)
ffi::Tensor new_rows(ffi::Function fn, ffi::TensorView x, int64_t m, DLDataType dtype) {
  int64_t shape[1] = {m};
  ffi::Tensor out = ffi::Tensor::FromEnvAlloc(TVMFFIEnvTensorAlloc, ffi::ShapeView(shape, 1),
                                              dtype, x.device());
  fn(x, out);
  return out;
}

// out = empty(x.shape, dtype), contiguous, on x's device; fn(x, out); return out.
ffi::Tensor new_like(ffi::Function fn, ffi::TensorView x, DLDataType dtype) {
  ffi::Tensor out = ffi::Tensor::FromEnvAlloc(TVMFFIEnvTensorAlloc, x.shape(), dtype, x.device());
  fn(x, out);
  return out;
}
"""
_FUNCTIONS = ("new_rows", "new_like")


def _build_dir() -> Path:
    from importlib import metadata

    from .cache import _private_root

    tag = hashlib.sha256((_SOURCE + metadata.version("apache-tvm-ffi")).encode()).hexdigest()[:16]
    root = _private_root()
    base = root / "native" if root is not None else Path(tempfile.gettempdir()) / "cuteforge-native"
    return base / tag


@functools.cache
def _module() -> Any:
    """The built module, or None where it cannot be built (reported once)."""
    try:
        import tvm_ffi.cpp
        from filelock import FileLock

        where = _build_dir()
        where.mkdir(parents=True, exist_ok=True, mode=0o700)
        with FileLock(str(where) + ".lock"):  # N processes: one build, the rest load it
            return tvm_ffi.cpp.load_inline(
                "cuteforge_native", cpp_sources=_SOURCE, functions=list(_FUNCTIONS), build_directory=str(where)
            )
    except Exception as e:  # no compiler, no headers: the Python path still works
        warnings.warn(f"cuteforge: native dispatch unavailable, using Python allocation ({e})", stacklevel=3)
        return None


def launcher(kind: str) -> Callable[..., Any] | None:
    """`new_rows(fn, x, m, dtype)` or `new_like(fn, x, dtype)`, or None where native
    dispatch is off or unavailable.

    `dtype` is a `tvm_ffi.dtype` (see `ffi_dtype`); `fn` a compiled kernel's function.
    """
    if kind not in _FUNCTIONS:
        raise ValueError(f"unknown native launcher {kind!r}; have {_FUNCTIONS}")
    if os.environ.get("CUTEFORGE_NATIVE", "1") == "0" or not _torch_exchange_api():
        return None
    mod = _module()
    return None if mod is None else getattr(mod, kind)


@functools.cache
def _torch_exchange_api() -> bool:
    import torch

    try:  # torch-c-dlpack-ext adds the API to older torch when installed
        import tvm_ffi  # noqa: F401
    except ImportError:
        return False
    return hasattr(torch.Tensor, "__dlpack_c_exchange_api__")


@functools.cache
def ffi_dtype(dtype: Any) -> Any:
    """The tvm-ffi dtype for a torch dtype (cached: built once per dtype)."""
    import tvm_ffi

    return tvm_ffi.dtype(str(dtype).removeprefix("torch."))
