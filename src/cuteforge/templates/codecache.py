"""The source code cache: rendered templates as real files, imported from there.

CuTe DSL reads a `@cute.jit` function's source file (its preprocessor works on the AST),
so rendered code must live in a file. `write(text)` puts it at `<cache root>/src/<sha256>.py`
once (atomic `os.replace`; identical renders map to one file) and `load(digest)` imports
it as `cuteforge.templates.generated.m<sha256>`: identical renders share one module.
Compiled objects do not live here; they go through the kernel cache like any kernel's.

Compile workers (a fresh process) import generated modules by name, so
`cuteforge.templates.generated` is a package whose path is this directory.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import sys
import tempfile
import threading
from pathlib import Path
from types import ModuleType

from ..cache import cache_root

PACKAGE = "cuteforge.templates.generated"
_modules: dict[str, ModuleType] = {}
_lock = threading.Lock()


def src_dir() -> Path:
    d = cache_root() / "src"
    d.mkdir(parents=True, exist_ok=True, mode=0o700)
    return d


def digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def path_for(h: str, prefix: str = "") -> Path:
    return src_dir() / f"{prefix}{h}.py"


def write(text: str, prefix: str = "") -> tuple[str, Path]:
    """(sha256, path) of `text` written to the source cache (once)."""
    h = digest(text)
    path = path_for(h, prefix)
    try:
        if path.read_text() == text:
            return h, path
    except OSError:
        pass
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return h, path


def module_name(h: str, prefix: str = "m") -> str:
    return f"{PACKAGE}.{prefix}{h}"


def load(h: str, prefix: str = "") -> ModuleType:
    """Import the cached source `<prefix><h>.py` (once per process)."""
    name = module_name(h, prefix or "m")
    with _lock:
        mod = _modules.get(name) or sys.modules.get(name)
        if mod is not None:
            _modules[name] = mod
            return mod
        path = path_for(h, prefix)
        if not path.exists():
            raise FileNotFoundError(f"cuteforge: generated source {path} is missing (was the cache cleared?)")
        spec = importlib.util.spec_from_file_location(name, path)
        assert spec is not None and spec.loader is not None
        mod = importlib.util.module_from_spec(spec)
        sys.modules[name] = mod
        try:
            spec.loader.exec_module(mod)
        except BaseException:
            sys.modules.pop(name, None)
            raise
        _modules[name] = mod
        return mod


def list_sources() -> list[Path]:
    d = cache_root() / "src"
    return sorted(d.glob("*.py"), key=lambda p: p.stat().st_mtime, reverse=True) if d.is_dir() else []
