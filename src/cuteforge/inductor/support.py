"""Where the integration applies: the torch versions whose Inductor it was read against,
and the candidates' preconditions (an sm_90 CUDA device, max-autotune on, static shapes)."""

from __future__ import annotations

import re
from typing import Any

import torch

# Inclusive (major, minor) range this package was written and read against.
SUPPORTED_TORCH = ((2, 11), (2, 13))
GEMM_DTYPES = (torch.bfloat16, torch.float16)
ROW_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
MAX_N = 262144  # longest row the softmax / norm kernels take (ops/softmax.py, ops/norm.py)


def _parse(version: str) -> tuple[int, int] | None:
    m = re.match(r"(\d+)\.(\d+)", version)
    return (int(m.group(1)), int(m.group(2))) if m else None


def unsupported_reason(version: str | None = None) -> str | None:
    """None when this torch offers every hook enable() uses, else why not."""
    v = _parse(version if version is not None else str(torch.__version__))
    if v is None or not (SUPPORTED_TORCH[0] <= v <= SUPPORTED_TORCH[1]):
        lo, hi = (".".join(map(str, p)) for p in SUPPORTED_TORCH)
        return f"torch {version or torch.__version__} is outside the supported range {lo} to {hi}"
    try:
        from torch._inductor import config, lowering, select_algorithm
        from torch._inductor.choices import InductorChoices
        from torch._inductor.custom_graph_pass import CustomGraphPass  # noqa: F401
        from torch._inductor.kernel import custom_op
    except ImportError as e:
        return f"torch {torch.__version__}: Inductor module missing ({e})"
    needed = [
        (custom_op, "register_custom_op_autotuning"), (custom_op, "CustomOpConfig"),
        (custom_op, "autotune_select_algorithm"),
        (InductorChoices, "get_template_configs"), (select_algorithm, "ExternKernelChoice"),
        (select_algorithm, "add_feedback_saver"), (select_algorithm, "get_algorithm_selector_cache"),
        (lowering, "lowerings"), (config, "pre_grad_custom_pass"), (config, "post_grad_custom_post_pass"),
        (config, "max_autotune"),
    ]
    missing = [f"{getattr(o, '__name__', o)}.{a}" for o, a in needed if not hasattr(o, a)]
    if missing:
        return f"torch {torch.__version__} lacks {', '.join(missing)}"
    return None


def sm90(device: torch.device) -> bool:
    if device.type != "cuda" or not torch.cuda.is_available():
        return False
    try:
        return torch.cuda.get_device_capability(device) == (9, 0)
    except Exception:  # noqa: BLE001
        return False


def autotuning() -> bool:
    from torch._inductor import config

    return bool(config.max_autotune or config.max_autotune_gemm)


def static_shape(shape: Any) -> bool:
    return all(isinstance(s, int) for s in shape)
