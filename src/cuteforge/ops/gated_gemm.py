"""`cuteforge.ops.gated_gemm(a, b_gate, b_up)`: ``silu(a @ b_gate) * (a @ b_up)`` (SwiGLU's
gate and up projections with their activation) as one GEMM on Hopper.

    h = gated_gemm(x, mlp.gate_proj.weight.t(), mlp.up_proj.weight.t())   # (..., I)

Each B tile of the kernel holds half its columns from each weight, so the accumulator
pairs a gate column with its up column and the epilogue writes only the product: the
(tokens x I) gate and up activations never reach memory. ``gate="gelu"`` (tanh form)
gives GeGLU.

a: (..., K) bf16 / fp16, any layout TMA reads (K- or M-major rows; others are copied);
b_gate, b_up: (K, N) of a's dtype, K-major (an ``nn.Linear`` weight's ``.t()``); an
N-major weight is copied K-major per call. The output is (..., N) in a's dtype.

Backward (autograd): the forward keeps nothing but its inputs, so the backward
recomputes a @ b_gate and a @ b_up (cuBLAS), takes the activation's backward and runs
the four gradient GEMMs; training trades one extra pair of GEMMs for two (tokens x N)
activations of memory per layer. Under torch.compile the call is one opaque op,
``torch.ops.cuteforge.gated_gemm`` (Inductor cannot fuse an epilogue into its cuBLAS
GEMMs); its backward traces as torch expressions, so Inductor fuses the activation's
backward into one pointwise kernel around the recomputed GEMMs.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch.autograd.function import once_differentiable

from .. import checks
from ..arch import gpu_info, limits_for
from ..kernels.gemm.epilogue import GATES, activation_torch
from ..kernels.gemm.sm90.config import (
    GemmConfig,
    default_config,
    fit_swizzle,
    gated_config,
    stream_k_workspace_words,
    usable_tuned,
)
from ..kernels.gemm.spec import AB_DTYPES, gemm_gated_kernel
from ..native import launch as native_launch
from ..native.args import arg, contiguous_arg
from .gemm import _is_fake
from .gemm_launch import _layout, _no_work, _operand_for, _persistent_clusters, _workspace
from .memo import remember
from .registered import define
from .swiglu import silu_mul_backward

__all__ = ["gated_gemm"]

_WHERE = "cuteforge.ops.gated_gemm"
_PLANS: dict[tuple[Any, ...], Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]] = {}


def _reference(a: torch.Tensor, b_gate: torch.Tensor, b_up: torch.Tensor, gate: str) -> torch.Tensor:
    return activation_torch(gate, a @ b_gate) * (a @ b_up)


def _k_major(b: torch.Tensor) -> torch.Tensor:
    """b (K, N) with unit stride along K and 16-byte aligned columns (a copy otherwise)."""
    return _operand_for(b.unsqueeze(0), (1,))[0][0]


class _InPlace:
    """run(a2, b_gate, b_up) for a layout the kernel reads in place (the memo keys it): no
    per-call layout work; and the same call as a C launch plan for the registered op."""

    def __init__(self, launch: Callable[..., Any], work: Callable[[], torch.Tensor], m: int, n: int, splits: bool) -> None:
        self.launch, self.work, self.m, self.n, self.splits = launch, work, m, n, splits
        self._c_run: Any = False  # not made yet

    def __call__(self, a: torch.Tensor, b_gate: torch.Tensor, b_up: torch.Tensor) -> torch.Tensor:
        out = a.new_empty(1, self.m, self.n)
        self.launch(a.unsqueeze(0), b_gate.unsqueeze(0), b_up.unsqueeze(0), out, self.work())
        return out[0]

    def c_run(self, a: torch.Tensor, b_gate: torch.Tensor, b_up: torch.Tensor) -> Callable[..., Any] | None:
        """The C launch (`native.launch.runner`) of this layout, or None: a stream-K split's
        workspace is the stream's, fetched per call, so only configs that never read theirs
        (one fixed word) have one."""
        if self._c_run is False:
            self._c_run = None
            if not self.splits:
                word = self.work()  # the device's word, which the kernel never reads
                IN, OUT, FIXED = native_launch.INPUT, native_launch.OUTPUT, native_launch.FIXED
                args = [arg(IN, 0, a.unsqueeze(0)), arg(IN, 1, b_gate.unsqueeze(0)), arg(IN, 2, b_up.unsqueeze(0)),
                        contiguous_arg(OUT, 0, (1, self.m, self.n)), arg(FIXED, 0, word)]
                self._c_run = native_launch.runner("cuteforge::gated_gemm", self.launch, a.device, 3,
                                                   [((self.m, self.n), a.dtype)], args, [0], fixed=[word])
        return self._c_run


def _plan(a: torch.Tensor, b_gate: torch.Tensor, b_up: torch.Tensor, gate: str,
          config: GemmConfig | None) -> Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]:
    """run(a2, b_gate, b_up) for 2-D a2 (M, K) of this layout."""
    M, K = a.shape
    N = b_gate.shape[1]
    if M == 0 or N == 0 or K == 0:
        return lambda a, bg, bu: _reference(a, bg, bu, gate)
    info = gpu_info(a.device.index)
    sms = info.sm_count if info else 132
    a3, a_k = _operand_for(a.unsqueeze(0), (2, 1))
    kern = gemm_gated_kernel(a_k, gate)
    n_pad = -(-N // 8) * 8  # 16-byte output rows for the TMA store
    out = torch.empty(1, M, n_pad, dtype=a.dtype, device=a.device)[..., :N]
    bg3, bu3 = _k_major(b_gate).unsqueeze(0), _k_major(b_up).unsqueeze(0)
    key = kern.signature.bind((a3, bg3, bu3, out, _no_work(a.device.index)), _WHERE)
    from ..autotune import lookup  # slow path only

    # a config `cuteforge tune gemm_sm90_tn_silu_mul ...` stored for this shape bucket
    params: tuple[tuple[str, Any], ...] = (("sms", sms),)
    tuned = usable_tuned(lookup(kern, key, params, {"M": M, "N": N, "K": K}), a.element_size(), a.element_size())
    if config is not None:
        cfg = config
    elif tuned is not None and tuned.gated_ok:
        cfg = fit_swizzle(tuned, M, 2 * N)
    else:  # the heuristic sees the (M, 2N) product the kernel's MMAs run
        cfg = fit_swizzle(gated_config(default_config(M, 2 * N, K, sms, a.element_size())), M, 2 * N)
    clusters = _persistent_clusters(a.device.index, cfg, sms)
    if clusters < sms // (cfg.cluster_m * cfg.cluster_n):
        params += (("clusters", clusters),)
    launch = kern.get(key, tuple(sorted(params)), cfg)
    work = _workspace(a.device.index, cfg, sms, clusters, M, 2 * N, K, 1)

    if n_pad == N and a3.data_ptr() == a.data_ptr() and bg3.data_ptr() == b_gate.data_ptr() \
            and bu3.data_ptr() == b_up.data_ptr():
        return _InPlace(launch, work, M, N, stream_k_workspace_words(cfg, clusters, M, 2 * N, K, 1, sms=sms) > 0)

    def run(a: torch.Tensor, b_gate: torch.Tensor, b_up: torch.Tensor) -> torch.Tensor:
        a3 = _operand_for(a.unsqueeze(0), (2, 1))[0]
        out = torch.empty(1, M, n_pad, dtype=a.dtype, device=a.device)
        view = out[..., :N] if n_pad != N else out
        launch(a3, _k_major(b_gate).unsqueeze(0), _k_major(b_up).unsqueeze(0), view, work())
        return view[0] if n_pad == N else view[0].contiguous()

    return run


def _run_for(a2: torch.Tensor, b_gate: torch.Tensor, b_up: torch.Tensor, gate: str,
             config: GemmConfig | None) -> Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]:
    memo = (_layout(a2), _layout(b_gate), _layout(b_up), gate, config)
    run = _PLANS.get(memo)
    if run is None:
        run = remember(_PLANS, memo, _plan(a2, b_gate, b_up, gate, config))
    return run


def _forward(a2: torch.Tensor, b_gate: torch.Tensor, b_up: torch.Tensor, gate: str,
             config: GemmConfig | None) -> torch.Tensor:
    return _run_for(a2, b_gate, b_up, gate, config)(a2, b_gate, b_up)


def _gate_grads(gate: str, grad: torch.Tensor, z_gate: torch.Tensor, z_up: torch.Tensor,
                traced: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """(d z_gate, d z_up) of ``gate(z_gate) * z_up``: silu_mul's backward kernel eagerly;
    traced, torch's expressions (Inductor fuses them into one pointwise kernel)."""
    if gate == "silu" and not traced:
        return silu_mul_backward(grad, z_gate, z_up)
    if gate == "silu":
        g, zg = grad.float(), z_gate.float()
        sig = torch.sigmoid(zg)
        d_gate = g * z_up.float() * sig * (1 + zg * (1 - sig))
        return d_gate.to(z_gate.dtype), (g * zg * sig).to(z_up.dtype)
    d_gate = torch.ops.aten.gelu_backward(grad * z_up, z_gate, approximate="tanh")
    return d_gate, grad * F.gelu(z_gate, approximate="tanh")


