"""Build and load cuteforge's C++ extension: the eager autograd node (ffi_backward.cpp), the
eager forward launch (ffi_launch.cpp), the registered ops' dispatcher kernels
(ffi_dispatch.cpp) and a kernel's call from Python (ffi_call.cpp), as one torch extension.

Built once per machine for each (source, torch, tvm-ffi, Python) combination and each
environment's libtvm_ffi (the extension links it by absolute path), into the
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

No call waits for a build. An extension built before is imported straight from its build
directory (its file name carries the build tag; no toolchain check, a few milliseconds).
Where none is built, `load()` starts the build in a background thread and returns None,
so calls take the Python paths; once it is ready, later `load()` calls return the module
(progress on stderr; `building()` says whether one is under way). `load(wait=True)`
builds in the foreground, or waits for the background build (`cuteforge build-native`,
`precompile`, the tests: `CUTEFORGE_NATIVE_BUILD=wait` makes every `load()` wait).
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import logging
import os
import shutil
import sys
import threading
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

from filelock import FileLock, Timeout

from .. import runtime_libraries, trust

# the backward node, the forward launch, the dispatcher kernels, a kernel's call from Python,
# and what they share
SOURCES = [Path(__file__).with_name(f) for f in ("ffi_backward.cpp", "ffi_launch.cpp", "ffi_dispatch.cpp", "ffi_call.cpp")]
HEADERS = [Path(__file__).with_name(f) for f in ("ffi_common.h", "launch_plan.h")]
_state: dict[str, object] = {}
log = logging.getLogger("cuteforge.native")
LOCK_TIMEOUT_S = 600.0  # several builds' time: only a stopped or hung holder waits this out


def enabled() -> bool:
    return os.environ.get("CUTEFORGE_NATIVE_AUTOGRAD", "1") != "0"


def build_tag() -> str:
    """What the extension is built for: its sources, torch, tvm-ffi (version and library), Python (16 hex digits).
    Computed once per process: a load asks it several times."""
    return _build_tag(tuple(SOURCES + HEADERS))


@functools.cache
def _build_tag(files: tuple[Path, ...]) -> str:
    import torch

    h = hashlib.sha256()
    for f in files:
        h.update(f.read_bytes())
    # the libtvm_ffi it links (by absolute rpath): each environment builds its own
    # (the environment itself where that library is not found in the package's place)
    lib = runtime_libraries.tvm_ffi_library() or sys.prefix
    h.update(f"{torch.__version__}|{_tvm_ffi_version()}|{lib}|{sys.version}|{sys.platform}".encode())
    return h.hexdigest()[:16]


def _tvm_ffi_version() -> str:
    """tvm-ffi's version from its installed distribution's name: importing `tvm_ffi` for
    its `__version__` would cost a process's first call 20-40 ms."""
    from ..cache import toolchain_versions

    version = dict(toolchain_versions()).get("apache-tvm-ffi")
    if version is not None:
        return version
    import tvm_ffi

    return str(tvm_ffi.__version__)


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


_lock = threading.Lock()


def module_name() -> str:
    return f"cuteforge_ffi_backward_{build_tag()}"


def _wait_default() -> bool:
    return os.environ.get("CUTEFORGE_NATIVE_BUILD", "background") == "wait"


def building() -> bool:
    """Whether the extension is being built in the background right now."""
    t = _state.get("thread")
    return isinstance(t, threading.Thread) and t.is_alive()


def load(wait: bool | None = None) -> ModuleType | None:
    """The extension module; None when it is disabled or cannot be built (warned once per
    process), and, unless `wait` (default: CUTEFORGE_NATIVE_BUILD=wait), while it builds
    in the background: the first call on a machine without it starts that build."""
    if "module" in _state:
        return _state["module"]  # type: ignore[return-value]
    if not enabled():
        _state["module"] = None
        return None
    wait = _wait_default() if wait is None else wait
    with _lock:
        if "module" in _state:
            return _state["module"]  # type: ignore[return-value]
        thread = _state.get("thread")
        if thread is None:
            mod = None if wait else _import_now()
            if wait or mod is not None:
                _state["module"] = mod if mod is not None else _settle(stacklevel=4)
                return _state["module"]  # type: ignore[return-value]
            thread = threading.Thread(target=_background, name="cuteforge-native-build", daemon=True)
            _state["thread"] = thread
            thread.start()
            return None
    if wait:
        thread.join()  # type: ignore[union-attr]
    return _state.get("module")  # type: ignore[return-value]


def ready() -> ModuleType | None:
    """The extension where this process has loaded it or it is built, else None; never
    starts or waits for a build (`load` does). After a None it stays None until `load`
    loads the module, so that asking again costs nothing."""
    if "module" in _state:
        return _state["module"]  # type: ignore[return-value]
    if not enabled() or "thread" in _state or "absent" in _state:
        return None
    mod = _import_now()
    with _lock:
        if "module" in _state:
            return _state["module"]  # type: ignore[return-value]
        if mod is None:
            _state["absent"] = True
        else:
            _state["module"] = mod
    return mod


def _settle(stacklevel: int) -> ModuleType | None:
    try:
        return _build_and_load()
    except Exception as e:  # no compiler, headers missing: keep the Python nodes
        warnings.warn(f"cuteforge: the C++ extension could not be built ({type(e).__name__}: "
                      f"{str(e).strip().splitlines()[-1] if str(e).strip() else e}); eager calls use "
                      "Python launches and Python autograd nodes (set CUTEFORGE_NATIVE_AUTOGRAD=0 to silence)",
                      RuntimeWarning, stacklevel=stacklevel)
        return None


