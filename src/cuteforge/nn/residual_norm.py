"""A decoder layer whose post-attention norm does the residual add before it
(`patch(residual_norm=True)`).

The Llama family's decoder layer computes ``h = residual + attention(...)`` and then
``post_attention_layernorm(h)``: an add kernel that writes h, and a norm that reads it
back (under torch.compile the add stays a kernel of its own beside cuteforge's opaque
norm, and in the backward another add sums the two gradients of h). The swapped forward
hands both operands to the norm instead, ``post_attention_layernorm(attention(...),
residual=residual)`` (`cuteforge.nn.RMSNorm`), whose one kernel writes the sum and its
norm and whose backward kernel adds the sum's gradient to its own.

The forward is swapped only where it is the one this module knows, checked on its
source's syntax tree (`check`): the layer's statements in order, an attention call that
passes each of the layer's arguments on under its own name, no decorator but
transformers' renames of deprecated arguments (`deprecate_kwarg`, applied here too, the
new name winning where both are given), and no wrapper around it at run time but those
renames and transformers' gradient checkpointing. Any other layer keeps its forward and
is reported with the reason. Where transformers checkpoints the class's `forward` (5.24
wraps it; an instance's forward would bypass that), a call under gradient checkpointing
(the layer's `gradient_checkpointing` set, training, grad enabled) goes to the layer's
own forward, whose wrapper checkpoints it; where it checkpoints `__call__` (earlier 5.x),
the swapped forward runs inside the checkpoint, fused in the forward and the recompute
alike. After undo, a call that still reaches the swapped forward (through a wrapper put
on the instance since) goes to the layer's own. The swap is an instance attribute bound with
`types.MethodType`, so a deep copy of the patched model runs its own modules.
"""

from __future__ import annotations

import ast
import inspect
import os
import sys
import textwrap
import types
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

__all__ = ["check", "swap"]

# the known body, statement by statement (`ast.unparse`), with the attention call's
# keyword arguments checked apart
_BODY = (
    "residual = hidden_states",
    "hidden_states = self.input_layernorm(hidden_states)",
    "hidden_states, _ = self.self_attn(...)",
    "hidden_states = residual + hidden_states",
    "residual = hidden_states",
    "hidden_states = self.post_attention_layernorm(hidden_states)",
    "hidden_states = self.mlp(hidden_states)",
    "hidden_states = residual + hidden_states",
    "return hidden_states",
)


def _renames(decorators: list[ast.expr]) -> dict[str, str] | None:
    """{old name: new name} of ``deprecate_kwarg(old, version, new_name=new)`` decorators
    (no other options); None for any other decorator."""
    renames = {}
    for d in decorators:
        if not (isinstance(d, ast.Call) and isinstance(d.func, ast.Name) and d.func.id == "deprecate_kwarg"
                and 1 <= len(d.args) <= 2 and all(isinstance(a, ast.Constant) and isinstance(a.value, str) for a in d.args)
                and {k.arg for k in d.keywords} <= {"new_name", "version"}):
            return None
        new = [k.value.value for k in d.keywords
               if k.arg == "new_name" and isinstance(k.value, ast.Constant) and isinstance(k.value.value, str)]
        if len(new) != 1:
            return None
        renames[d.args[0].value] = new[0]
    return renames


# The wrappers transformers puts around a layer's forward at run time, by the module and
# the name of their code: gradient checkpointing (5.24's `GradientCheckpointingLayer`
# wraps `forward` when the class is made; `forward` below hands checkpointed calls to it)
# and the renames of deprecated arguments (one per `deprecate_kwarg` in the source).
_CHECKPOINTING = ("transformers.modeling_layers", "forward_with_checkpointing")
_RENAMING = ("transformers.utils.deprecation", "wrapped_func")


def _innermost(forward: Any) -> tuple[Any, int, bool] | None:
    """(the function under transformers' wrappers, how many of them rename arguments,
    whether one checkpoints); None where another wrapper stands between (it could change
    what the layer does)."""
    renaming, checkpointing = 0, False
    while hasattr(forward, "__wrapped__"):
        code = getattr(forward, "__code__", None)
        kind = None
        for module_name, name in (_CHECKPOINTING, _RENAMING):
            module = sys.modules.get(module_name)
            if (code is not None and module is not None and code.co_name == name
                    and os.path.realpath(code.co_filename) == os.path.realpath(str(getattr(module, "__file__", "")))):
                kind = name
        if kind is None:
            return None
        renaming += kind == _RENAMING[1]
        checkpointing |= kind == _CHECKPOINTING[1]
        forward = forward.__wrapped__
    return forward, renaming, checkpointing


