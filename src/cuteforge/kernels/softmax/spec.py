"""Softmax kernels as cuteforge kernels: signatures, configs, standard specializations.

N is static (the row lives in registers, so every loop over it is unrolled at compile
time); M and every row stride are dynamic, so one compiled kernel serves every batch
size and every 2-D view of a larger tensor. The vector width is the widest one that the
rows' alignment allows *and* that divides N, so there is never a scalar tail.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch

from ...arch import limits_for, parse_arch
from ...kernel import CompileSpec, kernel
from ...signature import FLOAT_DTYPES, MAX_VECTOR_BYTES, BoundKey, Signature, TensorArg, torch_dtype
from . import config as cfg_mod

FWD_MODES = ("softmax", "log_softmax")
BWD_MODES = ("softmax_bwd", "log_softmax_bwd")
# The N values `cuteforge precompile` builds ahead of time (powers of two seen in models).
STANDARD_N = (256, 512, 1024, 2048, 4096, 8192, 16384, 32768, 65536, 131072, 262144)
# Vocabulary sizes of common models (Llama 2, GPT-2, Llama 3, Qwen 2): the forward's grid
# also holds them (sampling over a vocabulary; the training loss is cross-entropy's).
VOCAB_N = (32000, 50257, 128256, 151936)

FWD_SIGNATURE = Signature(
    TensorArg("x", ("M", "N")),
    TensorArg("y", ("M", "N"), dtype_like="x"),
    static=("N",),
)
BWD_SIGNATURE = Signature(
    TensorArg("dy", ("M", "N")),
    TensorArg("y", ("M", "N"), dtype_like="dy"),
    TensorArg("dx", ("M", "N"), dtype_like="dy"),
    static=("N",),
)


def row_vec(key: BoundKey) -> int:
    """Elements per vector access: every argument's alignment allows it and it divides N."""
    n = dict(key.static)["N"]
    v = min(key.vec)
    while n % v:
        v //= 2
    return v


def kernel_params(mode: str, key: BoundKey, same_heads: bool) -> tuple[tuple[str, Any], ...]:
    """The kernels' parameters for one call: the mode, and ("same_heads", True) where the
    rows are realigned (no 16-byte vectors at their own alignment) and the caller knows
    every operand's rows start as far from a 16-byte boundary as the reference's (the ops:
    pointers and row strides checked at plan time; outputs are fresh, aligned and
    contiguous). That kernel has no element-by-element fallback: the 16-bit backward at
    N = 151937 read 84-87 % of copy without it, 58-63 % with it."""
    params: tuple[tuple[str, Any], ...] = (("mode", mode),)
    if same_heads and rows_realigned(key):
        params += (("same_heads", True),)
    return params


def _same_heads(spec: CompileSpec) -> bool:
    """The spec's same_heads parameter: a bool (a kernel without the fallback is wrong for
    operands with other heads, so "False" as text must not pass for True)."""
    same = spec.param("same_heads", False)
    if not isinstance(same, bool):
        raise ValueError(f"{spec.kernel}: parameter same_heads must be a bool, got {same!r}")
    return same


def rows_realigned(key: BoundKey) -> bool:
    """The kernels realign these rows: they do not start on 16 bytes (no 16-byte vectors
    at their own alignment)."""
    return row_vec(key) * torch_dtype(key.dtypes[0]).itemsize < MAX_VECTOR_BYTES


def config_for(arch: str, n: int, dtype_bits: int, backward: bool, m: int | None, mode: str | None = None,
               key: BoundKey | None = None) -> cfg_mod.SoftmaxConfig:
    """The heuristic config for an (m, n) problem; clusters only on sm_90 and newer. With
    the call's ``mode`` and ``key``, the forward knows rows that are realigned."""
    return cfg_mod.default_config(n, dtype_bits, backward, m, cluster=parse_arch(arch) >= 90, mode=mode,
                                  realigned=key is not None and rows_realigned(key))