def _grads(a2: torch.Tensor, b_gate: torch.Tensor, b_up: torch.Tensor, gate: str, grad: torch.Tensor,
           need: tuple[bool, ...], traced: bool) -> tuple[Any, Any, Any]:
    """(da, db_gate, db_up), each None where ``need`` says so: both products recomputed
    (the forward wrote neither), the activation's backward, the gradient GEMMs."""
    z_gate, z_up = a2 @ b_gate, a2 @ b_up
    d_gate, d_up = _gate_grads(gate, grad.contiguous(), z_gate, z_up, traced)
    da = torch.addmm(d_gate @ b_gate.t(), d_up, b_up.t()) if need[0] else None
    # each weight gradient in its weight's layout: b = W.t() gets (d^T a)^T, contiguous W-shaped
    db_gate = (d_gate.t() @ a2).t() if need[1] else None
    db_up = (d_up.t() @ a2).t() if need[2] else None
    return da, db_gate, db_up


class _GatedGemm(torch.autograd.Function):
    """Eager calls with grad, without the registered op's dispatch cost."""

    @staticmethod
    def forward(ctx: Any, a2: torch.Tensor, b_gate: torch.Tensor, b_up: torch.Tensor, gate: str) -> torch.Tensor:
        ctx.save_for_backward(a2, b_gate, b_up)
        ctx.gate = gate
        return _forward(a2, b_gate, b_up, gate, None)

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, ...]:
        a2, b_gate, b_up = ctx.saved_tensors
        return (*_grads(a2, b_gate, b_up, ctx.gate, grad, ctx.needs_input_grad, traced=False), None)


