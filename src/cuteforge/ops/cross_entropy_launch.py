"""The cross-entropy kernels' launchers behind `cuteforge.ops.cross_entropy`: the per-row
forward, the reduced forward (`cross_entropy_fwd_reduce`) and the backward, each bound,
configured (a stored tuning result, else the heuristic) and memoized per layout."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from ..kernels.cross_entropy.config import reduce_fits, work_words
from ..kernels.cross_entropy.spec import (
    config_for,
    cross_entropy_bwd,
    cross_entropy_fwd,
    cross_entropy_fwd_reduce,
)
from ..kernels.reduce.config import RowReduceConfig
from .memo import remember

_FWD: dict[tuple[Any, ...], Callable[..., Any]] = {}
_BWD: dict[tuple[Any, ...], Callable[..., Any]] = {}
_RED: dict[tuple[Any, ...], Callable[..., Any]] = {}
_WHERE = "cuteforge.ops.cross_entropy"


def _key(logits: torch.Tensor, target: torch.Tensor, ignore_index: int) -> tuple[Any, ...]:
    # pointers only through their 16-byte alignment (it decides the compiled variant)
    return (logits.dtype, logits.shape, logits.stride(), logits.data_ptr() & 15, target.dtype, target.data_ptr() & 15,
            logits.get_device(), ignore_index)


def _skip(*args: Any) -> None:
    """M == 0: nothing to launch."""


def _tuned(kernel: Any, key: Any, ignore_index: int, logits: torch.Tensor) -> Any:
    """A stored tuning result (`cuteforge tune cross_entropy_fwd` / `_bwd`) for this call,
    else the heuristic. `lookup` has checked it against the kernel's validate hook."""
    from ..autotune import lookup  # slow path only

    m, n = logits.shape
    cfg = lookup(kernel, key, (("ignore_index", ignore_index),), {"M": m})
    return cfg if isinstance(cfg, RowReduceConfig) else config_for(n, logits.element_size() * 8,
                                                                   kernel is cross_entropy_bwd)


def _row_config(logits: torch.Tensor, target: torch.Tensor, ignore_index: int) -> Any:
    """The forward's row config (M > 0). The reduced forward runs the per-row forward's
    row loop, so it takes the same config: a stored result for `cross_entropy_fwd` and
    this layout, or the heuristic."""
    loss = torch.empty(logits.shape[0], dtype=torch.float32, device=logits.device)
    key = cross_entropy_fwd.signature.bind((logits, target, loss, loss), _WHERE)
    return _tuned(cross_entropy_fwd, key, ignore_index, logits)


def _fwd_launcher(logits: torch.Tensor, target: torch.Tensor, ignore_index: int) -> Callable[..., Any]:
    m, n = logits.shape
    loss = torch.empty(m, dtype=torch.float32, device=logits.device)
    key = cross_entropy_fwd.signature.bind((logits, target, loss, loss), _WHERE)
    fn: Callable[..., Any] = _skip
    if m > 0:
        params = (("ignore_index", ignore_index),)
        fn = cross_entropy_fwd.get(key, params, _tuned(cross_entropy_fwd, key, ignore_index, logits))
    remember(_FWD, _key(logits, target, ignore_index), fn)
    return fn


def _red_key(logits: torch.Tensor, target: torch.Tensor, out_dtype: torch.dtype) -> Any:
    """Validate a reduced forward's call and return its BoundKey (the same with and
    without lse, and for any workspace: their lengths are dynamic dims of their own)."""
    dev = logits.device
    out = torch.empty(1, dtype=out_dtype, device=dev)
    lse = torch.empty(1, dtype=torch.float32, device=dev)
    work = torch.empty(4, dtype=torch.int32, device=dev)
    return cross_entropy_fwd_reduce.signature.bind((logits, target, out, lse, work), _WHERE)


