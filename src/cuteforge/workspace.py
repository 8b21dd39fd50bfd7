"""Per-stream device workspaces for kernels that keep counters or flags across CTAs.

Such a kernel needs its counters zero when a launch starts and sets them back to zero
before it ends, so two launches may share a workspace only if they cannot overlap. Eager
calls therefore get one workspace per (owner, device, current stream), allocated zeroed on
first use on that stream (by `persistent`) and kept (launches on one stream run in
order); a larger request replaces it with a larger zeroed one. Under CUDA-graph capture
each call gets its own, with the leading `zero_words` zeroed by a captured memset (the
graph zeroes them at every replay; the memory comes from the graph's private pool), so
graphs never share counters with each other or with eager calls and may be replayed on
any stream.

Tensors kept across calls (the eager workspaces, and the ops' other per-device constants
through `persistent`) are allocated by a helper thread: a memory pool that routes this
thread's allocations, as CUDA-graph trees do while they warm a graph up (torch.compile's
"reduce-overhead" and "max-autotune"), would otherwise own them, and the graph trees
refuse a live tensor in their pool that is not one of the graph's outputs.

Not covered: a stream whose handle is reused by a new stream while launches of the old
one are still pending (an `ExternalStream` destroyed early) shares the old one's
workspace.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

import torch

_capturing = torch._C._cuda_isCurrentStreamCapturing
_raw_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None)  # absent from CPU builds

_WORK: dict[tuple[str, int, int], torch.Tensor] = {}
_MAX_WORK = 64  # (owner, device, stream) entries kept before the dict is cleared
_MIN_WORDS = 1 << 16  # eager workspaces are powers of two from 256 KiB: few regrowths


def stream_workspace(owner: str, device: int, words: int, zero_words: int) -> torch.Tensor:
    """An int32 workspace of at least `words` for `owner`'s kernels on the current stream
    of `device` (module doc). Its first `zero_words` words are zero when the launch that
    uses it starts, provided every launch leaves them zero."""
    if _capturing():
        w = torch.empty(words, dtype=torch.int32, device=device)
        w[:zero_words].zero_()
        return w
    key = (owner, device, _raw_stream(device))
    w = _WORK.get(key)
    if w is None or w.shape[0] < words:
        if len(_WORK) >= _MAX_WORK:
            _WORK.clear()  # each is recorded on the stream it served: freed after its launches
        # zeroed before it is returned (persistent); a replaced smaller one is freed after
        # the launches queued on its stream before this one
        size = 1 << max(_MIN_WORDS.bit_length() - 1, (words - 1).bit_length())
        w = _WORK[key] = persistent(device, lambda: torch.zeros(size, dtype=torch.int32, device=device))
    return w


def persistent(device: torch.device | int | str | None, make: Callable[[], torch.Tensor]) -> torch.Tensor:
    """`make()`, a tensor on `device` to keep across calls, allocated outside any memory
    pool that routes this thread's allocations (module doc): by a helper thread, its
    stream work finished before it returns, the tensor recorded on this thread's current
    stream (so that the allocator reuses its memory only after the work queued there).
    The helper zeroes on the device's default stream and waits for it, which also waits
    for the work queued on the device's other blocking streams: a stall at a first
    allocation (a few per process), none on later calls. Under CUDA-graph capture,
    `make()` itself, and for a tensor off CUDA (`device` None or not a CUDA device)."""
    if isinstance(device, str):
        device = torch.device(device)
    if device is None or (isinstance(device, torch.device) and device.type != "cuda") or _capturing():
        return make()
    # the caller's device where none is named: the helper thread's current device is its own
    index = device if isinstance(device, int) else (device.index if device.index is not None else torch.cuda.current_device())
    made: list[torch.Tensor | BaseException] = []

    def run() -> None:
        try:
            with torch.cuda.device(index):
                made.append(make())
                torch.cuda.current_stream(index).synchronize()
        except BaseException as e:  # raised in the caller's thread
            made.append(e)

    helper = threading.Thread(target=run, name="cuteforge-persistent-alloc")
    helper.start()
    helper.join()
    out = made[0]
    if isinstance(out, BaseException):
        raise out
    out.record_stream(torch.cuda.current_stream(index))
    return out
