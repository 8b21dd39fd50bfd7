"""A shared library linked against another environment's libtvm_ffi (a cache shared
between virtual environments) runs on this environment's copy once
`runtime_libraries.open_tvm_ffi` has opened it: one libtvm_ffi in the process, so one
error slot and one launch stream."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from cuteforge import runtime_libraries
from cuteforge.native import build

pytestmark = pytest.mark.skipif(shutil.which("cc") is None or runtime_libraries.tvm_ffi_library() is None,
                                reason="needs a C compiler and tvm-ffi's library")

CHILD = """
import ctypes, os, sys
from cuteforge import runtime_libraries
if sys.argv[2] == "open":
    runtime_libraries.open_tvm_ffi()
ctypes.CDLL(sys.argv[1], mode=os.RTLD_NOW | os.RTLD_LOCAL)
maps = open("/proc/self/maps").read().split()
print(sorted({os.path.realpath(w) for w in maps if w.endswith("libtvm_ffi.so")}))
"""


@pytest.fixture(scope="module")
def foreign_library(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A library whose rpath names a copy of libtvm_ffi in another directory."""
    base = tmp_path_factory.mktemp("other-env")
    (base / "lib").mkdir()
    shutil.copy(runtime_libraries.tvm_ffi_library(), base / "lib" / "libtvm_ffi.so")
    (base / "k.c").write_text("int TVMFFIErrorSetRaisedFromCStr(const char*, const char*);\n"
                              "int k(void) { return TVMFFIErrorSetRaisedFromCStr(\"ValueError\", \"no\"), 0; }\n")
    lib = base / "libk.so"
    subprocess.run(["cc", "-shared", "-fPIC", "-o", lib, base / "k.c", f"-L{base / 'lib'}", "-ltvm_ffi",
                    f"-Wl,-rpath,{base / 'lib'}"], check=True, capture_output=True)
    return lib


def _loaded(lib: Path, mode: str) -> str:
    done = subprocess.run([sys.executable, "-c", CHILD, str(lib), mode], capture_output=True, text=True, check=True)
    return done.stdout.strip()


def test_a_foreign_rpath_gets_this_environments_libtvm_ffi(foreign_library: Path) -> None:
    assert _loaded(foreign_library, "open") == str([str(runtime_libraries.tvm_ffi_library())])


def test_without_it_the_rpath_loads_the_other_copy(foreign_library: Path) -> None:
    # what the opening prevents: the foreign copy, which tvm-ffi's import would then double
    assert _loaded(foreign_library, "plain") == str([str(foreign_library.parent / "lib" / "libtvm_ffi.so")])


def test_the_extensions_build_tag_names_the_libtvm_ffi_it_links(monkeypatch: pytest.MonkeyPatch) -> None:
    tag = build.build_tag()
    try:
        monkeypatch.setattr(runtime_libraries, "tvm_ffi_library", lambda: Path("/elsewhere/libtvm_ffi.so"))
        build._build_tag.cache_clear()
        assert build.build_tag() != tag
    finally:
        monkeypatch.undo()
        build._build_tag.cache_clear()
    assert build.build_tag() == tag


def test_kernel_dependencies_are_the_ones_the_dsl_names() -> None:
    from cuteforge.compiler import prepare_dsl

    prepare_dsl()
    import cutlass.cute as cute

    found = runtime_libraries.kernel_dependencies()
    assert found is not None
    assert found == [os.path.realpath(p) for p in cute.runtime.find_runtime_libraries(enable_tvm_ffi=True)]
