"""`cuteforge ARGS...` with a deterministic `Measurement` in place of the GPU: no tensors, no
compile, no check, and a timer whose milliseconds are a hash of (kernel, key, params,
config). Every sweep this process runs is appended to `$FAKE_TUNE_LOG/<RANK or single>.log`
(one line: the kernel, the problem's key and its candidate count). Run under torchrun for
`cuteforge tune --distributed`, or alone for the single-process reference."""

from __future__ import annotations

import hashlib
import os
import sys
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from cuteforge.autotune.measure import Measurement, use_measurement


class _Stub:
    """What `ready` hands the tuner for a candidate: never launched, only timed."""

    def __init__(self, kernel: str, item: tuple[Any, Any, Any]) -> None:
        self.kernel, self.item = kernel, item

    def __call__(self, *args: Any) -> None:
        raise AssertionError("a fake-measured candidate was launched")


def fake_ms(fn: _Stub, config: Any) -> float:
    key, params, _ = fn.item
    digest = hashlib.sha256(f"{fn.kernel}|{key!r}|{params!r}|{config!r}".encode()).hexdigest()
    return 0.01 + int(digest[:8], 16) % 10_000 / 1e5


class FakeMeasurement(Measurement):
    needs_gpu = False

    def __init__(self, log: Path) -> None:
        self.log = log

    def tensors(self, make: Callable[[], tuple[Any, ...]]) -> tuple[Any, ...]:
        return ()

    def expected(self, reference: Callable[..., Any], tensors: Sequence[Any]) -> Any:
        return None

    def ready(self, kernel: Any, items: Sequence[tuple[Any, Any, Any]], arch: str,
              workers: int | None) -> Iterator[tuple[Any, Any, str, float, str | None]]:
        with self.log.open("a") as f:
            f.write(f"{kernel.name}\t{items[0][0]!r}\t{len(items)}\n")
        for it in items:
            yield it, _Stub(kernel.name, it), "loaded", 0.0, None

    def timer(self) -> Callable[[Any, Any, Any], float]:
        return lambda config, fn, input_sets: fake_ms(fn, config)


def main(argv: list[str]) -> int:
    from cuteforge.cli import main as cli_main

    logs = Path(os.environ["FAKE_TUNE_LOG"])
    logs.mkdir(parents=True, exist_ok=True)
    with use_measurement(FakeMeasurement(logs / f"{os.environ.get('RANK', 'single')}.log")):
        return cli_main(argv)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
