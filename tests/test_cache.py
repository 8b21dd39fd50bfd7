"""The persistent kernel cache: cross-process reuse, fingerprints, concurrency, corruption,
permissions, strict mode. CPU only: kernels compile for sm_90a and load without a GPU."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

HERE = Path(__file__).parent
SRC = HERE.parent / "src"


def run_worker(cache_dir: Path, variant: float = 2.0, env: dict[str, str] | None = None) -> dict:
    e = dict(os.environ, CUTEFORGE_CACHE_DIR=str(cache_dir), CUTEFORGE_ARCH="sm_90a", CUTE_DSL_ARCH="sm_90a")
    e["PYTHONPATH"] = os.pathsep.join([str(SRC), str(HERE), e.get("PYTHONPATH", "")])
    e.update(env or {})
    out = subprocess.run([sys.executable, str(HERE / "cache_worker.py"), str(variant)], env=e, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


UNLINKED = {"CUTEFORGE_LINKED_KERNELS": "0"}


def entries(cache_dir: Path) -> list[Path]:
    return sorted(cache_dir.glob("*/*/*.o"))


def test_second_process_loads_instead_of_compiling(tmp_path: Path) -> None:
    first = run_worker(tmp_path)
    assert first["compiles"] == 1 and first["l2_loads"] == 0 and first["callable"]
    second = run_worker(tmp_path)
    assert second["compiles"] == 0 and second["l2_loads"] == 1 and second["callable"]
    assert len(entries(tmp_path)) == 1


def test_cache_root_is_private(tmp_path: Path) -> None:
    root = tmp_path / "fresh"
    run_worker(root)
    assert (root.stat().st_mode & 0o777) == 0o700


def test_distinct_keys_get_distinct_entries(tmp_path: Path) -> None:
    run_worker(tmp_path, 2.0)
    run_worker(tmp_path, 3.0)
    assert len(entries(tmp_path)) == 2


def test_cache_disabled_compiles_every_process(tmp_path: Path) -> None:
    for _ in range(2):
        r = run_worker(tmp_path, env={"CUTEFORGE_CACHE": "0"})
        assert r["compiles"] == 1 and r["l2_loads"] == 0
    assert entries(tmp_path) == []


def test_eight_processes_compile_once(tmp_path: Path) -> None:
    e = dict(os.environ, CUTEFORGE_CACHE_DIR=str(tmp_path), CUTEFORGE_ARCH="sm_90a", CUTE_DSL_ARCH="sm_90a")
    e["PYTHONPATH"] = os.pathsep.join([str(SRC), str(HERE), e.get("PYTHONPATH", "")])
    procs = [
        subprocess.Popen([sys.executable, str(HERE / "cache_worker.py"), "5.0"], env=e, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for _ in range(8)
    ]
    results = []
    for p in procs:
        out, err = p.communicate(timeout=600)
        assert p.returncode == 0, err[-3000:]
        results.append(json.loads(out.strip().splitlines()[-1]))
    assert sum(r["compiles"] for r in results) == 1
    assert sum(r["l2_loads"] for r in results) == 7
    assert all(r["callable"] and not r["warnings"] for r in results)
    assert len(entries(tmp_path)) == 1
    assert not list(tmp_path.rglob("*.tmp")) and not list(tmp_path.rglob("*.new"))


@pytest.mark.parametrize("damage", ["truncate", "garbage", "delete_meta", "bad_meta", "delete_object"])
def test_damaged_entry_recompiles(tmp_path: Path, damage: str) -> None:
    run_worker(tmp_path)
    (obj,) = entries(tmp_path)
    meta = obj.with_suffix(".json")
    if damage == "truncate":
        obj.write_bytes(obj.read_bytes()[: obj.stat().st_size // 2])
    elif damage == "garbage":
        obj.write_bytes(b"\x7fELF" + os.urandom(4000))
    elif damage == "delete_meta":
        meta.unlink()
    elif damage == "bad_meta":
        meta.write_text("{not json")
    else:
        obj.unlink()
    r = run_worker(tmp_path)
    assert r["callable"] and r["compiles"] == 1
    if damage != "delete_object":
        assert any("corrupt" in w for w in r["warnings"]), r["warnings"]
        assert list((tmp_path / "quarantine").iterdir())
    # and the rewritten entry is good again
    again = run_worker(tmp_path)
    assert again["compiles"] == 0 and again["l2_loads"] == 1, again


def test_entries_are_linked_by_default(tmp_path: Path) -> None:
    first = run_worker(tmp_path)
    (obj,) = entries(tmp_path)
    lib = obj.with_suffix(".so")
    meta = json.loads(obj.with_suffix(".json").read_text())
    assert first["compiles"] == 1 and lib.is_file() and meta["lib_sha256"] == hashlib.sha256(lib.read_bytes()).hexdigest()
    assert lib.stat().st_mode & 0o077 == 0  # private whatever the umask: the loader refuses anything else
    warm = run_worker(tmp_path)
    assert warm["compiles"] == 0 and warm["l2_loads"] == 1 and warm["callable"]
    assert warm["kind"] == "LinkedKernel" and not warm["tvm_ffi"] and not warm["warnings"]


def test_linked_kernels_off(tmp_path: Path) -> None:
    first = run_worker(tmp_path / "off", env=UNLINKED)
    (obj,) = entries(tmp_path / "off")
    assert first["compiles"] == 1 and not obj.with_suffix(".so").exists()
    assert "lib_sha256" not in json.loads(obj.with_suffix(".json").read_text())
    # an entry written with its library loads the object while the switch is off
    run_worker(tmp_path / "on")
    warm = run_worker(tmp_path / "on", env=UNLINKED)
    assert warm["compiles"] == 0 and warm["l2_loads"] == 1 and warm["callable"] and warm["kind"] != "LinkedKernel"


LINKED_CALL = """
import sys, torch
from cuteforge import compiler
lib = sys.argv[1]
fn = compiler.load_shared(lib)
handle = fn.__chandle__()
print(type(fn).__name__, "tvm_ffi" in sys.modules, handle > 0 and fn.__chandle__() == handle)
try:  # CPU tensors: the kernel's own argument check answers, so the call reached it
    fn(torch.ones(4), torch.ones(4))
