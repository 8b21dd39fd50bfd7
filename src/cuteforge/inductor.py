"""cuteforge kernels as autotuning candidates inside torch.compile(mode="max-autotune").

    import cuteforge.inductor
    cuteforge.inductor.enable()      # opt-in; returns False (with one warning) on an unsupported torch
    torch.compile(model, mode="max-autotune")(x)
    cuteforge.inductor.choices_log() # which cuteforge candidates won or lost, with timings
    cuteforge.inductor.disable()     # puts back exactly what enable() changed

Every coupling to Inductor internals lives in this module. Three seams, each checked on
torch 2.11 and 2.13 (both read from source):

1. mm / addmm / bmm: `InductorChoices.get_template_configs` (torch/_inductor/choices.py)
   is what `tuned_mm`, `tuned_addmm` and `tuned_bmm` (torch/_inductor/kernel/mm.py,
   bmm.py) call to turn their template lists into `ChoiceCaller`s before
   `autotune_select_algorithm`. enable() wraps that method on the class: when the list
   holds Inductor's own ATen choice ("mm", "addmm", "bmm"), one more choice is appended:
   an `ExternKernelChoice` (select_algorithm.py) whose kernel is a plain cuteforge
   function (`cuteforge_mm` ...), called directly by the timing loop and, when it wins,
   by the compiled graph (an `ir.ExternKernelAlloc`). It is timed next to cuBLAS and
   every Triton template in the same selection, so it only wins when it is faster.
2. softmax / log_softmax / rms_norm / layer_norm and Linear + relu/gelu(tanh)/silu: a
   pre-grad graph pass (`config.pre_grad_custom_pass`, run by
   torch/_inductor/fx_passes/pre_grad.py on the Dynamo graph, where these are still
   single `F.*` calls) rewrites them into single-output custom ops `cuteforge_inductor::*`
   (inference graphs only: outputs that do not require grad). Each op is registered with
   `register_custom_op_autotuning` (torch/_inductor/kernel/custom_op.py) with Inductor's
   own decomposition `inductor_*` (the plain torch expression, which Inductor compiles
   and, when it wins, inlines so its own fusion applies). Into that selection enable()
   adds one `ExternKernelChoice` whose kernel is the plain function `cuteforge_<op>` (the
   GEMM epilogue fused by cuteforge's own epilogue mechanism), by wrapping the op's
   lowering (which records its scalar arguments) and the module's
   `autotune_select_algorithm` (which appends the choice to selections named `cfi_*`).
   Inductor times both (and, on 2.13, the op's eager impl, also cuteforge) and keeps
   the fastest.
3. Logging: a feedback saver (`select_algorithm.add_feedback_saver`) sees every selection's
   timings; those with a cuteforge candidate are logged (logger `cuteforge.inductor`) and
   kept for `choices_log()`.

The FX graph cache key follows the switch: a `CustomGraphPass` with a `uuid()` goes into
`config.post_grad_custom_post_pass` (part of `FxGraphHashDetails` on both versions), so
a graph compiled with cuteforge is never served to a run without it, and the reverse.

Candidates are offered only where they can run: a CUDA device of compute capability 9.0,
static shapes, bf16/fp16 GEMM operands (fp32 too for softmax/norms), max-autotune on.
Every candidate calls the ordinary cuteforge ops, so their plan memo, on-disk compile
cache and stored tuning results serve Inductor's benchmarking and the compiled graph alike.
"""

from __future__ import annotations

import functools
import hashlib
import importlib
import inspect
import logging
import operator
import re
import struct
import threading
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

__all__ = ["enable", "disable", "is_enabled", "choices_log", "clear_choices_log", "unsupported_reason", "SUPPORTED_TORCH"]

log = logging.getLogger("cuteforge.inductor")

# Inclusive (major, minor) range this module was written and read against.
SUPPORTED_TORCH = ((2, 11), (2, 13))

_LOCK = threading.RLock()
_WARNED = False
_STATE: dict[str, Any] | None = None  # what enable() changed, for disable()
_LOG: list[dict[str, Any]] = []
_MISSING = object()
_GEMM_DTYPES = (torch.bfloat16, torch.float16)
_ROW_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
_MAX_N = 262144  # longest row the softmax / norm kernels take (ops/softmax.py, ops/norm.py)


# --------------------------------------------------------------------------- custom ops
# Single-output ops the pre-grad pass rewrites into, and the kernels of the GEMM choices.
# Their eager impls are the cuteforge ops (warm path: one dict lookup).


