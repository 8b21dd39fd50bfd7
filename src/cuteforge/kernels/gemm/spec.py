"""The sm_90a GEMM as cuteforge kernels: signatures, configs, registration.

One kernel per (A major, B major, epilogue operand kinds), because each has its own
signature; the epilogue expression itself and the SM count are compile parameters.
Tensors as the signature sees them: a (L, M, K), b (L, K, N), out (L, M, N), operands
"row" (M,), "col" (N,), "full" (L, M, N). Every extent and every non-unit stride is
dynamic: the TMA descriptors are built on the host from the runtime tensors, so one
compiled kernel serves every M, N, K and batch.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import torch

from ...arch import limits_for
from ...kernel import REGISTRY, CompileSpec, Kernel, kernel
from ...signature import FLOAT_DTYPES, BoundKey, Signature, TensorArg
from .epilogue import GATES, GemmEpilogue, gate_function
from .sm90.config import GemmConfig, candidate_configs, default_config, gated_config

AB_DTYPES = (torch.bfloat16, torch.float16)
# fp8 (WGMMA reads both operands K-major only; A and B may be different fp8 formats).
FP8_DTYPES = (torch.float8_e4m3fn, torch.float8_e5m2)
OPERAND_DIMS = {"row": ("M",), "col": ("N",), "full": ("L", "M", "N")}
# What `cuteforge precompile` builds for each plain layout (any shape: all dims dynamic),
# for a 132-SM part (H100 SXM / H200); `ops.gemm` passes the live SM count.
STANDARD_DTYPES = (("bfloat16",) * 3, ("float16",) * 3, ("bfloat16", "bfloat16", "float32"))
STANDARD_SMS = 132


def kernel_name(a_k_major: bool, b_k_major: bool, kinds: tuple[str, ...] = (), fp8: bool = False) -> str:
    # t/n as in BLAS: A "t" = K-major rows (row-major), B "n" = K-major (nn.Linear weight.T).
    base = f"gemm_sm90_{'fp8_' if fp8 else ''}{'t' if a_k_major else 'n'}{'n' if b_k_major else 't'}"
    return base + ("_" + "_".join(kinds) if kinds else "")


WORK = TensorArg("work", ("W",), dtypes=(torch.int32,))


def signature(a_k_major: bool, b_k_major: bool, kinds: tuple[str, ...], fp8: bool = False) -> Signature:
    """a, b, out, the int32 stream-K workspace `work` (flags zero; at least
    `stream_k_workspace_words(config, clusters, M, N, K, L, sms=sms)` words for a stream_k config
    to split the problem's last wave, anything, e.g. one word, otherwise: it then runs
    whole tiles), then (fp8) the fp32 per-tensor scales scale_a, scale_b of one element
    each, then the epilogue operands e0.. ."""
    if fp8:
        args = [
            TensorArg("a", ("L", "M", "K"), dtypes=FP8_DTYPES, leading=2),
            TensorArg("b", ("L", "K", "N"), dtypes=FP8_DTYPES, leading=1),
            TensorArg("out", ("L", "M", "N"), dtypes=FLOAT_DTYPES),
            WORK,
            TensorArg("scale_a", ("SA",), dtypes=(torch.float32,)),
            TensorArg("scale_b", ("SB",), dtypes=(torch.float32,)),
        ]
    else:
        args = [
            TensorArg("a", ("L", "M", "K"), dtypes=AB_DTYPES, leading=2 if a_k_major else 1),
            TensorArg("b", ("L", "K", "N"), dtypes=AB_DTYPES, dtype_like="a", leading=1 if b_k_major else 2),
            TensorArg("out", ("L", "M", "N"), dtypes=FLOAT_DTYPES),
            WORK,
        ]
    args += [TensorArg(f"e{i}", OPERAND_DIMS[k], dtypes=FLOAT_DTYPES) for i, k in enumerate(kinds)]
    return Signature(*args)


def gated_signature(a_k_major: bool) -> Signature:
    """a, the gate weight b and the up weight b_up (both (L, K, N), K-major: an nn.Linear
    weight transposed), out (L, M, N) = gate(a @ b, a @ b_up), the stream-K workspace."""
    return Signature(
        TensorArg("a", ("L", "M", "K"), dtypes=AB_DTYPES, leading=2 if a_k_major else 1),
        TensorArg("b", ("L", "K", "N"), dtypes=AB_DTYPES, dtype_like="a", leading=1),
        TensorArg("b_up", ("L", "K", "N"), dtypes=AB_DTYPES, dtype_like="a", leading=1),
        TensorArg("out", ("L", "M", "N"), dtypes=FLOAT_DTYPES),
        WORK,
    )


def _sizes(spec: CompileSpec) -> tuple[int, int]:
    return spec.bits("a") // 8, spec.bits("out") // 8


def _default_config(spec: CompileSpec) -> GemmConfig:
    return default_config(None, None, None, in_bytes=_sizes(spec)[0])


def _configs(spec: CompileSpec) -> list[GemmConfig]:
    # `validate` drops what spec's dtypes and target cannot run
    return candidate_configs(None, None, in_bytes=_sizes(spec)[0])


def _validate(spec: CompileSpec, config: Any) -> None:
    in_b, out_b = _sizes(spec)
    config.validate(in_b, out_b, limits_for(spec.arch))


def _validate_gated(spec: CompileSpec, config: Any) -> None:
    _validate(spec, config)
    config.validate_gated()


def _gated_configs(spec: CompileSpec) -> list[GemmConfig]:
    return [c for c in _configs(spec) if c.gated_ok]


def _builder(a_k_major: bool, b_k_major: bool, kinds: tuple[str, ...], fp8: bool = False) -> Any:
    def build(spec: CompileSpec) -> Any:
        from .sm90.host import make_gemm

        in_b, out_b = _sizes(spec)
        cfg = spec.config or default_config(None, None, None, in_bytes=in_b)
        # Every compile path (ops.gemm config=, precompile, show, direct Kernel.get) gets
        # the same check as the tuner: an impossible tile must not reach the tracer.
        cfg.validate(in_b, out_b, limits_for(spec.arch))
        stages = cfg.resolved_stages(in_b, out_b, limits_for(spec.arch))
        epi_key = spec.param("epilogue", None)
        epi_fn = GemmEpilogue(epi_key, kinds).fn() if epi_key else None
        sms = int(spec.param("sms", limits_for(spec.arch).sm_count))
        # "clusters": the persistent grid, set by ops.gemm only where the device runs fewer
        # clusters at once than sms / cluster size (4-CTA clusters)
        clusters = int(spec.param("clusters", sms // (cfg.cluster_m * cfg.cluster_n)))
        return make_gemm(cfg, stages, a_k_major, b_k_major, kinds, epi_fn, clusters, scaled=fp8, sms=sms)

    build.__name__ = kernel_name(a_k_major, b_k_major, kinds, fp8)
    return build


def _gated_builder(a_k_major: bool, gate: str) -> Any:
    def build(spec: CompileSpec) -> Any:
        from .sm90.host import make_gemm

        in_b, out_b = _sizes(spec)
        cfg = spec.config or gated_config(default_config(None, None, None, in_bytes=in_b))
        _validate_gated(spec, cfg)
        stages = cfg.resolved_stages(in_b, out_b, limits_for(spec.arch))
        sms = int(spec.param("sms", limits_for(spec.arch).sm_count))
        clusters = int(spec.param("clusters", sms // (cfg.cluster_m * cfg.cluster_n)))
        return make_gemm(cfg, stages, a_k_major, True, (), None, clusters, sms=sms, gate_fn=gate_function(gate))

    build.__name__ = gated_kernel_name(a_k_major, gate)
    return build


def _gated_specializations() -> Iterable[tuple[BoundKey, dict[str, Any]]]:
    """SwiGLU's (`nn.SwiGLUMLP` without grad) in bf16 and fp16: what `precompile` builds."""
    for dt in ("bfloat16", "float16"):
        yield BoundKey((dt,) * 4 + ("int32",), (), (8, 8, 8, 8, 4)), {"sms": STANDARD_SMS}


