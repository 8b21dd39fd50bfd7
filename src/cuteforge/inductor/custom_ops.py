"""The custom ops the graph rewrites produce (`cuteforge_inductor::*`), the GEMM choices'
kernels, and both sides of each custom-op selection: `inductor_*`, Inductor's own
decomposition, and `cuteforge_*`, the plain function of the cuteforge ExternKernelChoice.
Their eager impls are the cuteforge ops (warm path: one dict lookup)."""

from __future__ import annotations

import functools
import logging
import re
import struct
from collections.abc import Callable
from typing import Any

import torch

log = logging.getLogger("cuteforge.inductor")


@functools.cache
def _preset_key(act: str, bias: bool, c: bool = False) -> tuple[str, str]:
    """(epilogue key, operand kinds) of a preset epilogue, as torch.ops.cuteforge.gemm takes them."""
    from ..kernels.gemm.epilogue import GemmEpilogue

    epi = GemmEpilogue.preset(act, bias="col" if bias else None, c=c)
    return (epi.key, ",".join(epi.kinds)) if epi is not None else ("", "")


def _gemm(a: torch.Tensor, b: torch.Tensor, ops: list[torch.Tensor], act: str = "none", bias: bool = False,
          c: bool = False) -> torch.Tensor:
    """The cuteforge GEMM with a preset epilogue, straight to ops.gemm's plan memo (`_run`,
    what torch.ops.cuteforge.gemm calls): these calls run inside Inductor's timing loop and
    the compiled graph, so they skip the public gemm()'s argument resolution (the plan made
    on the first call of a layout still checks everything). `ops`: bias then c, as present."""
    from ..ops.gemm import _run

    key, kinds = _preset_key(act, bias, c)
    return _run(a, b, ops, key, kinds, None)


_NO_PY_DISPATCHER = getattr(torch._C, "_DisablePythonDispatcher", None)


def _as_at_runtime(fn: Callable[..., torch.Tensor]) -> Callable[..., torch.Tensor]:
    """A cuteforge choice's kernel, called with the Python dispatcher off. Inductor compiles,
    and so benchmarks its choices, under `enable_python_dispatcher()`, which sends every
    aten op a Python function makes through Python: two tensor ops cost 23-29 us there
    against 6 us outside (measured on the CPU). The compiled graph runs without it, so
    the timing now sees what the graph will pay. The guard costs <1 us."""
    if _NO_PY_DISPATCHER is None:
        return fn

    @functools.wraps(fn)
    def call(*args: Any, **kwargs: Any) -> torch.Tensor:
        with _NO_PY_DISPATCHER():
            return fn(*args, **kwargs)

    return call


# The GEMM choices' kernels. Inductor calls these plain functions directly, both in its
# timing loop and in the compiled graph (`extern_kernels.cuteforge_mm(a, b)`): no
# dispatcher in between. Inductor's benchmarker starts its timer before the call, so host
# time shows up in the timing whenever the GPU runs ahead; through the custom op it was
# 20-40 us a call, more than the GPU time these GEMMs save.


