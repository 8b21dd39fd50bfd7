"""Seam 2: the graph rewrite of softmax / log_softmax / rms_norm / layer_norm and Linear + act
into `cuteforge_inductor::*` ops (`rewrite_graph`). The pass objects enable() installs, which
run it and key the FX graph cache, are in `passes.py`."""

from __future__ import annotations

import operator
from typing import Any

import torch

from . import support
from .custom_ops import (
    _layer_norm_nb_op,
    _layer_norm_op,
    _linear_act_op,
    _linear_bias_act_op,
    _log_softmax_op,
    _name_safe,
    _rms_norm_op,
    _softmax_op,
    eps_to_bits,
)


def _arg(node: torch.fx.Node, i: int, name: str, default: Any = None) -> Any:
    if len(node.args) > i:
        return node.args[i]
    return node.kwargs.get(name, default)


def _ev(node: Any) -> Any:
    return node.meta.get("example_value") if isinstance(node, torch.fx.Node) else None


_CHECK_DEVICE = [True]  # rewrite_graph(require_gpu=False) turns the sm_90 check off (CPU tests)
# What rewrite_graph may rewrite: every kind it knows, or the `only` of the call in progress.
REWRITES = ("softmax", "log_softmax", "rms_norm", "layer_norm", "linear_act")
_ONLY: list[frozenset[str]] = [frozenset(REWRITES)]


def _inference_tensor(t: Any) -> bool:
    # contiguous: the inductor_* and cuteforge_* decompositions must give the same layout
    # (register_custom_op_autotuning checks it), and the cuteforge ops return contiguous
    return (isinstance(t, torch.Tensor) and not t.requires_grad and support.static_shape(t.shape) and t.numel() > 0
            and t.is_contiguous() and (not _CHECK_DEVICE[-1] or support.sm90(t.device)))


_SOFTMAX = {torch.softmax, torch.nn.functional.softmax, torch.Tensor.softmax}
_LOG_SOFTMAX = {torch.log_softmax, torch.nn.functional.log_softmax, torch.Tensor.log_softmax}
_RMS = {torch.rms_norm, torch.nn.functional.rms_norm}
_LAYER = {torch.nn.functional.layer_norm, torch.layer_norm}
_LINEAR = {torch._C._nn.linear, torch.nn.functional.linear}
_RELU = {torch.relu, torch.nn.functional.relu, torch.Tensor.relu}
_SILU = {torch.nn.functional.silu}
_GELU = {torch._C._nn.gelu, torch.nn.functional.gelu}


# Producers whose output Inductor always holds in a buffer (graph inputs, GEMMs, other
# custom ops), and the views that keep it one. A softmax / norm input made by a pointwise
# op is not rewritten: Inductor fuses that producer into its own softmax / norm kernel (a
# cuteforge kernel would need it written out first, and so would the inductor_* choice
# once the op's input is realized for the custom-op autotuning, which on torch 2.11 cannot
# take an unrealized input: `_infer_custom_op_layout` asks a Pointwise node for its strides
# and raises NotImplementedError). A Linear's input is different: every GEMM Inductor has
# (cuBLAS, its Triton templates) reads it from memory anyway, so Linear + act takes any
# producer and its lowering realizes x first (`_wrap_lowering`).
_BUFFERED = {torch.matmul, torch.bmm, torch.mm, torch.addmm, torch.baddbmm, torch.nn.functional.scaled_dot_product_attention,
             torch._C._nn.linear, torch.nn.functional.linear, operator.matmul}
_VIEW_METHODS = {"view", "reshape", "permute", "transpose", "unsqueeze", "squeeze", "flatten", "contiguous", "expand"}
_VIEW_FNS = {torch.reshape, torch.permute, torch.transpose, torch.unsqueeze, torch.squeeze, torch.flatten, operator.getitem,
             torch.unbind}


def _buffered(x: Any) -> bool:
    """Whether x (an FX node) reaches Inductor as a realized buffer or a view of one."""
    while isinstance(x, torch.fx.Node):
        if x.op in ("placeholder", "get_attr"):
            return True
        if x.op == "call_method" and x.target in _VIEW_METHODS | {"unbind"}:
            x = x.args[0]
        elif x.op == "call_function" and x.target in _VIEW_FNS:
            x = x.args[0]
        elif x.op == "call_function":
            return x.target in _BUFFERED or str(getattr(x.target, "namespace", "")) == "cuteforge_inductor"
        else:
            return False
    return False


def _is(node: torch.fx.Node, fns: set[Any], method: str | None = None) -> bool:
    if node.op == "call_function":
        return node.target in fns
    return method is not None and node.op == "call_method" and node.target == method


def _row_ok(x: Any, dim: Any, out: Any) -> bool:
    return (_inference_tensor(x) and _inference_tensor(out) and x.dtype in support.ROW_DTYPES and x.dim() >= 1
            and isinstance(dim, int) and dim in (-1, x.dim() - 1) and x.shape[-1] <= support.MAX_N)


def _norm_ok(x: Any, shape: Any, ws: list[Any], out: Any) -> bool:
    if not (_inference_tensor(x) and _inference_tensor(out) and x.dtype in support.ROW_DTYPES and x.shape[-1] <= support.MAX_N):
        return False
    if not (isinstance(shape, (tuple, list)) and len(shape) == 1 and shape[0] == x.shape[-1]):
        return False
    return all(isinstance(w, torch.Tensor) and w.shape == (x.shape[-1],) and w.dtype == x.dtype
               and w.device == x.device for w in ws)


def _act_of(node: torch.fx.Node) -> str | None:
    if _is(node, _RELU, "relu") and not _arg(node, 1, "inplace", False):
        return "relu"
    if _is(node, _SILU) and not _arg(node, 1, "inplace", False):
        return "silu"
    if _is(node, _GELU) and _arg(node, 1, "approximate", "none") == "tanh":
        return "gelu"
    return None


