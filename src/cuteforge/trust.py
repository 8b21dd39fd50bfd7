"""What cuteforge trusts on disk, decided in one place.

Loading a compiled object, importing a rendered source, loading the C++ extension or
acting on a tuning record runs or trusts what a file says, so every such path lives under
a root that only this user can write, and is reached through this module:

- the root (symlinks to it resolved, each owned by this user or root) is a directory owned
  by this user (or root) that no one else can write, under directories (every one up to
  `/`) that no one else can rename it out of; it is created 0700;
- every component below it is a real directory or file, never a symlink, owned by this
  user (or root) and writable by no one else; directories are created 0700, files 0600;
- files are written whole: a private temporary file renamed over the target (`os.replace`
  replaces a link instead of following it).

A path that fails a check raises `UntrustedPath` (an `OSError`, so callers that survive
an unwritable disk survive a refused one the same way). Callers fall back to memory or a
private temporary directory and say so once per process (`warn_once`).
"""

from __future__ import annotations

import atexit
import math
import os
import shutil
import stat
import tempfile
import threading
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

_warned: set[str] = set()
_lock = threading.Lock()
FIX = "make it a directory of your own with mode 700, or point CUTEFORGE_CACHE_DIR at one"


class UntrustedPath(OSError):
    """A path that may hold another user's code: refused."""


def warn_once(topic: str, message: str, stacklevel: int = 3) -> None:
    """Warn about `topic` once per process."""
    with _lock:
        if topic in _warned:
            return
        _warned.add(topic)
    warnings.warn(message, RuntimeWarning, stacklevel=stacklevel)


def _uid() -> int | None:
    return os.getuid() if hasattr(os, "getuid") else None


def _check_stat(st: os.stat_result, path: Path | str, what: str) -> None:
    uid = _uid()
    # root's files are as trusted as the installed package; anyone else's are not
    if uid is not None and st.st_uid not in (uid, 0):
        raise UntrustedPath(f"{what} {path} is owned by uid {st.st_uid}, neither this user (uid {uid}) nor root")
    if st.st_mode & 0o022:
        raise UntrustedPath(f"others can write to {what} {path} (mode {oct(st.st_mode & 0o777)})")


def _check_ancestor(d: Path, root: Path) -> None:
    """Raise unless no one but this user (or root) can rename entries of directory `d`."""
    st = os.lstat(d)
    if not stat.S_ISDIR(st.st_mode):
        raise UntrustedPath(f"the path to the cache root {root} changed while it was checked ({d} is not a directory)")
    uid = _uid()
    if uid is not None and st.st_uid not in (uid, 0):
        raise UntrustedPath(f"others can rename the cache root {root}: {d} is owned by uid {st.st_uid}, "
                            f"neither this user (uid {uid}) nor root")
    # In a directory others can write without the sticky bit, they could swap what lies below.
    if st.st_mode & 0o022 and not st.st_mode & stat.S_ISVTX:
        raise UntrustedPath(f"others can rename the cache root {root}: {d} is writable by them (mode {oct(st.st_mode & 0o7777)})")


_MAX_LINKS = 40


def _resolve(path: Path) -> Path:
    """`path` absolute with its links followed (as `os.path.realpath`), refusing a link owned by
    another user or sitting in a directory others can rename it in; a missing tail is kept as named."""
    uid = _uid()
    if uid is None:
        return Path(os.path.realpath(path))
    todo = list(reversed((Path.cwd() / path).parts))  # not normalized: ".." is taken after links, as the kernel does
    real = Path(todo.pop())
    links = 0
    while todo:
        name = todo.pop()
        if name in ("", "."):
            continue
        if name == "..":
            real = real.parent
            continue
        nxt = real / name
        try:
            st = os.lstat(nxt)
        except FileNotFoundError:
            return Path(os.path.normpath(nxt.joinpath(*reversed(todo))))
        if not stat.S_ISLNK(st.st_mode):
            real = nxt
            continue
        links += 1
        if links > _MAX_LINKS:
            raise UntrustedPath(f"too many symbolic links resolving {path}")
        if st.st_uid not in (uid, 0):
            raise UntrustedPath(f"the cache root {path} is reached through the symbolic link {nxt}, owned by uid "
                                f"{st.st_uid}, neither this user (uid {uid}) nor root")
        _check_ancestor(real, Path(path))
        target = Path(os.readlink(nxt))
        if target.is_absolute():
            real = Path(target.anchor)
        todo.extend(reversed(target.parts[1:] if target.is_absolute() else target.parts))
    return real


def _mkdirs(path: Path) -> None:
    """Create `path` and its missing parents 0700 (no one else may write an ancestor of a root)."""
    missing = []
    while not os.path.lexists(path) and path != path.parent:
        missing.append(path)
        path = path.parent
    for d in reversed(missing):
        try:
            os.mkdir(d, 0o700)
        except FileExistsError:
            pass


