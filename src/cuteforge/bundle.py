"""Kernel bundles: compiled objects and tuning records built once, shipped anywhere.

A bundle is a directory (tar it to ship it) holding

    manifest.json                                   what it holds, and for whom
    kernels/<fingerprint>/<kernel>/<key hash>.o     compiled objects, as in the kernel cache
    autotune/<fingerprint>/<kernel>/<name>.json     tuning records, as in the tuning store

The manifest lists every file with its sha256 and, per fingerprint, what the fingerprint
covers (cuteforge's version and source hash, the CuTe DSL and tvm-ffi distributions, the
Python minor version, the target arch). `create` writes one from the kernel cache
(`cuteforge bundle create OUT --from-cache`, or after a precompile); `use_bundle(path,
sha256=...)` and `CUTEFORGE_BUNDLES=a:b` add bundles as read-only layers that
`KernelCache` consults after its own cache and before compiling, and the tuning store
after its own records.

A bundle is code: loading one of its objects runs it. So a bundle is read only from a
path the user names (never found by searching), optionally pinned by the sha256 of its
manifest (`use_bundle(path, sha256=...)`, `CUTEFORGE_BUNDLES=path#sha256=HEX`); the
manifest is read once and kept in memory, every object is read once, checked against
the manifest's sha256 and its compile key, and loaded from a private copy, never from
the bundle's own file (which could change after the check): the library linked from that
copy into the private cache (`linked/`), checked against its own sha256 before each load,
or where it cannot be linked the copy itself through the DSL. A file that fails its check
is refused with a warning and the kernel compiles; a bundle built for another
fingerprint (another DSL, tvm-ffi, Python or cuteforge) is skipped with one warning.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import stat
import tempfile
import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from . import trust

MANIFEST = "manifest.json"
FORMAT = 1
ENV = "CUTEFORGE_BUNDLES"
_PIN = re.compile(r"[0-9a-fA-F]{64}")


class BundleError(ValueError):
    """A bundle that cannot be used: unreadable, malformed, or not the one pinned."""


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _read_file(path: Path) -> bytes:
    """A regular file's bytes, read without following a link at its last component (a FIFO
    or other special file raises UntrustedPath at once)."""
    try:
        fd = trust.open_nofollow(path)
    except OSError as e:
        if os.path.islink(path):
            raise trust.UntrustedPath(f"{path} is a symbolic link") from e
        raise
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):  # a FIFO or device: never read
            raise trust.UntrustedPath(f"{path} is not a regular file")
        os.set_blocking(f.fileno(), True)
        return f.read()


def _relative(name: Any) -> str:
    """A manifest's file name: a relative path of plain components, else BundleError."""
    if not isinstance(name, str) or not name or name.startswith("/") or "\\" in name or "\0" in name:
        raise BundleError(f"manifest names a file outside the bundle: {name!r}")
    parts = name.split("/")
    if any(p in ("", ".", "..") for p in parts) or parts[0] not in ("kernels", "autotune"):
        raise BundleError(f"manifest names a file outside the bundle: {name!r}")
    if len(parts) != 4:  # kernels|autotune / fingerprint / kernel / file
        raise BundleError(f"manifest names a file not laid out as <kind>/<fingerprint>/<kernel>/<file>: {name!r}")
    return name


def fingerprint_record(arch: str) -> dict[str, Any]:
    """What this installation's fingerprint for `arch` covers, with its id and cuteforge's version."""
    from . import __version__, cache

    return {"id": cache.fingerprint(arch), "cuteforge_version": __version__, **cache.fingerprint_parts(arch)}


def _differences(theirs: Mapping[str, Any], arch: str) -> str:
    ours = json.loads(json.dumps(fingerprint_record(arch)))
    diff = [f"{k}: {theirs.get(k)!s:.40} here {ours.get(k)!s:.40}" for k in ("cuteforge_version", "cuteforge", "toolchain", "python")
            if theirs.get(k) != ours.get(k)]
    return "; ".join(diff) or "its fingerprint differs"


