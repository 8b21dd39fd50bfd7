"""The rotary position embedding of transformers' Llama-family models on cuteforge's kernel.

Those models' attention layers call their modeling module's ``apply_rotary_pos_emb(q, k,
cos, sin, unsqueeze_dim=1)`` (older releases: an unused ``position_ids`` before
``unsqueeze_dim``) by its global name, so the swap is made in that module: while at least
one model of its type is patched, the name points at a function of the same parameters
that runs `cuteforge.ops.rotary_embedding` (one kernel over q and k, forward and
backward) inside a patched model's decoder call (`decoder_call`) for the CUDA tensors it
takes, and the module's own function for anything else: other models of the type are
left to torch.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

import torch

from ..signature import FLOAT_DTYPES
from . import decoder_call, module_functions

_NAME = "apply_rotary_pos_emb"
# the parameters of transformers' function, newer and older (an unused position_ids)
_PARAMETERS = (["q", "k", "cos", "sin", "unsqueeze_dim"], ["q", "k", "cos", "sin", "position_ids", "unsqueeze_dim"])


def _takes(q: Any, k: Any, cos: Any, sin: Any, unsqueeze_dim: Any) -> bool:
    """Whether the kernel applies: a patched model's call, CUDA tensors of one float dtype,
    4-D q and k, the whole head rotated (partial rotary embeddings go to the module's
    function)."""
    tensors = (q, k, cos, sin)
    return (decoder_call.in_patched_call() and all(isinstance(t, torch.Tensor) and t.is_cuda for t in tensors)
            and q.dtype in FLOAT_DTYPES and all(t.dtype == q.dtype for t in tensors)
            and q.dim() == 4 and k.dim() == 4 and cos.dim() == 3 and sin.dim() == 3
            and cos.shape[-1] == q.shape[-1] and unsqueeze_dim in (1, 2))


def _make(original: Callable[..., Any]) -> Callable[..., Any] | str:
    """The swap, with ``original``'s parameters (or why there is none)."""
    names = module_functions.parameters(original)
    if names not in _PARAMETERS:
        return f"{original.__module__}.{_NAME} takes ({', '.join(names)}), not (q, k, cos, sin[, position_ids], unsqueeze_dim)"

    def rotated(q: Any, k: Any, cos: Any, sin: Any, unsqueeze_dim: Any, position_ids: Any = None) -> Any:
        if not _takes(q, k, cos, sin, unsqueeze_dim):
            if "position_ids" in names:
                return original(q, k, cos, sin, position_ids, unsqueeze_dim)
            return original(q, k, cos, sin, unsqueeze_dim)
        from ..ops import rotary_embedding

        return rotary_embedding(q, k, cos, sin, unsqueeze_dim)

    if "position_ids" in names:

        def apply_rotary_pos_emb(q: Any, k: Any, cos: Any, sin: Any, position_ids: Any = None,
                                 unsqueeze_dim: int = 1) -> Any:
            return rotated(q, k, cos, sin, unsqueeze_dim, position_ids)
    else:

        def apply_rotary_pos_emb(q: Any, k: Any, cos: Any, sin: Any, unsqueeze_dim: int = 1) -> Any:  # type: ignore[misc]
            return rotated(q, k, cos, sin, unsqueeze_dim)

    return apply_rotary_pos_emb


def swap(model: torch.nn.Module) -> tuple[str | None, Callable[[], None] | None]:
    """Point ``model``'s modeling module's ``apply_rotary_pos_emb`` at cuteforge's kernel.
    Returns (why not, None) or (None, undo)."""
    return module_functions.swap(sys.modules.get(type(model).__module__), _NAME, _make)