def gated_kernel_name(a_k_major: bool, gate: str) -> str:
    return f"{kernel_name(a_k_major, True)}_{gate}_mul"


def gemm_gated_kernel(a_k_major: bool, gate: str = "silu") -> Kernel:
    """The gated GEMM: out = gate(a @ b) * (a @ b_up) in one kernel (SwiGLU's gate and up
    projections with their activation), neither product written to memory."""
    if gate not in GATES:
        raise ValueError(f"gate must be one of {GATES}, got {gate!r}")
    name = gated_kernel_name(a_k_major, gate)
    k = REGISTRY.get(name)
    if k is None:
        k = kernel(
            name=name,
            signature=gated_signature(a_k_major),
            archs=("sm_90a",),
            default_config=lambda spec: gated_config(_default_config(spec)),
            configs=_gated_configs,
            specializations=_gated_specializations if a_k_major and gate == "silu" else None,
            validate=_validate_gated,
        )(_gated_builder(a_k_major, gate))
    return k


def _specializations(kinds: tuple[str, ...]) -> Callable[[], Iterable[tuple[BoundKey, dict[str, Any]]]] | None:
    if kinds:
        return None  # epilogue kernels are compiled on first use (or by the tuner)

    def specs() -> Iterable[tuple[BoundKey, dict[str, Any]]]:
        for dts in STANDARD_DTYPES:
            vecs = tuple(4 if d == "float32" else 8 for d in dts)
            yield BoundKey((*dts, "int32"), (), (*vecs, 4)), {"sms": STANDARD_SMS}

    return specs


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
            specializations=_specializations(kinds),
            validate=_validate,  # the autotuner's pre-compile check
        )(_builder(a_k_major, b_k_major, kinds))
    return k


