"""What every command shares: the one-line error, the target arch flag, progress on
stderr, wide tables off a terminal, and `--param NAME=VALUE` parsing."""

from __future__ import annotations

import contextlib
import os
import shutil
import sys
from typing import Any

EXIT_USAGE = 2


class CliError(Exception):
    """A failure to report as one line with exit code 2."""


def _set_arch(arch: str | None) -> None:
    if arch:
        from ..arch import parse_arch

        parse_arch(arch)
        os.environ["CUTEFORGE_ARCH"] = arch
        os.environ["CUTE_DSL_ARCH"] = arch


class Progress:
    """Progress on stderr: a rich bar on a terminal, plain lines otherwise (a log, CI)."""

    def __init__(self, title: str, total: int, enabled: bool = True) -> None:
        self.title, self.total, self.done, self.enabled = title, total, 0, enabled
        self.tty = sys.stderr.isatty()
        self._bar: Any = None
        self._stack = contextlib.ExitStack()

    def __enter__(self) -> Progress:
        if self.enabled and self.tty:
            from rich.console import Console
            from rich.progress import Progress as RichProgress

            self._bar = self._stack.enter_context(RichProgress(console=Console(stderr=True), transient=True))
            self._task = self._bar.add_task(self.title, total=self.total)
        elif self.enabled:
            print(f"{self.title}: {self.total} to do", file=sys.stderr, flush=True)
        return self

    def advance(self, what: str) -> None:
        self.done += 1
        if self._bar is not None:
            self._bar.update(self._task, advance=1, description=f"{self.title}: {what}")
        elif self.enabled:
            print(f"[{self.done}/{self.total}] {what}", file=sys.stderr, flush=True)

    def __exit__(self, *exc: object) -> None:
        self._stack.close()


def note(text: str) -> None:
    """A progress note on stderr (what a long step is doing)."""
    print(text, file=sys.stderr, flush=True)


def _mib(n: float) -> str:
    return f"{n / 2**20:.1f} MiB"


def _console() -> Any:
    from rich.console import Console

    # off a terminal rich would assume 80 columns and cut names: use the real width or a wide one
    return Console(width=None if sys.stdout.isatty() else max(shutil.get_terminal_size((160, 24)).columns, 160))


def _number(text: str) -> Any:
    """'4' -> 4, '3.0' / '1e-5' -> float, anything else stays text."""
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


def _params(items: list[str] | None) -> dict[str, Any]:
    """--param NAME=VALUE pairs: integers as int, anything else as text."""
    out: dict[str, Any] = {}
    for item in items or []:
        name, sep, value = item.partition("=")
        if not sep or not name:
            raise ValueError(f"--param {item!r}: expected NAME=VALUE, e.g. act=gelu")
        out[name.strip()] = _number(value.strip())
    return out
