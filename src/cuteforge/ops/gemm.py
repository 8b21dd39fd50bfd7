"""`cuteforge.ops.gemm(a, b, ...)`: a @ b on Hopper with a fused epilogue.

    gemm(a, b)                                  # (M,K) @ (K,N) or batched (L,M,K) @ (L,K,N)
    gemm(a, b, bias=bias, epilogue="gelu")      # gelu_tanh(a @ b + bias), one pass
    gemm(a, b, c=c, alpha=0.5, beta=2.0)        # 0.5 * a @ b + 2 * c
    gemm(a, b, residual=r, epilogue="silu")     # silu(a @ b) + r
    gemm(a, b, epilogue=Epilogue.from_fn(lambda acc, s: relu(acc) * s, s="col"),
         epilogue_args={"s": scale})            # any cuteforge.fusion.Epilogue

Preset order: act(alpha * (a @ b) + beta * c + bias) + residual, act in none/relu/
gelu (tanh form)/silu. `bias` (N,) or (1, N) is per column (as in nn.Linear); (M, 1) is
per row; any other shape is an error (never reshaped). `c`/`residual` broadcast to the
output without adding dims. bf16/fp16 inputs, fp32 accumulation, output bf16/fp16/fp32.
Every shape, dtype and config error is raised before the device checks; an empty M, N,
K or batch gives torch's answer without a launch.

fp8: `gemm(a, b, scale_a=sa, scale_b=sb, ...)` with float8_e4m3fn / float8_e5m2 a and b
(mixed allowed) computes (a * sa) @ (b * sb) as torch._scaled_mm does, scales read at run
time: per tensor (one element), or per row of a (sa (M, 1)) and / or per column of b (sb
(1, N)) as _scaled_mm's rowwise mode, then the same epilogues; a row-major (M, K), b
column-major (K, N) (WGMMA reads fp8 only K-major), K a multiple of 16, output bf16 unless
out_dtype says.

Every layout runs without a copy when TMA can address it (unit stride in K or in M/N,
16-byte aligned rows); anything else is copied once into an aligned buffer. Warm calls
are one dict lookup. Under torch.compile the call goes through the custom op
`torch.ops.cuteforge.gemm` (fake impl + autograd); an eager call with grad through an
autograd.Function on the same plans. Either backward runs dA / dB as cuteforge GEMMs for
2-D 16-bit calls with a preset epilogue, an fp32 recompute in torch otherwise.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch

from .. import checks
from ..kernels.gemm.epilogue import ACTIVATIONS, GemmEpilogue
from ..kernels.gemm.sm90.config import GemmConfig
from ..kernels.gemm.spec import AB_DTYPES
from . import gemm_launch as launch
from .gemm_launch import _WHERE, _check_ab, _is_fp8, _layout, _one, _plan, _scale_is_rowwise
from .memo import remember
from .registered import define

_PLANS: dict[tuple[Any, ...], Callable[..., torch.Tensor]] = {}
_NONE_KEY = ""



def _run(a: torch.Tensor, b: torch.Tensor, ops: Sequence[torch.Tensor], epi_key: str, kinds: str, out_dtype: torch.dtype | None,
         config: GemmConfig | None = None, names: Sequence[str] | None = None, scales: Sequence[torch.Tensor] = ()) -> torch.Tensor:
    """The memo in front of `_plan`. `names` only label errors (the custom op has none).
    `scales`: () or fp8's (scale_a, scale_b) tensors."""
    return _lookup(a, b, ops, epi_key, kinds, out_dtype, config, names, scales)(a, b, ops, scales)


