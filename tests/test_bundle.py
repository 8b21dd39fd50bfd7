"""Kernel bundles: built from a cache of tiny test kernels, they serve a fresh cache without
compiling; an altered object, another installation's fingerprint or a pin that differs is
refused with a warning and the kernel compiles. CPU only (sm_90a objects load without a GPU)."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from test_cache import HERE, SRC, UNLINKED, run_worker

from cuteforge import bundle


def cli(*args: str, cache_dir: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    e = dict(os.environ, CUTEFORGE_CACHE_DIR=str(cache_dir), CUTEFORGE_ARCH="sm_90a", CUTE_DSL_ARCH="sm_90a")
    e["PYTHONPATH"] = os.pathsep.join([str(SRC), str(HERE), e.get("PYTHONPATH", "")])
    e.update(env or {})
    return subprocess.run([sys.executable, "-m", "cuteforge", *args], env=e, capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A bundle of one compiled test kernel (test_scale, factor 2.0)."""
    base = tmp_path_factory.mktemp("bundle")
    assert run_worker(base / "cache")["compiles"] == 1
    out = cli("bundle", "create", str(base / "b"), "--from-cache", "--json", cache_dir=base / "cache")
    assert out.returncode == 0, out.stderr
    made = json.loads(out.stdout)
    assert made["objects"] == 1 and made["sha256"] == bundle.open_bundle(base / "b").manifest_sha256
    return base / "b"


def copy(src: Path, dest: Path) -> Path:
    shutil.copytree(src, dest)
    return dest


def objects(b: Path) -> list[Path]:
    return sorted(b.glob("kernels/*/*/*.o"))


def test_bundle_serves_a_fresh_cache_without_compiling(built: Path, tmp_path: Path) -> None:
    r = run_worker(tmp_path / "fresh", env={"CUTEFORGE_BUNDLES": str(built)})
    assert r["compiles"] == 0 and r["bundle_loads"] == 1 and r["callable"], r
    assert r["warnings"] == []
    assert list((tmp_path / "fresh").glob("*/*/*.o")) == []  # a read-only layer: nothing copied in
    # objects only: each machine links its own library from the bundle's object, once
    assert objects(built) and not [p for p in built.rglob("*") if p.suffix != ".o" and "kernels" in p.parts and p.is_file()]
    (lib,) = (tmp_path / "fresh" / "linked").glob("*.so")
    assert r["kind"] == "LinkedKernel" and list((tmp_path / "fresh").glob("*/*/*.so")) == []
    stamp = lib.stat().st_mtime_ns
    again = run_worker(tmp_path / "fresh", env={"CUTEFORGE_BUNDLES": str(built)})
    assert again["compiles"] == 0 and again["bundle_loads"] == 1 and again["kind"] == "LinkedKernel"
    assert lib.stat().st_mtime_ns == stamp  # opened, not linked again
    unlinked = run_worker(tmp_path / "plain", env={"CUTEFORGE_BUNDLES": str(built), **UNLINKED})
    assert unlinked["bundle_loads"] == 1 and unlinked["kind"] != "LinkedKernel"
    assert not (tmp_path / "plain" / "linked").exists()
    # a key the bundle lacks compiles as before
    other = run_worker(tmp_path / "fresh", 3.0, env={"CUTEFORGE_BUNDLES": str(built)})
    assert other["compiles"] == 1 and other["bundle_loads"] == 0


def test_bundle_pinned_by_its_manifest_hash(built: Path, tmp_path: Path) -> None:
    digest = bundle.open_bundle(built).manifest_sha256
    r = run_worker(tmp_path / "c1", env={"CUTEFORGE_BUNDLES": f"{built}#sha256={digest}"})
    assert r["compiles"] == 0 and r["bundle_loads"] == 1
    r = run_worker(tmp_path / "c2", env={"CUTEFORGE_BUNDLES": f"{built}#sha256={'0' * 64}"})
    assert r["compiles"] == 1 and r["bundle_loads"] == 0
    assert any("not the pinned" in w for w in r["warnings"]), r["warnings"]
    with pytest.raises(bundle.BundleError, match="not the pinned"):
        bundle.use_bundle(built, sha256="0" * 64)
    assert bundle.use_bundle(built, sha256=digest).manifest_sha256 == digest
    bundle.clear_bundles()


