"""How the tuner measures candidates on this machine: the seam between `tune()` and the GPU.

`tune()` and `cuteforge tune` (distributed or not) ask the current `Measurement` for the
problem's tensors, the reference's expected outputs, the candidates' loaded functions (each
compiled or read from the kernel cache), the correctness check and the timer. The default
measures for real: tensors on the current CUDA device, `iter_ready` (GPU-blind compile
workers), the reference check, `GraphTimer`. Everything else in a sweep (candidates,
validation, rounds, medians, the pick, the tuning store) stays the tuner's own, so a
`Measurement` that times deterministically (`use_measurement`) runs the whole tuning flow
where there is no GPU: tests of the command, of the distributed split, of the store.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

from ..kernel import Kernel
from ..timing.graphs import GraphTimer, Timer, make_input_sets
from .candidates import iter_ready

Item = tuple[Any, Any, Any]  # (key, params, config)


class Measurement:
    """The real measurement (GPU). Subclass and override to measure otherwise."""

    needs_gpu = True  # False: tuning runs where kernels cannot launch (no GPU of the target)

    def tensors(self, make: Callable[[], tuple[Any, ...]]) -> tuple[Any, ...]:
        """The problem's call arguments, from its factory's `make_tensors`."""
        return tuple(make())

    def expected(self, reference: Callable[..., Any], tensors: Sequence[Any]) -> Any:
        """The reference's output(s), or None to skip the check."""
        return reference(*tensors)

    def input_sets(self, tensors: Sequence[Any]) -> list[tuple[Any, ...]]:
        """What the timer rotates over."""
        import torch

        if any(isinstance(t, torch.Tensor) and t.is_cuda for t in tensors):
            return make_input_sets(tensors)
        return [tuple(tensors)]

    def ready(self, kernel: Kernel, items: Sequence[Item], arch: str,
              workers: int | None) -> Iterable[tuple[Item, Any, str, float, str | None]]:
        """(item, function or None, 'loaded' | 'compiled' | 'failed', ms, error) per candidate."""
        return iter_ready(kernel, items, arch, workers)

    def check(self, fn: Any, tensors: Sequence[Any], out_idx: Sequence[int], expected: Any, rtol: float | None,
              atol: float | None, names: Sequence[str] = ()) -> str | None:
        """Run once against the expected outputs; the mismatch, or None."""
        return check_outputs(fn, tensors, out_idx, expected, rtol, atol, names)

    def timer(self) -> Timer:
        """A fresh timer for one sweep."""
        return GraphTimer()


_lock = threading.Lock()
_current: list[Measurement] = [Measurement()]


def measurement() -> Measurement:
    """The measurement `tune()` uses now."""
    return _current[-1]


@contextlib.contextmanager
def use_measurement(m: Measurement) -> Iterator[Measurement]:
    """Tune with `m` inside the block (process-wide)."""
    with _lock:
        _current.append(m)
    try:
        yield m
    finally:
        with _lock:
            _current.remove(m)


def _tolerance(dtype: Any) -> tuple[float, float]:
    import torch

    if not dtype.is_floating_point:
        return 0.0, 0.0
    return (1e-3, 1e-3) if dtype in (torch.float32, torch.float64) else (2e-2, 2e-2)


def check_outputs(fn: Any, tensors: Sequence[Any], out_idx: Sequence[int], expected: Any, rtol: float | None,
                  atol: float | None, names: Sequence[str] = ()) -> str | None:
    """Run once on the call's tensors (outputs poisoned first); the mismatch, or None."""
    import torch

    exp = list(expected) if isinstance(expected, (tuple, list)) else [expected]
    for i in out_idx:
        tensors[i].fill_(float("nan") if tensors[i].dtype.is_floating_point else -7)
    fn(*tensors)
    torch.cuda.synchronize()
    for i, e in zip(out_idx, exp):
        got = tensors[i]
        r, a = _tolerance(got.dtype)
        try:
            torch.testing.assert_close(got, e.to(got.dtype), rtol=r if rtol is None else rtol, atol=a if atol is None else atol, equal_nan=True)
        except AssertionError as err:
            return f"wrong result in {names[i] if i < len(names) else i!r}: " + " ".join(str(err).split())[:400]
    return None