def _lookup(a: torch.Tensor, b: torch.Tensor, ops: Sequence[torch.Tensor], epi_key: str, kinds: str,
            out_dtype: torch.dtype | None, config: GemmConfig | None = None, names: Sequence[str] | None = None,
            scales: Sequence[torch.Tensor] = ()) -> Callable[..., torch.Tensor]:
    """`_run`'s plan: fn(a, b, ops, scales) for this layout, planned (and checked) on a miss."""
    try:
        memo: Any = (_layout(a), _layout(b), tuple(_layout(t) for t in ops), epi_key, out_dtype, config,
                     tuple(_layout(t) for t in scales))
        fn = _PLANS.get(memo)
    except (AttributeError, TypeError, RuntimeError):  # not (dense) tensors, unhashable: _plan says so
        memo, fn = None, None
    if fn is None:
        epi = GemmEpilogue(epi_key, tuple(k for k in kinds.split(",") if k)) if epi_key else None
        fn = _plan(a, b, ops, names or (epi.operand_names() if epi is not None else ()), epi, out_dtype, config, scales)
        if memo is not None:
            remember(_PLANS, memo, fn)
    return fn


# --- torch.library registration -----------------------------------------------------------


# no launch plans: a stream-K GEMM takes a workspace per stream or capture (`workspace.py`),
# which a plan keyed by layout cannot hold
def _gemm_impl(a: torch.Tensor, b: torch.Tensor, ops: list[torch.Tensor], epi_key: str, kinds: str,
               out_dtype: torch.dtype | None) -> torch.Tensor:
    return _run(a, b, ops, epi_key, kinds, out_dtype)


def _gemm_fake(a: torch.Tensor, b: torch.Tensor, ops: list[torch.Tensor], epi_key: str, kinds: str, out_dtype: torch.dtype | None) -> torch.Tensor:
    torch._check(a.shape[-1] == b.shape[-2], lambda: f"{_WHERE}: a and b disagree on K")
    batched = a.dim() == 3 or b.dim() == 3
    L = a.shape[0] if a.dim() == 3 else (b.shape[0] if b.dim() == 3 else 1)
    shape = (L, a.shape[-2], b.shape[-1]) if batched else (a.shape[-2], b.shape[-1])
    return a.new_empty(shape, dtype=out_dtype or a.dtype)


def _setup(ctx: Any, inputs: tuple[Any, ...], output: torch.Tensor) -> None:
    a, b, ops, epi_key, kinds, out_dtype = inputs
    ctx.save_for_backward(a, b, *ops)
    ctx.meta = (epi_key, kinds)


# the activations' backward kernels in torch: grad of act at the pre-activation z
_ACT_BACKWARD: dict[str, Callable[[torch.Tensor, torch.Tensor], torch.Tensor]] = {
    "relu": lambda g, z: torch.ops.aten.threshold_backward(g, z, 0),
    "gelu": lambda g, z: torch.ops.aten.gelu_backward(g, z, approximate="tanh"),
    "silu": lambda g, z: torch.ops.aten.silu_backward(g, z),
}


