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
passes each of the layer's arguments on under its own name, and no decorator but
transformers' renames of deprecated arguments (`deprecate_kwarg`, applied here too).
Any other layer keeps its forward and is reported with the reason. The swap is an
instance attribute bound with `types.MethodType`, so a deep copy of the patched model
runs its own modules.
"""

from __future__ import annotations

import ast
import inspect
import textwrap
import types
from collections.abc import Callable
from typing import Any

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
    """{old name: new name} of ``deprecate_kwarg(old, version, new_name=new)`` decorators;
    None for any other decorator."""
    renames = {}
    for d in decorators:
        if not (isinstance(d, ast.Call) and isinstance(d.func, ast.Name) and d.func.id == "deprecate_kwarg"
                and d.args and isinstance(d.args[0], ast.Constant) and isinstance(d.args[0].value, str)):
            return None
        new = [k.value.value for k in d.keywords
               if k.arg == "new_name" and isinstance(k.value, ast.Constant) and isinstance(k.value.value, str)]
        if len(new) != 1:
            return None
        renames[d.args[0].value] = new[0]
    return renames


def check(cls: type) -> tuple[str | None, tuple[tuple[str, ...], dict[str, str]]]:
    """(None, (argument names after hidden_states, deprecated renames)) when ``cls.forward``
    is the known decoder layer forward, else (why not, ((), {}))."""
    nothing: tuple[tuple[str, ...], dict[str, str]] = ((), {})
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(inspect.unwrap(cls.forward))))
    except (OSError, TypeError, SyntaxError):
        return f"{cls.__name__}.forward has no source to check", nothing
    fn = tree.body[0] if tree.body else None
    if not isinstance(fn, ast.FunctionDef):
        return f"{cls.__name__}.forward is not a plain function", nothing
    renames = _renames(fn.decorator_list)
    if renames is None:
        return f"{cls.__name__}.forward has a decorator other than deprecate_kwarg", nothing
    a = fn.args
    names = tuple(p.arg for p in a.args)
    if (a.posonlyargs or a.vararg or a.kwonlyargs or a.kwarg is None or names[:2] != ("self", "hidden_states")
            or len(a.defaults) != len(names) - 2):
        return f"{cls.__name__}.forward's arguments are not (self, hidden_states, name=default, ..., **kwargs)", nothing
    body = [s for s in fn.body if not (isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant))]
    attention = body[2] if len(body) == len(_BODY) else None
    call = attention.value if isinstance(attention, ast.Assign) else None
    if not isinstance(call, ast.Call):
        return f"{cls.__name__}.forward is not the Llama decoder layer's", nothing
    passed = {k.arg: k.value for k in call.keywords}
    own = set(names[2:]) | {"hidden_states"}
    if (call.args or set(passed) != own | {None} or any(
            not isinstance(v, ast.Name) or v.id != (a.kwarg.arg if k is None else k) for k, v in passed.items())):
        return f"{cls.__name__}.forward does not pass its arguments on to self_attn by name", nothing
    call.keywords = []
    call.args = [ast.Constant(...)]
    if tuple(ast.unparse(s) for s in body) != _BODY:
        return f"{cls.__name__}.forward is not the Llama decoder layer's", nothing
    return None, (names[2:], renames)


def _forward(names: tuple[str, ...], defaults: dict[str, Any], renames: dict[str, str]) -> Callable[..., Any]:
    def forward(self: nn.Module, hidden_states: Any, *args: Any, **kwargs: Any) -> Any:
        """The decoder layer's forward with the residual add in the post-attention norm
        (module doc)."""
        for old, new in renames.items():
            if old in kwargs:
                kwargs[new] = kwargs.pop(old)
        if len(args) > len(names):
            raise TypeError(f"{type(self).__name__}.forward takes at most {len(names) + 1} positional arguments "
                            f"after self, got {len(args) + 1}")
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
    parameters = inspect.signature(inspect.unwrap(type(layer).forward)).parameters
    defaults = {name: parameters[name].default for name in names}
    layer.forward = types.MethodType(_forward(names, defaults, renames), layer)

    def undo() -> None:
        vars(layer).pop("forward", None)

    return None, undo