def _op_impl(a2: torch.Tensor, b_gate: torch.Tensor, b_up: torch.Tensor, gate: str) -> torch.Tensor:
    return _forward(a2, b_gate, b_up, gate, None)


def _op_fake(a2: torch.Tensor, b_gate: torch.Tensor, b_up: torch.Tensor, gate: str) -> torch.Tensor:
    return a2.new_empty(a2.shape[0], b_gate.shape[1])  # contiguous, as every path of _forward returns


def _op_plan(a2: torch.Tensor, b_gate: torch.Tensor, b_up: torch.Tensor, gate: str) -> Any:
    """The registered op's C launch plan (`registered.define`) where the operands are read
    in place and the config splits no tile; None otherwise (memoized with the layout's run)."""
    run = _run_for(a2, b_gate, b_up, gate, None)
    return run.c_run(a2, b_gate, b_up) if isinstance(run, _InPlace) else None


def _op_setup(ctx: Any, inputs: tuple[Any, ...], output: torch.Tensor) -> None:
    ctx.save_for_backward(*inputs[:3])
    ctx.gate = inputs[3]


def _op_backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, ...]:
    a2, b_gate, b_up = ctx.saved_tensors
    return (*_grads(a2, b_gate, b_up, ctx.gate, grad, ctx.needs_input_grad, traced=True), None)


