"""GPU timing for the autotuner: one CUDA graph of many launches per config, L2-cold.

A timer is any callable `timer(config, fn, input_sets) -> ms per launch`; the tuner calls
it once per sample and does the interleaving and the median itself, so tests can inject
a fake one. The default `GraphTimer`:

* rotates over input sets: copies of the call's tensors, as many as it takes for the
  sets together to span >= 3x the L2 cache (a set larger than that is used alone: one
  launch streams it through L2 and evicts its own start);
* on the first sample of a config, warms it up and captures `n` launches (cycling the
  sets) into one CUDA graph, `n` sized so that a replay lasts about `graph_ms`;
* a sample replays the graph once between two CUDA events and divides by `n`.

Where capture fails, a sample times the same `n` launches with events around them
(`mode == "events"`), which adds the launch overhead but keeps the comparison fair.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

Timer = Callable[[Any, Callable[..., Any], Sequence[tuple[Any, ...]]], float]


def make_input_sets(tensors: Sequence[Any], min_bytes_factor: float = 3.0, max_sets: int = 64, mem_fraction: float = 0.4) -> list[tuple[Any, ...]]:
    """The call's tensors plus copies (same strides and 16-byte alignment class) so that all
    sets together span `min_bytes_factor` x L2. Copies are capped by `max_sets` and by
    `mem_fraction` of the free device memory."""
    import torch

    tensors = tuple(tensors)
    cuda = [t for t in tensors if isinstance(t, torch.Tensor) and t.is_cuda]
    if not cuda:
        return [tensors]
    dev = cuda[0].device
    l2 = getattr(torch.cuda.get_device_properties(dev), "L2_cache_size", 50 << 20)
    set_bytes = sum(_extent(t) * t.element_size() for t in cuda) or 1
    want = max(1, math.ceil(min_bytes_factor * l2 / set_bytes))
    free, _ = torch.cuda.mem_get_info(dev)
    n = max(1, min(want, max_sets, int(free * mem_fraction // set_bytes) + 1))
    sets = [tensors]
    for _ in range(n - 1):
        sets.append(tuple(_copy(t) if isinstance(t, torch.Tensor) and t.is_cuda else t for t in tensors))
    return sets


def _extent(t: Any) -> int:
    """Elements a tensor's view spans (its own sizes and strides, not its whole storage)."""
    if t.numel() == 0:
        return 0
    return 1 + sum((n - 1) * abs(s) for n, s in zip(t.size(), t.stride()))


def _copy(t: Any) -> Any:
    import torch

    # Same sizes and strides at offset 0 of a fresh (256-byte aligned) buffer: at least
    # as aligned as the original, so the kernel's divisibility assumptions hold.
    base = torch.empty(max(_extent(t), 1), dtype=t.dtype, device=t.device)
    c = base.as_strided(t.size(), t.stride(), 0)
    c.copy_(t)
    return c


@dataclass
class _State:
    n: int
    graph: Any = None  # torch.cuda.CUDAGraph, or None: time with events
    run: Callable[[], None] | None = None


class GraphTimer:
    """The default timer (see the module docstring). `mode`: 'graph' or 'events'."""

    def __init__(self, graph_ms: float = 5.0, max_launches: int = 200, use_graphs: bool = True) -> None:
        self.graph_ms = graph_ms
        self.max_launches = max_launches
        self.use_graphs = use_graphs
        self._states: dict[Any, _State] = {}
        self.modes: dict[Any, str] = {}
        self.capture_errors: dict[Any, str] = {}

    @property
    def mode(self) -> str:
        m = set(self.modes.values())
        return m.pop() if len(m) == 1 else "mixed" if m else ""

    def __call__(self, config: Any, fn: Callable[..., Any], input_sets: Sequence[tuple[Any, ...]]) -> float:
        import torch

        st = self._states.get(config)
        if st is None:
            st = self._states[config] = self._prepare(config, fn, input_sets)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        if st.graph is not None:
            st.graph.replay()
        else:
            assert st.run is not None
            st.run()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / st.n

    def _prepare(self, config: Any, fn: Callable[..., Any], input_sets: Sequence[tuple[Any, ...]]) -> _State:
        import torch

        k = len(input_sets)

        def run_n(n: int) -> None:
            for i in range(n):
                fn(*input_sets[i % k])

        run_n(k)  # warm-up: every set once (first touch, lazy module load)
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        run_n(max(k, 5))
        end.record()
        end.synchronize()
        est = max(start.elapsed_time(end) / max(k, 5), 1e-4)
        n = max(1, min(self.max_launches, math.ceil(self.graph_ms / est)))
        n = max(k, k * math.ceil(n / k)) if n > k else n
        if self.use_graphs:
            try:
                g = torch.cuda.CUDAGraph()
                side = torch.cuda.Stream()
                side.wait_stream(torch.cuda.current_stream())
                with torch.cuda.stream(side):
                    run_n(1)
                torch.cuda.current_stream().wait_stream(side)
                with torch.cuda.graph(g):
                    run_n(n)
                g.replay()  # the first replay uploads the graph
                torch.cuda.synchronize()
                self.modes[config] = "graph"
                return _State(n, graph=g)
            except Exception as e:  # capture is not possible for this kernel: time with events
                self.capture_errors[config] = f"{type(e).__name__}: {e}"
                torch.cuda.synchronize()
        self.modes[config] = "events"
        return _State(n, run=lambda: run_n(n))

    def warmup(self, ms: float = 200.0) -> None:
        """Bring the GPU to its steady clock/thermal state: replay captured graphs for `ms`."""
        import torch

        states = list(self._states.values())
        if not states:
            return
        t0 = time.perf_counter()
        i = 0
        while (time.perf_counter() - t0) * 1e3 < ms:
            st = states[i % len(states)]
            st.graph.replay() if st.graph is not None else st.run()  # type: ignore[misc]
            torch.cuda.synchronize()
            i += 1

    def close(self) -> None:
        self._states.clear()
