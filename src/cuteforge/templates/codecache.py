"""The source code cache: rendered templates as real files, imported from there.

CuTe DSL reads a `@cute.jit` function's source file (its preprocessor works on the AST),
so rendered code must live in a file. `write(text)` puts it at `<cache root>/src/<sha256>.py`
once (atomic `os.replace`; identical renders map to one file) and `load(digest)` imports
it as `cuteforge.templates.generated.m<sha256>`: identical renders share one module.
Compiled objects do not live here; they go through the kernel cache like any kernel's.

Importing runs the file, so the directory is checked by `trust.py` (under a refused or
unwritable root, sources go to a private temporary directory of the process), a file is
executed only when its contents hash to its name, and no bytecode is read or written.

Compile workers (a fresh process) import generated modules by name; the finder below
serves `cuteforge.templates.generated.*` the same way.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.abc
import importlib.machinery
import json
import os
import re
import sys
import threading
from pathlib import Path
from types import ModuleType
from typing import Any

from .. import trust
from ..cache import private_root

PACKAGE = "cuteforge.templates.generated"
_HEX = re.compile(r"[0-9a-f]{64}")
_modules: dict[str, ModuleType] = {}
_lock = threading.RLock()


def src_dir() -> Path:
    """`<cache root>/src`, or this process's private temporary directory when the root
    is refused or the directory cannot be made."""
    root = private_root()
    if root is not None:
        try:
            return trust.private_dir(root, "src")
        except OSError as e:
            trust.warn_once(f"src:{root}", f"cuteforge: cannot use {root / 'src'} for rendered templates ({e}); "
                            "they go to a private temporary directory for this process")
    return trust.process_temp_dir("src")


def digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def path_for(h: str, prefix: str = "") -> Path:
    return src_dir() / f"{prefix}{h}.py"


def _dirs() -> list[Path]:
    """Where a written source may be: the source cache, then the process's fallback."""
    first = src_dir()
    fallback = trust.temp_dir_if_made("src")
    return [first] if fallback is None or fallback == first else [first, fallback]


def _write_in(d: Path, name: str, text: str) -> Path:
    path = d / name
    try:
        if trust.read_bytes(path) == text.encode():
            return path
    except OSError:
        pass
    trust.atomic_write(path, text)
    return path


def write(text: str, prefix: str = "") -> tuple[str, Path]:
    """(sha256, path) of `text` written to the source cache (once)."""
    h = digest(text)
    d = src_dir()
    try:
        return h, _write_in(d, f"{prefix}{h}.py", text)
    except OSError as e:  # a read-only or full cache: the process's own directory
        trust.warn_once(f"src-write:{d}", f"cuteforge: cannot write rendered templates to {d} ({e}); "
                        "they go to a private temporary directory for this process")
        return h, _write_in(trust.process_temp_dir("src"), f"{prefix}{h}.py", text)


def write_meta(source: Path, meta: dict[str, Any]) -> None:
    """The `.json` beside a rendered source (`cuteforge show` reads it), once; best effort."""
    path = source.with_suffix(".json")
    if os.path.lexists(path):
        return
    try:
        trust.atomic_write(path, json.dumps(meta))
    except OSError:  # a missing description only costs `cuteforge show` this kernel
        pass


def module_name(h: str, prefix: str = "m") -> str:
    return f"{PACKAGE}.{prefix}{h}"


def _verified(h: str, prefix: str) -> tuple[Path, str]:
    """The source `<prefix><h>.py` and its text, which must hash to `h`."""
    if not _HEX.fullmatch(h):
        raise ValueError(f"cuteforge: {h!r} is not a generated source digest")
    missing = None
    for d in _dirs():
        path = d / f"{prefix}{h}.py"
        try:
            raw = trust.read_bytes(path)
        except FileNotFoundError:
            missing = missing or path
            continue
        if hashlib.sha256(raw).hexdigest() != h:
            raise ImportError(f"cuteforge: generated source {path} does not match its digest (altered); not importing it")
        return path, raw.decode()
    raise FileNotFoundError(f"cuteforge: generated source {missing} is missing (was the cache cleared?)")


class _Loader(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Imports `cuteforge.templates.generated.{m,v}<sha256>` from its verified source text."""

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        tail = fullname.removeprefix(PACKAGE + ".")
        if tail == fullname or tail[:1] not in ("m", "v") or not _HEX.fullmatch(tail[1:]):
            return None
        return importlib.machinery.ModuleSpec(fullname, self, origin=tail)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return None

    def exec_module(self, module: ModuleType) -> None:
        tail = module.__name__.rpartition(".")[2]
        path, text = _verified(tail[1:], "v" if tail[0] == "v" else "")
        module.__file__ = str(path)
        exec(compile(text, str(path), "exec", dont_inherit=True), module.__dict__)


_LOADER = _Loader()
if not any(isinstance(f, _Loader) for f in sys.meta_path):
    sys.meta_path.append(_LOADER)


def load(h: str, prefix: str = "") -> ModuleType:
    """Import the cached source `<prefix><h>.py` (once per process)."""
    name = module_name(h, prefix or "m")
    with _lock:
        mod = _modules.get(name) or sys.modules.get(name)
        if mod is None:
            _verified(h, prefix)  # a clear error for a missing or altered file
            mod = importlib.import_module(name)
        _modules[name] = mod
        return mod


def list_sources() -> list[Path]:
    d = src_dir()
    return sorted(d.glob("*.py"), key=lambda p: p.stat().st_mtime, reverse=True)