@functools.cache
def _preset_key(act: str, bias: bool, c: bool = False) -> tuple[str, str]:
    """(epilogue key, operand kinds) of a preset epilogue, as torch.ops.cuteforge.gemm takes them."""
    from .kernels.gemm.epilogue import GemmEpilogue

    epi = GemmEpilogue.preset(act, bias="col" if bias else None, c=c)
    return (epi.key, ",".join(epi.kinds)) if epi is not None else ("", "")


def _gemm(a: torch.Tensor, b: torch.Tensor, ops: list[torch.Tensor], act: str = "none", bias: bool = False,
          c: bool = False) -> torch.Tensor:
    """The cuteforge GEMM with a preset epilogue, straight to ops.gemm's plan memo (`_run`,
    what torch.ops.cuteforge.gemm calls): these calls run inside Inductor's timing loop and
    the compiled graph, so they skip the public gemm()'s argument resolution (the plan made
    on the first call of a layout still checks everything). `ops`: bias then c, as present."""
    from .ops.gemm import _run

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
    from .ops.softmax import softmax  # (cuteforge.ops.softmax the attribute is the function)

    return softmax(x, -1)


def _log_softmax_impl(x: torch.Tensor) -> torch.Tensor:
    from .ops.softmax import log_softmax

    return log_softmax(x, -1)


def _rms_norm_impl(x: torch.Tensor, w: torch.Tensor, eps_bits: int) -> torch.Tensor:
    from .ops.norm import rms_norm

    return rms_norm(x, w, bits_to_eps(eps_bits))


def _layer_norm_impl(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor, eps_bits: int) -> torch.Tensor:
    from .ops.norm import layer_norm

    return layer_norm(x, w, b, bits_to_eps(eps_bits))


def _layer_norm_nb_impl(x: torch.Tensor, w: torch.Tensor, eps_bits: int) -> torch.Tensor:
    from .ops.norm import layer_norm

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
_AUTOTUNED: list[tuple[Any, str, tuple[Callable[..., Any], ...], str]] = [
    (_linear_act_op, "cfi_linear_act", (inductor_linear_act,), "linear_act"),
    (_linear_bias_act_op, "cfi_linear_bias_act", (inductor_linear_bias_act,), "linear_bias_act"),
    (_softmax_op, "cfi_softmax", (inductor_softmax,), "softmax"),
    (_log_softmax_op, "cfi_log_softmax", (inductor_log_softmax,), "log_softmax"),
    (_rms_norm_op, "cfi_rms_norm", (inductor_rms_norm,), "rms_norm"),
    (_layer_norm_op, "cfi_layer_norm", (inductor_layer_norm,), "layer_norm"),
    (_layer_norm_nb_op, "cfi_layer_norm_nobias", (inductor_layer_norm_nobias,), "layer_norm_nobias"),
]


# --------------------------------------------------------------------------- version gate


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


# --------------------------------------------------------------------------- candidate checks


def _sm90(device: torch.device) -> bool:
    if device.type != "cuda" or not torch.cuda.is_available():
        return False
    try:
        return torch.cuda.get_device_capability(device) == (9, 0)
    except Exception:  # noqa: BLE001
        return False


def _autotuning() -> bool:
    from torch._inductor import config

    return bool(config.max_autotune or config.max_autotune_gemm)


def _static(shape: Any) -> bool:
    return all(isinstance(s, int) for s in shape)


# --------------------------------------------------------------------------- seam 1: GEMM choices

_EXTERN: dict[str, Any] = {}  # op name -> ExternKernelChoice (registered once per process)
_GEMM_OPS = {"mm": "mm", "addmm": "addmm", "bmm": "bmm"}


def _extern_choice(op_name: str) -> Any:
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


def _node_static(node: Any) -> bool:
    try:
        return all(getattr(s, "is_number", isinstance(s, int)) for s in node.get_size())
    except Exception:  # noqa: BLE001
        return False


