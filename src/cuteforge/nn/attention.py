"""Causal SDPA for transformers models under torch.compile.

transformers builds an explicit (batch, 1, q, kv) boolean causal mask whenever its code is
traced, torch.compile included: a graph exported for one sequence length must not
hard-code ``is_causal``. SDPA then runs its masked kernel where eager mode runs the causal
one, several times slower in the backward (docs/nn.md). The skip below applies only where
the keys are the query's own tokens (no cache offset, the query as long as the keys), which
holds for every length a graph traced there can be called with, compiled or exported.

`IMPLEMENTATION` names an attention implementation that is transformers' ``"sdpa"`` with
that skip kept under torch.compile: the same attention function, and a mask function that
returns no mask for plain causal attention (no padding mask, no cache offset, no sliding
window or chunking, query as long as the keys) and defers to transformers' ``sdpa_mask``
for everything else.

Without a cache (``use_cache=False``: gradient checkpointing, most training loops)
transformers checks the position ids for packed sequences, which it cannot rule out while
tracing, and keeps the mask. Positions the decoder makes itself (the caller passed none)
are 0..S-1 in every row, never packed: `hold_generated_positions` tells the modeling
module's ``create_causal_mask`` so for such calls by passing it no position ids, exactly
what transformers is given when it has none to check.
"""

from __future__ import annotations

import inspect
import sys
from collections.abc import Callable
from typing import Any

import torch

from . import module_functions

IMPLEMENTATION = "cuteforge_sdpa"
BASE = "sdpa"
# the arguments of transformers' sdpa_mask that `_plain_causal` reads
_MASK_ARGS = {"q_length", "kv_length", "q_offset", "kv_offset", "mask_function", "attention_mask", "local_size",
              "allow_is_causal_skip"}


def _plain_causal(kwargs: dict[str, Any]) -> bool:
    """Whether SDPA's ``is_causal`` gives the mask ``sdpa_mask`` would build for these
    arguments (transformers' own eager-mode condition, minus the padding-mask scan)."""
    from transformers.masking_utils import causal_mask_function

    q_offset, kv_offset = kwargs.get("q_offset", 0), kwargs.get("kv_offset", 0)
    return (kwargs["q_length"] == kwargs["kv_length"]
            and kwargs.get("allow_is_causal_skip", True) is True
            and kwargs.get("attention_mask") is None
            and kwargs.get("mask_function", causal_mask_function) is causal_mask_function
            and kwargs.get("local_size") is None
            # a static cache's offset is a tensor: comparing it would branch on data
            and type(q_offset) is int and type(kv_offset) is int and q_offset == 0 and kv_offset == 0
            # not torch.compiler.is_exporting(): on torch 2.11 it reads True inside torch.compile
            and not torch.jit.is_tracing())


def causal_sdpa_mask(**kwargs: Any) -> torch.Tensor | None:
    """transformers' ``sdpa_mask``, except that plain causal attention gets no mask (SDPA's
    ``is_causal``) under torch.compile too."""
    from transformers.masking_utils import sdpa_mask

    return None if _plain_causal(kwargs) else sdpa_mask(**kwargs)


def register() -> str | None:
    """Register `IMPLEMENTATION` with transformers (idempotent). None on success, else why
    this transformers cannot take it."""
    try:
        from transformers import AttentionInterface
        from transformers.integrations.sdpa_attention import sdpa_attention_forward
        from transformers.masking_utils import (  # noqa: F401
            AttentionMaskInterface,
            causal_mask_function,
            sdpa_mask,
        )
    except ImportError as e:
        return f"this transformers has no attention / mask interfaces ({e})"
    missing = _MASK_ARGS - set(inspect.signature(sdpa_mask).parameters)
    if missing:  # another mask-function signature: the skip could not be judged
        return f"this transformers' sdpa_mask takes no {', '.join(sorted(missing))}"
    AttentionInterface.register(IMPLEMENTATION, sdpa_attention_forward)
    AttentionMaskInterface.register(IMPLEMENTATION, causal_sdpa_mask)
    return None


# The config of the patched decoder call under way that made its own position ids (None
# outside one), read by the swapped create_causal_mask. A dict: torch 2.11's Dynamo traces
# a dict item's assignment where it refuses a class attribute's.
_DECODER_CALL: dict[str, Any] = {"config": None}


def _mask_without_positions(original: Callable[..., Any]) -> Callable[..., Any] | str:
    if not {"config", "position_ids"} <= set(module_functions.parameters(original)):
        return f"{original.__module__}.create_causal_mask takes no config and position_ids"

    def create_causal_mask(*args: Any, **kwargs: Any) -> Any:
        config = _DECODER_CALL["config"]
        if config is not None and kwargs.get("config") is config and "position_ids" in kwargs:
            kwargs["position_ids"] = None  # the decoder's own 0..S-1: nothing packed to find
        return original(*args, **kwargs)

    return create_causal_mask


def hold_generated_positions(decoder: torch.nn.Module) -> tuple[str | None, Callable[[], None] | None]:
    """Make ``decoder``'s calls without position ids reach ``create_causal_mask`` without
    them too (its forward wrapped on the instance, the mask function swapped in its
    modeling module). Returns (why not, None) or (None, undo)."""
    names = module_functions.parameters(decoder.forward)
    if "position_ids" not in names or "forward" in vars(decoder):
        return f"{type(decoder).__name__}.forward takes no position_ids or is wrapped already", None
    why, undo_mask = module_functions.swap(sys.modules.get(type(decoder).__module__), "create_causal_mask",
                                           _mask_without_positions)
    if undo_mask is None:
        return why, None
    position = names.index("position_ids")
    original = decoder.forward

    def forward(*args: Any, **kwargs: Any) -> Any:
        made_here = (args[position] if len(args) > position else kwargs.get("position_ids")) is None
        previous = _DECODER_CALL["config"]
        _DECODER_CALL["config"] = decoder.config if made_here else None
        try:
            return original(*args, **kwargs)
        finally:
            _DECODER_CALL["config"] = previous

    decoder.forward = forward

    def undo() -> None:
        if vars(decoder).get("forward") is forward:
            del decoder.forward
        undo_mask()

    return None, undo