def check_rewrites(only: Any) -> frozenset[str]:
    """`only` (names from REWRITES; None: all of them) as a set, or a ValueError naming the unknown."""
    if only is None:
        return frozenset(REWRITES)
    names = frozenset([only] if isinstance(only, str) else only)
    unknown = sorted(names - set(REWRITES))
    if unknown:
        raise ValueError(f"unknown rewrite(s) {unknown}; known: {', '.join(REWRITES)}")
    return names


def rewrite_graph(graph: torch.fx.Graph, *, require_gpu: bool = True, only: Any = None) -> dict[str, int]:
    """Rewrite supported patterns of a Dynamo (pre-grad) graph into cuteforge_inductor ops.

    Returns counts per op. `require_gpu=False` skips the device check (CPU tests of the
    rewrite itself); everything else (no grad, static shapes, dtypes, last dim) still holds.
    `only`: the kinds to rewrite (names from REWRITES; default all)."""
    counts: dict[str, int] = {}
    _CHECK_DEVICE.append(require_gpu)
    _ONLY.append(check_rewrites(only))
    try:
        for node in list(graph.nodes):
            if node.op not in ("call_function", "call_method"):
                continue
            new = _rewrite_node(graph, node)
            if new is not None:
                counts[new] = counts.get(new, 0) + 1
    finally:
        _CHECK_DEVICE.pop()
        _ONLY.pop()
    if counts:
        graph.lint()
    return counts


def _eps_arg(eps: Any) -> int | None:
    """eps as the ops take it (float64 bits), or None when it is no usable number."""
    if isinstance(eps, bool) or not isinstance(eps, (int, float)) or not (0.0 <= float(eps) < float("inf")):
        return None
    return eps_to_bits(float(eps))


def _replace(graph: torch.fx.Graph, old: torch.fx.Node, target: Any, args: tuple[Any, ...]) -> None:
    # every scalar must print identifier-safe (see eps_to_bits): a choice name holding
    # anything else would fail to compile on torch 2.11
    assert all(_name_safe(a) for a in args if not isinstance(a, torch.fx.Node)), args
    with graph.inserting_before(old):
        new = graph.call_function(target, args)
    new.meta.update(old.meta)
    old.replace_all_uses_with(new)
    graph.erase_node(old)


def _rewrite_node(graph: torch.fx.Graph, node: torch.fx.Node) -> str | None:
    out = _ev(node)
    if _is(node, _SOFTMAX, "softmax") or _is(node, _LOG_SOFTMAX, "log_softmax"):
        x, dim = node.args[0], _arg(node, 1, "dim")
        if _arg(node, 3, "dtype") is not None or not _row_ok(_ev(x), dim, out) or not _buffered(x):
            return None
        log_ = _is(node, _LOG_SOFTMAX, "log_softmax")
        if ("log_softmax" if log_ else "softmax") not in _ONLY[-1]:
            return None
        _replace(graph, node, (_log_softmax_op if log_ else _softmax_op)._opoverload, (x,))
        return "log_softmax" if log_ else "softmax"
    if _is(node, _RMS):
        if "rms_norm" not in _ONLY[-1]:
            return None
        x, shape, w, eps = node.args[0], _arg(node, 1, "normalized_shape"), _arg(node, 2, "weight"), _arg(node, 3, "eps")
        xv = _ev(x)
        if w is None or not _norm_ok(xv, shape, [_ev(w)], out) or not _buffered(x):
            return None
        bits = _eps_arg(float(torch.finfo(xv.dtype).eps) if eps is None else eps)
        if bits is None:
            return None
        _replace(graph, node, _rms_norm_op._opoverload, (x, w, bits))
        return "rms_norm"
    if _is(node, _LAYER):
        if "layer_norm" not in _ONLY[-1]:
            return None
        x, shape, w, b, eps = (node.args[0], _arg(node, 1, "normalized_shape"), _arg(node, 2, "weight"),
                               _arg(node, 3, "bias"), _arg(node, 4, "eps", 1e-5))
        ws = [_ev(w)] + ([_ev(b)] if b is not None else [])
        bits = _eps_arg(eps)
        if w is None or bits is None or not _norm_ok(_ev(x), shape, ws, out) or not _buffered(x):
            return None
        if b is None:
            _replace(graph, node, _layer_norm_nb_op._opoverload, (x, w, bits))
        else:
            _replace(graph, node, _layer_norm_op._opoverload, (x, w, b, bits))
        return "layer_norm"
    act = _act_of(node)
    if act is not None and "linear_act" in _ONLY[-1]:
        lin = node.args[0]
        if not (isinstance(lin, torch.fx.Node) and _is(lin, _LINEAR) and len(lin.users) == 1):
            return None
        x, w, b = lin.args[0], _arg(lin, 1, "weight"), _arg(lin, 2, "bias")
        xv, wv, bv = _ev(x), _ev(w), _ev(b)
        if not (_inference_tensor(out) and _inference_tensor(xv) and isinstance(wv, torch.Tensor)):
            return None
        if xv.dtype not in support.GEMM_DTYPES or wv.dtype != xv.dtype or wv.dim() != 2 or xv.dim() < 2 or not support.static_shape(xv.shape):
            return None
        if b is not None and not (isinstance(bv, torch.Tensor) and bv.shape == (wv.shape[0],) and bv.dtype == xv.dtype):
            return None
        if b is None:
            _replace(graph, node, _linear_act_op._opoverload, (x, w, act))
        else:
            _replace(graph, node, _linear_bias_act_op._opoverload, (x, w, b, act))
        graph.erase_node(lin)
        return f"linear_{act}"
    return None
