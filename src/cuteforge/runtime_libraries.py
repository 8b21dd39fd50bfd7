"""The shared libraries compiled kernels run on, found without importing the DSL or
tvm-ffi: this environment's libtvm_ffi, opened before the C++ extension or a cached
kernel's shared library is, and the DSL's runtime, which a kernel's library links
(`kernel_dependencies`, so linking a bundle's object imports no DSL) and which is opened
before one is loaded (`open_kernel_runtime`).

Both link libtvm_ffi through an absolute rpath: the tvm-ffi installation of the
environment that built or linked them. A cache is per user, not per environment, so a
file made in one virtual environment can be opened in another. Had that file's rpath
loaded the other environment's libtvm_ffi, the process would hold two copies of it, each
with its own thread-local error slot and launch stream: a kernel's error would come back
without its message, and kernels could launch on a stream other than torch's. With this
environment's copy open first (RTLD_GLOBAL, as tvm-ffi's own import opens it), the
dynamic loader serves every later dependency on `libtvm_ffi.so` from it by its soname.
Found without importing `tvm_ffi` (its import is tens of ms of a process's start).
"""

from __future__ import annotations

import ctypes
import functools
import importlib.util
import os
from pathlib import Path


@functools.cache
def tvm_ffi_library() -> Path | None:
    """The libtvm_ffi.so of the installed `tvm_ffi` package (resolved), or None where it is
    not found there (then the rpath decides)."""
    try:
        spec = importlib.util.find_spec("tvm_ffi")
    except (ImportError, ValueError):
        return None
    for base in (spec.submodule_search_locations or []) if spec else []:
        lib = Path(base) / "lib" / "libtvm_ffi.so"
        if lib.is_file():
            return lib.resolve()
    return None


@functools.cache
def open_tvm_ffi() -> None:
    """Open this environment's libtvm_ffi once, globally (see the module's doc)."""
    _open_global(tvm_ffi_library())


@functools.cache
def open_kernel_runtime() -> None:
    """Open what a kernel's library links, this environment's libtvm_ffi and DSL runtime,
    once, globally: a library linked in another environment then runs on these (by
    soname) rather than on copies its rpath names."""
    open_tvm_ffi()
    _open_global(dsl_runtime_library())


def _open_global(lib: Path | None) -> None:
    if lib is not None:
        try:
            ctypes.CDLL(str(lib), mode=os.RTLD_NOW | os.RTLD_GLOBAL)
        except OSError:  # then the rpath decides
            pass


@functools.cache
def dsl_runtime_library() -> Path | None:
    """The DSL's runtime library as the DSL picks it (`CUTE_DSL_LIBS`, else the one the
    installed package holds), found without importing the DSL; None where that is not
    exactly one file (then the DSL is asked)."""
    name = "libcute_dsl_runtime.so"
    listed = os.environ.get("CUTE_DSL_LIBS")
    if listed:
        found = [Path(p) for p in listed.split(os.pathsep) if p.endswith(name)]
    else:
        try:
            spec = importlib.util.find_spec("nvidia_cutlass_dsl")
        except (ImportError, ValueError):
            return None
        bases = [Path(b) for b in ((spec.submodule_search_locations or []) if spec else [])]
        found = [lib for b in bases for lib in (*b.glob(f"lib/{name}"), *b.glob(f"cu*/lib/{name}"))]
    return found[0].resolve() if len(found) == 1 and found[0].is_file() else None


def kernel_dependencies() -> list[str] | None:
    """What a kernel's shared library links (`compiler.link_shared`): the DSL's runtime and
    libtvm_ffi, found without importing either; None where one is not found so."""
    libs = (dsl_runtime_library(), tvm_ffi_library())
    return None if None in libs else [str(p) for p in libs]
