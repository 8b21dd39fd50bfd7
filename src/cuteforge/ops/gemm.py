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
are one dict lookup. Under torch.compile or autograd the call goes through the custom
op `torch.ops.cuteforge.gemm` (fake impl; a backward whose dA / dB are cuteforge GEMMs for
2-D 16-bit calls with a preset epilogue, an fp32 recompute in torch otherwise).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch

from ..arch import gpu_info, limits_for, max_active_clusters
from ..kernels.gemm.epilogue import ACTIVATIONS, GemmEpilogue
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
from ..workspace import stream_workspace
from .registered import define

_WHERE = "cuteforge.ops.gemm"
_PLANS: dict[tuple[Any, ...], Callable[..., torch.Tensor]] = {}
_MAX_PLANS = 4096
_NONE_KEY = ""
_NO_WORK: dict[int, torch.Tensor] = {}  # device -> the one-word workspace of configs without stream-K


_ONE: dict[Any, torch.Tensor] = {}  # device -> the per-tensor scale of 1 behind per-row / per-column fp8 scales


def _one(device: torch.device) -> torch.Tensor:
    """A one-element fp32 1.0 on `device` (read-only: the kernel only reads scales); made
    once per device in eager calls, fresh while torch.compile traces."""
    if torch.compiler.is_compiling():
        return torch.ones(1, dtype=torch.float32, device=device)
    t = _ONE.get(device)
    if t is None:
        t = _ONE[device] = torch.ones(1, dtype=torch.float32, device=device)
    return t


def _no_work(device: int) -> torch.Tensor:
    w = _NO_WORK.get(device)
    if w is None:
        w = _NO_WORK[device] = torch.zeros(4, dtype=torch.int32, device=device)
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
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{_WHERE}: argument {name!r} must be a torch.Tensor, got {type(t).__name__}")
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
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{_WHERE}: argument {name!r} must be a torch.Tensor, got {type(t).__name__}")
    if t.dtype not in FLOAT_DTYPES:
        raise TypeError(f"{_WHERE}: argument {name!r} has dtype {dtype_name(t.dtype)}; supported: float32, bfloat16, float16")
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
        if not t.is_cuda:
            raise ValueError(f"{_WHERE}: argument {name!r} must be a CUDA tensor, got one on {t.device}")
    if a.device != b.device:
        raise ValueError(f"{_WHERE}: a is on {a.device} but b is on {b.device}")
    for name, t in zip(names, operands):
        if t.device != a.device:
            raise ValueError(f"{_WHERE}: argument {name!r} is on {t.device} but a is on {a.device}")


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
    except AttributeError:  # not tensors: _plan raises the clear error
        memo, fn = None, None
    if fn is None:
        epi = GemmEpilogue(epi_key, tuple(k for k in kinds.split(",") if k)) if epi_key else None
        fn = _plan(a, b, ops, names or (epi.operand_names() if epi is not None else ()), epi, out_dtype, config, scales)
        if len(_PLANS) >= _MAX_PLANS:
            _PLANS.clear()
        _PLANS[memo] = fn
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
                      g: torch.Tensor, needs: Sequence[bool]) -> tuple[Any, ...] | None:
    """The gradients of a 2-D 16-bit GEMM with a preset epilogue (or none) on cuteforge's
    own GEMMs: dA = dZ @ B^T, dB = A^T @ dZ (a K-heavy product: the stream-K fill split),
    dbias and dc sums of dZ, d residual = g. An activation recomputes its pre-activation z
    with one more GEMM (bias, c and alpha fused) and applies torch's activation backward.
    None where this path does not apply (torch's recompute then serves)."""
    fields = epi.preset_fields() if epi is not None else ("none", False, False, False, 1.0, 1.0)
    if (fields is None or a.dim() != 2 or b.dim() != 2 or a.dtype not in AB_DTYPES or b.dtype != a.dtype
            or not g.is_cuda or torch.cuda.get_device_capability(g.device) != (9, 0) or 0 in (*a.shape, b.shape[1])):
        return None
    act, has_bias, has_c, has_res, alpha, beta = fields

    # the custom op itself, not gemm(): AOT autograd traces this backward with fake tensors
    def mm(x: torch.Tensor, y: torch.Tensor, out_dtype: torch.dtype) -> torch.Tensor:
        return _gemm_op(x, y, [], _NONE_KEY, "", out_dtype)

    if act != "none":
        # z = alpha * a @ b + beta * c + bias: the forward's epilogue without its activation
        pre = GemmEpilogue.preset("none", bias=epi.kinds[0] if has_bias else None, c=has_c, alpha=alpha, beta=beta)
        pre_ops = list(ops[:has_bias + has_c])
        z = _gemm_op(a, b, pre_ops, pre.key if pre is not None else _NONE_KEY, ",".join(pre.kinds) if pre else "", g.dtype)
        dz = _ACT_BACKWARD[act](g, z)
    else:
        dz = g
    dacc = (dz * alpha if alpha != 1.0 else dz).to(a.dtype)
    # each gradient in its input's layout (autograd then makes no copy), e.g. an nn.Linear
    # weight's: b = W.t() is K-major, so dB = (dZ^T @ A)^T lands as W's contiguous gradient
    da = db = None
    if needs[0]:
        da = mm(b, dacc.t(), a.dtype).t() if _k_major_t(a) else mm(dacc, b.t(), a.dtype)
    if needs[1]:
        db = mm(dacc.t(), a, b.dtype).t() if _k_major_t(b) else mm(a.t(), dacc, b.dtype)
    # the operands in kernel order: bias (per column or per row), c, residual
    terms = [dz] * has_bias + [dz * beta if beta != 1.0 else dz] * has_c + [g] * has_res
    op_grads = [d.float().sum_to_size(t.shape).to(t.dtype) for d, t in zip(terms, ops)] if needs[2] else [None] * len(ops)
    return da, db, op_grads, None, None, None


