"""The ops' memos of plans by call layout: plain dicts (a warm call's lookup stays the
interpreter's exact-dict fast path), each bounded by `remember`; `EagerPath`, what the
pointwise ops' eager memos hold per layout."""

from __future__ import annotations

from collections.abc import Callable
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


class EagerPath:
    """A layout's eager C path, what an op's memo holds for it: ``run``, the forward's C
    launch (`native.launch.runner`; None where the C launch is turned off,
    `CUTEFORGE_NATIVE_LAUNCH=0`: the op launches from Python), and the C++ autograd node's
    plan, made by ``make_plan`` from the layout's first call with grad (no-grad calls never
    build the backward)."""

    __slots__ = ("run", "_plan", "_make_plan")

    def __init__(self, run: Any, make_plan: Callable[..., Any]) -> None:
        self.run, self._plan, self._make_plan = run, None, make_plan

    def plan(self, *tensors: Any) -> Any:
        """The node's plan, made from this call's tensors (of the memo key's layout) at the first."""
        if self._plan is None:
            self._plan = self._make_plan(*tensors)
        return self._plan
