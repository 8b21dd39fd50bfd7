"""enable() / disable(): install every seam into Inductor and put back exactly what was
replaced; the custom ops' lowering and selection wrappers that add the cuteforge choice."""

from __future__ import annotations

import functools
import importlib
import inspect
import logging
import threading
import warnings
from collections.abc import Callable, Iterable
from typing import Any

import torch

from . import selection_log
from .custom_ops import AUTOTUNED, _linear_act_op, _linear_bias_act_op, extern_choice
from .gemm_choices import GEMM_OPS, _wrap_get_template_configs
from .rewrites import check_rewrites
from .support import unsupported_reason

log = logging.getLogger("cuteforge.inductor")

_LOCK = threading.RLock()
_WARNED = False
_STATE: dict[str, Any] | None = None  # what enable() changed, for disable()
_MISSING = object()


def _no_fallback(*args: Any, **kwargs: Any) -> Any:
    raise RuntimeError("cuteforge.inductor: placeholder for a disabled torch 2.11 fallback choice")


_LINEAR_OPS = (_linear_act_op, _linear_bias_act_op)
# (selection name, scalar arguments) of each custom-op lowering in progress: what
# _wrap_select binds the cuteforge choice with. A stack, since lowerings nest.
_LOWERING: list[tuple[str, dict[str, Any]]] = []


def _wrap_lowering(op: Any, name: str, lowerings: dict[Any, Any], user: dict[Any, Any] | None) -> None:
    """Wrap the lowering register_custom_op_autotuning just registered for op (in
    `user_lowerings` on 2.13, `lowerings` on 2.11): it records the op's scalar arguments for
    the cuteforge choice, and for a Linear + act writes x, when a pointwise op made it,
    out contiguous first (`ExternKernel.require_contiguous`; Inductor fuses that copy into
    the producer): the autotuning needs a buffer's strides, and every GEMM choice reads x
    from memory anyway. disable() restores the table entry, so the wrapper goes with it."""
    from torch._inductor import ir

    table = user if user is not None and op in user else lowerings
    inner = table[op]
    names = [a.name for a in op._schema.arguments]
    realize_x = op in {o._opoverload for o in _LINEAR_OPS}

    @functools.wraps(inner)
    def lowering(*args: Any, **kwargs: Any) -> Any:
        if realize_x and args and isinstance(args[0], ir.TensorBox):
            realized = ir.ExternKernel.require_contiguous(args[0])
            if isinstance(realized, ir.TensorBox):
                args = (realized, *args[1:])
        scalars = {names[i]: a for i, a in enumerate(args) if i < len(names) and not isinstance(a, ir.IRNode)}
        scalars.update({k: v for k, v in kwargs.items() if not isinstance(v, ir.IRNode)})
        _LOWERING.append((name, scalars))
        try:
            return inner(*args, **kwargs)
        finally:
            _LOWERING.pop()

    table[op] = lowering


def _custom_choice(sel: str, input_nodes: Any, layout: Any) -> Any:
    """The cuteforge ExternKernelChoice for the custom-op selection `sel` being lowered,
    bound to its tensor inputs, output layout and scalar arguments, or None."""
    if not _LOWERING or _LOWERING[-1][0] != sel:
        return None
    op_name = next(o for _, n, _, o in AUTOTUNED if n == sel)
    return extern_choice(op_name).bind(list(input_nodes), layout, **_LOWERING[-1][1])


def _wrap_select(orig: Callable[..., Any]) -> Callable[..., Any]:
    """autotune_select_algorithm as torch/_inductor/kernel/custom_op.py calls it (by keyword:
    name, choices, input_nodes, layout, ...), with the cuteforge choice appended to the
    choices of our own selections; every other selection passes through untouched."""

    def autotune_select_algorithm(*args: Any, **kwargs: Any) -> Any:
        sel = kwargs.get("name", args[0] if args else None)
        if isinstance(sel, str) and sel.startswith("cfi_") and "choices" in kwargs:
            try:
                extra = _custom_choice(sel, kwargs["input_nodes"], kwargs["layout"])
            except Exception as e:  # noqa: BLE001 - never break Inductor's own selection
                log.debug("cuteforge %s choice not offered: %r", sel, e)
                extra = None
            if extra is not None:
                selection_log.ensure_feedback()
                kwargs["choices"] = [*kwargs["choices"], extra]
        return orig(*args, **kwargs)

    autotune_select_algorithm.__wrapped__ = orig  # type: ignore[attr-defined]
    return autotune_select_algorithm


def is_enabled() -> bool:
    return _STATE is not None