def _default_config(backward: bool):
    def f(spec: CompileSpec) -> Any:
        return config_for(spec.arch, spec.static("N"), spec.bits(spec._signature.names[0]), backward, None,
                          spec.param("mode", None), spec.key)

    return f


def _validator(backward: bool):
    """`f(spec, config)` raising ValueError when config cannot run spec's problem: the
    kernels' `validate=` hook, which the autotuner calls before compiling a candidate."""

    def f(spec: CompileSpec, config: Any) -> None:
        config.validate(spec.static("N"), spec.bits(spec._signature.names[0]), backward, limits_for(spec.arch))

    return f


def _configs(backward: bool):
    def f(spec: CompileSpec) -> list[Any]:  # filtered by the kernels' `validate`
        return cfg_mod.candidate_configs(spec.static("N"), spec.bits(spec._signature.names[0]), backward)

    return f


def standard_specializations(backward: bool):
    """(key, params) pairs of contiguous rows of the STANDARD_N lengths (the forward also of
    the VOCAB_N lengths), every dtype and mode: what `cuteforge precompile` builds ahead of
    time. Keyed and parameterized as the ops key a contiguous call (rows that do not start on
    16 bytes: a narrower vector and same_heads, `kernel_params`)."""

    def f(ns: Iterable[int] | None = None) -> Iterable[tuple[BoundKey, dict[str, Any]]]:
        lengths = ns if ns is not None else STANDARD_N if backward else STANDARD_N + VOCAB_N
        for mode in BWD_MODES if backward else FWD_MODES:
            for dt in FLOAT_DTYPES:
                for n in lengths:
                    rows = torch.empty(1, n, dtype=dt, device="meta")
                    key = (BWD_SIGNATURE if backward else FWD_SIGNATURE).fresh_key((rows,) * (3 if backward else 2))
                    yield key, dict(kernel_params(mode, key, True))

    return f


def _softmax_kernel(backward: bool) -> Any:
    """`@kernel` for softmax_fwd or softmax_bwd: every hook is the direction's own."""
    return kernel(
        name="softmax_bwd" if backward else "softmax_fwd",
        signature=BWD_SIGNATURE if backward else FWD_SIGNATURE,
        archs=("sm_80+",),
        default_config=_default_config(backward),
        configs=_configs(backward),
        specializations=standard_specializations(backward),
        validate=_validator(backward),
    )


def _mode(spec: CompileSpec, kernel_name: str, modes: tuple[str, ...]) -> str:
    mode = spec.param("mode")
    if mode not in modes:
        raise ValueError(f"{kernel_name}: mode must be one of {modes}, got {mode!r}")
    return mode


@_softmax_kernel(backward=False)
def softmax_fwd(spec: CompileSpec) -> Any:
    from .chunked import make_softmax_chunked
    from .device import make_softmax

    mode = _mode(spec, "softmax_fwd", FWD_MODES)
    same = _same_heads(spec)
    if getattr(spec.config, "path", "regs") != "regs":  # the long-row forward paths (chunked.py)
        return make_softmax_chunked(mode, spec.dtype("x"), spec.static("N"), row_vec(spec.key), spec.config, same)
    return make_softmax(mode, spec.dtype("x"), spec.static("N"), row_vec(spec.key), spec.config, same)


@_softmax_kernel(backward=True)
def softmax_bwd(spec: CompileSpec) -> Any:
    from .chunked import make_softmax_chunked
    from .device import make_softmax

    mode = _mode(spec, "softmax_bwd", BWD_MODES)
    same = _same_heads(spec)
    if getattr(spec.config, "path", "regs") == "mbar":  # chunked rows, st.async exchange (chunked.py)
        return make_softmax_chunked(mode, spec.dtype("dy"), spec.static("N"), row_vec(spec.key), spec.config, same)
    return make_softmax(mode, spec.dtype("dy"), spec.static("N"), row_vec(spec.key), spec.config, same)
