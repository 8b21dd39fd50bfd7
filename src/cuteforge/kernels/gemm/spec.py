"""The sm_90a GEMM as cuteforge kernels: signatures, configs, registration.

One kernel per (A major, B major, epilogue operand kinds), because each has its own
signature; the epilogue expression itself and the SM count are compile parameters.
Tensors as the signature sees them: a (L, M, K), b (L, K, N), out (L, M, N), operands
"row" (M,), "col" (N,), "full" (L, M, N). Every extent and every non-unit stride is
dynamic: the TMA descriptors are built on the host from the runtime tensors, so one
compiled kernel serves every M, N, K and batch.
"""

from __future__ import annotations

from typing import Any

import torch

from ...arch import limits_for
from ...kernel import REGISTRY, CompileSpec, Kernel, kernel
from ...signature import FLOAT_DTYPES, Signature, TensorArg
from .epilogue import GemmEpilogue
from .sm90.config import GemmConfig, candidate_configs, default_config

AB_DTYPES = (torch.bfloat16, torch.float16)
OPERAND_DIMS = {"row": ("M",), "col": ("N",), "full": ("L", "M", "N")}


def kernel_name(a_k_major: bool, b_k_major: bool, kinds: tuple[str, ...] = ()) -> str:
    # t/n as in BLAS: A "t" = K-major rows (row-major), B "n" = K-major (nn.Linear weight.T).
    base = f"gemm_sm90_{'t' if a_k_major else 'n'}{'n' if b_k_major else 't'}"
    return base + ("_" + "_".join(kinds) if kinds else "")


def signature(a_k_major: bool, b_k_major: bool, kinds: tuple[str, ...]) -> Signature:
    args = [
        TensorArg("a", ("L", "M", "K"), dtypes=AB_DTYPES, leading=2 if a_k_major else 1),
        TensorArg("b", ("L", "K", "N"), dtypes=AB_DTYPES, dtype_like="a", leading=1 if b_k_major else 2),
        TensorArg("out", ("L", "M", "N"), dtypes=FLOAT_DTYPES),
    ]
    args += [TensorArg(f"e{i}", OPERAND_DIMS[k], dtypes=FLOAT_DTYPES) for i, k in enumerate(kinds)]
    return Signature(*args)


def _sizes(spec: CompileSpec) -> tuple[int, int]:
    return spec.dtype("a").width // 8, spec.dtype("out").width // 8


def _default_config(spec: CompileSpec) -> GemmConfig:
    return default_config(None, None, None)


def _configs(spec: CompileSpec) -> list[GemmConfig]:
    in_b, out_b = _sizes(spec)
    limits = limits_for(spec.arch)
    valid = []
    for c in candidate_configs(None, None):
        try:
            c.validate(in_b, out_b, limits)
        except ValueError:
            continue
        valid.append(c)
    return valid


def _validate(spec: CompileSpec, config: Any) -> None:
    in_b, out_b = _sizes(spec)
    config.validate(in_b, out_b, limits_for(spec.arch))


def _builder(a_k_major: bool, b_k_major: bool, kinds: tuple[str, ...]) -> Any:
    def build(spec: CompileSpec) -> Any:
        from .sm90.host import make_gemm

        cfg = spec.config or GemmConfig()
        in_b, out_b = _sizes(spec)
        stages = cfg.resolved_stages(in_b, out_b, limits_for(spec.arch))
        epi_key = spec.param("epilogue", None)
        epi_fn = GemmEpilogue(epi_key, kinds).fn() if epi_key else None
        sms = int(spec.param("sms", limits_for(spec.arch).sm_count))
        return make_gemm(cfg, stages, a_k_major, b_k_major, kinds, epi_fn, sms // (cfg.cluster_m * cfg.cluster_n))

    build.__name__ = kernel_name(a_k_major, b_k_major, kinds)
    return build


def gemm_kernel(a_k_major: bool, b_k_major: bool, kinds: tuple[str, ...] = ()) -> Kernel:
    """The registered kernel for these operand majors and epilogue operand kinds."""
    name = kernel_name(a_k_major, b_k_major, kinds)
    k = REGISTRY.get(name)
    if k is None:
        k = kernel(
            name=name,
            signature=signature(a_k_major, b_k_major, kinds),
            archs=("sm_90a",),
            default_config=_default_config,
            configs=_configs,
        )(_builder(a_k_major, b_k_major, kinds))
        k.validate_config = _validate  # type: ignore[attr-defined]  # the autotuner's hook
    return k


# The four plain layouts are registered on import (the CLI and `precompile` list them).
for _a in (True, False):
    for _b in (True, False):
        gemm_kernel(_a, _b)