def check_root(root: Path) -> Path:
    """`root` (created 0700 when missing) resolved to a real directory this user alone can
    write, every directory above it safe from others renaming its entries; raises
    UntrustedPath or OSError otherwise."""
    real = _resolve(root)
    if not os.path.lexists(real):
        _mkdirs(real)
        real = _resolve(real)
    st = os.lstat(real)
    if not stat.S_ISDIR(st.st_mode):
        raise UntrustedPath(f"the cache root {real} is not a directory")
    _check_stat(st, real, "the cache root")
    for d in real.parents:
        _check_ancestor(d, real)
    return real


def _part(name: str) -> str:
    if not name or name in (".", "..") or "/" in name or (os.altsep and os.altsep in name) or "\0" in name:
        raise ValueError(f"not a single path component: {name!r}")
    return name


def private_dir(root: Path, *parts: str, create: bool = True) -> Path:
    """`root/parts...` with the root and every component checked (created 0700 where
    missing, else FileNotFoundError without `create`); raises UntrustedPath or OSError."""
    path = check_root(root)
    for name in parts:
        path = path / _part(name)
        if create:
            try:
                os.mkdir(path, 0o700)
            except FileExistsError:
                pass
        st = os.lstat(path)
        if stat.S_ISLNK(st.st_mode):
            raise UntrustedPath(f"{path} is a symbolic link")
        if not stat.S_ISDIR(st.st_mode):
            raise UntrustedPath(f"{path} is not a directory")
        _check_stat(st, path, "directory")
    return path


def check_file(path: Path, st: os.stat_result | None = None) -> None:
    """Raise UntrustedPath unless `path` is a regular file (not a link) of this user that
    no one else can write; FileNotFoundError when it is absent."""
    st = st if st is not None else os.lstat(path)
    if stat.S_ISLNK(st.st_mode):
        raise UntrustedPath(f"{path} is a symbolic link")
    if not stat.S_ISREG(st.st_mode):
        raise UntrustedPath(f"{path} is not a regular file")
    _check_stat(st, path, "file")


def open_nofollow(path: Path) -> int:
    """A read-only descriptor of `path`, not through a link at its last component and
    without blocking: a FIFO's open would wait for a writer (check the type, then read)."""
    return os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_NONBLOCK", 0))


def finite_number(v: Any) -> bool:
    """Whether a value read from a file is a finite int or float (not a bool); an int too
    large for a float is not."""
    try:
        return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
    except OverflowError:
        return False


def read_bytes(path: Path) -> bytes:
    """The contents of a file that passes `check_file`, read without following a link."""
    try:
        fd = open_nofollow(path)
    except OSError as e:
        if os.path.islink(path):
            raise UntrustedPath(f"{path} is a symbolic link") from e
        raise
    with os.fdopen(fd, "rb") as f:
        check_file(path, os.fstat(f.fileno()))
        os.set_blocking(f.fileno(), True)
        return f.read()


def read_text(path: Path) -> str:
    return read_bytes(path).decode()


def atomic_write_with(path: Path, write: Callable[[str], None]) -> None:
    """`write(tmp)` fills a private temporary file beside `path`, which then replaces
    `path` in one rename: readers see the old file or the whole new one, never a part."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    try:
        write(tmp)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def atomic_write(path: Path, data: bytes | str) -> None:
    """Write `data` to `path` whole (see `atomic_write_with`)."""
    raw = data.encode() if isinstance(data, str) else data
    atomic_write_with(path, lambda tmp: Path(tmp).write_bytes(raw))


_temp_dirs: dict[str, Path] = {}


def _is_private_temp(d: Path) -> bool:
    """Whether `d` is still a real directory of this user that no one else can enter."""
    try:
        st = os.lstat(d)
    except OSError:
        return False
    uid = _uid()
    return stat.S_ISDIR(st.st_mode) and (uid is None or st.st_uid == uid) and not st.st_mode & 0o077


def _remove_temp(d: Path) -> None:
    if _is_private_temp(d):  # a directory someone else made under that name is not ours to remove
        shutil.rmtree(d, True)


def process_temp_dir(purpose: str) -> Path:
    """A private temporary directory for this process (one per purpose), removed at exit:
    where files go when the cache root is refused. One that is gone, or that is no longer a
    private directory of this user (a cleaner removed it and someone else made the name), is
    replaced by a fresh one."""
    with _lock:
        d = _temp_dirs.get(purpose)
        if d is None or not _is_private_temp(d):
            d = Path(tempfile.mkdtemp(prefix=f"cuteforge-{purpose}-"))
            _temp_dirs[purpose] = d
            atexit.register(_remove_temp, d)
        return d


def temp_dir_if_made(purpose: str) -> Path | None:
    """This process's temporary directory for `purpose`, if `process_temp_dir` made one
    and it is still private."""
    d = _temp_dirs.get(purpose)
    return d if d is not None and _is_private_temp(d) else None