def check(cls: type) -> tuple[str | None, tuple[tuple[str, ...], dict[str, str]]]:
    """(None, (argument names after hidden_states, deprecated renames)) when ``cls.forward``
    is the known decoder layer forward, else (why not, ((), {}))."""
    nothing: tuple[tuple[str, ...], dict[str, str]] = ((), {})
    unwrapped = _innermost(cls.forward)
    if unwrapped is None:
        return f"{cls.__name__}.forward is wrapped by something other than transformers' checkpointing", nothing
    function, renaming, _ = unwrapped
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(function)))
    except (OSError, TypeError, SyntaxError):
        return f"{cls.__name__}.forward has no source to check", nothing
    fn = tree.body[0] if tree.body else None
    if not isinstance(fn, ast.FunctionDef):
        return f"{cls.__name__}.forward is not a plain function", nothing
    renames = _renames(fn.decorator_list)
    if renames is None or len(fn.decorator_list) != renaming:
        return f"{cls.__name__}.forward has a decorator other than deprecate_kwarg", nothing
    a = fn.args
    names = tuple(p.arg for p in a.args)
    if (a.posonlyargs or a.vararg or a.kwonlyargs or a.kwarg is None or names[:2] != ("self", "hidden_states")
            or len(a.defaults) != len(names) - 2):
        return f"{cls.__name__}.forward's arguments are not (self, hidden_states, name=default, ..., **kwargs)", nothing
    try:  # the source read from disk must be the function that runs
        live = inspect.signature(function).parameters
    except (TypeError, ValueError):
        live = {}
    if tuple(live) != (*names, a.kwarg.arg):
        return f"{cls.__name__}.forward's source does not match the function that runs", nothing
    body = [s for s in fn.body if not (isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant))]
    attention = body[2] if len(body) == len(_BODY) else None
    call = attention.value if isinstance(attention, ast.Assign) else None
    if not isinstance(call, ast.Call):
        return f"{cls.__name__}.forward is not the Llama decoder layer's", nothing
    passed = [k.arg for k in call.keywords]
    if (call.args or len(passed) != len(set(passed)) or set(passed) != set(names[1:]) | {None} or any(
            not isinstance(k.value, ast.Name) or k.value.id != (a.kwarg.arg if k.arg is None else k.arg)
            for k in call.keywords)):
        return f"{cls.__name__}.forward does not pass its arguments on to self_attn by name", nothing
    call.keywords = []
    call.args = [ast.Constant(...)]
    if tuple(ast.unparse(s) for s in body) != _BODY:
        return f"{cls.__name__}.forward is not the Llama decoder layer's", nothing
    return None, (names[2:], renames)


_ACTIVE = "_cuteforge_residual_norm"  # set on a swapped layer until its undo


def _forward(names: tuple[str, ...], defaults: dict[str, Any], renames: dict[str, str],
             checkpointing_wrapper: bool) -> Callable[..., Any]:
    def forward(self: nn.Module, hidden_states: Any, *args: Any, **kwargs: Any) -> Any:
        """The decoder layer's forward with the residual add in the post-attention norm
        (module doc)."""
        if not getattr(self, _ACTIVE, False) or (
                checkpointing_wrapper and getattr(self, "gradient_checkpointing", False) and self.training
                and torch.is_grad_enabled()):
            # undone (a wrapper put on the instance since may still call this), or
            # checkpointed: the layer's own forward, through transformers' checkpointing wrapper
            return type(self).forward(self, hidden_states, *args, **kwargs)
        for old, new in renames.items():  # as deprecate_kwarg: the new name wins where both are given
            if old in kwargs:
                kwargs.setdefault(new, kwargs.pop(old))
        if len(args) > len(names):
            raise TypeError(f"{type(self).__name__}.forward takes at most {len(names) + 1} positional arguments "
                            f"after self, got {len(args) + 1}")
        twice = [name for name in names[:len(args)] if name in kwargs]
        if twice:
            raise TypeError(f"{type(self).__name__}.forward got multiple values for argument '{twice[0]}'")
        # every argument goes on to the attention, the defaults too, as the layer's own forward passes them
        kwargs = {**defaults, **kwargs, **dict(zip(names, args))}
        residual = hidden_states
        hidden_states, _ = self.self_attn(hidden_states=self.input_layernorm(hidden_states), **kwargs)
        hidden_states, residual = self.post_attention_layernorm(hidden_states, residual=residual)
        return residual + self.mlp(hidden_states)

    return forward


def swap(layer: nn.Module, norm_type: type) -> tuple[str | None, Callable[[], None] | None]:
    """Swap ``layer``'s forward (module doc) when its post-attention norm is a ``norm_type``
    (a cuteforge norm, which takes ``residual``). Returns (why not, None) or (None, undo)."""
    if not isinstance(getattr(layer, "post_attention_layernorm", None), norm_type):
        return f"{type(layer).__name__}'s post_attention_layernorm is not cuteforge's", None
    if "forward" in vars(layer):
        return f"{type(layer).__name__} has a forward of its own on the instance", None
    why, (names, renames) = check(type(layer))
    if why is not None:
        return why, None
    function, _, checkpointing = _innermost(type(layer).forward)  # type: ignore[misc]  (check found it)
    parameters = inspect.signature(function).parameters
    defaults = {name: parameters[name].default for name in names}
    swapped = types.MethodType(_forward(names, defaults, renames, checkpointing), layer)
    layer.forward = swapped
    setattr(layer, _ACTIVE, True)

    def undo() -> None:
        vars(layer).pop(_ACTIVE, None)
        if vars(layer).get("forward") is swapped:  # not someone's wrapper put there since
            del vars(layer)["forward"]

    return None, undo
