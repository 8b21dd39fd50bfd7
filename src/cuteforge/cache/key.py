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

PACKAGE_DIR = Path(__file__).resolve().parent.parent  # the cuteforge package



@functools.cache
def source_hash(files: tuple[str, ...], base: str = "") -> str:
    """sha256 over files' names (relative to `base`) and contents, once per process."""
    h = hashlib.sha256()
    for f in files:
        h.update(os.path.relpath(f, base).encode() if base else os.path.basename(f).encode())
        h.update(Path(f).read_bytes())
    return h.hexdigest()



def package_source_hash() -> str:
    files = tuple(sorted(str(p) for p in PACKAGE_DIR.rglob("*.py")))
    return source_hash(files, str(PACKAGE_DIR))



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

    @classmethod
    def at(cls, directory: Path, key_hash: str) -> Entry:
        return cls(directory / f"{key_hash}.o", directory / f"{key_hash}.json", directory / f"{key_hash}.lock")



def key_hash(key_repr: str) -> str:
    return hashlib.sha256(key_repr.encode()).hexdigest()[:32]



def entry_parts(kernel: str, arch: str, extra_fingerprint: str = "") -> tuple[str, str]:
    """The directories of a kernel's entries below the root: fingerprint, kernel[-source hash]."""
    return fingerprint(arch), f"{kernel}-{extra_fingerprint[:8]}" if extra_fingerprint else kernel



def entry_for(root: Path, *, kernel: str, key_repr: str, arch: str, extra_fingerprint: str = "") -> Entry:
    """Where a compile key lives: <root>/<fingerprint>/<kernel>[-<source hash>]/<key hash>.o"""
    return Entry.at(root.joinpath(*entry_parts(kernel, arch, extra_fingerprint)), key_hash(key_repr))