except ValueError as e:
    print("cuda" in str(e), "tvm_ffi" in sys.modules)
try:  # an argument the extension's call does not pack: tvm_ffi's call
    fn(torch.ones(4), "not a tensor")
except Exception as e:
    print(type(e).__name__, "tvm_ffi" in sys.modules)
print(type(compiler.load_shared(lib)).__name__)  # tvm_ffi imported now: its own Function
"""


def _linked_call(lib: Path, cache_dir: Path) -> list[str]:
    e = dict(os.environ, CUTEFORGE_CACHE_DIR=str(cache_dir),
             PYTHONPATH=os.pathsep.join([str(SRC), os.environ.get("PYTHONPATH", "")]))
    out = subprocess.run([sys.executable, "-c", LINKED_CALL, str(lib)], env=e, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    return out.stdout.split("\n")[:4]


def test_linked_kernel_without_the_extension_calls_through_tvm_ffi(tmp_path: Path) -> None:
    # a cache without the C++ extension built: a Python call imports tvm_ffi (and starts no build)
    run_worker(tmp_path)
    (obj,) = entries(tmp_path)
    lines = _linked_call(obj.with_suffix(".so"), tmp_path)
    assert lines[:2] == ["LinkedKernel False True", "True True"] and lines[3] == "Function", lines
    assert not list((tmp_path / "native").glob("*/*.so"))


def test_linked_kernel_called_from_python_through_the_extension_imports_no_tvm_ffi(tmp_path: Path) -> None:
    from cuteforge.native import build

    mod = build.load(wait=True)
    if mod is None:
        pytest.skip("the C++ extension cannot be built here")
    # a cache of its own holding a copy of the built extension: no other process's build
    # lock on the session's cache can hide it from the call
    built = Path(mod.__file__).parent
    root = tmp_path / "cache"
    (root / "native").mkdir(parents=True, mode=0o700)
    root.chmod(0o700)
    shutil.copytree(built, root / "native" / built.name)
    run_worker(root, variant=17.0)
    (obj,) = [p for p in entries(root) if p.relative_to(root).parts[0] != "native"]  # not the extension's objects
    lines = _linked_call(obj.with_suffix(".so"), root)
    assert lines[:2] == ["LinkedKernel False True", "True False"], lines
    assert lines[2].endswith(" True") and lines[3] == "Function", lines


@pytest.mark.parametrize("damage", ["truncate", "delete", "does_not_open"])
def test_damaged_library_loads_the_object_instead(tmp_path: Path, damage: str) -> None:
    run_worker(tmp_path)
    (obj,) = entries(tmp_path)
    lib, meta_path = obj.with_suffix(".so"), obj.with_suffix(".json")
    if damage == "truncate":
        lib.write_bytes(lib.read_bytes()[:1000])
    elif damage == "delete":
        lib.unlink()
    else:  # its sha256 recorded, but no library (its runtime moved, say)
        lib.write_bytes(b"not a shared library")
        meta = json.loads(meta_path.read_text())
        meta_path.write_text(json.dumps({**meta, "lib_sha256": hashlib.sha256(lib.read_bytes()).hexdigest()}))
    r = run_worker(tmp_path)
    assert r["compiles"] == 0 and r["l2_loads"] == 1 and r["callable"] and r["kind"] != "LinkedKernel", r
    assert not (tmp_path / "quarantine").exists() and not r["warnings"]


@pytest.mark.parametrize("tools", ["none", "failing"])
def test_without_a_working_linker_entries_load_through_the_dsl(tmp_path: Path, tools: str) -> None:
    no_tools = tmp_path / "bin"
    no_tools.mkdir()
    env = {"PATH": str(no_tools), "CC": ""}
    if tools == "failing":  # a C compiler whose link fails
        cc = no_tools / "cc"
        cc.write_text("#!/bin/sh\necho 'ld: cannot link' >&2\nexit 1\n")
        cc.chmod(0o755)
    first = run_worker(tmp_path / "c", env=env)
    assert first["compiles"] == 1 and first["callable"] and not first["warnings"], first["warnings"]
    (obj,) = entries(tmp_path / "c")
    assert not obj.with_suffix(".so").exists() and "lib_sha256" not in json.loads(obj.with_suffix(".json").read_text())
    warm = run_worker(tmp_path / "c")
    assert warm["compiles"] == 0 and warm["l2_loads"] == 1 and warm["callable"] and warm["kind"] != "LinkedKernel"


@pytest.mark.parametrize("cc, level", [(None, "DEBUG"), ("/usr/bin/cc", "WARNING")])
def test_an_entry_without_its_library_is_logged_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                      caplog: pytest.LogCaptureFixture, cc: str | None, level: str) -> None:
    import dataclasses
    import logging

    from cuteforge.cache import kernel_cache as kc
    from cuteforge.cache.key import Entry

    def link(obj: str, lib: str) -> None:
        raise RuntimeError("ld: cannot link")

    monkeypatch.setattr(kc, "_link_noted", set())
    monkeypatch.setattr(kc.compiler, "linker", lambda: cc)
    directory = tmp_path / "entry"
    directory.mkdir(mode=0o700)
    codec = dataclasses.replace(kc._FUNCTIONS, link=link)
    with caplog.at_level(logging.DEBUG, logger="cuteforge"):
        for _ in range(2):
            assert kc.KernelCache._link(Entry.at(directory, "k"), str(directory / "k.o"), codec) is None
    lines = [r for r in caplog.records if "not linked" in r.getMessage()]
    assert len(lines) == 1 and lines[0].levelname == level and "cannot link" in lines[0].getMessage()
    assert not (directory / "k.so").exists()


def test_package_source_hash_is_memoized_by_the_files_stats(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from cuteforge.cache import key

    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "a.py").write_text("x = 1\n")
    (pkg / "sub" / "b.py").write_text("y = 2\n")
    monkeypatch.setattr(key, "PACKAGE_DIR", pkg)
    monkeypatch.setenv("CUTEFORGE_CACHE_DIR", str(tmp_path / "c"))
    memo_file = tmp_path / "c" / "source-hash.json"
    key.source_hash.cache_clear()
    digest = key.package_source_hash.__wrapped__()
    assert digest == key.source_hash((str(pkg / "a.py"), str(pkg / "sub" / "b.py")), str(pkg))
    memo = json.loads(memo_file.read_text())
    assert memo["hash"] == digest
    memo_file.write_text(json.dumps({**memo, "hash": "f" * 64}))  # the same stats: the memo answers
    assert key.package_source_hash.__wrapped__() == "f" * 64
    # an edit of the same size with its mtime put back still changes ctime: hashed again
    st = (pkg / "a.py").stat()
    time.sleep(0.05)  # past the file system clock's tick (a few ms), so the edit's ctime differs
    (pkg / "a.py").write_text("x = 3\n")
    os.utime(pkg / "a.py", ns=(st.st_atime_ns, st.st_mtime_ns))
    key.source_hash.cache_clear()
    edited = key.package_source_hash.__wrapped__()
    assert edited not in (digest, "f" * 64)
    assert json.loads(memo_file.read_text())["hash"] == edited
    key.source_hash.cache_clear()


def test_fingerprint_changes_with_toolchain(monkeypatch: pytest.MonkeyPatch) -> None:
    from cuteforge import cache

    cache.fingerprint.cache_clear()
    base = cache.fingerprint("sm_90a")
    assert cache.fingerprint("sm_100a") != base
    monkeypatch.setattr(cache.key, "toolchain_versions", lambda: (("nvidia-cutlass-dsl", "9.9.9"),))
    cache.fingerprint.cache_clear()
    assert cache.fingerprint("sm_90a") != base
    monkeypatch.setattr(cache.key, "package_source_hash", lambda: "changed")
    cache.fingerprint.cache_clear()
    changed = cache.fingerprint("sm_90a")
    monkeypatch.undo()
    cache.fingerprint.cache_clear()
    assert changed != base and cache.fingerprint("sm_90a") == base


def test_toolchain_lists_the_pinned_dsl() -> None:
    from cuteforge import cache

    names = dict(cache.toolchain_versions())
    assert names.get("nvidia-cutlass-dsl") == "4.8.1"
    assert "apache-tvm-ffi" in names


def test_source_edit_changes_fingerprint_dir(tmp_path: Path) -> None:
    """A user kernel's own source file is part of its cache directory name."""
    mod = tmp_path / "mykern.py"
    src = (HERE / "kernels_for_tests.py").read_text().replace('name="test_scale"', 'name="user_scale"').replace(
        'name="test_sm90_only"', 'name="user_sm90_only"'
    )
    mod.write_text(src)
    code = (
        f"import sys; sys.path.insert(0, {str(tmp_path)!r}); import mykern; from cuteforge.signature import BoundKey;"
        "mykern.scale.get(BoundKey(('float32','float32'), (), (4,4)), (('factor', 2.0),))"
    )
    e = dict(os.environ, CUTEFORGE_CACHE_DIR=str(tmp_path / "c"), CUTEFORGE_ARCH="sm_90a", CUTE_DSL_ARCH="sm_90a")
    e["PYTHONPATH"] = os.pathsep.join([str(SRC), e.get("PYTHONPATH", "")])
    subprocess.run([sys.executable, "-c", code], env=e, check=True, timeout=300)
    mod.write_text(src.replace("scale_jit(128,", "scale_jit(256,"))
    subprocess.run([sys.executable, "-c", code], env=e, check=True, timeout=300)
    dirs = {p.parent.name for p in (tmp_path / "c").glob("*/*/*.o")}
    assert len(dirs) == 2 and all(d.startswith("user_scale-") for d in dirs)


