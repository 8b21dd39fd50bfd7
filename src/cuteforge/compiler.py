"""The one place that talks to `cute.compile`, `export_to_c` and `load_module`.

Compiles run one at a time per process: the DSL's preprocessor is not thread-safe, so
parallel compilation uses processes (see the autotuner), never threads.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import shutil
import subprocess
import tempfile
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from . import runtime_libraries
from .arch import target_arch

COMPILE_LOCK = threading.RLock()
ENTRY = "cuteforge_entry"  # exported symbol name inside every cached object file


def prepare_dsl(arch: str | None = None) -> None:
    """Point the DSL at the target arch before it is first imported or queried.

    On a machine with no GPU the DSL cannot detect an arch; CUTE_DSL_ARCH makes it
    compile for ours. An explicit CUTE_DSL_ARCH set by the user is left alone.
    """
    os.environ.setdefault("CUTE_DSL_ARCH", arch or target_arch())


@dataclass
class CompileResult:
    compiled: Any  # the DSL's JitCompiledFunction
    function: Callable[..., Any]  # its TVM-FFI function: the fast call path
    ptx: str | None
    cubin: bytes | None


@contextlib.contextmanager
def artifact_options(keep: bool) -> Iterator[str]:
    """The `cute.compile` options that keep a compile's PTX and cubin (empty without
    ``keep``), in a temporary directory of this compile's own, removed on exit. The DSL
    names these files after the kernel function and its argument types, not its
    compile-time config, and by default writes them into the directory the process started
    in: two configs compiled there by two processes (the compile pool, parallel test runs)
    would overwrite each other's files and read back the other's kernel. Read the
    artifacts (`__ptx__`, `__cubin__`) inside the block."""
    if not keep:
        yield ""
        return
    dump = tempfile.mkdtemp(prefix="cuteforge-artifacts-")
    try:
        yield f" --keep-ptx --keep-cubin --dump-dir {shlex.quote(dump)}"  # the DSL shlex-splits options
    finally:
        shutil.rmtree(dump, ignore_errors=True)


def compile_jit(jit_fn: Any, args: list[Any], arch: str, keep_artifacts: bool = False) -> CompileResult:
    """cute.compile a `@cute.jit` function against fake arguments, TVM-FFI enabled.

    `args` are the fake tensors; the environment stream is appended here so every
    kernel launches on torch's current stream. ``keep_artifacts``: also the PTX and cubin
    (`artifact_options`).
    """
    prepare_dsl(arch)
    import cutlass.cute as cute

    stream = cute.runtime.make_fake_stream(use_tvm_ffi_env_stream=True)
    with artifact_options(keep_artifacts) as keep:
        with COMPILE_LOCK:
            compiled = cute.compile(jit_fn, *args, stream, options=f"--enable-tvm-ffi --gpu-arch {arch}{keep}")
        ptx = getattr(compiled, "__ptx__", None) if keep_artifacts else None
        cubin = getattr(compiled, "__cubin__", None) if keep_artifacts else None
    return CompileResult(compiled, compiled.__tvm_ffi_object__(), ptx, cubin)


def export_object(compiled: Any, path: str) -> None:
    """Write the compiled function as a TVM-FFI object file (no GPU needed)."""
    with COMPILE_LOCK:
        compiled.export_to_c(path, function_name=ENTRY)


def load_object(path: str) -> Callable[..., Any]:
    """Load an object file written by `export_object`; returns the TVM-FFI function.

    The DSL links the object in memory (its JIT linker, after loading its runtime
    libraries): tens of milliseconds. `load_shared` is the fast path for cached kernels."""
    prepare_dsl()
    import cutlass.cute as cute

    return cute.runtime.load_module(path, enable_tvm_ffi=True)[ENTRY]


def linker() -> str | None:
    """The C compiler driver that links objects into shared libraries (CC, else cc, gcc,
    c++ on PATH), or None where the machine has none."""
    for name in (os.environ.get("CC"), "cc", "gcc", "c++"):
        found = shutil.which(name) if name else None
        if found:
            return found
    return None


LINK_RECIPE = "2"  # raise when link_shared's command changes: bundles' libraries are named by it
LINK_TIMEOUT_S = 300  # a link takes well under a second: a hung linker must not hang a kernel's first call


def link_shared(object_path: str, library_path: str) -> None:
    """Link an object written by `export_object` into a shared library for `load_shared`:
    the DSL's runtime and tvm-ffi as its dependencies, found through an rpath, so opening
    it is one dlopen. Needs a C compiler (raises RuntimeError without one or when the link
    fails); imports the DSL only where its runtime library is not found without it."""
    cc = linker()
    if cc is None:
        raise RuntimeError("no C compiler (cc, gcc or c++ on PATH, or CC) to link kernels with")
    libs = runtime_libraries.kernel_dependencies()
    if libs is None:
        prepare_dsl()
        import cutlass.cute as cute

        libs = cute.runtime.find_runtime_libraries(enable_tvm_ffi=True)
    argv = [cc, "-shared", "-o", library_path, object_path,
            # every kernel library defines the same internal symbol names: bind each to its own
            "-Wl,-Bsymbolic"]
    for lib in libs:
        d = os.path.dirname(lib)
        # -Xlinker passes the directory as one argument, commas and all (-Wl, would split it)
        argv += [f"-L{d}", f"-l:{os.path.basename(lib)}", "-Xlinker", "-rpath", "-Xlinker", d]
    try:
        done = subprocess.run(argv, capture_output=True, text=True, check=False, timeout=LINK_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        raise RuntimeError(f"linking {object_path} took over {LINK_TIMEOUT_S} s; stopped") from None
    if done.returncode != 0:
        raise RuntimeError(f"linking {object_path} failed ({done.returncode}): {done.stderr.strip()[-500:]}")


def load_shared(path: str) -> Callable[..., Any]:
    """Open a shared library written by `link_shared`; returns its TVM-FFI function
    (`kernel_library.open_function`). No DSL, no JIT linking, no tvm-ffi import: a dlopen
    and a symbol lookup."""
    from .kernel_library import open_function

    return open_function(path, ENTRY)


def sass(cubin: bytes) -> str:
    """SASS for cubin bytes (see `disassemble`)."""
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        return disassemble(f.name)


def _wheel_nvdisasm() -> str | None:
    """nvdisasm from the `nvidia-cuda-nvdisasm` wheel (pip puts it under the `nvidia`
    namespace package: `cu13/bin`, or `cuda_nvdisasm/bin` in the CUDA 12 wheels), which
    brings SASS to a machine without the CUDA toolkit."""
    try:
        import nvidia  # namespace package of NVIDIA's CUDA wheels
    except ImportError:
        return None
    for base in getattr(nvidia, "__path__", []):
        for sub in ("cu13", "cuda_nvdisasm"):
            exe = os.path.join(base, sub, "bin", "nvdisasm")
            if os.access(exe, os.X_OK):
                return exe
    return None


def disassemble(cubin_path: str) -> str:
    """SASS for a cubin, through nvdisasm (on PATH or from the nvidia-cuda-nvdisasm wheel)
    or cuobjdump, where the machine has one."""
    tools = ((shutil.which("nvdisasm") or _wheel_nvdisasm(), ["-c"]), (shutil.which("cuobjdump"), ["-sass"]))
    for exe, argv in tools:
        if exe:
            out = subprocess.run([exe, *argv, cubin_path], capture_output=True, text=True, check=False)
            if out.returncode == 0:
                return out.stdout
    raise RuntimeError("SASS needs nvdisasm or cuobjdump (CUDA toolkit on PATH, or `pip install "
                       "nvidia-cuda-nvdisasm`); PTX and CUBIN are kept")


def compile_only(kern: Any, *tensors: Any, arch: str = "sm_90a", config: Any = None, **params: Any) -> str:
    """Compile `kern` (a `@cuteforge.kernel`) for `arch` without a GPU and return the cache
    entry's path. `tensors` give dtypes, shapes and strides only: CPU or "meta" tensors do;
    the key is the one a call with freshly allocated CUDA tensors of that layout looks up, so
    such a call later on an `arch` GPU loads this object instead of compiling."""
    key = kern.signature.fresh_key(tensors)
    spec = kern.spec(key, kern.key_params(sorted(params.items())), config, arch=arch)
    prepare_dsl(arch)
    kern.compile(spec)
    return str(kern.cache_entry(spec))