@dataclass
class Bundle:
    """An opened bundle: its manifest, read once and checked (`open_bundle`)."""

    path: Path
    manifest_sha256: str
    fingerprints: dict[str, dict[str, Any]]  # id -> what it covers (arch, versions)
    objects: dict[str, dict[str, Any]]  # file name -> {"sha256", "kernel", "key", "arch"}
    records: dict[str, dict[str, Any]]  # file name -> {"sha256"}
    _warned: set[str] = field(default_factory=set)

    def __str__(self) -> str:
        return str(self.path)

    def serves(self, fingerprint: str, arch: str) -> bool:
        """Whether this bundle holds entries for `fingerprint`; warns once (per bundle and
        arch) when it does not."""
        if fingerprint in self.fingerprints:
            return True
        topic = f"bundle-fp:{self.path}:{arch}"
        theirs = [f for f in self.fingerprints.values() if f.get("arch") == arch]
        why = (f"it was built for another installation ({_differences(theirs[0], arch)})" if theirs
               else f"it holds no kernels for {arch} (it has {', '.join(sorted({str(f.get('arch')) for f in self.fingerprints.values()})) or 'none'})")
        trust.warn_once(topic, f"cuteforge: skipping kernel bundle {self.path}: {why}; rebuild it with `cuteforge bundle create`", stacklevel=6)
        return False

    def read(self, name: str, expected: Mapping[str, Any]) -> bytes | None:
        """The file's bytes if they match the manifest's sha256; None (one warning) otherwise."""
        try:
            data = _read_file(self.path / name)
        except OSError as e:
            trust.warn_once(f"bundle-file:{self.path}:{name}", f"cuteforge: kernel bundle {self.path}: cannot read {name} ({e}); "
                            "refused, compiling instead", stacklevel=6)
            return None
        if _sha256(data) != expected.get("sha256"):
            trust.warn_once(f"bundle-file:{self.path}:{name}", f"cuteforge: kernel bundle {self.path}: {name} does not match the "
                            "sha256 in its manifest (altered or damaged); refused, compiling instead", stacklevel=6)
            return None
        return data

    def object_bytes(self, fingerprint: str, kernel_dir: str, key_hash: str, key_repr: str, arch: str) -> bytes | None:
        """The checked bytes of the object for this key, or None."""
        name = f"kernels/{fingerprint}/{kernel_dir}/{key_hash}.o"
        if not self.serves(fingerprint, arch):
            return None
        entry = self.objects.get(name)
        if entry is None:
            return None
        if entry.get("key") != key_repr:  # a hash collision, or a manifest that lies about a key
            return None
        return self.read(name, entry)

    def record(self, fingerprint: str, kernel: str, name: str) -> tuple[Path, Any] | None:
        rel = f"autotune/{fingerprint}/{kernel}/{name}"
        entry = self.records.get(rel)
        if entry is None:
            return None
        data = self.read(rel, entry)
        if data is None:
            return None
        try:
            return self.path / rel, json.loads(data)
        except ValueError:
            return None


def open_bundle(path: str | os.PathLike[str], sha256: str | None = None) -> Bundle:
    """Read and check a bundle's manifest; with `sha256`, it must hash to that (BundleError otherwise)."""
    root = Path(path).expanduser()
    try:
        raw = _read_file(root / MANIFEST)
    except OSError as e:
        raise BundleError(f"{root} is not a readable kernel bundle ({e})") from None
    digest = _sha256(raw)
    if sha256 is not None and digest != sha256.strip().lower():
        raise BundleError(f"kernel bundle {root}: its manifest's sha256 is {digest}, not the pinned {sha256}; refused")
    try:
        m = json.loads(raw)
    except ValueError as e:
        raise BundleError(f"kernel bundle {root}: manifest is not JSON ({e})") from None
    if not isinstance(m, dict) or m.get("format") != FORMAT:
        raise BundleError(f"kernel bundle {root}: not a format {FORMAT} manifest")
    fps, objs, recs = m.get("fingerprints"), m.get("objects"), m.get("tuning")
    if not isinstance(fps, dict) or not isinstance(objs, list) or not isinstance(recs, list):
        raise BundleError(f"kernel bundle {root}: manifest lacks fingerprints, objects or tuning")
    objects: dict[str, dict[str, Any]] = {}
    records: dict[str, dict[str, Any]] = {}
    for items, into in ((objs, objects), (recs, records)):
        for e in items:
            if not isinstance(e, dict) or not isinstance(e.get("sha256"), str):
                raise BundleError(f"kernel bundle {root}: malformed manifest entry {str(e)[:200]}")
            name = _relative(e.get("file"))
            if name.split("/")[1] not in fps:
                raise BundleError(f"kernel bundle {root}: {name} is under no fingerprint the manifest lists")
            into[name] = e
    return Bundle(root, digest, {str(k): v for k, v in fps.items() if isinstance(v, dict)}, objects, records)


# --- the layers this process consults ------------------------------------------------

_lock = threading.Lock()
_named: list[Bundle] = []  # use_bundle
_env: dict[str, Any] = {"value": None, "bundles": []}