def enable(rewrites: Iterable[str] | None = None) -> bool:
    """Offer cuteforge kernels to torch.compile(mode="max-autotune"). Idempotent. On a torch
    this module does not support: warns once, changes nothing, returns False.

    `rewrites`: which ops the pre-grad pass hands to cuteforge (names from
    `rewrites.REWRITES`: softmax, log_softmax, rms_norm, layer_norm, linear_act; default
    all); part of the pass's uuid, so the FX graph cache keeps graphs of different sets
    apart. Called again with another set, it replaces the pass's set."""
    global _STATE, _WARNED
    only = check_rewrites(rewrites)
    with _LOCK:
        if _STATE is not None:
            from torch._inductor import config

            from .passes import CuteforgePreGradPass

            if set(config.pre_grad_custom_pass.rewrites) != only:
                config.pre_grad_custom_pass = CuteforgePreGradPass(_STATE["pre_grad_custom_pass"], only)
            return True
        reason = unsupported_reason()
        if reason is not None:
            if not _WARNED:
                warnings.warn(f"cuteforge.inductor.enable(): disabled: {reason}", RuntimeWarning, stacklevel=2)
                _WARNED = True
            return False
        from torch._inductor import config, lowering
        from torch._inductor.choices import InductorChoices
        from torch._inductor.kernel import custom_op
        from torch._inductor.kernel.custom_op import CustomOpConfig, register_custom_op_autotuning
        from torch._inductor.select_algorithm import extern_kernels

        for mod in ("gemm", "norm", "softmax"):  # what the kernels call, imported once here
            importlib.import_module(f"..ops.{mod}", __package__)
        for op_name in [*GEMM_OPS, *(o for *_, o in AUTOTUNED)]:
            # extern_kernels.cuteforge_* must exist before any compiled graph that calls
            # them runs, including one the FX graph cache serves to a fresh process
            extern_choice(op_name)

        from .passes import CuteforgeKeyPass, CuteforgePreGradPass

        user = getattr(lowering, "user_lowerings", None)  # 2.13: register_* writes here; 2.11: lowerings
        state: dict[str, Any] = {
            "get_template_configs": InductorChoices.__dict__["get_template_configs"],
            "autotune_select_algorithm": custom_op.autotune_select_algorithm,
            "pre_grad_custom_pass": config.pre_grad_custom_pass,
            "post_grad_custom_post_pass": config.post_grad_custom_post_pass,
            "lowerings": {op._opoverload: lowering.lowerings.get(op._opoverload, _MISSING) for op, *_ in AUTOTUNED},
            "user_lowerings": ({op._opoverload: user.get(op._opoverload, _MISSING) for op, *_ in AUTOTUNED}
                               if user is not None else None),
            "extern_names": [],
        }
        # torch 2.11's autotune_custom_op adds the op's eager impl as a fallback choice only
        # while extern_kernels has no "<name>_fallback_default", and binds it without the
        # op's scalar arguments (a winning fallback would lower to a call missing them).
        # The cuteforge_* decomposition is the cuteforge candidate there, so the fallback
        # is switched off by taking its name. 2.13 (`_create_fallback_choice(op_overload)`)
        # binds the scalars and needs nothing.
        if "name" in inspect.signature(custom_op._create_fallback_choice).parameters:
            for _, name, *_ in AUTOTUNED:
                fb = f"{name}_fallback_default"
                if not hasattr(extern_kernels, fb):
                    setattr(extern_kernels, fb, _no_fallback)
                    state["extern_names"].append(fb)
        try:
            InductorChoices.get_template_configs = _wrap_get_template_configs(state["get_template_configs"])
            config.pre_grad_custom_pass = CuteforgePreGradPass(state["pre_grad_custom_pass"], only)
            config.post_grad_custom_post_pass = CuteforgeKeyPass(state["post_grad_custom_post_pass"])
            custom_op.autotune_select_algorithm = _wrap_select(state["autotune_select_algorithm"])
            for op, name, decomps, _ in AUTOTUNED:
                register_custom_op_autotuning(op, configs=[CustomOpConfig(d) for d in decomps], name=name)
                _wrap_lowering(op._opoverload, name, lowering.lowerings, user)
            _STATE = state
            selection_log.install()
        except Exception:
            _STATE = state
            disable()
            raise
        log.info("cuteforge.inductor enabled (torch %s)", torch.__version__)
        return True


def disable() -> None:
    """Undo enable(): every object and config value it replaced is put back. Idempotent."""
    global _STATE
    with _LOCK:
        state = _STATE
        if state is None:
            return
        from torch._inductor import config, lowering
        from torch._inductor.choices import InductorChoices

        InductorChoices.get_template_configs = state["get_template_configs"]
        from torch._inductor.kernel import custom_op

        custom_op.autotune_select_algorithm = state["autotune_select_algorithm"]
        config.pre_grad_custom_pass = state["pre_grad_custom_pass"]
        config.post_grad_custom_post_pass = state["post_grad_custom_post_pass"]
        for table, saved in ((lowering.lowerings, state["lowerings"]), (getattr(lowering, "user_lowerings", None), state["user_lowerings"])):
            if table is None or saved is None:
                continue
            for op, prior in saved.items():
                if prior is _MISSING:
                    table.pop(op, None)
                else:
                    table[op] = prior
        from torch._inductor.select_algorithm import extern_kernels

        for fb in state["extern_names"]:
            if getattr(extern_kernels, fb, None) is _no_fallback:
                delattr(extern_kernels, fb)
        selection_log.uninstall()
        _STATE = None
        log.info("cuteforge.inductor disabled")