def when_ready(hook: Callable[[], Any]) -> None:
    """Call ``hook`` when a background build of the extension finishes with the module
    ready (never, if it is ready, disabled or failed already): the ops forget the Python
    launches they memoized meanwhile, so their next calls make C plans."""
    with _lock:
        if "module" not in _state:
            _state.setdefault("ready_hooks", []).append(hook)  # type: ignore[union-attr]


def _background() -> None:
    t0 = time.perf_counter()
    print("cuteforge: building the C++ extension (eager launch, autograd node) in the background, once per machine "
          "(about 30 s on 16 cores, 90 s on 2); calls use the Python paths until it is ready "
          "(`cuteforge build-native` builds it ahead)", file=sys.stderr, flush=True)
    mod = _settle(stacklevel=2)
    with _lock:
        _state["module"] = mod
        hooks = _state.pop("ready_hooks", []) if mod is not None else []
    for hook in hooks:  # type: ignore[union-attr]
        hook()
    if mod is not None:
        print(f"cuteforge: C++ extension ready ({time.perf_counter() - t0:.0f} s); calls use it from now on", file=sys.stderr, flush=True)


def _import_now() -> ModuleType | None:
    """The built extension if it is there and no build of it is under way, else None at once."""
    try:
        directory = build_dir()
        with FileLock(str(directory) + ".lock", timeout=0, mode=0o600):
            return _import_built(directory)
    except (Timeout, OSError):
        return None


def _so_path(directory: Path) -> Path:
    return directory / f"{module_name()}.so"


def built() -> bool:
    """Whether this machine has the extension built for this (sources, torch, tvm-ffi, Python)."""
    try:
        return _so_path(build_dir()).is_file()
    except OSError:
        return False


def _import_built(directory: Path) -> ModuleType | None:
    """The built extension imported straight from `directory` (no toolchain check), or None
    when it is not there or does not import (then it is rebuilt)."""
    path = _so_path(directory)
    try:
        trust.check_file(path)
    except OSError:
        return None
    name = module_name()
    if name in sys.modules:
        return sys.modules[name]
    try:
        import torch  # noqa: F401  (its libraries first: the extension links against them)

        runtime_libraries.open_tvm_ffi()

        spec = importlib.util.spec_from_file_location(name, path)
        if spec is None or spec.loader is None:
            return None
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
    except (ImportError, OSError) as e:
        log.warning("cuteforge: the built C++ extension %s did not import (%s); rebuilding it", path, e)
        return None
    sys.modules[name] = mod
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
    directory = build_dir()
    lock = FileLock(str(directory) + ".lock", timeout=LOCK_TIMEOUT_S, mode=0o600)
    try:
        lock.acquire()
    except (Timeout, OSError) as e:
        trust.warn_once("native-lock", f"cuteforge: cannot take the C++ extension's build lock {lock.lock_file} ({e}); "
                        "building it in a private temporary directory for this process")
        directory = trust.private_dir(trust.process_temp_dir("native"), directory.name)
        return _build(directory)
    try:
        # Holding the lock, no build of this directory is under way: a built file is whole.
        mod = _import_built(directory)
        if mod is not None:
            return mod
        # torch's own build lock (a `lock` file its FileBaton creates in the build
        # directory and removes when done) outlives a build that was killed; every later
        # build would then wait for it forever. Holding our lock, no other build of this
        # directory runs, so such a file is stale.
        (directory / "lock").unlink(missing_ok=True)
        return _build(directory)
    finally:
        lock.release()


def _build(directory: Path) -> ModuleType:
    # the toolchain only where a build runs: a built extension loads without tvm-ffi's
    # Python package (its import is a new process's largest start-up cost after the DSL's)
    import tvm_ffi.libinfo as ffi_info
    from torch.utils import cpp_extension

    _ninja_on_path()
    libdir = str(Path(ffi_info.find_libtvm_ffi()).parent)
    includes = sorted({*ffi_info.include_paths(), ffi_info.find_dlpack_include_path()})
    if not any(directory.glob("*.so")):
        log.warning("cuteforge: building the C++ extension (autograd node, forward launch) once for this torch (~30 s) in %s", directory)
    mod = cpp_extension.load(
        name=module_name(),
        sources=[str(f) for f in SOURCES],
        extra_include_paths=includes,
        extra_cflags=["-O2"],
        extra_ldflags=[f"-L{libdir}", "-ltvm_ffi", f"-Wl,-rpath,{libdir}"],
        build_directory=str(directory),
        with_cuda=False,
        verbose=False,
    )
    _make_private(directory)
    return mod


def _make_private(directory: Path) -> None:
    """The build's files private whatever the umask: the linker makes the .so per the umask
    (0775 under umask 002), and `_import_built` loads it only when no one else can write it."""
    try:
        with os.scandir(directory) as it:
            for entry in it:
                if entry.is_file(follow_symlinks=False):
                    mode = 0o700 if entry.name.endswith(".so") else entry.stat(follow_symlinks=False).st_mode & 0o700
                    os.chmod(entry.path, mode)
    except OSError as e:  # this process has the module; a later one rebuilds it
        log.warning("cuteforge: could not make the C++ extension in %s private (%s)", directory, e)