def _red_words(logits: torch.Tensor, cfg: Any) -> int:
    """The workspace words a reduced forward of these logits under `cfg` needs, or 0 where
    the caller reduces with torch ops instead: a grid beyond kernels.reduce_fits (the
    reduced kernel is level with or ahead of the per-row kernel + torch reduction at
    every N, docs/kernels/cross_entropy.md)."""
    m = logits.shape[0]
    ctas = -(-m // cfg.rows_per_cta)
    return work_words(ctas) if reduce_fits(ctas, cfg.threads) else 0


def _red_get(key: Any, cfg: Any, ignore_index: int, mean: bool, with_lse: bool) -> Callable[..., Any]:
    """fn(logits, target, out (1,) of the key's dtype, lse, work): compiled once ever, loaded, or an L1 hit."""
    params = (("ignore_index", ignore_index), ("lse", with_lse), ("mean", mean))  # sorted, as precompile's
    return cross_entropy_fwd_reduce.get(key, params, cfg)


def _red_launcher(logits: torch.Tensor, target: torch.Tensor, ignore_index: int, mean: bool,
                  with_lse: bool, out_dtype: torch.dtype) -> tuple[Callable[..., Any] | None, int]:
    """(reduced forward, workspace words) for this layout (M >= 1), memoized in _RED;
    (None, 0) where the grid is beyond kernels.reduce_fits."""
    cfg = _row_config(logits, target, ignore_index)
    words = _red_words(logits, cfg)
    fn = None
    if words:
        fn = _red_get(_red_key(logits, target, out_dtype), cfg, ignore_index, mean, with_lse)
    remember(_RED, (*_key(logits, target, ignore_index), mean, with_lse, out_dtype), (fn, words))
    return fn, words


def _fwd(logits: torch.Tensor, target: torch.Tensor, ignore_index: int,
         loss: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-row (loss, lse), fp32, the loss written into ``loss`` where given (a unit-stride
    fp32 (M,) view on 16 bytes, as a fresh buffer). The custom op's body and the eager path."""
    if target.stride(0) != 1:
        target = target.contiguous()
    try:
        fn = _FWD[_key(logits, target, ignore_index)]
    except (AttributeError, KeyError, TypeError):
        fn = _fwd_launcher(logits, target, ignore_index)
    m = logits.shape[0]
    if loss is None:
        loss = logits.new_empty(m, dtype=torch.float32)
    lse = logits.new_empty(m, dtype=torch.float32)
    fn(logits, target, loss, lse)
    return loss, lse


def _bwd_kernel(logits: torch.Tensor, target: torch.Tensor, lse: torch.Tensor, dloss: torch.Tensor, dlogits: torch.Tensor,
                ignore_index: int) -> Any:
    """The compiled backward for these operands (M > 0)."""
    key = cross_entropy_bwd.signature.bind((logits, target, lse, dloss, dlogits), _WHERE)
    return cross_entropy_bwd.get(key, (("ignore_index", ignore_index),), _tuned(cross_entropy_bwd, key, ignore_index, logits))


def _bwd(logits: torch.Tensor, target: torch.Tensor, lse: torch.Tensor, dloss: torch.Tensor, ignore_index: int) -> torch.Tensor:
    """dlogits for a per-row loss gradient `dloss` (ignored rows get zeros in the kernel)."""
    m, n = logits.shape
    dlogits = torch.empty((m, n), dtype=logits.dtype, device=logits.device)
    if m == 0:
        return dlogits
    if target.stride(0) != 1:
        target = target.contiguous()
    if dloss.dtype != torch.float32 or dloss.stride(0) != 1:
        dloss = dloss.float().contiguous()  # the mean/sum backward hands in an expanded scalar
    _bwd_into(logits, target, lse, dloss, dlogits, ignore_index)
    return dlogits


def _bwd_into(logits: torch.Tensor, target: torch.Tensor, lse: torch.Tensor, dloss: torch.Tensor, dlogits: torch.Tensor,
              ignore_index: int) -> None:
    """Launch the backward into ``dlogits`` (M > 0; ``target`` and ``dloss`` unit-stride,
    ``dloss`` fp32), its kernel memoized per layout, so a warm call neither binds the
    signature nor looks up tuning records."""
    k = (*_key(logits, target, ignore_index), dlogits.data_ptr() & 15, dlogits.stride(), lse.data_ptr() & 15,
         dloss.data_ptr() & 15)
    fn = _BWD.get(k)
    if fn is None:
        fn = remember(_BWD, k, _bwd_kernel(logits, target, lse, dloss, dlogits, ignore_index))
    fn(logits, target, lse, dloss, dlogits)
