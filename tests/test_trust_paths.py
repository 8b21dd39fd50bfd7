"""Paths to what cuteforge loads: every directory above a cache root, links on the way to
it, the process's temporary directories and the private copies of bundle objects in them,
bundle pins, and files that are not regular files. Another user is simulated with
`os.chown` to `nobody` (uid 65534), which needs root (skipped otherwise)."""

from __future__ import annotations

import hashlib
import json
import os
import threading
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from trust_stand_in import IS_ROOT

from cuteforge import bundle, trust

NOBODY = 65534
needs_root = pytest.mark.skipif(not IS_ROOT, reason="chown to another user needs root")


@pytest.fixture(autouse=True)
def fresh_state(fresh_warnings: None, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(trust, "_temp_dirs", {})
    monkeypatch.delenv(bundle.ENV, raising=False)
    bundle.clear_bundles()


# --- every ancestor of the cache root ----------------------------------------------------


def test_root_below_an_ancestor_others_can_write_is_refused(tmp_path: Path) -> None:
    top = tmp_path / "project"
    (top / "team").mkdir(parents=True)
    os.chmod(top, 0o770)  # group-writable, not sticky: the group could swap team/ for its own
    with pytest.raises(trust.UntrustedPath, match=f"rename.*{top} is writable"):
        trust.check_root(top / "team" / "cache")
    os.chmod(top, 0o757)
    with pytest.raises(trust.UntrustedPath, match="rename"):
        trust.check_root(top / "team" / "cache")
    os.chmod(top, 0o1777)  # sticky, as /tmp: others cannot rename what is ours
    assert trust.check_root(top / "team" / "cache") == top / "team" / "cache"
    os.chmod(top, 0o755)
    assert trust.check_root(top / "team" / "cache").is_dir()


@needs_root
def test_root_below_an_ancestor_another_user_owns_is_refused(tmp_path: Path) -> None:
    top = tmp_path / "theirs"
    (top / "mine").mkdir(parents=True)
    os.chmod(top, 0o755)
    os.chown(top, NOBODY, -1)  # its owner can rename mine/ whatever its mode
    with pytest.raises(trust.UntrustedPath, match=f"rename.*{top} is owned by uid {NOBODY}"):
        trust.check_root(top / "mine" / "cache")


def test_refused_ancestor_means_the_cache_is_not_used(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from cuteforge import cache

    top = tmp_path / "open"
    (top / "team").mkdir(parents=True)
    os.chmod(top, 0o777)
    monkeypatch.setenv("CUTEFORGE_CACHE_DIR", str(top / "team" / "cache"))
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        assert cache.private_root() is None
    said = [str(x.message) for x in w if "kernel cache" in str(x.message)]
    assert len(said) == 1 and "not using the kernel cache" in said[0] and "rename" in said[0], said


def test_missing_parents_of_a_root_are_created_private(tmp_path: Path) -> None:
    old = os.umask(0o002)  # a group-writable umask must not make the new parents refuse the root
    try:
        root = trust.check_root(tmp_path / "a" / "b" / "cache")
    finally:
        os.umask(old)
    for d in (tmp_path / "a", tmp_path / "a" / "b", root):
        assert os.stat(d).st_mode & 0o777 == 0o700


def test_default_and_tmp_roots_still_accepted(tmp_path: Path) -> None:
    assert trust.check_root(tmp_path / "cache").is_dir()
    assert trust.check_root(Path(trust.process_temp_dir("paths-test"))).is_dir()


# --- links on the way to the root --------------------------------------------------------


@needs_root
def test_root_through_a_link_another_user_owns_is_refused(tmp_path: Path) -> None:
    mine = tmp_path / "mine"
    mine.mkdir(mode=0o700)
    link = tmp_path / "cache"
    link.symlink_to(mine)
    assert trust.check_root(link) == mine  # this user's link: followed
    os.lchown(link, NOBODY, -1)
    with pytest.raises(trust.UntrustedPath, match=f"symbolic link {link}, owned by uid {NOBODY}"):
        trust.check_root(link)
    with pytest.raises(trust.UntrustedPath, match="symbolic link"):
        trust.check_root(link / "sub")  # a link that is not the last component
    hop = tmp_path / "hop"
    hop.symlink_to(link)  # this user's link to another user's
    with pytest.raises(trust.UntrustedPath, match=f"symbolic link {link}"):
        trust.check_root(hop)


def test_root_through_a_link_in_a_directory_others_can_write_is_refused(tmp_path: Path) -> None:
    mine = tmp_path / "mine"
    mine.mkdir(mode=0o700)
    shared = tmp_path / "shared"
    shared.mkdir()
    (shared / "cache").symlink_to(mine)
    os.chmod(shared, 0o777)  # others could swap the link for one of this user's other links
    with pytest.raises(trust.UntrustedPath, match="rename"):
        trust.check_root(shared / "cache")
    os.chmod(shared, 0o1777)
    assert trust.check_root(shared / "cache") == mine


def test_relative_links_and_dotdot_resolve_as_the_kernel_does(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "x" / "y").mkdir(parents=True)
    (tmp_path / "l").symlink_to("x/y")
    assert trust.check_root(tmp_path / "l" / ".." / "c") == tmp_path / "x" / "c"
    monkeypatch.chdir(tmp_path)
    assert trust.check_root(Path("l")) == tmp_path / "x" / "y"
    (tmp_path / "loop").symlink_to("loop")
    with pytest.raises(OSError):
        trust.check_root(tmp_path / "loop")


# --- the process's temporary directories and private copies --------------------------------


def test_temp_dir_that_is_no_longer_private_is_not_reused(tmp_path: Path) -> None:
    d = trust.process_temp_dir("paths-test")
    assert trust.process_temp_dir("paths-test") == d
    os.chmod(d, 0o755)
    fresh = trust.process_temp_dir("paths-test")
    assert fresh != d and os.lstat(fresh).st_mode & 0o777 == 0o700
    assert trust.temp_dir_if_made("paths-test") == fresh
    fresh.rmdir()
    fresh.symlink_to(tmp_path)  # a link at the name: never followed
    assert trust.temp_dir_if_made("paths-test") is None
    again = trust.process_temp_dir("paths-test")
    assert again != fresh and not again.is_symlink()
    fresh.unlink()
    os.chmod(d, 0o700)


@needs_root
def test_temp_dir_recreated_by_another_user_is_not_reused() -> None:
    d = trust.process_temp_dir("paths-test")
    os.chown(d, NOBODY, -1)  # as if a cleaner removed it and someone else made the name
    try:
        fresh = trust.process_temp_dir("paths-test")
        assert fresh != d and os.lstat(fresh).st_uid == os.getuid()
    finally:
        os.chown(d, os.getuid(), -1)


def test_private_copy_never_serves_a_planted_object() -> None:
    good = b"the checked object bytes"
    path = bundle.private_copy(good)
    assert path.read_bytes() == good
    path.write_bytes(b"PLANTED")
    assert bundle.private_copy(good) == path and path.read_bytes() == good
    path.unlink()
    path.symlink_to("/etc/hostname")
    assert bundle.private_copy(good) == path and not path.is_symlink() and path.read_bytes() == good


@needs_root
def test_private_copy_rewrites_a_right_object_another_user_owns() -> None:
    good = b"the checked object bytes, again"
    path = bundle.private_copy(good)
    os.chown(path, NOBODY, -1)
    assert bundle.private_copy(good) == path and os.lstat(path).st_uid == os.getuid()


def test_private_copy_in_a_temp_dir_someone_replaced() -> None:
    good = b"bytes for a replaced directory"
    first = bundle.private_copy(good)
    d = first.parent
    os.chmod(d, 0o777)
    try:
        second = bundle.private_copy(good)
        assert second.parent != d and second.read_bytes() == good
    finally:
        os.chmod(d, 0o700)


# --- bundle pins -------------------------------------------------------------------------


def _bundle(where: Path) -> str:
    where.mkdir()
    raw = json.dumps({"format": 1, "fingerprints": {}, "objects": [], "tuning": []}).encode()
    (where / "manifest.json").write_bytes(raw)
    return hashlib.sha256(raw).hexdigest()


def _layers(monkeypatch: pytest.MonkeyPatch, value: str) -> tuple[list[str], list[str]]:
    monkeypatch.setenv(bundle.ENV, value)
    bundle.clear_bundles()
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        found = [str(b) for b in bundle.layers()]
    return found, [str(x.message) for x in w]


@pytest.mark.parametrize("pin", ["", " ", "deadbeef", "z" * 64, "0" * 63])
def test_empty_or_malformed_pin_refuses_the_bundle(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, pin: str) -> None:
    b = tmp_path / "b"
    _bundle(b)
    found, said = _layers(monkeypatch, f"{b}#sha256={pin}")
    assert found == [] and len(said) == 1 and bundle.ENV in said[0] and "refused" in said[0], said


def test_well_formed_pins_and_no_pin(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    b = tmp_path / "b"
    digest = _bundle(b)
    assert _layers(monkeypatch, f"{b}#sha256={digest}") == ([str(b)], [])
    assert _layers(monkeypatch, f"{b}#sha256={digest.upper()}") == ([str(b)], [])
    assert _layers(monkeypatch, str(b)) == ([str(b)], [])
    found, said = _layers(monkeypatch, f"{b}#sha256={'0' * 64}")
    assert found == [] and "not the pinned" in said[0]


# --- files that are not regular files -------------------------------------------------------


def _returns_promptly(fn: Callable[[], Any], fifo: Path) -> BaseException | None:
    """What `fn` raised (None if nothing), failing the test if it blocks."""
    out: list[BaseException | None] = []

    def run() -> None:
        try:
            fn()
            out.append(None)
        except BaseException as e:  # noqa: BLE001
            out.append(e)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(10)
    if t.is_alive():
        os.close(os.open(fifo, os.O_WRONLY))  # release the blocked reader before failing
        t.join(5)
        pytest.fail(f"reading the FIFO {fifo} blocked")
    return out[0]


def test_fifo_manifest_is_refused_promptly(tmp_path: Path) -> None:
    b = tmp_path / "b"
    b.mkdir()
    os.mkfifo(b / "manifest.json")
    e = _returns_promptly(lambda: bundle.use_bundle(b, sha256="0" * 64), b / "manifest.json")
    assert isinstance(e, bundle.BundleError) and "not a regular file" in str(e)


def test_fifo_object_in_a_bundle_is_refused_promptly(tmp_path: Path) -> None:
    b = tmp_path / "b"
    _bundle(b)
    name = "kernels/fp/k/0.o"
    (b / name).parent.mkdir(parents=True)
    os.mkfifo(b / name)
    opened = bundle.open_bundle(b)
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        assert _returns_promptly(lambda: opened.read(name, {"sha256": "0" * 64}), b / name) is None
    assert "not a regular file" in str(w[0].message)
    e = _returns_promptly(lambda: bundle._read_file(b / name), b / name)
    assert isinstance(e, trust.UntrustedPath)


def test_fifo_in_the_cache_is_refused_promptly(tmp_path: Path) -> None:
    fifo = tmp_path / "stats.json"
    os.mkfifo(fifo)
    e = _returns_promptly(lambda: trust.read_bytes(fifo), fifo)
    assert isinstance(e, trust.UntrustedPath) and "not a regular file" in str(e)
