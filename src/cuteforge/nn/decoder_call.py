"""Which patched model's decoder, and which of its attention layers, is running.

The functions `patch` swaps in a transformers modeling module (`module_functions`) serve
every model of that type in the process, so each acts only inside a patched model's
calls and hands any other call to the module's own function. `mark` registers forward
hooks that record, for the length of a call, the decoder's config and whether it made
its own position ids (the caller passed none), and that one of its layers' attention
modules is running.

Hooks, not a wrapped forward: they receive the module they run for, so a deep copy of a
patched model (an EMA or reference model) marks its own calls. On the attention modules,
not the layers: gradient checkpointing recomputes a layer in the backward, outside the
decoder's call, through the layer's `forward` (transformers 5.24) or its `__call__`
(earlier), and either way calls the attention module, whose hooks mark the recompute
again, so it takes the same functions as the forward (its saved tensors must match).
The marks are a module-level dict: torch 2.11's Dynamo traces a dict item's assignment
where it refuses a class attribute's, and the decoder's hooks run inside compiled calls
(the attention marks are not written while Dynamo traces, below). The decoder's end
restores the attention count its start found, so a count left unbalanced (a graph break
between an attention module's hooks) lasts one decoder call at most. They are
per process, not per thread: patched models run from several threads at once are not
supported.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from . import module_functions

_CALL: dict[str, Any] = {"config": None, "own_positions": False, "attention": 0, "saved": []}


def in_patched_attention() -> bool:
    """Whether a patched model's attention module is running; never while torch.compile
    traces (the swapped functions' kernels take torch's expressions there anyway)."""
    return _CALL["attention"] > 0 and not torch.compiler.is_compiling()


def own_positions(config: Any) -> bool:
    """Whether the patched decoder call under way is ``config``'s and made its own position ids."""
    return _CALL["config"] is config and _CALL["own_positions"]


def _decoder_starts(position: int) -> Callable[..., None]:
    def hook(module: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        made_here = (args[position] if len(args) > position else kwargs.get("position_ids")) is None
        _CALL["saved"].append((_CALL["config"], _CALL["own_positions"], _CALL["attention"]))
        _CALL["config"], _CALL["own_positions"] = module.config, made_here

    return hook


def _decoder_ends(module: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], output: Any) -> None:
    _CALL["config"], _CALL["own_positions"], _CALL["attention"] = _CALL["saved"].pop()


# The attention marks are left alone while torch.compile traces: nothing reads them there
# (`in_patched_attention`), and a layer under gradient checkpointing is traced as one
# checkpointed region, in which Dynamo refuses a write to the marks as a side effect the
# recompute would not replay. The decoder's own hooks run outside any layer.
def _attention_starts(module: torch.nn.Module, args: tuple[Any, ...]) -> None:
    if not torch.compiler.is_compiling():
        _CALL["attention"] += 1


def _attention_ends(module: torch.nn.Module, args: tuple[Any, ...], output: Any) -> None:
    if not torch.compiler.is_compiling():
        _CALL["attention"] -= 1


def mark(decoder: Any) -> tuple[str | None, Callable[[], None] | None]:
    """Register the hooks that mark ``decoder``'s calls and its layers' attention modules'
    (``layer.self_attn``). Returns (why not, None) or (None, undo)."""
    if not isinstance(decoder, torch.nn.Module) or not hasattr(decoder, "config"):
        return "the model has no decoder `model` with a config", None
    names = module_functions.parameters(decoder.forward)
    layers = getattr(decoder, "layers", None)
    attention = [getattr(layer, "self_attn", None) for layer in layers] if isinstance(layers, torch.nn.ModuleList) else []
    if "position_ids" not in names or not attention or not all(isinstance(a, torch.nn.Module) for a in attention):
        return f"{type(decoder).__name__} takes no position_ids or has no `layers` with `self_attn`", None
    handles = [decoder.register_forward_pre_hook(_decoder_starts(names.index("position_ids")), with_kwargs=True),
               decoder.register_forward_hook(_decoder_ends, with_kwargs=True, always_call=True)]
    for module in attention:
        handles += [module.register_forward_pre_hook(_attention_starts),
                    module.register_forward_hook(_attention_ends, always_call=True)]

    def undo() -> None:
        for handle in handles:
            handle.remove()

    return None, undo
