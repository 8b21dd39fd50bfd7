"""Which patched model's decoder call is under way.

The functions `patch` swaps in a transformers modeling module (`module_functions`) serve
every model of that type in the process, so each acts only inside a patched model's
decoder call and hands any other call to the module's own function. `mark` wraps a
decoder's forward on the instance to record, for the length of the call, its config and
whether it made its own position ids (the caller passed none).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from . import module_functions

# A dict: torch 2.11's Dynamo traces a dict item's assignment where it refuses a class
# attribute's (the graph broke), and the marks are set inside compiled decoder calls.
_CALL: dict[str, Any] = {"config": None, "own_positions": False}


def in_patched_call() -> bool:
    """Whether a patched model's decoder call is under way."""
    return _CALL["config"] is not None


def own_positions(config: Any) -> bool:
    """Whether the patched decoder call under way is ``config``'s and made its own position ids."""
    return _CALL["config"] is config and _CALL["own_positions"]


def mark(decoder: Any) -> tuple[str | None, Callable[[], None] | None]:
    """Wrap ``decoder``'s forward (on the instance) to mark its calls. Returns (why not,
    None) or (None, undo)."""
    if not isinstance(decoder, torch.nn.Module) or not hasattr(decoder, "config"):
        return "the model has no decoder `model` with a config", None
    names = module_functions.parameters(decoder.forward)
    if "position_ids" not in names or "forward" in vars(decoder):
        return f"{type(decoder).__name__}.forward takes no position_ids or is wrapped already", None
    position = names.index("position_ids")
    original = decoder.forward

    def forward(*args: Any, **kwargs: Any) -> Any:
        made_here = (args[position] if len(args) > position else kwargs.get("position_ids")) is None
        previous = _CALL["config"], _CALL["own_positions"]
        _CALL["config"], _CALL["own_positions"] = decoder.config, made_here
        try:
            return original(*args, **kwargs)
        finally:
            _CALL["config"], _CALL["own_positions"] = previous

    decoder.forward = forward

    def undo() -> None:
        if vars(decoder).get("forward") is forward:
            del decoder.forward

    return None, undo