def gemm_choice(kernel_inputs: Any, templates: Any, op_name: str) -> Any:
    """The cuteforge ChoiceCaller for this tuned_mm/addmm/bmm selection, or None."""
    if op_name not in _GEMM_OPS or not _autotuning():
        return None
    # Only the call that carries Inductor's ATen choice of this op (2.13's addmm asks twice;
    # Triton's mm_template is also named "mm", hence the type check).
    from torch._inductor.select_algorithm import ExternKernelChoice

    if not any(isinstance(t, ExternKernelChoice) and t.name == op_name for t in templates):
        return None
    nodes = kernel_inputs.nodes()
    if not _sm90(kernel_inputs.device()):
        return None
    dts = kernel_inputs.dtypes()
    if dts[-1] not in _GEMM_DTYPES or dts[-2] != dts[-1] or kernel_inputs.out_dtype() != dts[-1]:
        return None
    if not all(_node_static(n) for n in nodes):
        return None
    if op_name == "addmm":
        if kernel_inputs.get_scalar("alpha") != 1 or kernel_inputs.get_scalar("beta") != 1:
            return None
        if dts[0] not in _ROW_DTYPES:
            return None
    m, n, k = kernel_inputs.mnk_hinted()
    if min(m, n, k) <= 0:
        return None
    return _extern_choice(op_name).bind(nodes, kernel_inputs.output_layout(flexible=False))


def _wrap_get_template_configs(orig: Callable[..., Any]) -> Callable[..., Any]:
    def get_template_configs(self: Any, kernel_inputs: Any, templates: Any, op_name: str, *args: Any, **kwargs: Any) -> Any:
        choices = orig(self, kernel_inputs, templates, op_name, *args, **kwargs)
        try:
            extra = gemm_choice(kernel_inputs, templates, op_name)
        except Exception as e:  # noqa: BLE001 - never break Inductor's own selection
            log.debug("cuteforge %s choice not offered: %r", op_name, e)
            extra = None
        if extra is not None:
            _ensure_feedback()
            choices = [*choices, extra]
        return choices

    get_template_configs.__wrapped__ = orig  # type: ignore[attr-defined]
    get_template_configs._cuteforge = True  # type: ignore[attr-defined]
    return get_template_configs


# --------------------------------------------------------------------------- seam 2: graph passes


def _module_uuid() -> str:
    h = hashlib.sha256(Path(__file__).read_bytes())
    from . import __version__

    h.update(__version__.encode())
    return h.hexdigest()


def _arg(node: torch.fx.Node, i: int, name: str, default: Any = None) -> Any:
    if len(node.args) > i:
        return node.args[i]
    return node.kwargs.get(name, default)


def _ev(node: Any) -> Any:
    return node.meta.get("example_value") if isinstance(node, torch.fx.Node) else None


_CHECK_DEVICE = [True]  # rewrite_graph(require_gpu=False) turns the sm_90 check off (CPU tests)


def _inference_tensor(t: Any) -> bool:
    # contiguous: the inductor_* and cuteforge_* decompositions must give the same layout
    # (register_custom_op_autotuning checks it), and the cuteforge ops return contiguous
    return (isinstance(t, torch.Tensor) and not t.requires_grad and _static(t.shape) and t.numel() > 0
            and t.is_contiguous() and (not _CHECK_DEVICE[-1] or _sm90(t.device)))


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
    return (_inference_tensor(x) and _inference_tensor(out) and x.dtype in _ROW_DTYPES and x.dim() >= 1
            and isinstance(dim, int) and dim in (-1, x.dim() - 1) and x.shape[-1] <= _MAX_N)


def _norm_ok(x: Any, shape: Any, ws: list[Any], out: Any) -> bool:
    if not (_inference_tensor(x) and _inference_tensor(out) and x.dtype in _ROW_DTYPES and x.shape[-1] <= _MAX_N):
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


def rewrite_graph(graph: torch.fx.Graph, *, require_gpu: bool = True) -> dict[str, int]:
    """Rewrite supported patterns of a Dynamo (pre-grad) graph into cuteforge_inductor ops.

    Returns counts per op. `require_gpu=False` skips the device check (CPU tests of the
    rewrite itself); everything else (no grad, static shapes, dtypes, last dim) still holds."""
    counts: dict[str, int] = {}
    _CHECK_DEVICE.append(require_gpu)
    try:
        for node in list(graph.nodes):
            if node.op not in ("call_function", "call_method"):
                continue
            new = _rewrite_node(graph, node)
            if new is not None:
                counts[new] = counts.get(new, 0) + 1
    finally:
        _CHECK_DEVICE.pop()
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
        _replace(graph, node, (_log_softmax_op if log_ else _softmax_op)._opoverload, (x,))
        return "log_softmax" if log_ else "softmax"
    if _is(node, _RMS):
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
    if act is not None:
        lin = node.args[0]
        if not (isinstance(lin, torch.fx.Node) and _is(lin, _LINEAR) and len(lin.users) == 1):
            return None
        x, w, b = lin.args[0], _arg(lin, 1, "weight"), _arg(lin, 2, "bias")
        xv, wv, bv = _ev(x), _ev(w), _ev(b)
        if not (_inference_tensor(out) and _inference_tensor(xv) and isinstance(wv, torch.Tensor)):
            return None
        if xv.dtype not in _GEMM_DTYPES or wv.dtype != xv.dtype or wv.dim() != 2 or xv.dim() < 2 or not _static(xv.shape):
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


