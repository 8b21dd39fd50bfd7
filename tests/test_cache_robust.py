"""The cache's own maintenance survives what it finds on disk: `clear` deletes only the files
cuteforge writes (never a mistaken root's other contents, never under a refused root),
`ls` / `stats` skip damaged metadata, numbers too large for a float are ignored, and the
built C++ extension is private under any umask."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from trust_stand_in import ARCH, KERNEL, get

from cuteforge import cache, trust
from cuteforge.autotune import store as tune_store
from cuteforge.native import build
from cuteforge.templates import codecache

pytestmark = pytest.mark.usefixtures("fresh_warnings")  # conftest.py

SRC = Path(__file__).resolve().parent.parent / "src"
HUGE = int("9" * 400)  # a JSON number no float can hold


def cli(*args: str, cache_dir: Path) -> subprocess.CompletedProcess:
    env = dict(os.environ, CUTEFORGE_CACHE_DIR=str(cache_dir), PYTHONPATH=os.pathsep.join([str(SRC), os.environ.get("PYTHONPATH", "")]))
    return subprocess.run([sys.executable, "-m", "cuteforge", *args], env=env, capture_output=True, text=True, timeout=300)


def _home(d: Path) -> set[str]:
    """A directory that is no cache: what a mistaken CUTEFORGE_CACHE_DIR=$HOME points at."""
    (d / ".ssh").mkdir(parents=True)
    (d / ".ssh" / "id").write_text("key")
    (d / "todo.txt").write_text("notes")
    (d / "projects" / "thesis").mkdir(parents=True)
    (d / "0123456789abcdef").mkdir()  # a fingerprint's name, not its layout
    (d / "0123456789abcdef" / "readme.txt").write_text("x")
    return _tree(d)


def _tree(d: Path) -> set[str]:
    return {str(p.relative_to(d)) for p in d.rglob("*")}


# --- cache clear -----------------------------------------------------------------------------


def _populate(root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every kind of file cuteforge writes under a root, written by the code that writes it."""
    monkeypatch.setenv("CUTEFORGE_LOG", "artifacts")
    assert get(f"key-{uuid.uuid4()}", ptx="// ptx")[1] == 1  # entry, lock, linked library, artifacts
    monkeypatch.delenv("CUTEFORGE_LOG")
    r = trust.check_root(root)
    _, src = codecache.write("x = 1\n")
    codecache.write_meta(src, {"kernel": "t"})
    codecache.write("y = 2\n", prefix="v")
    entry = cache.entry_for(r, kernel=KERNEL, key_repr="quarantined", arch=ARCH)
    trust.private_dir(r, *entry.obj.parent.relative_to(r).parts)
    entry.obj.write_bytes(b"damaged")
    with pytest.warns(UserWarning, match="quarantined"):
        cache.DEFAULT_CACHE._quarantine(r, entry, "a test")
    d = build.build_dir()
    (d / f"{build.module_name()}.so").write_bytes(b"\x7fELF")
    (d / "build.ninja").write_text("")
    Path(str(d) + ".lock").touch()
    ident = {"fingerprint": cache.fingerprint(ARCH), "kernel": KERNEL, "schema": tune_store.SCHEMA}
    rec = {"identity": ident, "times_ms": {"Cfg()": 1.0}, "best_config": {}, "errors": {}}
    assert tune_store.TuneStore().put(json.dumps(rec).encode()) is not None
    monkeypatch.setattr(cache.store, "STATS", cache.CacheStats(compiles=1))
    cache._save_stats()
    trust.atomic_write(r / "source-hash.json", "{}")
    (r / ".stats.json.abc123.tmp").touch()  # an atomic write a killed process left