def _parse_env(value: str) -> list[Bundle]:
    out = []
    for item in (i.strip() for i in value.split(os.pathsep)):
        if not item:
            continue
        path, sep, pin = item.partition("#sha256=")
        if sep and not _PIN.fullmatch(pin.strip()):  # an empty pin (an unset variable) must not mean unpinned
            trust.warn_once(f"bundle-env:{item}", f"cuteforge: {ENV}: kernel bundle {path}: its pin #sha256={pin!r} is not "
                            "a sha256 (64 hex digits); refused, not using it", stacklevel=6)
            continue
        try:
            out.append(open_bundle(path, pin if sep else None))
        except BundleError as e:
            trust.warn_once(f"bundle-env:{item}", f"cuteforge: {ENV}: {e}; not using it", stacklevel=6)
    return out


def layers() -> list[Bundle]:
    """The bundles this process consults, in order: `use_bundle`'s, then CUTEFORGE_BUNDLES's."""
    value = os.environ.get(ENV, "")
    with _lock:
        if _env["value"] != value:
            _env["value"], _env["bundles"] = value, _parse_env(value)
        return [*_named, *_env["bundles"]]


def use_bundle(path: str | os.PathLike[str], sha256: str | None = None) -> Bundle:
    """Add a bundle as a read-only layer of the kernel cache and tuning store for this
    process. `sha256` pins its manifest (BundleError when it differs: refused)."""
    b = open_bundle(path, sha256)
    with _lock:
        _named[:] = [x for x in _named if x.path != b.path] + [b]
    return b


def clear_bundles() -> None:
    """Forget the bundles `use_bundle` added (CUTEFORGE_BUNDLES is read again on next use)."""
    with _lock:
        _named.clear()
        _env["value"] = None


def find_object(fingerprint: str, kernel_dir: str, key_hash: str, key_repr: str, arch: str) -> tuple[Bundle, bytes] | None:
    """The first layer holding this key, with its checked bytes."""
    for b in layers():
        data = b.object_bytes(fingerprint, kernel_dir, key_hash, key_repr, arch)
        if data is not None:
            return b, data
    return None


def find_record(fingerprint: str, kernel: str, name: str) -> tuple[Path, Any] | None:
    """The first layer's tuning record of this name (checked against its manifest)."""
    for b in layers():
        found = b.record(fingerprint, kernel, name)
        if found is not None:
            return found
    return None


def private_copy(data: bytes) -> Path:
    """`data` in a private file of this process named by its hash (what gets loaded); a file
    already there is used only if it is this user's and hashes to that name, else rewritten."""
    digest = _sha256(data)
    path = trust.process_temp_dir("bundles") / f"{digest}.o"
    try:
        if _sha256(trust.read_bytes(path)) == digest:
            return path
    except OSError:
        pass
    trust.atomic_write(path, data)
    return path


# --- writing ---------------------------------------------------------------------------


def _cache_objects(root: Path, fingerprints: Iterable[str], only: set[str] | None) -> Iterable[tuple[str, bytes, dict[str, Any]]]:
    """(file name, bytes, entry) for each sound kernel-cache entry under these fingerprints;
    with `only`, just the object files it names (resolved paths: `entry_paths`)."""
    for fp in sorted(fingerprints):
        base = root / fp
        if not base.is_dir():
            continue
        for meta_path in sorted(base.glob("*/*.json")):
            obj = meta_path.with_suffix(".o")
            if only is not None and os.path.realpath(obj) not in only:
                continue
            try:
                meta = json.loads(trust.read_bytes(meta_path))
                data = trust.read_bytes(obj)
            except (OSError, ValueError):
                continue
            if not isinstance(meta, dict) or _sha256(data) != meta.get("sha256"):
                continue  # damaged: never shipped
            name = f"kernels/{fp}/{meta_path.parent.name}/{obj.name}"
            yield name, data, {"file": name, "sha256": meta["sha256"], "kernel": meta.get("kernel"), "key": meta.get("key"),
                               "arch": meta.get("arch")}


def _cache_records(root: Path, fingerprints: Iterable[str]) -> Iterable[tuple[str, bytes, dict[str, Any]]]:
    for fp in sorted(fingerprints):
        base = root / "autotune" / fp
        if not base.is_dir():
            continue
        for rec in sorted(base.glob("*/*.json")):
            try:
                data = trust.read_bytes(rec)
                if not isinstance(json.loads(data), dict):
                    continue
            except (OSError, ValueError):
                continue
            name = f"autotune/{fp}/{rec.parent.name}/{rec.name}"
            yield name, data, {"file": name, "sha256": _sha256(data)}


def entry_paths(paths: Iterable[str | os.PathLike[str]]) -> set[str]:
    """Object files as `_cache_objects(only=...)` matches them: resolved, so a cache reached
    through a symbolic link or a relative CUTEFORGE_CACHE_DIR selects its own entries."""
    return {os.path.realpath(p) for p in paths}


