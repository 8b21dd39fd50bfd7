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
are 0..S-1 in every row, never packed: in such a call of a patched decoder
(`decoder_call`), `swap_mask`'s ``create_causal_mask`` passes transformers' no position
ids, exactly what it is given when it has none to check.
"""

from __future__ import annotations

import inspect
import sys
from collections.abc import Callable
from typing import Any

import torch

from . import decoder_call, module_functions

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


def _mask_without_positions(original: Callable[..., Any]) -> Callable[..., Any] | str:
    if not {"config", "position_ids"} <= set(module_functions.parameters(original)):
        return f"{original.__module__}.create_causal_mask takes no config and position_ids"

    def create_causal_mask(*args: Any, **kwargs: Any) -> Any:
        if "position_ids" in kwargs and decoder_call.own_positions(kwargs.get("config")):
            kwargs["position_ids"] = None  # the decoder's own 0..S-1: nothing packed to find
        return original(*args, **kwargs)

    return create_causal_mask


def swap_mask(decoder: torch.nn.Module) -> tuple[str | None, Callable[[], None] | None]:
    """Have the modeling module's ``create_causal_mask`` called without position ids in a
    marked (`decoder_call.mark`) decoder call that made its own. Returns (why not, None)
    or (None, undo)."""
    return module_functions.swap(sys.modules.get(type(decoder).__module__), "create_causal_mask",
                                 _mask_without_positions)