def _pass_base() -> type:
    from torch._inductor.custom_graph_pass import CustomGraphPass

    return CustomGraphPass


class _Passes:
    """Built lazily (CustomGraphPass imports Inductor)."""

    pre: type | None = None
    key: type | None = None


def _pass_classes() -> tuple[type, type]:
    if _Passes.pre is None:
        base = _pass_base()

        class CuteforgePreGradPass(base):  # type: ignore[misc, valid-type]
            """config.pre_grad_custom_pass: the rewrite, then whatever pass was there before."""

            def __init__(self, prior: Any) -> None:
                self.prior = prior

            def __call__(self, graph: torch.fx.Graph) -> None:
                if _autotuning():
                    counts = rewrite_graph(graph)
                    if counts:
                        _ensure_feedback()
                        log.info("cuteforge.inductor: rewrote %s", counts)
                _run_prior(self.prior, graph)

            def uuid(self) -> Any:
                return ("cuteforge-pre", _module_uuid(), _prior_uuid(self.prior))

        class CuteforgeKeyPass(base):  # type: ignore[misc, valid-type]
            """config.post_grad_custom_post_pass: changes no graph (runs the prior pass);
            its uuid puts 'cuteforge enabled' into the FX graph cache key."""

            def __init__(self, prior: Any) -> None:
                self.prior = prior

            def __call__(self, graph: torch.fx.Graph) -> None:
                _run_prior(self.prior, graph)

            def uuid(self) -> Any:
                return ("cuteforge-key", _module_uuid(), _prior_uuid(self.prior))

        _Passes.pre, _Passes.key = CuteforgePreGradPass, CuteforgeKeyPass
    return _Passes.pre, _Passes.key  # type: ignore[return-value]


def _run_prior(prior: Any, graph: torch.fx.Graph) -> None:
    for p in prior if isinstance(prior, (list, tuple)) else ([prior] if prior is not None else []):
        p(graph)


def _prior_uuid(prior: Any) -> Any:
    ps = prior if isinstance(prior, (list, tuple)) else ([prior] if prior is not None else [])
    return tuple(p.uuid() if hasattr(p, "uuid") else repr(p) for p in ps)


# --------------------------------------------------------------------------- seam 3: the log


def _is_cuteforge(sel: str, choice: Any) -> bool:
    name = str(getattr(choice, "name", ""))
    if sel.startswith("cfi_"):
        # custom-op selections: every choice but the inductor_* decomposition (named
        # "<sel>_inductor_...") runs cuteforge: the cuteforge_<op> extern choice, and the
        # op's eager impl as the fallback ("cuteforge_inductor_<op>_fallback" on 2.13)
        return not name.startswith(f"{sel}_inductor_")
    return name.startswith("cuteforge")


def _feedback(timings: dict[Any, float], name: str, input_nodes: Any, choices: Any, *rest: Any) -> None:
    try:
        if not timings or not any(_is_cuteforge(name, c) for c in timings):
            return
        ranked = sorted(timings.items(), key=lambda kv: kv[1])
        win, win_t = ranked[0]
        cf = [(c, t) for c, t in ranked if _is_cuteforge(name, c)]
        other = [(c, t) for c, t in ranked if not _is_cuteforge(name, c)]
        try:
            shapes = [list(map(int, n.get_size())) for n in input_nodes]
        except Exception:  # noqa: BLE001
            shapes = []
        entry = {
            "op": name,
            "shapes": shapes,
            "winner": str(win.name),
            "cuteforge_won": _is_cuteforge(name, win),
            "winner_ms": float(win_t),
            "cuteforge_best": str(cf[0][0].name),
            "cuteforge_best_ms": float(cf[0][1]),
            "inductor_best": str(other[0][0].name) if other else None,
            "inductor_best_ms": float(other[0][1]) if other else None,
            "timings_ms": {str(c.name): float(t) for c, t in ranked},
        }
        _LOG.append(entry)
        log.info("cuteforge.inductor %s %s: winner %s (%.4f ms; %s); cuteforge best %s %.4f ms, inductor best %s %s ms",
                 name, shapes, entry["winner"], win_t, "cuteforge WON" if entry["cuteforge_won"] else "cuteforge lost",
                 entry["cuteforge_best"], entry["cuteforge_best_ms"], entry["inductor_best"], entry["inductor_best_ms"])
    except Exception as e:  # noqa: BLE001 - logging must never fail a compile
        log.debug("cuteforge.inductor feedback failed: %r", e)