def _k_major_t(t: torch.Tensor) -> bool:
    """Whether a 2-D operand is the transpose of a contiguous matrix (unit stride down its rows)."""
    return t.stride(0) == 1 and t.stride(1) == t.shape[0] and t.shape[1] > 1


def _backward(ctx: Any, g: torch.Tensor) -> tuple[Any, ...]:
    """Where `_backward_on_gemm` applies, its GEMMs; else recompute the forward in torch
    (fp32) and differentiate it: exact for every epilogue."""
    epi_key, kinds = ctx.meta
    a, b, *ops = ctx.saved_tensors
    epi = GemmEpilogue(epi_key, tuple(k for k in kinds.split(",") if k)) if epi_key else None
    needs = getattr(ctx, "needs_input_grad", None) or (True, True, True)
    fast = _backward_on_gemm(a, b, list(ops), epi, g.contiguous(), needs)
    if fast is not None:
        return fast
    with torch.enable_grad():
        leaves = [t.detach().requires_grad_(True) for t in (a, b, *ops)]
        y = _reference(leaves[0], leaves[1], leaves[2:], epi, torch.float32)
        grads = torch.autograd.grad(y, leaves, g.float(), allow_unused=True)
    cast = [None if gr is None else gr.to(t.dtype) for gr, t in zip(grads, (a, b, *ops))]
    return cast[0], cast[1], cast[2:], None, None, None


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
            if not isinstance(bias, torch.Tensor):
                raise TypeError(f"{_WHERE}: argument 'bias' must be a torch.Tensor, got {type(bias).__name__}")
            # (M, 1) is per row; (N,) / (1, N) per column, as torch broadcasting reads them.
            kind = "row" if bias.dim() >= 2 and bias.shape[-1] == 1 and bias.shape[-2] != 1 else "col"
        if beta == 0 and c is not None:
            if not isinstance(c, torch.Tensor):
                raise TypeError(f"{_WHERE}: argument 'c' must be a torch.Tensor, got {type(c).__name__}")
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
    bypassing tuned results and the heuristic (benchmarks, experiments); calls through
    the custom op (torch.compile, or an input that requires grad) ignore it.

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
    except (AttributeError, KeyError, TypeError):
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
    if torch.compiler.is_compiling() or needs_grad:
        if scales:
            return _gemm_fp8_op(a, b, scales[0], scales[1], ops, epi_key, kinds, out_dtype)
        return _gemm_op(a, b, ops, epi_key, kinds, out_dtype)
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
            if len(_EAGER) >= _MAX_PLANS:
                _EAGER.clear()
            fp8 = None
            if scales:
                # the per-tensor scale the kernel reads: the call's own tensor, or fixed (a
                # number's one-element tensor, or the 1.0 behind a per-row / per-column one)
                fixed = tuple(None if isinstance(t, torch.Tensor) and not wise else p
                              for t, wise, p in ((scale_a, row, scales[0]), (scale_b, col, scales[1])))
                fp8 = (row, col, *fixed)
            _EAGER[key] = _eager_run(fn, bias, c if "c" in names else None, residual, fp8)
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