def _backward_on_gemm(a: torch.Tensor, b: torch.Tensor, ops: list[torch.Tensor], epi: GemmEpilogue | None,
                      g: torch.Tensor, needs: Sequence[bool], run: Callable[..., torch.Tensor] | None = None,
                      ) -> tuple[Any, ...] | None:
    """The gradients of a 2-D 16-bit GEMM with a preset epilogue (or none) on cuteforge's
    own GEMMs: dA = dZ @ B^T, dB = A^T @ dZ, dbias and dc sums of dZ, d residual = g. An
    activation recomputes its pre-activation z with one more GEMM (bias, c and alpha
    fused) and applies torch's activation backward. `run(a, b, ops, epi_key, kinds,
    out_dtype)` runs each GEMM: the custom op (default; AOT autograd traces the custom
    op's backward with fake tensors) or, in eager mode, `_run`'s memoized plans. Returns
    (da, db, [d operand]); None where this path does not apply (torch's recompute serves)."""
    fields = epi.preset_fields() if epi is not None else ("none", False, False, False, 1.0, 1.0)
    if (fields is None or a.dim() != 2 or b.dim() != 2 or a.dtype not in AB_DTYPES or b.dtype != a.dtype
            or not _on_sm90(g) or 0 in (*a.shape, b.shape[1])):
        return None
    act, has_bias, has_c, has_res, alpha, beta = fields
    run = run or _gemm_op

    if act != "none":
        # z = alpha * a @ b + beta * c + bias: the forward's epilogue without its activation
        pre = GemmEpilogue.preset("none", bias=epi.kinds[0] if has_bias else None, c=has_c, alpha=alpha, beta=beta)
        pre_ops = list(ops[:has_bias + has_c])
        z = run(a, b, pre_ops, pre.key if pre is not None else _NONE_KEY, ",".join(pre.kinds) if pre else "", g.dtype)
        dz = _ACT_BACKWARD[act](g, z)
    else:
        dz = g
    dacc = (dz * alpha if alpha != 1.0 else dz).to(a.dtype)
    # each gradient in its input's layout (autograd then makes no copy), e.g. an nn.Linear
    # weight's: b = W.t() is K-major, so dB = (dZ^T @ A)^T lands as W's contiguous gradient
    da = db = None
    if needs[0]:
        da = run(b, dacc.t(), [], _NONE_KEY, "", a.dtype).t() if _k_major_t(a) else run(dacc, b.t(), [], _NONE_KEY, "", a.dtype)
    if needs[1]:
        db = run(dacc.t(), a, [], _NONE_KEY, "", b.dtype).t() if _k_major_t(b) else run(a.t(), dacc, [], _NONE_KEY, "", b.dtype)
    # the operands in kernel order: bias (per column or per row), c, residual
    terms = [dz] * has_bias + [dz * beta if beta != 1.0 else dz] * has_c + [g] * has_res
    op_grads = [d.float().sum_to_size(t.shape).to(t.dtype) for d, t in zip(terms, ops)] if needs[2] else [None] * len(ops)
    return da, db, op_grads


def _on_sm90(t: torch.Tensor) -> bool:
    """Whether `t` lives where the sm_90a GEMM runs."""
    return t.is_cuda and torch.cuda.get_device_capability(t.device) == (9, 0)


def _k_major_t(t: torch.Tensor) -> bool:
    """Whether a 2-D operand is the transpose of a contiguous matrix (unit stride down its rows)."""
    return t.stride(0) == 1 and t.stride(1) == t.shape[0] and t.shape[1] > 1


def _grads(a: torch.Tensor, b: torch.Tensor, ops: list[torch.Tensor], epi_key: str, kinds: str, g: torch.Tensor,
           needs: Sequence[bool], run: Callable[..., torch.Tensor] | None = None) -> tuple[Any, Any, list[Any]]:
    """(da, db, [d operand]): `_backward_on_gemm` where it applies, else the forward
    recomputed in torch (fp32) and differentiated: exact for every epilogue."""
    epi = GemmEpilogue(epi_key, tuple(k for k in kinds.split(",") if k)) if epi_key else None
    fast = _backward_on_gemm(a, b, ops, epi, g.contiguous(), needs, run)
    if fast is not None:
        return fast
    with torch.enable_grad():
        leaves = [t.detach().requires_grad_(True) for t in (a, b, *ops)]
        y = launch._reference(leaves[0], leaves[1], leaves[2:], epi, torch.float32)
        grads = torch.autograd.grad(y, leaves, g.float(), allow_unused=True)
    cast = [None if gr is None else gr.to(t.dtype) for gr, t in zip(grads, (a, b, *ops))]
    return cast[0], cast[1], cast[2:]


def _backward(ctx: Any, g: torch.Tensor) -> tuple[Any, ...]:
    a, b, *ops = ctx.saved_tensors
    needs = getattr(ctx, "needs_input_grad", None) or (True, True, True)
    da, db, op_grads = _grads(a, b, list(ops), *ctx.meta, g, needs)
    return da, db, op_grads, None, None, None