# what torch.compile sees: one opaque GEMM forward, a traced backward
_op = define("cuteforge::gated_gemm", _op_impl, fake=_op_fake, plan=_op_plan, backward=_op_backward,
             setup_context=_op_setup)


def gated_gemm(a: torch.Tensor, b_gate: torch.Tensor, b_up: torch.Tensor, *, gate: str = "silu",
               config: GemmConfig | None = None) -> torch.Tensor:
    """``gate(a @ b_gate) * (a @ b_up)`` in one GEMM kernel (fp32 accumulate, rounded once).

    a (..., K); b_gate, b_up (K, N); `gate` "silu" (SwiGLU) or "gelu" (tanh form, GeGLU);
    `config` (a `GemmConfig` whose tile_n / 2 is the output tile) pins the kernel config
    for eager calls without grad (torch.compile and calls with grad ignore it)."""
    checks.tensor(_WHERE, "a", a, AB_DTYPES)
    checks.tensor(_WHERE, "b_gate", b_gate, AB_DTYPES)
    checks.matches(_WHERE, "b_up", b_up, "b_gate", b_gate)
    if gate not in GATES:
        raise ValueError(f"{_WHERE}: gate must be one of {GATES}, got {gate!r}")
    if a.dim() == 0:
        raise ValueError(f"{_WHERE}: argument 'a' must have at least one dim, got a 0-d tensor")
    if b_gate.dim() != 2:
        raise ValueError(f"{_WHERE}: argument 'b_gate' must be 2-D (K, N), got shape {tuple(b_gate.shape)}")
    if b_gate.dtype != a.dtype:
        raise TypeError(f"{_WHERE}: a is {a.dtype} but b_gate is {b_gate.dtype}; they must match")
    if a.shape[-1] != b_gate.shape[0]:
        raise ValueError(f"{_WHERE}: a has K={a.shape[-1]} (shape {tuple(a.shape)}) but b_gate has K={b_gate.shape[0]} "
                         f"(shape {tuple(b_gate.shape)}); a @ b_gate needs a.shape[-1] == b_gate.shape[0]")
    if config is not None:
        if not isinstance(config, GemmConfig):
            raise TypeError(f"{_WHERE}: config must be a GemmConfig or None, got {type(config).__name__}")
        try:
            config.validate(a.element_size(), a.element_size(), limits_for("sm_90a"))
            config.validate_gated()
        except ValueError as e:
            raise ValueError(f"{_WHERE}: config {config} cannot run: {e}") from None
    checks.on_cuda(_WHERE, "a", a)
    checks.same_device(_WHERE, "b_gate", b_gate, "a", a)
    if a.shape[-1] == 0 or a.numel() == 0:
        return _reference(a, b_gate, b_up, gate)  # nothing to launch: torch's zeros / empty result
    lead = a.shape[:-1]
    a2 = a.reshape(-1, a.shape[-1])
    # traced outside Dynamo too (AOTAutograd, make_fx: fake or functional tensor subclasses);
    # a plain tensor skips the fake check on the eager path
    if torch.compiler.is_compiling() or (type(a2) is not torch.Tensor and _is_fake(a2)):
        out = _op(a2, b_gate, b_up, gate)
    elif torch.is_grad_enabled() and (a.requires_grad or b_gate.requires_grad or b_up.requires_grad):
        out = _GatedGemm.apply(a2, b_gate, b_up, gate)
    else:
        out = _forward(a2, b_gate, b_up, gate, config)
    return out.reshape(*lead, b_gate.shape[1])
