"""What cuteforge trusts on disk: refused roots, planted files, links, misplaced entries.

Stand-in compiles (`CompileResult` holding bytes, through `KernelCache.get_bytes`) keep
these tests fast: the cache's protocol is the same for every codec. Another user is
simulated with `os.chown` to `nobody`, which needs root (skipped otherwise).
"""

from __future__ import annotations

import importlib.util
import json
import marshal
import os
import shutil
import sys
from pathlib import Path

import pytest
from trust_stand_in import ARCH, IS_ROOT, KERNEL, get

from cuteforge import cache, trust
from cuteforge.cache import entry_for

pytestmark = pytest.mark.usefixtures("fresh_warnings")  # conftest.py


@pytest.fixture
def refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A cache root others can write (as an attacker's would be)."""
    r = tmp_path / "shared"
    r.mkdir()
    os.chmod(r, 0o777)
    monkeypatch.setenv("CUTEFORGE_CACHE_DIR", str(r))
    return r



def entry(r: Path, key: str) -> cache.Entry:
    return entry_for(trust.check_root(r), kernel=KERNEL, key_repr=key, arch=ARCH)


# --- kernel cache entries ---------------------------------------------------------------


def test_entry_written_for_another_key_is_not_served(root: Path) -> None:
    assert get("key-a")[:2] == (b"key-a", 1) and get("key-b")[:2] == (b"key-b", 1)
    a, b = entry(root, "key-a"), entry(root, "key-b")
    shutil.copyfile(a.obj, b.obj)
    shutil.copyfile(a.meta, b.meta)
    out, compiles, warned = get("key-b")
    assert out == b"key-b" and compiles == 1
    assert any("another key" in w for w in warned), warned
    assert get("key-b")[:2] == (b"key-b", 0)  # rewritten, then served from disk


def test_linked_entry_is_quarantined(root: Path) -> None:
    get("key-a")
    get("key-b")
    a, b = entry(root, "key-a"), entry(root, "key-b")
    b.obj.unlink()
    b.obj.symlink_to(a.obj)
    meta = json.loads(b.meta.read_text())
    b.meta.write_text(json.dumps({**meta, "sha256": json.loads(a.meta.read_text())["sha256"]}))
    out, compiles, warned = get("key-b")
    assert out == b"key-b" and compiles == 1 and any("symbolic link" in w for w in warned), warned
    assert not b.obj.is_symlink() and any((root / "quarantine").iterdir())


def test_linked_directory_below_the_root_is_not_followed(root: Path, tmp_path: Path) -> None:
    get("key-a")
    kdir = entry(root, "key-a").obj.parent
    elsewhere = tmp_path / "elsewhere"
    kdir.rename(elsewhere)
    kdir.symlink_to(elsewhere)  # a valid entry, reached through a link
    out, compiles, warned = get("key-a")
    assert out == b"key-a" and compiles == 1 and any("symbolic link" in w for w in warned), warned


def test_entry_others_can_write_is_quarantined(root: Path) -> None:
    get("key-a")
    os.chmod(entry(root, "key-a").obj, 0o666)
    out, compiles, warned = get("key-a")
    assert compiles == 1 and any("others can write" in w for w in warned), warned


@pytest.mark.skipif(not IS_ROOT, reason="chown to another user needs root")
def test_entry_of_another_user_is_quarantined(root: Path) -> None:
    import pwd

    get("key-a")
    os.chown(entry(root, "key-a").meta, pwd.getpwnam("nobody").pw_uid, -1)
    out, compiles, warned = get("key-a")
    assert compiles == 1 and any("owned by uid" in w for w in warned), warned


@pytest.mark.skipif(not IS_ROOT, reason="chown to another user needs root")
def test_root_of_another_user_is_refused(root: Path) -> None:
    import pwd

    get("key-a")
    os.chown(root, pwd.getpwnam("nobody").pw_uid, -1)
    out, compiles, warned = get("key-a")
    assert compiles == 1 and sum("not using the kernel cache" in w for w in warned) == 1


def test_refused_root_warns_once_and_writes_nothing(refused: Path) -> None:
    _, c1, w1 = get("key-a")
    _, c2, w2 = get("key-b")
    assert (c1, c2) == (1, 1) and len(w1) == 1 and not w2 and "CUTEFORGE_CACHE_DIR" in w1[0]
    assert not any(refused.iterdir())


# --- artifacts and stats -------------------------------------------------------------------


def test_artifact_dump_replaces_a_planted_link(root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CUTEFORGE_LOG", "artifacts")
    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    stem = trust.private_dir(root, "artifacts", KERNEL) / cache.key_hash("key-a")
    stem.with_suffix(".ptx").symlink_to(victim)
    get("key-a", ptx="// ptx")
    assert victim.read_text() == "precious"
    assert stem.with_suffix(".ptx").read_text() == "// ptx" and not stem.with_suffix(".ptx").is_symlink()


def test_artifacts_and_stats_stay_out_of_a_refused_root(refused: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CUTEFORGE_LOG", "artifacts")
    get("key-a", ptx="// ptx")
    monkeypatch.setattr(cache.store, "STATS", cache.CacheStats(compiles=1))  # the counters _save_stats saves
    cache._save_stats()
    assert not any(refused.iterdir())


# --- tuning records ------------------------------------------------------------------------


def _record_setup(store_root: Path):
    from cuteforge.autotune import TuneStore, make_problem
    from cuteforge.kernels.reduce.row import RowReduceConfig
    from cuteforge.kernels.reduce.spec import row_reduce
    from cuteforge.signature import BoundKey

    key = BoundKey(("float32", "float32"), (("N", 4096),), (4, 4))
    params = (("op", "sum"),)
    problem = make_problem(row_reduce, key, params, {"M": 1024}, ARCH)
    st = TuneStore(store_root)
    good = RowReduceConfig(512, 512, 2)
    return row_reduce, key, params, problem, st, good


def test_record_naming_an_unregistered_type_is_never_imported(tmp_path: Path) -> None:
    from cuteforge.autotune import lookup

    row_reduce, key, params, problem, st, good = _record_setup(tmp_path / "tune")
    path = st.save(row_reduce, problem, {good: 0.1}, {}, good)
    marker = tmp_path / "ran"
    rec = json.loads(path.read_text())
    rec["best_config"] = {"type": "os:system", "fields": {"command": f"touch {marker}"}}
    path.write_text(json.dumps(rec))
    with pytest.warns(RuntimeWarning, match="not a registered config class"):
        assert lookup(row_reduce, key, params, {"M": 1024}, arch=ARCH, store=st) is None
    assert not marker.exists()


def test_record_with_ill_typed_fields_is_ignored(tmp_path: Path) -> None:
    from cuteforge.autotune import lookup

    row_reduce, key, params, problem, st, good = _record_setup(tmp_path / "tune")
    path = st.save(row_reduce, problem, {good: 0.1}, {}, good)
    rec = json.loads(path.read_text())
    assert lookup(row_reduce, key, params, {"M": 1024}, arch=ARCH, store=st) == good
    rec["best_config"]["fields"]["threads"] = {"nested": "dict"}
    path.write_text(json.dumps(rec))
    with pytest.warns(RuntimeWarning, match="ignoring a stored config"):
        assert lookup(row_reduce, key, params, {"M": 1024}, arch=ARCH, store=st) is None


def test_refused_root_tuning_records_are_neither_read_nor_written(root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from cuteforge.autotune import TuneStore, lookup

    row_reduce, key, params, problem, _, good = _record_setup(root / "autotune")
    assert TuneStore().save(row_reduce, problem, {good: 0.1}, {}, good) is not None
    assert lookup(row_reduce, key, params, {"M": 1024}, arch=ARCH) == good
    os.chmod(root, 0o777)  # now anyone could have planted that record
    TuneStore._kept.clear()
    with pytest.warns(RuntimeWarning, match="not using the kernel cache"):
        assert lookup(row_reduce, key, params, {"M": 1024}, arch=ARCH) is None
    before = sorted(root.rglob("*"))
    with pytest.warns(RuntimeWarning, match="could not store"):
        assert TuneStore().save(row_reduce, problem, {good: 0.2}, {}, good) is None
    assert sorted(root.rglob("*")) == before


def test_linked_tuning_record_is_not_read(tmp_path: Path) -> None:
    row_reduce, key, params, problem, st, good = _record_setup(tmp_path / "tune")
    path = st.save(row_reduce, problem, {good: 0.1}, {}, good)
    elsewhere = tmp_path / "planted.json"
    path.rename(elsewhere)
    path.symlink_to(elsewhere)
    assert st.load(row_reduce, problem) is None


# --- rendered template sources -------------------------------------------------------------

BENIGN = "VALUE = 'benign'\n"


def test_altered_template_source_is_not_executed(root: Path, tmp_path: Path) -> None:
    from cuteforge.templates import codecache

    text = BENIGN + f"# {tmp_path}\n"
    h, path = codecache.write(text)
    marker = tmp_path / "ran"
    path.write_text(f"import pathlib\npathlib.Path({str(marker)!r}).touch()\nVALUE = 'planted'\n")
    with pytest.raises(ImportError, match="does not match"):
        codecache.load(h)
    assert not marker.exists()
    assert codecache.write(text)[1] == path and codecache.load(h).VALUE == "benign"  # rewritten


def test_planted_bytecode_is_never_read(root: Path, tmp_path: Path) -> None:
    from cuteforge.templates import codecache

    text = BENIGN + f"# bytecode {tmp_path}\n"
    h, path = codecache.write(text)
    st = path.stat()
    planted = compile("VALUE = 'planted'\n", str(path), "exec")
    pyc = Path(importlib.util.cache_from_source(str(path)))
    pyc.parent.mkdir(exist_ok=True)
    # a valid timestamp pyc for the real source: the import system would run it
    header = importlib.util.MAGIC_NUMBER + (0).to_bytes(4, "little")
    header += int(st.st_mtime).to_bytes(4, "little") + (st.st_size & 0xFFFFFFFF).to_bytes(4, "little")
    pyc.write_bytes(header + marshal.dumps(planted))
    assert codecache.load(h).VALUE == "benign"
    assert sys.modules[codecache.module_name(h)].VALUE == "benign"


def test_refused_root_templates_render_into_a_private_directory(refused: Path, tmp_path: Path) -> None:
    from cuteforge.templates import codecache

    text = BENIGN + f"# refused {tmp_path}\n"
    h = codecache.digest(text)
    marker = tmp_path / "ran"
    (refused / "src").mkdir()
    (refused / "src" / f"{h}.py").write_text(f"import pathlib\npathlib.Path({str(marker)!r}).touch()\n")
    with pytest.warns(RuntimeWarning, match="not using the kernel cache"):
        _, path = codecache.write(text)
    assert not path.is_relative_to(refused) and (path.parent.stat().st_mode & 0o777) == 0o700
    assert codecache.load(h).VALUE == "benign" and not marker.exists()


# --- the C++ extension's build directory ---------------------------------------------------


def test_native_build_dir_is_never_under_a_refused_root(refused: Path) -> None:
    from cuteforge.native import build

    with pytest.warns(RuntimeWarning, match="not using the kernel cache"):
        d = build.build_dir()
    assert not d.is_relative_to(refused) and (d.stat().st_mode & 0o777) == 0o700


def test_native_build_dir_behind_a_link_is_refused(root: Path, tmp_path: Path) -> None:
    from cuteforge.native import build

    trust.check_root(root)
    planted = tmp_path / "planted"
    planted.mkdir(mode=0o700)
    (root / "native").symlink_to(planted)
    with pytest.warns(RuntimeWarning, match="symbolic link"):
        d = build.build_dir()
    assert not d.is_relative_to(root) and not d.is_relative_to(planted)


def test_native_build_dir_under_a_private_root(root: Path) -> None:
    from cuteforge.native import build

    assert build.build_dir().parent == trust.check_root(root) / "native"


# --- trust helper ----------------------------------------------------------------------------


def test_private_dir_rejects_path_tricks(root: Path) -> None:
    for bad in ("..", "a/b", "", "."):
        with pytest.raises(ValueError):
            trust.private_dir(root, bad)


def test_root_in_a_directory_others_can_rename_it_from_is_refused(tmp_path: Path) -> None:
    parent = tmp_path / "open"
    parent.mkdir()
    os.chmod(parent, 0o777)
    with pytest.raises(trust.UntrustedPath, match="rename"):
        trust.check_root(parent / "cache")
    os.chmod(parent, 0o1777)  # sticky, as /tmp: others cannot rename what is ours
    assert trust.check_root(parent / "cache").is_dir()
