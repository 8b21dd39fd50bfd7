"""Swaps of a function that transformers' modeling code calls by its global name.

A modeling module (``transformers.models.llama.modeling_llama`` and its relatives) calls
helpers such as ``apply_rotary_pos_emb`` and ``create_causal_mask`` by module-global
name, so there is no per-model hook: the swap is made in the module, and held for as long
as a patched model needs it. Each swap counts the models holding it and is undone by the
last one's undo, unless someone replaced the function since (then it is left as they set
it). A patched model dropped without its undo keeps its hold: the swaps act only for
patched models' calls, and putting a function back when the collector happens to run
could change it under a torch.compile trace of another model.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType
from typing import Any


@dataclass
class _Swap:
    original: Callable[..., Any]  # the module's own function
    ours: Callable[..., Any]
    models: int  # patched models holding the swap


_SWAPS: dict[tuple[ModuleType, str], _Swap] = {}


def parameters(fn: Callable[..., Any]) -> list[str]:
    """fn's parameter names ([] where they cannot be read)."""
    try:
        return list(inspect.signature(fn).parameters)
    except (TypeError, ValueError):
        return []


def swap(module: ModuleType | None, name: str, make: Callable[[Callable[..., Any]], Callable[..., Any] | str]
         ) -> tuple[str | None, Callable[[], None] | None]:
    """Hold ``module.<name>`` swapped for ``make(original)`` (made at the first hold; a str
    from ``make`` says why the function cannot be swapped). Returns (why not, None) or
    (None, undo: this hold's release, once)."""
    current = getattr(module, name, None)
    if module is None or not callable(current):
        return f"{getattr(module, '__name__', module)} has no {name}", None
    held = _SWAPS.get((module, name))
    if held is not None and current is not held.ours:
        return f"{module.__name__}.{name} was replaced since cuteforge swapped it", None
    if held is None:
        ours = make(current)
        if isinstance(ours, str):
            return ours, None
        ours.__wrapped__ = current  # type: ignore[attr-defined]
        held = _SWAPS[(module, name)] = _Swap(current, ours, 0)
        setattr(module, name, ours)
    held.models += 1
    released = False

    def undo() -> None:
        nonlocal released
        if released:
            return
        released = True
        held.models -= 1
        if held.models == 0:
            del _SWAPS[(module, name)]
            if getattr(module, name, None) is held.ours:  # not replaced since
                setattr(module, name, held.original)

    return None, undo