class _GemmFunction(torch.autograd.Function):
    """Eager calls with grad: the forward and the backward's GEMMs on `_run`'s memoized
    plans, without the custom op (whose autograd and dispatch cost tens of microseconds of
    host time a GEMM); torch.compile keeps the custom op."""

    @staticmethod
    def forward(ctx: Any, a: torch.Tensor, b: torch.Tensor, epi_key: str, kinds: str, out_dtype: Any,
                names: tuple[str, ...], *ops: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(a, b, *ops)
        ctx.meta = (epi_key, kinds)
        return _run(a, b, ops, epi_key, kinds, out_dtype, names=names)

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> tuple[Any, ...]:
        a, b, *ops = ctx.saved_tensors
        need = ctx.needs_input_grad
        # create_graph=True (grad mode on here): the custom op, so the gradients are differentiable
        run = None if torch.is_grad_enabled() else _run
        da, db, op_grads = _grads(a, b, list(ops), *ctx.meta, g, (need[0], need[1], any(need[6:])), run)
        return (da, db, None, None, None, None, *op_grads)


_gemm_op = define("cuteforge::gemm", _gemm_impl, fake=_gemm_fake, backward=_backward, setup_context=_setup)


def _gemm_fp8_impl(a: torch.Tensor, b: torch.Tensor, scale_a: torch.Tensor, scale_b: torch.Tensor,
                   ops: list[torch.Tensor], epi_key: str, kinds: str, out_dtype: torch.dtype | None) -> torch.Tensor:
    return _run(a, b, ops, epi_key, kinds, out_dtype, scales=(scale_a, scale_b))


def _gemm_fp8_fake(a: torch.Tensor, b: torch.Tensor, scale_a: torch.Tensor, scale_b: torch.Tensor, ops: list[torch.Tensor],
      epi_key: str, kinds: str, out_dtype: torch.dtype | None) -> torch.Tensor:
    torch._check(a.shape[-1] == b.shape[-2], lambda: f"{_WHERE}: a and b disagree on K")
    torch._check(scale_a.numel() == 1 and scale_b.numel() == 1,
                 lambda: f"{_WHERE}: torch.ops.cuteforge.gemm_fp8 takes per-tensor scales; call cuteforge.ops.gemm, "
                         "which passes per-row / per-column scales as epilogue operands")
    batched = a.dim() == 3 or b.dim() == 3
    L = a.shape[0] if a.dim() == 3 else (b.shape[0] if b.dim() == 3 else 1)
    shape = (L, a.shape[-2], b.shape[-1]) if batched else (a.shape[-2], b.shape[-1])
    return a.new_empty(shape, dtype=out_dtype or torch.bfloat16)


_gemm_fp8_op = define("cuteforge::gemm_fp8", _gemm_fp8_impl, fake=_gemm_fp8_fake)


def _resolve(bias: Any, epilogue: Any, residual: Any, c: Any, alpha: float, beta: float,
             epilogue_args: Any) -> tuple[GemmEpilogue | None, list[Any], tuple[str, ...]]:
    """(epilogue, its tensor operands in kernel order, their names for errors)."""
    from ..fusion import Epilogue

    for name, v in (("alpha", alpha), ("beta", beta)):
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise TypeError(f"{_WHERE}: argument {name!r} must be a Python number, got {type(v).__name__}")
    if epilogue is None or isinstance(epilogue, str):
        if epilogue_args:
            raise TypeError(f"{_WHERE}: epilogue_args is for a cuteforge.fusion.Epilogue; presets take bias=, c=, residual=")
        kind = None
        if bias is not None:
            checks.tensor(_WHERE, "bias", bias)
            # (M, 1) is per row; (N,) / (1, N) per column, as torch broadcasting reads them.
            kind = "row" if bias.dim() >= 2 and bias.shape[-1] == 1 and bias.shape[-2] != 1 else "col"
        if beta == 0 and c is not None:
            checks.tensor(_WHERE, "c", c)
            c = None  # as torch.addmm: beta=0 ignores c, so NaN/inf in it do not propagate
        act = epilogue or "none"
        if act not in ACTIVATIONS:
            raise ValueError(f"{_WHERE}: epilogue must be one of {ACTIVATIONS} or a cuteforge.fusion.Epilogue, got {epilogue!r}")
        epi = GemmEpilogue.preset(act, bias=kind, c=c is not None, residual=residual is not None, alpha=alpha, beta=beta)
        present = [(n, t) for n, t in (("bias", bias), ("c", c), ("residual", residual)) if t is not None]
        return epi, [t for _, t in present], tuple(n for n, _ in present)
    if not isinstance(epilogue, Epilogue):
        raise TypeError(f"{_WHERE}: epilogue must be None, 'relu', 'gelu', 'silu' or a cuteforge.fusion.Epilogue, got {type(epilogue).__name__}")
    if bias is not None or residual is not None or c is not None:
        raise TypeError(f"{_WHERE}: with a fusion Epilogue pass its operands in epilogue_args, not bias=/c=/residual=")
    if alpha != 1.0 or beta != 1.0:
        raise TypeError(f"{_WHERE}: alpha/beta belong to the preset epilogues; write them into the fusion Epilogue's function")
    if epilogue_args is not None and not isinstance(epilogue_args, Mapping):
        raise TypeError(f"{_WHERE}: epilogue_args must be a dict of operand name -> value, got {type(epilogue_args).__name__}")
    args = dict(epilogue_args or {})
    scalars = {n: args.pop(n) for n, k in epilogue.operands if k == "scalar" and n in args}
    ep = epilogue.bind(**scalars) if scalars else epilogue
    missing = [n for n, _ in ep.operands if n not in args]
    extra = sorted(set(args) - {n for n, _ in ep.operands})
    if missing or extra:
        raise TypeError(f"{_WHERE}: epilogue_args must give exactly the operands {[n for n, _ in epilogue.operands]}; missing {missing}, unknown {extra}")
    if len(ep.operands) > 3:
        raise ValueError(f"{_WHERE}: the GEMM epilogue takes at most 3 tensor operands, got {[n for n, _ in ep.operands]}")
    return GemmEpilogue.from_fusion(ep), [args[n] for n, _ in ep.operands], tuple(f"epilogue_args[{n!r}]" for n, _ in ep.operands)


def gemm(
    a: torch.Tensor,
    b: torch.Tensor,
    *,
    bias: torch.Tensor | None = None,
    epilogue: Any = None,
    out_dtype: torch.dtype | None = None,
    residual: torch.Tensor | None = None,
    c: torch.Tensor | None = None,
    alpha: float = 1.0,
    beta: float = 1.0,
    epilogue_args: dict[str, Any] | None = None,
    config: GemmConfig | None = None,
    scale_a: torch.Tensor | float | None = None,
    scale_b: torch.Tensor | float | None = None,
) -> torch.Tensor:
    """a @ b with the epilogue fused before the store (see the module docstring).

    fp8 (`float8_e4m3fn` / `float8_e5m2`, mixed allowed): `scale_a` and `scale_b` are
    required dequantization scales, so the product is (a * scale_a) @ (b * scale_b) as in
    `torch._scaled_mm`, and the epilogue (alpha, c, bias, activation, residual) applies to
    it. Each is per tensor (a float or a one-element fp32 tensor), or fp32 per row of the
    output for `scale_a` ((M, 1) or (M,)) and per column for `scale_b` ((1, N) or (N,)),
    as _scaled_mm's rowwise mode; those two take epilogue operand slots (at most 3 in
    all, with bias, c, residual). A batched call applies a per-row scale to every batch.
    a must be row-major (M, K) and b column-major (K, N) (e.g. `w.t()` of an (N, K)
    weight), K a multiple of 16; the output defaults to bfloat16. No backward.

    `config` (a `GemmConfig`) pins the kernel config for eager calls without grad,
    bypassing tuned results and the heuristic (benchmarks, experiments); calls under
    torch.compile or with an input that requires grad ignore it.

    Warm eager calls are one dict lookup keyed by every argument (see `_EAGER`)."""
    if _is_compiling():
        return _gemm_slow(a, b, bias, epilogue, out_dtype, residual, c, alpha, beta, epilogue_args, config, scale_a, scale_b)
    try:
        run = _EAGER[(a.dtype, a.shape, a.stride(), a.data_ptr() & 15, a.get_device(),
                      b.dtype, b.shape, b.stride(), b.data_ptr() & 15, b.get_device(),
                      epilogue, out_dtype, alpha, type(alpha), beta, type(beta), config, epilogue_args,
                      None if scale_a is None else _scale_key(scale_a), None if scale_b is None else _scale_key(scale_b),
                      None if bias is None else (bias.dtype, bias.shape, bias.stride(), bias.data_ptr() & 15, bias.get_device()),
                      None if c is None else (c.dtype, c.shape, c.stride(), c.data_ptr() & 15, c.get_device()),
                      None if residual is None else (residual.dtype, residual.shape, residual.stride(),
                                                     residual.data_ptr() & 15, residual.get_device()))]
    except (AttributeError, KeyError, TypeError, RuntimeError):  # not a dense tensor: the plan says so
        run = None
    if run is None or (_grad_enabled() and (a.requires_grad or b.requires_grad or (bias is not None and bias.requires_grad)
                                            or (c is not None and c.requires_grad)
                                            or (residual is not None and residual.requires_grad))):
        return _gemm_slow(a, b, bias, epilogue, out_dtype, residual, c, alpha, beta, epilogue_args, config, scale_a, scale_b)
    return run(a, b, bias, c, residual, scale_a, scale_b)


_is_compiling = torch.compiler.is_compiling
_grad_enabled = torch.is_grad_enabled
# The eager warm path: one lookup keyed by every argument (a's and b's layouts, the preset
# epilogue name, out_dtype, alpha and beta with their types, config, fp8 scales (a tensor's
# layout, a number's type and value), the layouts of bias, c and residual) gives run(a, b,
# bias, c, residual, scale_a, scale_b); stored only for no-grad calls with a preset epilogue
# (or none), no epilogue_args and no scale that requires grad (others take `_gemm_slow`).
_EagerRun = Callable[[torch.Tensor, torch.Tensor, Any, Any, Any, Any, Any], torch.Tensor]
_EAGER: dict[tuple[Any, ...], _EagerRun] = {}


def _eager_key(a: torch.Tensor, b: torch.Tensor, bias: Any, epilogue: Any, out_dtype: Any, residual: Any, c: Any,
               alpha: Any, beta: Any, epilogue_args: Any, config: Any, scale_a: Any, scale_b: Any) -> tuple[Any, ...]:
    # gemm builds the same tuple inline
    return (*_layout_key(a), *_layout_key(b), epilogue, out_dtype, alpha, type(alpha), beta, type(beta), config,
            epilogue_args, None if scale_a is None else _scale_key(scale_a), None if scale_b is None else _scale_key(scale_b),
            _layout_key(bias), _layout_key(c), _layout_key(residual))


def _layout_key(t: Any) -> Any:
    return None if t is None else (t.dtype, t.shape, t.stride(), t.data_ptr() & 15, t.get_device())


def _scale_key(t: Any) -> Any:
    """An fp8 scale in the warm-path key: a tensor by its layout and requires_grad (its values
    are read by the kernel at run time), a number by its type and value (its one-element
    tensor is made once, with the plan)."""
    if isinstance(t, torch.Tensor):
        return (*_layout_key(t), t.requires_grad)
    return (type(t), t)


def _is_fake(t: Any) -> bool:
    """A fake (or functional wrapper of a fake) tensor: one being traced."""
    from torch._subclasses.fake_tensor import is_fake

    return isinstance(t, torch.Tensor) and is_fake(t)


def _gemm_slow(a: Any, b: Any, bias: Any, epilogue: Any, out_dtype: Any, residual: Any, c: Any, alpha: Any, beta: Any,
               epilogue_args: Any, config: Any, scale_a: Any, scale_b: Any) -> torch.Tensor:
    """Resolve and check every argument, then run; a plain eager call (no grad, a preset
    epilogue or none, no epilogue_args, no fp8 scale that requires grad) stores its
    warm-path run()."""
    if config is not None and not isinstance(config, GemmConfig):
        raise TypeError(f"{_WHERE}: config must be a GemmConfig or None, got {type(config).__name__}")
    epi, ops, names = _resolve(bias, epilogue, residual, c, alpha, beta, epilogue_args)
    scales, scale_ops, row, col = _scales(a, b, scale_a, scale_b)
    if scale_ops:
        # per-row / per-column fp8 scales: epilogue operands multiplying the accumulator
        # first (the kernel's per-tensor scales are then ones)
        epi = GemmEpilogue.with_scales(epi, row=row, col=col)
        ops = [*scale_ops, *ops]
        names = ("scale_a",) * row + ("scale_b",) * col + tuple(names)
        if len(ops) > 3:
            raise ValueError(
                f"{_WHERE}: the GEMM epilogue takes at most 3 tensor operands; per-row / per-column scales take "
                f"{len(scale_ops)} of them, which leaves {3 - len(scale_ops)} for {list(names[len(scale_ops):])}; "
                "apply the rest outside the call"
            )
    epi_key = epi.key if epi is not None else _NONE_KEY
    kinds = ",".join(epi.kinds) if epi is not None else ""
    needs_grad = torch.is_grad_enabled() and any(getattr(t, "requires_grad", False) for t in (a, b, *ops, *scales))
    if scales and needs_grad:
        raise TypeError(f"{_WHERE}: the fp8 GEMM has no backward (as torch._scaled_mm); call it under torch.no_grad()")
    if torch.compiler.is_compiling() or _is_fake(a):
        # traced (AOTAutograd traces a backward that calls gemm with fake tensors, outside
        # Dynamo): the registered op, whose fake implementation needs no data pointer
        if scales:
            return _gemm_fp8_op(a, b, scales[0], scales[1], ops, epi_key, kinds, out_dtype)
        return _gemm_op(a, b, ops, epi_key, kinds, out_dtype)
    if needs_grad:
        return _GemmFunction.apply(a, b, epi_key, kinds, out_dtype, tuple(names), *ops)
    fn = _lookup(a, b, ops, epi_key, kinds, out_dtype, config, names, scales)
    if epilogue_args is None and (epilogue is None or isinstance(epilogue, str)) and not any(
            isinstance(t, torch.Tensor) and t.requires_grad for t in (scale_a, scale_b)):
        try:
            key = _eager_key(a, b, bias, epilogue, out_dtype, residual, c, alpha, beta, epilogue_args, config, scale_a, scale_b)
        except TypeError:  # an unhashable argument: no warm path for it
            key = None
        # -0.0 == 0.0 in the key, but the epilogue keeps the sign of a zero alpha/beta (or fp8
        # scale given as a number): a zero of either sign gets no warm entry, so neither can
        # answer for the other
        if key is not None and not any(isinstance(v, float) and v == 0 for v in (alpha, beta, scale_a, scale_b)):
            fp8 = None
            if scales:
                # the per-tensor scale the kernel reads: the call's own tensor, or fixed (a
                # number's one-element tensor, or the 1.0 behind a per-row / per-column one)
                fixed = tuple(None if isinstance(t, torch.Tensor) and not wise else p
                              for t, wise, p in ((scale_a, row, scales[0]), (scale_b, col, scales[1])))
                fp8 = (row, col, *fixed)
            remember(_EAGER, key, _eager_run(fn, bias, c if "c" in names else None, residual, fp8))
    return fn(a, b, ops, scales)


def _eager_run(fn: Callable[..., torch.Tensor], bias: Any, c: Any, residual: Any,
               fp8: tuple[bool, bool, Any, Any] | None = None) -> _EagerRun:
    """run(a, b, bias, c, residual, scale_a, scale_b) -> fn(a, b, the present operands in
    kernel order[, the two per-tensor scales]); c only when the epilogue takes it (beta=0
    drops it). `fp8`: (scale_a per row, scale_b per column, scale_a's per-tensor tensor if
    fixed, scale_b's if fixed): a per-row / per-column scale goes in front of the operands
    (as `_gemm_slow` puts it), a fixed per-tensor one replaces the call's."""
    sel = tuple(i for i, t in enumerate((bias, c, residual)) if t is not None)
    if fp8 is not None:
        row, col, fixed_a, fixed_b = fp8

        def run_fp8(a: torch.Tensor, b: torch.Tensor, bias: Any, c: Any, residual: Any, scale_a: Any,
                    scale_b: Any) -> torch.Tensor:
            ops = [scale_a] * row + [scale_b] * col + [(bias, c, residual)[i] for i in sel]
            return fn(a, b, ops, (scale_a if fixed_a is None else fixed_a, scale_b if fixed_b is None else fixed_b))

        return run_fp8
    if not sel:
        return lambda a, b, bias, c, residual, scale_a, scale_b: fn(a, b, ())
    if sel == (0,):
        return lambda a, b, bias, c, residual, scale_a, scale_b: fn(a, b, (bias,))
    return lambda a, b, bias, c, residual, scale_a, scale_b: fn(a, b, [(bias, c, residual)[i] for i in sel])


def _scales(a: Any, b: Any, scale_a: Any, scale_b: Any) -> tuple[tuple[torch.Tensor, ...], list[torch.Tensor], bool, bool]:
    """(per-tensor scales, per-row / per-column scales, scale_a per row, scale_b per
    column). A 16-bit GEMM: ((), [], False, False). fp8: the kernel's two per-tensor scales
    as one-element fp32 tensors (a float becomes one on a's device; a per-row scale_a or
    per-column scale_b leaves a one there), and the per-row / per-column ones in epilogue
    operand order. Missing or misplaced scales raise, naming the argument."""
    given = [(n, t) for n, t in (("scale_a", scale_a), ("scale_b", scale_b)) if t is not None]
    if not (_is_fp8(a) and _is_fp8(b)):
        if not given:
            return (), [], False, False
        if _is_fp8(a) or _is_fp8(b):
            _check_ab(a, b, None)  # raises: one operand fp8, the other not
        raise TypeError(f"{_WHERE}: {given[0][0]} applies to float8 inputs only; use alpha= with bf16/fp16")
    if len(given) != 2:
        missing = [n for n, t in (("scale_a", scale_a), ("scale_b", scale_b)) if t is None]
        raise TypeError(
            f"{_WHERE}: fp8 inputs need scale_a and scale_b (dequantization scales: out = (a * scale_a) @ (b * scale_b), "
            f"as torch._scaled_mm; pass 1.0 for unscaled data); missing {', '.join(missing)}"
        )
    _check_ab(a, b, None)  # the shapes the per-row / per-column scales are checked against
    row = _scale_is_rowwise(scale_a, "scale_a", "row", a.shape[-2], b.shape[-1])
    col = _scale_is_rowwise(scale_b, "scale_b", "col", a.shape[-2], b.shape[-1])
    per_tensor = tuple(
        _one(a.device) if wise
        else t if isinstance(t, torch.Tensor) else torch.full((1,), float(t), dtype=torch.float32, device=a.device)
        for t, wise in ((scale_a, row), (scale_b, col)))
    return per_tensor, [t for t, wise in ((scale_a, row), (scale_b, col)) if wise], row, col