def gemm_fp8_kernel(kinds: tuple[str, ...] = ()) -> Kernel:
    """The fp8 kernel (A and B K-major, per-tensor scales; per-row / per-column ones are
    epilogue operands, `GemmEpilogue.with_scales`) for these epilogue operand kinds.
    No standard specializations: compiled on first use (or by the tuner)."""
    name = kernel_name(True, True, kinds, fp8=True)
    k = REGISTRY.get(name)
    if k is None:
        k = kernel(
            name=name,
            signature=signature(True, True, kinds, fp8=True),
            archs=("sm_90a",),
            default_config=_default_config,
            configs=_configs,
            validate=_validate,
        )(_builder(True, True, kinds, fp8=True))
    return k


# Registered on import: the four layouts with every operand-kind set the presets use, so
# that autotuner workers (which import this module and look kernels up by name) find
# them. A fusion Epilogue with another kind set registers on first use in the process.
PRESET_KINDS = tuple(
    tuple(k for k in (bias, "full" if c else None, "full" if res else None) if k)
    for bias in (None, "row", "col")
    for c in (False, True)
    for res in (False, True)
)
# fp8 also with per-row scale_a / per-column scale_b in front (ops.gemm's rowwise scales),
# within the kernel's three operands
SCALE_KINDS = ((), ("row",), ("col",), ("row", "col"))
for _kinds in dict.fromkeys(PRESET_KINDS):
    for _a in (True, False):
        for _b in (True, False):
            gemm_kernel(_a, _b, _kinds)
for _kinds in dict.fromkeys(h + k for h in SCALE_KINDS for k in PRESET_KINDS if len(h + k) <= 3):
    gemm_fp8_kernel(_kinds)
for _a in (True, False):
    for _gate in GATES:
        gemm_gated_kernel(_a, _gate)
