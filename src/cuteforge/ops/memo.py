"""The ops' memos of plans by call layout: plain dicts (a warm call's lookup stays the
interpreter's exact-dict fast path), each bounded by `remember`."""

from __future__ import annotations

from typing import Any, TypeVar

V = TypeVar("V")

MAX_PLANS = 4096  # per memo


def remember(memo: dict[Any, Any], key: Any, value: V, limit: int = MAX_PLANS) -> V:
    """``memo[key] = value``, returned; a full memo is emptied first (a process that meets
    endlessly many layouts stays bounded, and the warm ones come back at their next call)."""
    if len(memo) >= limit:
        memo.clear()
    memo[key] = value
    return value
