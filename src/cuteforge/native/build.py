"""Build and load cuteforge's C++ extension: the eager autograd node (ffi_backward.cpp) and
the eager forward launch (ffi_launch.cpp), as one torch extension.

Built once per machine for each (source, torch, tvm-ffi, Python) combination, into the
cuteforge cache directory (`CUTEFORGE_CACHE_DIR`, default ~/.cache/cuteforge) under a
file lock, so concurrent processes build it once; later processes load the shared
object in milliseconds. A build takes ~25-35 s (torch's headers); `cuteforge library`
does it ahead of time. It needs a C++ compiler (and ninja, a dependency), no CUDA toolkit.

Loading the shared object runs its code, so the build directory goes through `trust.py`:
under a refused root, or when another process holds the build lock for longer than
`LOCK_TIMEOUT_S`, the extension builds in a private temporary directory of this process.

`CUTEFORGE_NATIVE_AUTOGRAD=0` turns off both jobs (the name predates the forward launch).
When the build cannot run (no compiler, or that setting), `load()` returns
None after one warning and the ops keep their Python autograd nodes and Python launches.
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import sys
import warnings
from pathlib import Path
from types import ModuleType

from filelock import FileLock, Timeout

from .. import trust

# the backward node, the forward launch, and what they share
SOURCES = [Path(__file__).with_name(f) for f in ("ffi_backward.cpp", "ffi_launch.cpp", "ffi_dispatch.cpp")]
HEADERS = [Path(__file__).with_name(f) for f in ("ffi_common.h", "launch_plan.h")]
_state: dict[str, object] = {}
log = logging.getLogger("cuteforge.native")
LOCK_TIMEOUT_S = 600.0  # several builds' time: only a stopped or hung holder waits this out


def enabled() -> bool:
    return os.environ.get("CUTEFORGE_NATIVE_AUTOGRAD", "1") != "0"


def build_tag() -> str:
    import torch
    import tvm_ffi

    h = hashlib.sha256()
    for f in SOURCES + HEADERS:
        h.update(f.read_bytes())
    h.update(f"{torch.__version__}|{tvm_ffi.__version__}|{sys.version}|{sys.platform}".encode())
    return h.hexdigest()[:16]


def build_dir() -> Path:
    """`<cache root>/native/ffi_backward-<tag>`, or a private temporary directory of this
    process when the root is refused or the directory cannot be made."""
    from ..cache import private_root

    name = f"ffi_backward-{build_tag()}"
    root = private_root()
    if root is not None:
        try:
            return trust.private_dir(root, "native", name)
        except OSError as e:
            trust.warn_once(f"native:{root}", f"cuteforge: cannot use {root / 'native'} for the C++ extension ({e}); "
                            "it builds in a private temporary directory for this process")
    return trust.private_dir(trust.process_temp_dir("native"), name)


def load() -> ModuleType | None:
    """The extension module, building it first if this machine has none; None when it
    is disabled or cannot be built (warned once per process)."""
    if "module" in _state:
        return _state["module"]  # type: ignore[return-value]
    mod = None
    if enabled():
        try:
            mod = _build_and_load()
        except Exception as e:  # no compiler, headers missing: keep the Python nodes
            warnings.warn(f"cuteforge: the C++ extension could not be built ({type(e).__name__}: "
                          f"{str(e).strip().splitlines()[-1] if str(e).strip() else e}); eager calls use "
                          "Python launches and Python autograd nodes (set CUTEFORGE_NATIVE_AUTOGRAD=0 to silence)",
                          RuntimeWarning, stacklevel=3)
    _state["module"] = mod
    return mod


def _ninja_on_path() -> None:
    """torch's extension builder runs `ninja` from PATH; the `ninja` wheel (a dependency)
    installs it next to the interpreter, which is not on PATH when the venv is not active."""
    if shutil.which("ninja") is None:
        try:
            import ninja
        except ImportError:
            return
        os.environ["PATH"] = ninja.BIN_DIR + os.pathsep + os.environ.get("PATH", "")


def _build_and_load() -> ModuleType:
    import tvm_ffi.libinfo as ffi_info
    from torch.utils import cpp_extension

    _ninja_on_path()
    directory = build_dir()
    lock = FileLock(str(directory) + ".lock", timeout=LOCK_TIMEOUT_S, mode=0o600)
    try:
        lock.acquire()
    except (Timeout, OSError) as e:
        trust.warn_once("native-lock", f"cuteforge: cannot take the C++ extension's build lock {lock.lock_file} ({e}); "
                        "building it in a private temporary directory for this process")
        directory = trust.private_dir(trust.process_temp_dir("native"), directory.name)
        return _build(cpp_extension, ffi_info, directory)
    try:
        # torch's own build lock (a `lock` file its FileBaton creates in the build
        # directory and removes when done) outlives a build that was killed; every later
        # build would then wait for it forever. Holding our lock, no other build of this
        # directory runs, so such a file is stale.
        (directory / "lock").unlink(missing_ok=True)
        return _build(cpp_extension, ffi_info, directory)
    finally:
        lock.release()


def _build(cpp_extension: ModuleType, ffi_info: ModuleType, directory: Path) -> ModuleType:
    libdir = str(Path(ffi_info.find_libtvm_ffi()).parent)
    includes = sorted({*ffi_info.include_paths(), ffi_info.find_dlpack_include_path()})
    if not any(directory.glob("*.so")):
        log.warning("cuteforge: building the C++ extension (autograd node, forward launch) once for this torch (~30 s) in %s", directory)
    return cpp_extension.load(
        name=f"cuteforge_ffi_backward_{build_tag()}",
        sources=[str(f) for f in SOURCES],
        extra_include_paths=includes,
        extra_cflags=["-O2"],
        extra_ldflags=[f"-L{libdir}", "-ltvm_ffi", f"-Wl,-rpath,{libdir}"],
        build_directory=str(directory),
        with_cuda=False,
        verbose=False,
    )
