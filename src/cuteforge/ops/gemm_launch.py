"""`cuteforge.ops.gemm`'s launch plans: the operand checks (every one before the device
check), the aligned or copied operands TMA can address, the config (pinned, tuned or the
heuristic's), the stream-K workspace, and the bound kernel; `_plan` returns run(a, b, ops,
scales) for one layout. `_reference` is the same product and epilogue in torch (empty
extents, and the backward's recompute)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from .. import checks
from ..arch import gpu_info, limits_for, max_active_clusters
from ..kernels.gemm.epilogue import GemmEpilogue
from ..kernels.gemm.sm90.config import (
    GemmConfig,
    default_config,
    fit_swizzle,
    stream_k_flag_words,
    stream_k_workspace_words,
    usable_tuned,
)
from ..kernels.gemm.spec import AB_DTYPES, FP8_DTYPES, gemm_fp8_kernel, gemm_kernel
from ..signature import FLOAT_DTYPES, dtype_name
from ..workspace import persistent, stream_workspace

_WHERE = "cuteforge.ops.gemm"
_NO_WORK: dict[int, torch.Tensor] = {}  # device -> the one-word workspace of configs without stream-K


_ONE: dict[Any, torch.Tensor] = {}  # device -> the per-tensor scale of 1 behind per-row / per-column fp8 scales


def _one(device: torch.device) -> torch.Tensor:
    """A one-element fp32 1.0 on `device` (read-only: the kernel only reads scales); made
    once per device in eager calls, fresh while torch.compile traces."""
    if torch.compiler.is_compiling():
        return torch.ones(1, dtype=torch.float32, device=device)
    t = _ONE.get(device)
    if t is None:
        t = _ONE[device] = persistent(device, lambda: torch.ones(1, dtype=torch.float32, device=device))
    return t


def _no_work(device: int | None) -> torch.Tensor:
    w = _NO_WORK.get(device)
    if w is None:
        w = _NO_WORK[device] = persistent(device, lambda: torch.zeros(4, dtype=torch.int32, device=device))
    return w


def _persistent_clusters(device: int, cfg: GemmConfig, sms: int) -> int:
    """The persistent grid's clusters: one per cluster-size SMs, but no more than the device
    runs at once. 4-CTA clusters (a pinned 2x2 config) fit 30 times on a 132-SM H200, not
    33: the other 3 would run their tiles as a second round, and a stream-K owner waiting
    on a peer that is not resident would never finish. Pairs are not asked (the query
    costs ~0.24 s on a process's first plan): SMs come in TPC pairs and a GPC holds whole
    TPCs, so sms / 2 pairs always fit (66 on the H200, measured)."""
    size = cfg.cluster_m * cfg.cluster_n
    cap = max_active_clusters(device, size) if size > 2 else None
    return min(sms // size, cap) if cap else sms // size


def _workspace(device: int, cfg: GemmConfig, sms: int, clusters: int, m: int, n: int, k: int,
               batch: int) -> Callable[[], torch.Tensor]:
    """The `work` argument per call: where the config's stream-K split cuts tiles of this
    problem, flags + partial tiles from `cuteforge.workspace` (per stream; fresh under
    graph capture), else one word that the kernel never reads."""
    words = stream_k_workspace_words(cfg, clusters, m, n, k, batch, sms=sms)
    if words:
        flags = stream_k_flag_words(sms)
        return lambda: stream_workspace("gemm", device, words, flags)
    w = _no_work(device)
    return lambda: w


def _layout(t: torch.Tensor) -> tuple[Any, ...]:
    return (t.dtype, t.shape, t.stride(), t.data_ptr() & 15, t.device.index)


def _aligned(t: torch.Tensor, dim: int) -> bool:
    """TMA can read `t` with `dim` as its unit-stride dim: every other stride and the base
    address 16-byte aligned."""
    if t.stride(dim) != 1 and t.shape[dim] > 1:
        return False
    es = t.element_size()
    if t.data_ptr() % 16:
        return False
    return all(s * es % 16 == 0 for i, s in enumerate(t.stride()) if i != dim % t.dim() and t.shape[i] > 1)


def _padded(t: torch.Tensor, dim: int) -> torch.Tensor:
    """A copy of `t` whose `dim` is unit-stride and whose rows start 16-byte aligned
    (extent rounded up in storage, the view keeps the logical shape)."""
    unit = 16 // t.element_size()
    dim = dim % t.dim()
    shape = list(t.shape)
    shape[dim] = -(-shape[dim] // unit) * unit
    order = [i for i in range(t.dim()) if i != dim] + [dim]
    buf = torch.zeros([shape[i] for i in order], dtype=t.dtype, device=t.device)
    view = buf.permute(*[order.index(i) for i in range(t.dim())])
    view = view.narrow(dim, 0, t.shape[dim])
    view.copy_(t)
    return view


def _operand_for(t: torch.Tensor, prefer: tuple[int, int]) -> tuple[torch.Tensor, bool]:
    """`t` as is when TMA-readable with one of the two preferred unit-stride dims, else an
    aligned copy. Returns (tensor, first preference taken)."""
    for dim in prefer:
        if _aligned(t, dim):
            return t, dim == prefer[0]
    return _padded(t, prefer[0]), True


def _is_fp8(t: Any) -> bool:
    return isinstance(t, torch.Tensor) and t.dtype in FP8_DTYPES


def _check_ab(a: Any, b: Any, out_dtype: Any) -> None:
    """Types, dtypes and shapes of a and b (devices come later: every shape error is
    raised the same way for CPU and CUDA tensors)."""
    for name, t in (("a", a), ("b", b)):
        checks.tensor(_WHERE, name, t)
        if t.dtype not in AB_DTYPES + FP8_DTYPES:
            raise TypeError(
                f"{_WHERE}: argument {name!r} has dtype {dtype_name(t.dtype)}; supported: bfloat16, float16, "
                "float8_e4m3fn, float8_e5m2 (with scale_a/scale_b)"
            )
        if t.dim() not in (2, 3):
            raise ValueError(f"{_WHERE}: argument {name!r} must be 2-D or 3-D (batched), got shape {tuple(t.shape)}")
    if _is_fp8(a) != _is_fp8(b):
        raise TypeError(
            f"{_WHERE}: a is {dtype_name(a.dtype)} but b is {dtype_name(b.dtype)}; an fp8 GEMM needs both operands fp8 "
            "(float8_e4m3fn / float8_e5m2, mixed allowed)"
        )
    if not _is_fp8(a) and a.dtype != b.dtype:
        raise TypeError(f"{_WHERE}: a is {dtype_name(a.dtype)} but b is {dtype_name(b.dtype)}; they must match")
    if a.shape[-1] != b.shape[-2]:
        raise ValueError(
            f"{_WHERE}: a has K={a.shape[-1]} (shape {tuple(a.shape)}) but b has K={b.shape[-2]} "
            f"(shape {tuple(b.shape)}); a @ b needs a.shape[-1] == b.shape[-2]"
        )
    if a.dim() == 3 and b.dim() == 3 and a.shape[0] != b.shape[0]:
        raise ValueError(f"{_WHERE}: batch sizes differ: a has L={a.shape[0]}, b has L={b.shape[0]}")
    if out_dtype is not None and out_dtype not in FLOAT_DTYPES:
        raise TypeError(f"{_WHERE}: out_dtype must be float32, bfloat16 or float16, got {out_dtype}")


def _check_fp8_layout(a: torch.Tensor, b: torch.Tensor) -> None:
    """WGMMA reads fp8 operands only K-major, and TMA needs 16-byte rows: K a multiple of
    16, a row-major (M, K), b column-major in its (K, N) view (an (N, K) weight's .t())."""
    K = a.shape[-1]
    if K % 16:
        raise ValueError(
            f"{_WHERE}: fp8 GEMM needs K to be a multiple of 16 (TMA reads 16-byte rows of fp8), got K={K}; "
            "zero-pad K on both operands"
        )
    if K > 1 and a.stride(-1) != 1:
        raise ValueError(
            f"{_WHERE}: fp8 GEMM needs 'a' row-major (K-major, a.stride(-1) == 1): WGMMA reads fp8 operands only "
            f"K-major; got a of shape {tuple(a.shape)} with strides {tuple(a.stride())}. Pass a.contiguous()"
        )
    if K > 1 and b.stride(-2) != 1:
        raise ValueError(
            f"{_WHERE}: fp8 GEMM needs 'b' column-major in its (K, N) view (K-major, b.stride(-2) == 1), e.g. w.t() "
            f"of a row-major (N, K) weight, as torch._scaled_mm; got b of shape {tuple(b.shape)} with strides "
            f"{tuple(b.stride())}. Pass b.mT.contiguous().mT"
        )


def _check_scale(t: Any, name: str) -> None:
    """A per-tensor dequantization scale: a Python number or a one-element fp32 tensor."""
    if isinstance(t, torch.Tensor):
        if t.numel() != 1:
            raise ValueError(
                f"{_WHERE}: argument {name!r} must be a per-tensor scale (one element), got shape {tuple(t.shape)}"
            )
        if t.dtype != torch.float32:
            raise TypeError(f"{_WHERE}: argument {name!r} must be float32 (as torch._scaled_mm), got {dtype_name(t.dtype)}")
    elif isinstance(t, bool) or not isinstance(t, (int, float)):
        raise TypeError(f"{_WHERE}: argument {name!r} must be a float or a one-element float32 tensor, got {type(t).__name__}")


def _scale_is_rowwise(t: Any, name: str, kind: str, m: int, n: int) -> bool:
    """Whether fp8's `scale_a` (kind "row") / `scale_b` ("col") is per row / per column:
    True for an fp32 tensor of shape (M, 1) or (M,) / (1, N) or (N,) (torch._scaled_mm's
    rowwise mode), False for a per-tensor one (a Python number or a one-element fp32
    tensor); anything else raises, naming the argument."""
    if not isinstance(t, torch.Tensor) or t.numel() == 1:
        _check_scale(t, name)
        return False
    if t.dtype != torch.float32:
        raise TypeError(f"{_WHERE}: argument {name!r} must be float32 (as torch._scaled_mm), got {dtype_name(t.dtype)}")
    ext = m if kind == "row" else n
    shapes = ((ext, 1), (ext,)) if kind == "row" else ((1, ext), (ext,))
    if tuple(t.shape) not in shapes:
        which = f"per-row one of shape ({m}, 1) or ({m},)" if kind == "row" else f"per-column one of shape (1, {n}) or ({n},)"
        raise ValueError(
            f"{_WHERE}: argument {name!r} must be a per-tensor scale (one element) or a {which}, got shape {tuple(t.shape)}"
        )
    return True


def _check_operand(t: Any, kind: str, name: str, out_shape: tuple[int, ...]) -> None:
    """An epilogue operand's type, dtype and shape against the output shape (M, N) or
    (L, M, N). row: (M,) or (M, 1); col: (N,) or (1, N); full: broadcastable to the
    output; none may have more dims than the output (torch would grow the result)."""
    checks.tensor(_WHERE, name, t, FLOAT_DTYPES)
    shape, M, N = tuple(t.shape), out_shape[-2], out_shape[-1]
    fits = len(shape) <= len(out_shape)
    if kind == "col":
        ok = fits and len(shape) >= 1 and shape[-1] == N and all(s == 1 for s in shape[:-1])
        want = f"a per-column operand of shape ({N},) or (1, {N})"
    elif kind == "row":
        ok = fits and (shape == (M,) or (len(shape) >= 2 and shape[-2:] == (M, 1) and all(s == 1 for s in shape[:-2])))
        want = f"a per-row operand of shape ({M},) or ({M}, 1)"
    else:
        ok = fits and all(s in (1, o) for s, o in zip(reversed(shape), reversed(out_shape)))
        want = f"an operand that broadcasts to the output shape {out_shape}"
    if not ok:
        raise ValueError(f"{_WHERE}: argument {name!r} must be {want}, got shape {shape}")


def _check_devices(a: torch.Tensor, b: torch.Tensor, operands: Sequence[torch.Tensor], names: Sequence[str]) -> None:
    for name, t in (("a", a), ("b", b)):
        checks.on_cuda(_WHERE, name, t)
    for name, t in zip(("b", *names), (b, *operands)):
        checks.same_device(_WHERE, name, t, "a", a)


def _check_config(config: GemmConfig, in_bytes: int, out_bytes: int) -> None:
    """A pinned config must run on sm_90 (the builder would trace an impossible one)."""
    try:
        config.validate(in_bytes, out_bytes, limits_for("sm_90a"))
    except ValueError as e:
        raise ValueError(f"{_WHERE}: config {config} cannot run: {e}") from None


def _shape_operand(t: torch.Tensor, kind: str, L: int, M: int, N: int) -> torch.Tensor:
    """A checked epilogue operand in the kernel's form: row (M,), col (N,), full (L, M, N)."""
    if kind in ("row", "col"):
        return t.reshape(M if kind == "row" else N).contiguous()
    full = t.expand(L, M, N)
    return full if full.stride(-1) == 1 or N == 1 else full.contiguous()


def _shaper(t: torch.Tensor, kind: str, L: int, M: int, N: int) -> Callable[[torch.Tensor], torch.Tensor] | None:
    """None when `t` (a checked operand; its layout is in the memo key) already is in the
    kernel's form, else the per-call `_shape_operand`."""
    want = (M,) if kind == "row" else (N,) if kind == "col" else (L, M, N)
    if tuple(t.shape) == want and (t.dim() != 1 or t.stride(0) == 1 or t.shape[0] == 1):
        if t.dim() == 1 or t.stride(-1) == 1 or N == 1:
            return None
    return lambda u: _shape_operand(u, kind, L, M, N)


def _reference(a: torch.Tensor, b: torch.Tensor, ops: Sequence[torch.Tensor], epi: GemmEpilogue | None, out_dtype: torch.dtype,
               scales: Sequence[torch.Tensor] = ()) -> torch.Tensor:
    """torch: fp32 accumulate, the same epilogue (K == 0, M/N == 0, and backward)."""
    acc = torch.matmul(a.float(), b.float())
    if scales:
        acc = acc * (scales[0].float().reshape(()) * scales[1].float().reshape(()))
    if epi is not None:
        shaped = []
        for t, kind in zip(ops, epi.kinds):
            f = t.float()
            shaped.append(f.reshape(-1, 1) if kind == "row" else f.reshape(-1) if kind == "col" else f)
        acc = epi.reference(acc, *shaped)
    return acc.to(out_dtype)


def _plan(a: Any, b: Any, ops: Sequence[Any], names: Sequence[str], epi: GemmEpilogue | None, out_dtype: Any,
          config: GemmConfig | None = None, scales: Sequence[Any] = ()) -> Callable[..., torch.Tensor]:
    _check_ab(a, b, out_dtype)
    fp8 = _is_fp8(a)
    if fp8:
        if len(scales) != 2:
            raise TypeError(
                f"{_WHERE}: fp8 inputs need scale_a and scale_b (dequantization scales: out = (a * scale_a) @ "
                "(b * scale_b), as torch._scaled_mm); pass 1.0 for unscaled data"
            )
        for t, name in zip(scales, ("scale_a", "scale_b")):
            if isinstance(t, torch.Tensor) and t.numel() != 1:  # only a direct call of the custom op gets here
                raise ValueError(
                    f"{_WHERE}: argument {name!r}: torch.ops.cuteforge.gemm_fp8 takes per-tensor scales (one element), "
                    f"got shape {tuple(t.shape)}; call cuteforge.ops.gemm, which passes per-row / per-column scales "
                    "to the kernel as epilogue operands"
                )
            _check_scale(t, name)
        _check_fp8_layout(a, b)
    elif scales:
        raise TypeError(f"{_WHERE}: scale_a/scale_b apply to float8 inputs only; use alpha= with bf16/fp16")
    # fp8 has no fp8 output here: bf16 unless asked (torch._scaled_mm users pass out_dtype).
    odt = out_dtype or (torch.bfloat16 if fp8 else a.dtype)
    batched = a.dim() == 3 or b.dim() == 3
    L = a.shape[0] if a.dim() == 3 else (b.shape[0] if b.dim() == 3 else 1)
    M, K, N = a.shape[-2], a.shape[-1], b.shape[-1]
    out_shape = (L, M, N) if batched else (M, N)
    kinds = epi.kinds if epi is not None else ()
    if len(ops) != len(kinds):
        raise TypeError(f"{_WHERE}: the epilogue takes {len(kinds)} tensor operand(s), got {len(ops)}")
    names = tuple(names) + tuple(f"epilogue operand {i}" for i in range(len(names), len(ops)))
    for t, k, n in zip(ops, kinds, names):
        _check_operand(t, k, n, out_shape)
    if config is not None:
        _check_config(config, a.element_size(), torch.empty((), dtype=odt).element_size())
    _check_devices(a, b, [*ops, *scales], [*names, "scale_a", "scale_b"][: len(ops) + len(scales)])
    if L == 0 or M == 0 or N == 0 or K == 0:
        # No launch: an empty grid or a K loop of zero k-blocks. torch's answer (with the
        # epilogue: alpha * 0 + beta * c + bias ... when K == 0).
        return lambda a, b, ops, scales=(): _reference(a, b, ops, epi, odt, scales).reshape(out_shape)

    info = gpu_info(a.device.index)
    sms = info.sm_count if info else 132

    def prepare(a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, bool, bool]:
        a3 = a if a.dim() == 3 else a.unsqueeze(0)
        b3 = b if b.dim() == 3 else b.unsqueeze(0)
        if a3.shape[0] != L:
            a3 = a3.expand(L, M, K)
        if b3.shape[0] != L:
            b3 = b3.expand(L, K, N)
        # fp8: K-major only (checked above); a misaligned K-major view is copied.
        a3, a_k = _operand_for(a3, (2,) if fp8 else (2, 1))
        b3, b_k = _operand_for(b3, (1,) if fp8 else (1, 2))
        return a3, b3, a_k, b_k

    a3, b3, a_k, b_k = prepare(a, b)
    # 2-D operands TMA reads as they are: the warm call needs no layout probing
    plain = a.dim() == 2 and b.dim() == 2 and a3.data_ptr() == a.data_ptr() and b3.data_ptr() == b.data_ptr()
    kern = gemm_fp8_kernel(kinds) if fp8 else gemm_kernel(a_k, b_k, kinds)
    n_unit = 16 // torch.empty((), dtype=odt).element_size()
    n_pad = -(-N // n_unit) * n_unit
    out = torch.empty(L, M, n_pad, dtype=odt, device=a.device)[..., :N]
    shaped = [_shape_operand(t, k, L, M, N) for t, k in zip(ops, kinds)]
    scale_args = [t.reshape(1) for t in scales]
    key = kern.signature.bind((a3, b3, out, _no_work(a.device.index), *scale_args, *shaped), _WHERE)
    params = (("sms", sms),) + ((("epilogue", epi.key),) if epi is not None else ())
    from ..autotune import lookup  # slow path only: a tuned config if one was stored

    tuned = usable_tuned(lookup(kern, key, params, {"M": M, "N": N, "K": K}), a.element_size(), out.element_size())
    # A pinned config runs as given; a tuned one (stored for a bucket of shapes) gets its
    # swizzle group fitted to this problem, as the heuristic's does (no padding work).
    if config is not None:
        cfg = config
    elif tuned is not None:
        cfg = fit_swizzle(tuned, M, N)
    else:
        cfg = default_config(M, N, K, sms, a.element_size(), fused=epi is not None,
                             vector_operands=sum(k_ in ("row", "col") for k_ in kinds),
                             full_operands=sum(k_ == "full" for k_ in kinds),
                             scale_operands=epi.scale_operands if epi is not None else 0, batch=L)
    clusters = _persistent_clusters(a.device.index, cfg, sms)
    if clusters < sms // (cfg.cluster_m * cfg.cluster_n):
        params += (("clusters", clusters),)  # in the key only where it differs from sms's share
    launch = kern.get(key, tuple(sorted(params)), cfg)
    work = _workspace(a.device.index, cfg, sms, clusters, M, N, K, L)
    if plain and n_pad == N:
        # Operands already in the kernel's form (row (M,) / col (N,) unit-stride vectors, a
        # full (1, M, N) one) pass through; others get their per-call shaping. fp8's
        # per-tensor scales pass as the (1,) tensors the kernel takes; a 0-dim one (as
        # `torch.tensor(s)` makes) is reshaped per call (the plan is keyed by its layout).
        shapers = tuple(_shaper(t, k, L, M, N) for t, k in zip(ops, kinds))
        flat = all(t.dim() == 1 for t in scales)
        if not any(shapers) and flat:
            def run_plain(a: torch.Tensor, b: torch.Tensor, ops: Sequence[torch.Tensor],
                          scales: Sequence[torch.Tensor] = ()) -> torch.Tensor:
                out = a.new_empty(M, N, dtype=odt)
                launch(a.unsqueeze(0), b.unsqueeze(0), out.unsqueeze(0), work(), *scales, *ops)
                return out
        else:
            def run_plain(a: torch.Tensor, b: torch.Tensor, ops: Sequence[torch.Tensor],
                          scales: Sequence[torch.Tensor] = ()) -> torch.Tensor:
                out = a.new_empty(M, N, dtype=odt)
                launch(a.unsqueeze(0), b.unsqueeze(0), out.unsqueeze(0), work(),
                       *(scales if flat else [t.reshape(1) for t in scales]),
                       *[t if f is None else f(t) for t, f in zip(ops, shapers)])
                return out

        return run_plain

    def run(a: torch.Tensor, b: torch.Tensor, ops: Sequence[torch.Tensor], scales: Sequence[torch.Tensor] = ()) -> torch.Tensor:
        a3, b3, _, _ = prepare(a, b)
        out = torch.empty(L, M, n_pad, dtype=odt, device=a.device)
        view = out[..., :N] if n_pad != N else out
        launch(a3, b3, view, work(), *[t.reshape(1) for t in scales],
               *[_shape_operand(t, k, L, M, N) for t, k in zip(ops, kinds)])
        if n_pad != N:
            view = view.contiguous()
        return view if batched else view[0]

    return run