def write(out: str | os.PathLike[str], objects: Iterable[tuple[str, bytes, dict[str, Any]]],
          records: Iterable[tuple[str, bytes, dict[str, Any]]], archs: Iterable[str], force: bool = False) -> dict[str, Any]:
    """Write a bundle directory at `out` (whole: built beside it, then renamed in place)."""
    from . import cache

    dest = Path(out).expanduser()
    if dest.exists() and not force:
        raise BundleError(f"{dest} exists (pass force=True / --force to replace it)")
    if dest.exists() and not (dest / MANIFEST).is_file():
        raise BundleError(f"{dest} exists and is not a kernel bundle; not replacing it")
    fingerprints = {cache.fingerprint(a): fingerprint_record(a) for a in sorted(set(archs))}
    dest.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{dest.name}.", dir=dest.parent))
    try:
        obj_entries, rec_entries = [], []
        for items, into in ((objects, obj_entries), (records, rec_entries)):
            for name, data, entry in items:
                if _relative(name).split("/")[1] not in fingerprints:  # open_bundle would refuse the whole bundle
                    raise BundleError(f"{name} was built by another installation (fingerprint {name.split('/')[1]}; "
                                      f"this one: {', '.join(fingerprints)}): not writing a bundle that would be refused")
                target = staging / _relative(name)
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_bytes(data)
                into.append(entry)
        manifest = {
            "format": FORMAT,
            "fingerprints": fingerprints,
            "objects": sorted(obj_entries, key=lambda e: e["file"]),
            "tuning": sorted(rec_entries, key=lambda e: e["file"]),
        }
        raw = json.dumps(manifest, indent=1, sort_keys=True).encode()
        (staging / MANIFEST).write_bytes(raw)
        for d, _, files in os.walk(staging):  # a shipped artifact: readable by all, writable by its owner
            os.chmod(d, 0o755)
            for f in files:
                os.chmod(os.path.join(d, f), 0o644)
        old = None
        if dest.exists():  # the old bundle moved aside whole, so no reader sees it half deleted
            old = Path(tempfile.mkdtemp(prefix=f".{dest.name}.old.", dir=dest.parent))
            os.replace(dest, old / dest.name)
        try:
            os.replace(staging, dest)
        except BaseException:
            if old is not None:  # the old bundle goes back where it was
                os.replace(old / dest.name, dest)
                old.rmdir()
            raise
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return {"path": str(dest), "sha256": _sha256(raw), "objects": len(obj_entries), "tuning": len(rec_entries),
            "bytes": _size(dest)}


def _size(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def create_from_cache(out: str | os.PathLike[str], archs: Iterable[str], objects: Iterable[str | os.PathLike[str]] | None = None,
                      force: bool = False) -> dict[str, Any]:
    """A bundle of the kernel cache's entries (all of the current fingerprint of each arch,
    or only the object files `objects` names) and its tuning records for those fingerprints."""
    from . import cache

    archs = sorted(set(archs))
    root = cache.private_root()
    if root is None:
        raise BundleError(f"the kernel cache at {cache.cache_root()} cannot be used, so there is nothing to bundle")
    fps = [cache.fingerprint(a) for a in archs]
    only = None if objects is None else entry_paths(objects)
    found = list(_cache_objects(root, fps, only))
    if only is not None and len(found) != len(only):
        raise BundleError(f"{len(only) - len(found)} of the {len(only)} compiled objects to bundle are missing or damaged "
                          f"in the kernel cache at {root}")
    return write(out, found, _cache_records(root, fps), archs, force)


def verify(path: str | os.PathLike[str], sha256: str | None = None) -> dict[str, Any]:
    """Check every file of a bundle against its manifest, and its fingerprints against this
    installation's; raises BundleError for a manifest that cannot be used."""
    from . import cache

    b = open_bundle(path, sha256)
    bad = []
    for name, entry in (*b.objects.items(), *b.records.items()):
        try:
            ok = _sha256(_read_file(b.path / name)) == entry.get("sha256")
        except OSError:
            ok = False
        if not ok:
            bad.append(name)
    usable = {fid: fid == cache.fingerprint(str(f.get("arch"))) for fid, f in b.fingerprints.items()}
    return {"path": str(b.path), "sha256": b.manifest_sha256, "objects": len(b.objects), "tuning": len(b.records),
            "bad": bad, "fingerprints": {fid: {**f, "matches_here": usable[fid]} for fid, f in b.fingerprints.items()},
            "ok": not bad}


def describe(path: str | os.PathLike[str]) -> dict[str, Any]:
    """What a bundle holds (for `cuteforge bundle ls`)."""
    b = open_bundle(path)
    return {"path": str(b.path), "sha256": b.manifest_sha256, "fingerprints": b.fingerprints,
            "objects": [{k: e.get(k) for k in ("kernel", "arch", "key", "file")} for e in b.objects.values()],
            "tuning": sorted(b.records)}
