"""Where a compile key lives: the fingerprint (cuteforge's sources, the DSL and tvm-ffi,
Python, the arch) names a directory, the key's hash an entry in it."""

from __future__ import annotations

import functools
import hashlib
import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .. import trust
from .store import cache_root, disk_enabled

PACKAGE_DIR = Path(__file__).resolve().parent.parent  # the cuteforge package



@functools.cache
def source_hash(files: tuple[str, ...], base: str = "") -> str:
    """sha256 over files' names (relative to `base`) and contents, once per process."""
    h = hashlib.sha256()
    for f in files:
        h.update(os.path.relpath(f, base).encode() if base else os.path.basename(f).encode())
        h.update(Path(f).read_bytes())
    return h.hexdigest()



def _package_files() -> list[tuple[str, os.stat_result]]:
    """Every .py file of the package (absolute path, its stat), in a stable order."""
    found = []
    for dirpath, dirnames, filenames in os.walk(PACKAGE_DIR):
        dirnames[:] = [d for d in dirnames if d != "__pycache__"]
        found += [os.path.join(dirpath, name) for name in filenames if name.endswith(".py")]
    return [(path, os.stat(path)) for path in sorted(found)]


_SOURCE_MEMO = "source-hash.json"  # in the cache root: stat signature -> content hash


@functools.cache
def package_source_hash() -> str:
    """sha256 over cuteforge's sources (names relative to the package, contents).

    Reading and hashing every source file costs a new process 10-30 ms on its first cache
    lookup, so the hash is memoized in the cache root under a signature of the files'
    stats (name, size, inode, mtime and ctime in ns): any write, copy or reinstall changes
    ctime, which no tool can set back. The hash itself stays content-only, so identical
    sources on two machines share fingerprints (and kernel bundles)."""
    files = _package_files()
    skip = len(str(PACKAGE_DIR)) + 1  # the names below the package (os.path.relpath costs ~10 us each)
    signature = hashlib.sha256(repr([(f[skip:], st.st_size, st.st_ino, st.st_mtime_ns, st.st_ctime_ns)
                                     for f, st in files]).encode()).hexdigest()
    memo = _read_source_memo()
    if memo.get("signature") == signature and isinstance(memo.get("hash"), str):
        return memo["hash"]
    digest = source_hash(tuple(f for f, _ in files), str(PACKAGE_DIR))
    _write_source_memo({"signature": signature, "hash": digest})
    return digest


def _read_source_memo() -> dict[str, Any]:
    if not disk_enabled():
        return {}
    try:
        memo = json.loads(trust.read_bytes(trust.check_root(cache_root()) / _SOURCE_MEMO))
    except (OSError, ValueError):  # absent, refused, damaged: hash the files
        return {}
    return memo if isinstance(memo, dict) else {}


def _write_source_memo(memo: dict[str, str]) -> None:
    if not disk_enabled():
        return
    try:
        trust.atomic_write(trust.check_root(cache_root()) / _SOURCE_MEMO, json.dumps(memo))
    except OSError:  # a refused or read-only root: the next process hashes again
        pass



_TOOLCHAIN_PREFIXES = ("nvidia_cutlass_dsl", "apache_tvm_ffi")


@functools.cache
def toolchain_versions() -> tuple[tuple[str, str], ...]:
    """Every installed nvidia-cutlass-dsl* distribution (cu12 and cu13 libs differ) + tvm-ffi.

    Read from the `<name>-<version>.dist-info` directory names on sys.path (a process's
    first cache lookup pays this: parsing every installed distribution's metadata took
    tens of milliseconds in an environment with torch's stack); the metadata scan where
    none is named so (egg-info, unusual installs)."""
    found = set()
    for base in sys.path:
        try:
            entries = os.scandir(base or ".")
        except OSError:
            continue
        with entries:
            for e in entries:
                if e.name.endswith(".dist-info") and e.name.lower().startswith(_TOOLCHAIN_PREFIXES):
                    name, _, version = e.name[: -len(".dist-info")].partition("-")
                    name = name.lower().replace("_", "-")
                    if version and (name.startswith("nvidia-cutlass-dsl") or name == "apache-tvm-ffi"):
                        found.add((name, version))
    return tuple(sorted(found)) if found else _toolchain_from_metadata()


def _toolchain_from_metadata() -> tuple[tuple[str, str], ...]:
    from importlib import metadata

    found = set()
    for dist in metadata.distributions():
        name = (dist.metadata.get("Name") or "").lower().replace("_", "-")
        if name.startswith("nvidia-cutlass-dsl") or name == "apache-tvm-ffi":
            found.add((name, dist.version))
    return tuple(sorted(found))



def fingerprint_parts(arch: str) -> dict[str, Any]:
    """What the fingerprint covers: cuteforge's sources, the DSL and tvm-ffi, Python, the arch."""
    return {
        "cuteforge": package_source_hash(),
        "toolchain": toolchain_versions(),
        "python": f"{sys.version_info.major}.{sys.version_info.minor}",
        "arch": arch,
    }



@functools.cache
def fingerprint(arch: str) -> str:
    return hashlib.sha256(json.dumps(fingerprint_parts(arch), sort_keys=True).encode()).hexdigest()[:16]



@dataclass(frozen=True)
class Entry:
    """Where one compile key lives on disk."""

    obj: Path
    meta: Path
    lock: Path
    lib: Path  # the object linked into a shared library: what a process loads when it is there

    @classmethod
    def at(cls, directory: Path, key_hash: str) -> Entry:
        return cls(directory / f"{key_hash}.o", directory / f"{key_hash}.json", directory / f"{key_hash}.lock",
                   directory / f"{key_hash}.so")



def key_hash(key_repr: str) -> str:
    return hashlib.sha256(key_repr.encode()).hexdigest()[:32]



def entry_parts(kernel: str, arch: str, extra_fingerprint: str = "") -> tuple[str, str]:
    """The directories of a kernel's entries below the root: fingerprint, kernel[-source hash]."""
    return fingerprint(arch), f"{kernel}-{extra_fingerprint[:8]}" if extra_fingerprint else kernel



def entry_for(root: Path, *, kernel: str, key_repr: str, arch: str, extra_fingerprint: str = "") -> Entry:
    """Where a compile key lives: <root>/<fingerprint>/<kernel>[-<source hash>]/<key hash>.o"""
    return Entry.at(root.joinpath(*entry_parts(kernel, arch, extra_fingerprint)), key_hash(key_repr))
