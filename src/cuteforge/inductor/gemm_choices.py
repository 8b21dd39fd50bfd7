"""Seam 1: the cuteforge GEMM next to Inductor's mm / addmm / bmm choices, through a
wrapper on `InductorChoices.get_template_configs`."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from . import selection_log, support
from .custom_ops import extern_choice

log = logging.getLogger("cuteforge.inductor")

GEMM_OPS = {"mm": "mm", "addmm": "addmm", "bmm": "bmm"}


def _node_static(node: Any) -> bool:
    try:
        return all(getattr(s, "is_number", isinstance(s, int)) for s in node.get_size())
    except Exception:  # noqa: BLE001
        return False


def gemm_choice(kernel_inputs: Any, templates: Any, op_name: str) -> Any:
    """The cuteforge ChoiceCaller for this tuned_mm/addmm/bmm selection, or None."""
    if op_name not in GEMM_OPS or not support.autotuning():
        return None
    # Only the call that carries Inductor's ATen choice of this op (2.13's addmm asks twice;
    # Triton's mm_template is also named "mm", hence the type check).
    from torch._inductor.select_algorithm import ExternKernelChoice

    if not any(isinstance(t, ExternKernelChoice) and t.name == op_name for t in templates):
        return None
    nodes = kernel_inputs.nodes()
    if not support.sm90(kernel_inputs.device()):
        return None
    dts = kernel_inputs.dtypes()
    if dts[-1] not in support.GEMM_DTYPES or dts[-2] != dts[-1] or kernel_inputs.out_dtype() != dts[-1]:
        return None
    if not all(_node_static(n) for n in nodes):
        return None
    if op_name == "addmm":
        if kernel_inputs.get_scalar("alpha") != 1 or kernel_inputs.get_scalar("beta") != 1:
            return None
        if dts[0] not in support.ROW_DTYPES:
            return None
    m, n, k = kernel_inputs.mnk_hinted()
    if min(m, n, k) <= 0:
        return None
    return extern_choice(op_name).bind(nodes, kernel_inputs.output_layout(flexible=False))


def _wrap_get_template_configs(orig: Callable[..., Any]) -> Callable[..., Any]:
    def get_template_configs(self: Any, kernel_inputs: Any, templates: Any, op_name: str, *args: Any, **kwargs: Any) -> Any:
        choices = orig(self, kernel_inputs, templates, op_name, *args, **kwargs)
        try:
            extra = gemm_choice(kernel_inputs, templates, op_name)
        except Exception as e:  # noqa: BLE001 - never break Inductor's own selection
            log.debug("cuteforge %s choice not offered: %r", op_name, e)
            extra = None
        if extra is not None:
            selection_log.ensure_feedback()
            choices = [*choices, extra]
        return choices

    get_template_configs.__wrapped__ = orig  # type: ignore[attr-defined]
    get_template_configs._cuteforge = True  # type: ignore[attr-defined]
    return get_template_configs