def test_clear_removes_every_file_cuteforge_writes(root: Path, monkeypatch: pytest.MonkeyPatch,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    _populate(root, monkeypatch)
    names = {p.name for p in root.iterdir()}
    assert {"autotune", "native", "src", "quarantine", "artifacts", "stats.json", "source-hash.json"} <= names
    assert cache.clear() == 1
    assert list(root.iterdir()) == [] and capsys.readouterr().err == ""


def test_clear_leaves_what_cuteforge_did_not_write(root: Path, monkeypatch: pytest.MonkeyPatch,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    _populate(root, monkeypatch)
    ours = _tree(root)
    theirs = _home(root) - ours
    elsewhere = root.parent / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "keep").write_text("x")
    (root / "linked2").symlink_to(elsewhere)
    assert cache.clear() == 1
    assert _tree(root) == theirs | {"linked2"} and (elsewhere / "keep").exists()
    err = capsys.readouterr().err
    assert "left 5 files or directories" in err and ".ssh" in err and "todo.txt" in err


def test_clear_of_a_directory_that_is_no_cache_deletes_nothing(root: Path) -> None:
    root.mkdir(mode=0o700)
    (root / "src").mkdir()
    (root / "src" / "main.c").write_text("int main() {}")  # a name cuteforge uses, other contents
    before = _home(root)
    with pytest.raises(ValueError, match="does not look like a cuteforge cache"):
        cache.clear()
    assert _tree(root) == before


def test_clear_refuses_a_root_the_cache_refuses(root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _populate(root, monkeypatch)
    before = _tree(root)
    os.chmod(root, 0o777)
    try:
        with pytest.raises(trust.UntrustedPath):
            cache.clear()
        assert _tree(root) == before
    finally:
        os.chmod(root, 0o700)


def test_clear_of_no_root_or_an_empty_one_removes_nothing(root: Path) -> None:
    assert cache.clear() == 0 and not root.exists()
    root.mkdir(mode=0o700)
    assert cache.clear() == 0


def test_cli_clear_of_a_home_directory(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir(mode=0o700)
    before = _home(home)
    r = cli("cache", "clear", "--yes", cache_dir=home)
    assert r.returncode == 2 and "does not look like a cuteforge cache" in r.stderr and "Traceback" not in r.stderr
    assert _tree(home) == before


# --- cache ls / stats --------------------------------------------------------------------------


def test_ls_and_stats_skip_damaged_metadata(root: Path) -> None:
    d = root / "abc" / "k"
    d.mkdir(parents=True)
    (d / "list.json").write_text("[]")
    (d / "word.json").write_text('{"created": "yesterday", "kernel": ["x"]}')
    (d / "huge.json").write_text(json.dumps({"created": HUGE, "kernel": "k"}))
    (d / "nan.json").write_text('{"created": NaN, "kernel": "k"}')
    (d / "good.json").write_text('{"created": 5.0, "kernel": "k", "arch": "sm_90a", "key": "x"}')
    rows = cache.list_entries()
    assert len(rows) == 4 and rows[0]["created"] == 5.0 and {r["created"] for r in rows[1:]} == {0}
    assert {r["kernel"] for r in rows} == {"k", None}
    for action in ("ls", "stats"):
        r = cli("cache", action, cache_dir=root)
        assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr


# --- numbers too large for a float ---------------------------------------------------------------


def test_a_huge_number_in_stats_counts_as_zero(root: Path) -> None:
    r = trust.check_root(root)
    trust.atomic_write(r / "stats.json", json.dumps({"compiles": HUGE, "l1_hits": 3}))
    stats = cache.cumulative_stats()
    assert stats["compiles"] == 0 and stats["l1_hits"] == 3


def test_a_huge_number_in_a_tuning_record_is_no_record(root: Path) -> None:
    ident = {"fingerprint": "0123456789abcdef", "kernel": KERNEL, "schema": tune_store.SCHEMA}
    rec = {"identity": ident, "times_ms": {"Cfg()": HUGE}, "best_config": {}, "errors": {}}
    assert not tune_store._valid_record(rec, ident)
    with pytest.raises(ValueError, match="not a tuning record"):
        tune_store.TuneStore(root / "ts").put(json.dumps(rec).encode())


# --- the C++ extension under a permissive umask ----------------------------------------------------


def test_the_built_extension_is_private_under_umask_002(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from torch.utils import cpp_extension

    directory = tmp_path / "native"
    directory.mkdir(mode=0o700)
    module = object()

    def fake_load(**kw: object) -> object:  # what the linker leaves under umask 002
        so = build._so_path(Path(str(kw["build_directory"])))
        so.write_bytes(b"\x7fELF")
        os.chmod(so, 0o775)
        (so.parent / "build.ninja").write_text("")
        os.chmod(so.parent / "build.ninja", 0o664)
        return module

    monkeypatch.setattr(cpp_extension, "load", fake_load)
    assert build._build(directory) is module
    so = build._so_path(directory)
    trust.check_file(so)  # what _import_built asks of it in the next process
    assert so.stat().st_mode & 0o777 == 0o700 and (directory / "build.ninja").stat().st_mode & 0o777 == 0o600