def test_foreign_writable_root_is_refused(tmp_path: Path) -> None:
    root = tmp_path / "shared"
    root.mkdir()
    os.chmod(root, 0o777)
    r = run_worker(root)
    assert r["callable"] and r["compiles"] == 1
    assert any("not using the kernel cache" in w for w in r["warnings"])
    assert entries(root) == []


def test_strict_mode_raises_after_warmup(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import kernels_for_tests as kt

    from cuteforge import CompileAfterWarmupError, cache
    from cuteforge.signature import BoundKey

    monkeypatch.setenv("CUTEFORGE_CACHE_DIR", str(tmp_path))
    key = BoundKey(("float32", "float32"), (), (4, 4))
    kt.scale.get(key, (("factor", 7.0),))  # warm-up
    cache.end_warmup(strict=True)
    try:
        kt.scale.get(key, (("factor", 7.0),))  # L1 hit: fine
        with pytest.raises(CompileAfterWarmupError, match="test_scale"):
            kt.scale.get(key, (("factor", 8.0),))
    finally:
        cache.reset_warmup()


def test_stats_are_saved_for_the_cli(tmp_path: Path) -> None:
    run_worker(tmp_path)
    run_worker(tmp_path)
    stats = json.loads((tmp_path / "stats.json").read_text())
    assert stats["compiles"] == 1 and stats["l2_loads"] == 1


def test_toolchain_versions_from_dist_info_names_match_the_metadata() -> None:
    """The fingerprint's toolchain part, read from dist-info directory names, is what
    parsing every installed distribution's metadata finds."""
    from cuteforge.cache import key

    found = key.toolchain_versions.__wrapped__()
    assert found == key._toolchain_from_metadata()
    assert any(name == "nvidia-cutlass-dsl" for name, _ in found)