def _selector_cache() -> Any:
    from torch._inductor import select_algorithm

    return select_algorithm.get_algorithm_selector_cache()


def _ensure_feedback() -> None:
    """The selector cache can be rebuilt (cache clears); keep our saver on the live one."""
    if _STATE is None:
        return
    fns = getattr(_selector_cache(), "feedback_saver_fns", None)
    if fns is not None and _feedback not in fns:
        fns.append(_feedback)


def choices_log() -> list[dict[str, Any]]:
    """Every autotuning selection that had a cuteforge candidate, oldest first: op, input
    shapes, winner, whether cuteforge won, best cuteforge and best Inductor choice, all
    timings (ms)."""
    return [dict(e) for e in _LOG]


def clear_choices_log() -> None:
    _LOG.clear()


# --------------------------------------------------------------------------- switch


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
    op_name = next(o for _, n, _, o in _AUTOTUNED if n == sel)
    return _extern_choice(op_name).bind(list(input_nodes), layout, **_LOWERING[-1][1])


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
                _ensure_feedback()
                kwargs["choices"] = [*kwargs["choices"], extra]
        return orig(*args, **kwargs)

    autotune_select_algorithm.__wrapped__ = orig  # type: ignore[attr-defined]
    return autotune_select_algorithm


def is_enabled() -> bool:
    return _STATE is not None


def enable() -> bool:
    """Offer cuteforge kernels to torch.compile(mode="max-autotune"). Idempotent. On a torch
    this module does not support: warns once, changes nothing, returns False."""
    global _STATE, _WARNED
    with _LOCK:
        if _STATE is not None:
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
            importlib.import_module(f"{__package__}.ops.{mod}")
        for op_name in [*_GEMM_OPS, *(o for *_, o in _AUTOTUNED)]:
            # extern_kernels.cuteforge_* must exist before any compiled graph that calls
            # them runs, including one the FX graph cache serves to a fresh process
            _extern_choice(op_name)

        pre_cls, key_cls = _pass_classes()
        user = getattr(lowering, "user_lowerings", None)  # 2.13: register_* writes here; 2.11: lowerings
        state: dict[str, Any] = {
            "get_template_configs": InductorChoices.__dict__["get_template_configs"],
            "autotune_select_algorithm": custom_op.autotune_select_algorithm,
            "pre_grad_custom_pass": config.pre_grad_custom_pass,
            "post_grad_custom_post_pass": config.post_grad_custom_post_pass,
            "lowerings": {op._opoverload: lowering.lowerings.get(op._opoverload, _MISSING) for op, *_ in _AUTOTUNED},
            "user_lowerings": ({op._opoverload: user.get(op._opoverload, _MISSING) for op, *_ in _AUTOTUNED}
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
            for _, name, *_ in _AUTOTUNED:
                fb = f"{name}_fallback_default"
                if not hasattr(extern_kernels, fb):
                    setattr(extern_kernels, fb, _no_fallback)
                    state["extern_names"].append(fb)
        try:
            InductorChoices.get_template_configs = _wrap_get_template_configs(state["get_template_configs"])
            config.pre_grad_custom_pass = pre_cls(state["pre_grad_custom_pass"])
            config.post_grad_custom_post_pass = key_cls(state["post_grad_custom_post_pass"])
            custom_op.autotune_select_algorithm = _wrap_select(state["autotune_select_algorithm"])
            for op, name, decomps, _ in _AUTOTUNED:
                register_custom_op_autotuning(op, configs=[CustomOpConfig(d) for d in decomps], name=name)
                _wrap_lowering(op._opoverload, name, lowering.lowerings, user)
            _STATE = state
            _ensure_feedback()
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
        try:
            fns = _selector_cache().feedback_saver_fns
            while _feedback in fns:
                fns.remove(_feedback)
        except Exception:  # noqa: BLE001
            pass
        _STATE = None
        log.info("cuteforge.inductor disabled")
