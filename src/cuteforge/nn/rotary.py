"""The rotary position embedding of transformers' Llama-family models on cuteforge's kernel.

Those models' attention layers call their modeling module's ``apply_rotary_pos_emb(q, k,
cos, sin, unsqueeze_dim=1)`` (older releases: an unused ``position_ids`` before
``unsqueeze_dim``) by its global name, so the swap is made in that module: while at least
one model of its type is patched, the name points at a function of the same parameters
that runs `cuteforge.ops.rotary_embedding` (one kernel over q and k, forward and
backward) inside a patched model's attention layers (`decoder_call`) for the CUDA
tensors it takes, and the module's own function for anything else: other models of the type are
left to torch.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

import torch

from ..kernels.pointwise.spec import MAX_HEAD_DIM
from ..signature import FLOAT_DTYPES
from . import decoder_call, module_functions

_NAME = "apply_rotary_pos_emb"
# the parameters of transformers' function, newer and older (an unused position_ids)
_PARAMETERS = (["q", "k", "cos", "sin", "unsqueeze_dim"], ["q", "k", "cos", "sin", "position_ids", "unsqueeze_dim"])


def _takes(q: Any, k: Any, cos: Any, sin: Any, unsqueeze_dim: Any) -> bool:
    """Whether the kernel applies: a patched model's attention, CUDA tensors of one float dtype
    and the shapes `ops.rotary_embedding` takes, the whole head rotated (partial rotary
    embeddings and anything else go to the module's function)."""
    tensors = (q, k, cos, sin)
    if not (decoder_call.in_patched_attention() and unsqueeze_dim in (1, 2)
            and all(isinstance(t, torch.Tensor) and t.is_cuda and t.dtype == q.dtype for t in tensors)
            and q.dtype in FLOAT_DTYPES and q.dim() == 4 and k.dim() == 4 and cos.dim() == 3 and sin.dim() == 3):
        return False
    seq, d = 3 - unsqueeze_dim, q.shape[-1]
    return (d % 2 == 0 and d <= MAX_HEAD_DIM and k.shape[-1] == d and k.shape[0] == q.shape[0]
            and k.shape[seq] == q.shape[seq] and cos.shape == sin.shape and cos.shape[0] in (1, q.shape[0])
            and cos.shape[1] == q.shape[seq] and cos.shape[2] == d)


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
    """Point the modeling module of ``model``'s attention layers at cuteforge's kernel.
    Returns (why not, None) or (None, undo)."""
    layers = getattr(getattr(model, "model", None), "layers", None)
    attention = getattr(layers[0], "self_attn", None) if isinstance(layers, torch.nn.ModuleList) and len(layers) else None
    source = type(attention if attention is not None else model).__module__  # a subclass of the model may live elsewhere
    return module_functions.swap(sys.modules.get(source), _NAME, _make)