@_as_at_runtime
def cuteforge_mm(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return _gemm(a, b, [])


@_as_at_runtime
def cuteforge_bmm(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return _gemm(a, b, [])


@_as_at_runtime
def cuteforge_addmm(inp: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    M, N = a.shape[0], b.shape[1]
    if inp.dim() == 1 or (inp.dim() == 2 and inp.shape[0] == 1):
        return _gemm(a, b, [inp.reshape(N)], bias=True)
    if inp.dim() == 2 and inp.shape == (M, N) and inp.stride(0) == 0:  # an expanded bias row
        return _gemm(a, b, [inp[0]], bias=True)
    return _gemm(a, b, [inp], c=True)


# The same three as ops (their schemas and fake impls travel with the choices, for
# Inductor's metadata; the compiled graph calls the functions above).
@torch.library.custom_op("cuteforge_inductor::mm", mutates_args=())
def _mm_op(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return cuteforge_mm(a, b)


@_mm_op.register_fake
def _(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return a.new_empty(a.shape[0], b.shape[1])


@torch.library.custom_op("cuteforge_inductor::bmm", mutates_args=())
def _bmm_op(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return cuteforge_bmm(a, b)


@_bmm_op.register_fake
def _(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return a.new_empty(a.shape[0], a.shape[1], b.shape[2])


@torch.library.custom_op("cuteforge_inductor::addmm", mutates_args=())
def _addmm_op(inp: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return cuteforge_addmm(inp, a, b)


@_addmm_op.register_fake
def _(inp: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return a.new_empty(a.shape[0], b.shape[1])


def _linear(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None, act: str) -> torch.Tensor:
    x2 = x.reshape(-1, x.shape[-1])
    y = _gemm(x2, w.t(), [] if b is None else [b], act, bias=b is not None)
    return y.view(*x.shape[:-1], w.shape[0])


@torch.library.custom_op("cuteforge_inductor::linear_act", mutates_args=())
def _linear_act_op(x: torch.Tensor, w: torch.Tensor, act: str) -> torch.Tensor:
    return _linear_act_impl(x, w, act)


@_linear_act_op.register_fake
def _(x: torch.Tensor, w: torch.Tensor, act: str) -> torch.Tensor:
    return x.new_empty(*x.shape[:-1], w.shape[0])


@torch.library.custom_op("cuteforge_inductor::linear_bias_act", mutates_args=())
def _linear_bias_act_op(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor, act: str) -> torch.Tensor:
    return _linear_bias_act_impl(x, w, b, act)


@_linear_bias_act_op.register_fake
def _(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor, act: str) -> torch.Tensor:
    return x.new_empty(*x.shape[:-1], w.shape[0])


def _row_op(name: str, impl: Callable[..., torch.Tensor], fake: Callable[..., torch.Tensor]) -> Any:
    torch_impl = globals()[f"inductor_{name}"]

    def guarded(*args: Any) -> torch.Tensor:
        # The rewrite only offers what the kernels take; should one still refuse (a bad
        # input cuteforge checks and this module did not), compute it with torch rather
        # than fail the compile or the graph.
        try:
            return impl(*args)
        except (TypeError, ValueError) as e:
            log.warning("cuteforge.inductor: %s fell back to torch: %s", name, e)
            return torch_impl(*args)

    schema = torch.library.infer_schema(impl, mutates_args=())
    op = torch.library.custom_op(f"cuteforge_inductor::{name}", guarded, mutates_args=(), schema=schema)
    op.register_fake(fake)
    return op


# The ops' scalar arguments become part of Inductor's choice names, and those names become
# Python identifiers in generated code: register_custom_op_autotuning names a choice
# "<name>_<decomposition>_<arg>_<str(value)>..." and compiles it as a graph named
# "benchmark_<that>" whose buffers are "<graph name>_buf0". torch 2.13 sanitizes the value;
# torch 2.11 does not (SubgraphTemplate._generate_variant_name), so "eps_1e-05" or
# "dim_-1" there is a SyntaxError in the benchmark module and the choice fails. Hence every
# scalar here prints as [A-Za-z0-9_]+: softmax has no dim (always the last), and eps
# travels as the bit pattern of its float64 (a non-negative int for eps >= 0).


def eps_to_bits(eps: float) -> int:
    """The float64 bit pattern of `eps` as an int (identifier-safe when printed)."""
    return struct.unpack("<q", struct.pack("<d", float(eps)))[0]


def bits_to_eps(bits: int) -> float:
    return struct.unpack("<d", struct.pack("<q", int(bits)))[0]


def _name_safe(value: Any) -> bool:
    """str(value) can sit inside an identifier (what torch 2.11 puts in choice names)."""
    return re.fullmatch(r"[A-Za-z0-9_]+", str(value)) is not None


def _softmax_impl(x: torch.Tensor) -> torch.Tensor:
    from ..ops.softmax import softmax  # (cuteforge.ops.softmax the attribute is the function)

    return softmax(x, -1)


def _log_softmax_impl(x: torch.Tensor) -> torch.Tensor:
    from ..ops.softmax import log_softmax

    return log_softmax(x, -1)


def _rms_norm_impl(x: torch.Tensor, w: torch.Tensor, eps_bits: int) -> torch.Tensor:
    from ..ops.norm import rms_norm

    return rms_norm(x, w, bits_to_eps(eps_bits))


def _layer_norm_impl(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor, eps_bits: int) -> torch.Tensor:
    from ..ops.norm import layer_norm

    return layer_norm(x, w, b, bits_to_eps(eps_bits))


def _layer_norm_nb_impl(x: torch.Tensor, w: torch.Tensor, eps_bits: int) -> torch.Tensor:
    from ..ops.norm import layer_norm

    return layer_norm(x, w, None, bits_to_eps(eps_bits))


def _like_x(x: torch.Tensor, *_: Any) -> torch.Tensor:
    return x.new_empty(x.shape)


def _like_linear(x: torch.Tensor, w: torch.Tensor, *_: Any) -> torch.Tensor:
    return x.new_empty(*x.shape[:-1], w.shape[0])


def _linear_act_impl(x: torch.Tensor, w: torch.Tensor, act: str) -> torch.Tensor:
    return _linear(x, w, None, act)


def _linear_bias_act_impl(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor, act: str) -> torch.Tensor:
    return _linear(x, w, b, act)


# --------------------------------------------------------------------------- candidates
# `inductor_*`: the decomposition register_custom_op_autotuning times and, when it wins,
# inlines (called as decomp(*tensors, **scalars) with the op's schema names; the names
# matter: choice names contain them, and the log classifies by them).
# `cuteforge_*`: the plain functions of the cuteforge ExternKernelChoices added to the same
# selection (`_custom_choice`): called directly by the timing loop and, when one wins, by
# the compiled graph (`extern_kernels.cuteforge_rms_norm(buf0, arg1, eps_bits=...)`), like
# the GEMM choices. As subgraph decompositions they were compiled into benchmark modules
# whose host time (~100 us a call on the H200 host) landed in their timings: a layer_norm
# whose kernel takes ~17 us timed 134 us, a fused Linear + gelu 1.36x faster than cuBLAS
# + gelu standalone timed 1.3x slower.

_ACT_TORCH: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "none": lambda t: t,
    "relu": torch.relu,
    "gelu": lambda t: torch.nn.functional.gelu(t, approximate="tanh"),
    "silu": torch.nn.functional.silu,
}


@_as_at_runtime
def cuteforge_linear_act(x: torch.Tensor, w: torch.Tensor, act: str) -> torch.Tensor:
    return _linear_act_impl(x, w, act)


def inductor_linear_act(x: torch.Tensor, w: torch.Tensor, act: str) -> torch.Tensor:
    return _ACT_TORCH[act](torch.nn.functional.linear(x, w))


@_as_at_runtime
def cuteforge_linear_bias_act(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor, act: str) -> torch.Tensor:
    return _linear_bias_act_impl(x, w, b, act)


def inductor_linear_bias_act(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor, act: str) -> torch.Tensor:
    return _ACT_TORCH[act](torch.nn.functional.linear(x, w, b))


@_as_at_runtime
def cuteforge_softmax(x: torch.Tensor) -> torch.Tensor:
    return _softmax_impl(x)


def inductor_softmax(x: torch.Tensor) -> torch.Tensor:
    return torch.softmax(x, -1)


@_as_at_runtime
def cuteforge_log_softmax(x: torch.Tensor) -> torch.Tensor:
    return _log_softmax_impl(x)


def inductor_log_softmax(x: torch.Tensor) -> torch.Tensor:
    return torch.log_softmax(x, -1)


@_as_at_runtime
def cuteforge_rms_norm(x: torch.Tensor, w: torch.Tensor, eps_bits: int) -> torch.Tensor:
    return _rms_norm_impl(x, w, eps_bits)


def inductor_rms_norm(x: torch.Tensor, w: torch.Tensor, eps_bits: int) -> torch.Tensor:
    return torch.rms_norm(x, (x.shape[-1],), w, bits_to_eps(eps_bits))


@_as_at_runtime
def cuteforge_layer_norm(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor, eps_bits: int) -> torch.Tensor:
    return _layer_norm_impl(x, w, b, eps_bits)


def inductor_layer_norm(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor, eps_bits: int) -> torch.Tensor:
    return torch.nn.functional.layer_norm(x, (x.shape[-1],), w, b, bits_to_eps(eps_bits))


@_as_at_runtime
def cuteforge_layer_norm_nobias(x: torch.Tensor, w: torch.Tensor, eps_bits: int) -> torch.Tensor:
    return _layer_norm_nb_impl(x, w, eps_bits)


def inductor_layer_norm_nobias(x: torch.Tensor, w: torch.Tensor, eps_bits: int) -> torch.Tensor:
    return torch.nn.functional.layer_norm(x, (x.shape[-1],), w, None, bits_to_eps(eps_bits))


_softmax_op = _row_op("softmax", _softmax_impl, _like_x)
_log_softmax_op = _row_op("log_softmax", _log_softmax_impl, _like_x)
_rms_norm_op = _row_op("rms_norm", _rms_norm_impl, _like_x)
_layer_norm_op = _row_op("layer_norm", _layer_norm_impl, _like_x)
_layer_norm_nb_op = _row_op("layer_norm_nobias", _layer_norm_nb_impl, _like_x)


# op, autotune name (no "cuteforge" in it: the log tells candidates apart by name), the
# decompositions register_custom_op_autotuning gets (Inductor's own), and the op whose
# cuteforge_<op> function is the cuteforge ExternKernelChoice added to that selection.
AUTOTUNED: list[tuple[Any, str, tuple[Callable[..., Any], ...], str]] = [
    (_linear_act_op, "cfi_linear_act", (inductor_linear_act,), "linear_act"),
    (_linear_bias_act_op, "cfi_linear_bias_act", (inductor_linear_bias_act,), "linear_bias_act"),
    (_softmax_op, "cfi_softmax", (inductor_softmax,), "softmax"),
    (_log_softmax_op, "cfi_log_softmax", (inductor_log_softmax,), "log_softmax"),
    (_rms_norm_op, "cfi_rms_norm", (inductor_rms_norm,), "rms_norm"),
    (_layer_norm_op, "cfi_layer_norm", (inductor_layer_norm,), "layer_norm"),
    (_layer_norm_nb_op, "cfi_layer_norm_nobias", (inductor_layer_norm_nobias,), "layer_norm_nobias"),
]



_EXTERN: dict[str, Any] = {}  # op name -> ExternKernelChoice (registered once per process)


def extern_choice(op_name: str) -> Any:
    """The ExternKernelChoice whose kernel is the plain function cuteforge_<op_name> (the
    op cuteforge_inductor::<op_name> lends its schema). Creating it registers the function
    in `extern_kernels`."""
    from torch._inductor.select_algorithm import ExternKernelChoice

    if op_name not in _EXTERN:
        name = f"cuteforge_{op_name}"
        overload = getattr(torch.ops.cuteforge_inductor, op_name).default
        # lookup() exists on 2.13 only; the registry name is what the assert guards.
        existing = getattr(ExternKernelChoice, "lookup", lambda n: None)(name)
        # kernel: the plain function, which the compiled graph calls as
        # `extern_kernels.<name>(...)` (an ExternKernelAlloc; the op overload only lends its
        # schema for argument names). The function owns its output, hence no out variant.
        _EXTERN[op_name] = existing or ExternKernelChoice(
            globals()[name], name=name, has_out_variant=False, op_overload=overload, use_fallback_kernel=False)
    return _EXTERN[op_name]