def test_one_changed_byte_is_refused_and_the_kernel_compiles(built: Path, tmp_path: Path) -> None:
    b = copy(built, tmp_path / "b")
    (obj,) = objects(b)
    data = bytearray(obj.read_bytes())
    data[len(data) // 2] ^= 0x01
    obj.write_bytes(bytes(data))
    r = run_worker(tmp_path / "fresh", env={"CUTEFORGE_BUNDLES": str(b)})
    assert r["compiles"] == 1 and r["bundle_loads"] == 0
    assert [w for w in r["warnings"] if "does not match the sha256" in w and "refused" in w], r["warnings"]
    out = cli("bundle", "verify", str(b), cache_dir=tmp_path / "fresh")
    assert out.returncode == 2 and "do not match the manifest" in out.stderr


def test_another_installations_bundle_is_skipped_with_one_warning(built: Path, tmp_path: Path) -> None:
    b = copy(built, tmp_path / "b")
    manifest = json.loads((b / bundle.MANIFEST).read_text())
    (fid, fp), = manifest["fingerprints"].items()
    other = "f" * 16
    manifest["fingerprints"] = {other: {**fp, "id": other, "toolchain": [["nvidia-cutlass-dsl", "0.0.1"]]}}
    for e in manifest["objects"]:
        e["file"] = e["file"].replace(fid, other)
    (b / "kernels" / fid).rename(b / "kernels" / other)
    (b / bundle.MANIFEST).write_text(json.dumps(manifest))
    r = run_worker(tmp_path / "fresh", env={"CUTEFORGE_BUNDLES": str(b)})
    assert r["compiles"] == 1 and r["bundle_loads"] == 0
    skipped = [w for w in r["warnings"] if "skipping kernel bundle" in w]
    assert len(skipped) == 1 and "nvidia-cutlass-dsl" in skipped[0], r["warnings"]


def test_manifest_naming_a_file_outside_the_bundle_is_refused(built: Path, tmp_path: Path) -> None:
    b = copy(built, tmp_path / "b")
    manifest = json.loads((b / bundle.MANIFEST).read_text())
    manifest["objects"][0]["file"] = "kernels/../../elsewhere.o"
    (b / bundle.MANIFEST).write_text(json.dumps(manifest))
    with pytest.raises(bundle.BundleError, match="outside the bundle"):
        bundle.open_bundle(b)


@pytest.mark.parametrize("name", ["kernels", "autotune", "kernels/x", "kernels/a/b/c/d.o"])
def test_manifest_naming_a_file_off_the_layout_is_refused_and_the_kernel_compiles(built: Path, tmp_path: Path,
                                                                               name: str) -> None:
    b = copy(built, tmp_path / "b")
    manifest = json.loads((b / bundle.MANIFEST).read_text())
    manifest["objects"][0]["file"] = name
    (b / bundle.MANIFEST).write_text(json.dumps(manifest))
    with pytest.raises(bundle.BundleError, match="not laid out"):
        bundle.open_bundle(b)
    r = run_worker(tmp_path / "fresh", env={"CUTEFORGE_BUNDLES": str(b)})  # one warning, then the compile
    assert r["compiles"] == 1 and r["bundle_loads"] == 0 and r["callable"], r
    assert [w for w in r["warnings"] if "not laid out" in w], r["warnings"]


def test_an_object_of_another_installation_is_not_written_into_a_bundle(built: Path, tmp_path: Path) -> None:
    (obj,) = objects(built)
    name = obj.relative_to(built).as_posix()
    foreign = name.replace(name.split("/")[1], "f" * 16)
    with pytest.raises(bundle.BundleError, match="another installation"):
        bundle.write(tmp_path / "out", [(foreign, obj.read_bytes(), {"file": foreign, "sha256": "0"})], [], ["sm_90a"])
    assert not (tmp_path / "out").exists() and not list(tmp_path.glob(".out.*"))  # nothing left behind


def test_bundle_of_named_entries_through_a_linked_cache_directory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Entries named by the paths a kernel reports (under CUTEFORGE_CACHE_DIR as given)
    are found when that directory is a symbolic link or relative: the bundle holds them;
    a named entry the cache lacks fails the bundle instead of leaving it out."""
    real = tmp_path / "real"
    assert run_worker(real)["compiles"] == 1
    (tmp_path / "link").symlink_to(real)
    monkeypatch.setenv("CUTEFORGE_CACHE_DIR", str(tmp_path / "link"))
    monkeypatch.setenv("CUTEFORGE_ARCH", "sm_90a")
    (entry,) = (tmp_path / "link").glob("*/*/*.o")  # the path as the cache's user sees it
    made = bundle.create_from_cache(tmp_path / "b", ["sm_90a"], objects=[entry])
    assert made["objects"] == 1
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("CUTEFORGE_CACHE_DIR", "link")
    assert bundle.create_from_cache(tmp_path / "b2", ["sm_90a"], objects=[Path("link") / entry.relative_to(tmp_path / "link")])["objects"] == 1
    with pytest.raises(bundle.BundleError, match="1 of the 2 compiled objects"):
        bundle.create_from_cache(tmp_path / "b3", ["sm_90a"], objects=[entry, entry.with_name("0" * 32 + ".o")])
    assert not (tmp_path / "b3").exists()


def test_cli_ls_and_verify(built: Path, tmp_path: Path) -> None:
    ls = cli("bundle", "ls", str(built), "--json", cache_dir=tmp_path)
    assert ls.returncode == 0, ls.stderr
    listed = json.loads(ls.stdout)
    assert [o["kernel"] for o in listed["objects"]] == ["test_scale"]
    digest = listed["sha256"]
    ok = cli("bundle", "verify", str(built), "--sha256", digest, "--json", cache_dir=tmp_path)
    assert ok.returncode == 0, ok.stderr
    assert json.loads(ok.stdout)["ok"] and all(f["matches_here"] for f in json.loads(ok.stdout)["fingerprints"].values())
    pinned = cli("bundle", "verify", str(built), "--sha256", "0" * 64, cache_dir=tmp_path)
    assert pinned.returncode == 2 and "not the pinned" in pinned.stderr
    again = cli("bundle", "create", str(built), "--from-cache", cache_dir=tmp_path)
    assert again.returncode == 2 and "exists" in again.stderr


def test_tuning_records_travel_in_a_bundle(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import kernels_for_tests as kt

    from cuteforge.autotune import store
    from cuteforge.signature import BoundKey

    key = BoundKey(("float32", "float32"), (), (4, 4))
    problem = store.make_problem(kt.scale, key, (("factor", 2.0),), {"M": 1000}, "sm_90a")
    monkeypatch.setenv("CUTEFORGE_CACHE_DIR", str(tmp_path / "a"))
    assert store.TuneStore().save(kt.scale, problem, {None: 1.0}, {}, None) is not None
    made = bundle.create_from_cache(tmp_path / "b", ["sm_90a"])
    assert made["tuning"] == 1
    monkeypatch.setenv("CUTEFORGE_CACHE_DIR", str(tmp_path / "empty"))
    assert store.TuneStore().load(kt.scale, problem) is None
    bundle.use_bundle(tmp_path / "b")
    try:
        rec = store.TuneStore().load(kt.scale, problem)
        assert rec is not None and rec["path"].startswith(str(tmp_path / "b"))
    finally:
        bundle.clear_bundles()


def test_a_bundles_object_links_without_importing_the_dsl(built: Path, tmp_path: Path) -> None:
    (obj,) = objects(built)
    code = ("import sys; from cuteforge import compiler; compiler.link_shared(sys.argv[1], sys.argv[2]); "
            "print('cutlass' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", code, str(obj), str(tmp_path / "k.so")], capture_output=True, text=True,
                          env=dict(os.environ, PYTHONPATH=os.pathsep.join([str(SRC), os.environ.get("PYTHONPATH", "")])),
                          timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "False" and (tmp_path / "k.so").stat().st_size > 0


def test_a_linked_library_that_does_not_load_is_linked_again(built: Path, tmp_path: Path) -> None:
    env = {"CUTEFORGE_BUNDLES": str(built)}
    assert run_worker(tmp_path / "c", env=env)["kind"] == "LinkedKernel"
    (lib,) = (tmp_path / "c" / "linked").glob("*.so")
    lib.write_bytes(b"not a shared library")
    broken = run_worker(tmp_path / "c", env=env)
    assert broken["bundle_loads"] == 1 and broken["compiles"] == 0 and broken["kind"] != "LinkedKernel"
    assert not lib.exists()  # removed, so the next process links it again
    assert run_worker(tmp_path / "c", env=env)["kind"] == "LinkedKernel" and lib.exists()


def test_a_linked_library_changed_on_disk_is_not_loaded(built: Path, tmp_path: Path) -> None:
    """A library beside its sha256 whose bytes changed (still a loadable library: a byte of
    its padding) is refused before the loader sees it, removed and linked again."""
    env = {"CUTEFORGE_BUNDLES": str(built)}
    assert run_worker(tmp_path / "c", env=env)["kind"] == "LinkedKernel"
    (lib,) = (tmp_path / "c" / "linked").glob("*.so")
    stamp = lib.with_name(lib.name + ".sha256")
    assert stamp.read_text() == hashlib.sha256(lib.read_bytes()).hexdigest()
    lib.write_bytes(lib.read_bytes() + b"\0")
    changed = run_worker(tmp_path / "c", env=env)
    assert changed["bundle_loads"] == 1 and changed["compiles"] == 0 and changed["kind"] != "LinkedKernel"
    assert not lib.exists() and not stamp.exists()
    assert run_worker(tmp_path / "c", env=env)["kind"] == "LinkedKernel" and lib.exists() and stamp.exists()


def test_force_replaces_a_bundle_whole(built: Path, tmp_path: Path) -> None:
    (obj,) = objects(built)
    name = obj.relative_to(built).as_posix()
    item = (name, obj.read_bytes(), {"file": name, "sha256": hashlib.sha256(obj.read_bytes()).hexdigest()})
    first = bundle.write(tmp_path / "b", [item], [], ["sm_90a"])
    with pytest.raises(bundle.BundleError, match="exists"):
        bundle.write(tmp_path / "b", [], [], ["sm_90a"])
    second = bundle.write(tmp_path / "b", [], [], ["sm_90a"], force=True)
    assert first["objects"] == 1 and second["objects"] == 0 and bundle.open_bundle(tmp_path / "b").objects == {}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["b"]  # no staging or old copy left beside it


def test_a_replacement_that_fails_leaves_the_old_bundle_in_place(built: Path, tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    bundle.write(tmp_path / "b", [], [], ["sm_90a"])
    digest = bundle.open_bundle(tmp_path / "b").manifest_sha256
    real_replace = os.replace

    def replace(src: object, dst: object) -> None:
        if Path(str(src)).name.startswith(".b.") and ".old." not in Path(str(src)).name:  # the new bundle's move
            raise OSError("disk went away")
        real_replace(src, dst)

    monkeypatch.setattr(bundle.os, "replace", replace)
    with pytest.raises(OSError, match="disk went away"):
        bundle.write(tmp_path / "b", [], [], ["sm_90a", "sm_90"], force=True)
    monkeypatch.setattr(bundle.os, "replace", real_replace)
    assert bundle.open_bundle(tmp_path / "b").manifest_sha256 == digest
    assert sorted(p.name for p in tmp_path.iterdir()) == ["b"]

