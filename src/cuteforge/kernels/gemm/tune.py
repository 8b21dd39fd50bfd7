"""The GEMM's problem factory for `cuteforge tune` (`autotune.problems`):

    cuteforge tune gemm_sm90_tn --shapes 8192x8192x8192,1024x1024x1024 --dtype bfloat16
    cuteforge tune gemm_sm90_tn_col --shapes 2048x8192x28672 --dtype bfloat16 --param act=gelu

Shapes are MxNxK (or LxMxNxK, batched). The kernel name picks the operand majors (t/n
as in `spec.kernel_name`) and the epilogue operands: the plain kernels (`--param act=`
none / relu / gelu / silu, no operands) and the bias-per-column kernels (`_col`, the
`nn.Linear` bias; act defaults to none). The problem is keyed exactly as `ops.gemm` keys
the same call (dtypes, alignment, `sms`, the preset's epilogue key, dims M/N/K), so the
stored winner is what `ops.gemm` looks up.

The gated kernels (`gemm_sm90_tn_silu_mul`, ...: `ops.gated_gemm`) take MxNxK with N the
output's width (each weight's rows); their candidates are those of the (M, 2N) product
the MMAs run, made gate-able (`gated_config`).

Candidates are the heuristic's own config for the shape plus `candidate_configs(M, N)`
(the 64-row tiles for M <= 128 included), each with its swizzle group fitted to the
shape (`fit_swizzle`), because that is how `ops.gemm` runs a tuned config: timing an
unfitted group would time padding work the op never does. Every candidate's output is
checked against an fp32 torch reference before it is timed. One zeroed workspace sized
for the largest stream-K split among the candidates serves them all (each reads only its
own part; the flags are zero again after every launch).
"""

from __future__ import annotations

from typing import Any

import torch

from ...autotune.problems import ProblemInputs, register_problem
from ...signature import torch_dtype
from .epilogue import ACTIVATIONS, GATES, GemmEpilogue
from .sm90.config import (
    GemmConfig,
    candidate_configs,
    default_config,
    fit_swizzle,
    gated_config,
    stream_k_workspace_words,
)
from .spec import AB_DTYPES, gated_kernel_name, gemm_gated_kernel, gemm_kernel, kernel_name

# (A K-major, B K-major) of the four operand layouts; kinds: plain or a per-column bias
LAYOUTS = ((True, True), (True, False), (False, True), (False, False))
KINDS = ((), ("col",))


def tune_configs(m: int, n: int, k: int, sms: int, in_bytes: int, fused: bool, batch: int = 1) -> list[GemmConfig]:
    """The heuristic's config for the shape first, then the candidate list; each fitted to
    the shape's swizzle groups, duplicates dropped (the tuner validates each)."""
    out: list[GemmConfig] = []
    for c in [default_config(m, n, k, sms, in_bytes, fused=fused, batch=batch), *candidate_configs(m, n, in_bytes)]:
        c = fit_swizzle(c, m, n)
        if c not in out:
            out.append(c)
    return out


def _rows(shape: tuple[int, int, int], dim: int, dtype: torch.dtype, device: str) -> torch.Tensor:
    """An empty (L, X, Y) tensor with `dim` unit-stride and 16-byte aligned rows: the
    layout `ops.gemm` launches with (an operand whose rows are not aligned is copied into
    one like this; the output is allocated like this and copied out)."""
    unit = 16 // dtype.itemsize
    padded = list(shape)
    padded[dim] = -(-shape[dim] // unit) * unit
    order = [i for i in range(3) if i != dim] + [dim]
    buf = torch.empty([padded[i] for i in order], dtype=dtype, device=device)
    return buf.permute(*[order.index(i) for i in range(3)]).narrow(dim, 0, shape[dim])


def _dtype_and_sms(name: str, dtype: str, params: dict[str, Any], known: str) -> tuple[torch.dtype, int]:
    """A 16-bit `--dtype` and `sms` (the GPU's SM count where not given; 132 without a GPU);
    any parameter left in `params` is an error naming the `known` ones."""
    dt = torch_dtype(dtype)
    if dt not in AB_DTYPES:
        raise ValueError(f"{name}: --dtype must be bfloat16 or float16, got {dtype}")
    sms = params.pop("sms", None)
    if params:
        raise ValueError(f"{name}: unknown parameter(s) {sorted(params)}; known: {known}")
    if sms is None:
        from ...arch import gpu_info

        info = gpu_info()
        sms = info.sm_count if info else 132
    return dt, int(sms)


def gemm_problem(a_k: bool, b_k: bool, kinds: tuple[str, ...]) -> Any:
    """The `(shape, dtype, params) -> ProblemInputs` factory of one GEMM kernel."""
    kern = gemm_kernel(a_k, b_k, kinds)

    def factory(shape: tuple[int, ...], dtype: str, params: dict[str, Any]) -> ProblemInputs:
        if len(shape) not in (3, 4):
            raise ValueError(f"{kern.name} takes shapes MxNxK or LxMxNxK, got {'x'.join(map(str, shape))}")
        L, M, N, K = (1, *shape) if len(shape) == 3 else shape
        act = str(params.pop("act", "none"))
        if act not in ACTIVATIONS:
            raise ValueError(f"{kern.name}: act must be one of {ACTIVATIONS}, got {act!r}")
        dt, sms = _dtype_and_sms(kern.name, dtype, params, "act, sms")
        epi = GemmEpilogue.preset(act, bias="col" if kinds else None)
        compile_params: dict[str, Any] = {"sms": sms}
        if epi is not None:
            compile_params["epilogue"] = epi.key
        configs = tune_configs(M, N, K, sms, dt.itemsize, fused=epi is not None, batch=L)
        words = max([4] + [stream_k_workspace_words(c, sms // (c.cluster_m * c.cluster_n), M, N, K, L, sms=sms) for c in configs])

        def layout(device: str) -> list[torch.Tensor]:
            a = _rows((L, M, K), 2 if a_k else 1, dt, device)
            b = _rows((L, K, N), 1 if b_k else 2, dt, device)
            ops = [torch.empty(N, dtype=dt, device=device)] if kinds else []
            return [a, b, _rows((L, M, N), 2, dt, device), torch.zeros(4, dtype=torch.int32, device=device), *ops]

        key = kern.signature.fresh_key(layout("meta"))

        def make() -> tuple[Any, ...]:
            a, b, out, _, *ops = layout("cuda")
            # unit-variance products: |a @ b| ~ 1, well inside bf16/fp16 range at any K
            a.copy_(torch.randn(a.shape, device="cuda") / K**0.25)
            b.copy_(torch.randn(b.shape, device="cuda") / K**0.25)
            for t in ops:
                t.copy_(torch.randn(t.shape, device="cuda"))
            return (a, b, out, torch.zeros(words, dtype=torch.int32, device="cuda"), *ops)

        def reference(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor, work: torch.Tensor, *ops: torch.Tensor) -> torch.Tensor:
            acc = a.float() @ b.float()
            return acc if epi is None else epi.reference(acc, *(t.float() for t in ops))

        return ProblemInputs(key, compile_params, {"M": M, "N": N, "K": K}, make, reference, configs=configs, outputs=("out",))

    return factory


for _a_k, _b_k in LAYOUTS:
    for _kinds in KINDS:
        register_problem(kernel_name(_a_k, _b_k, _kinds), gemm_problem(_a_k, _b_k, _kinds))


def gated_problem(a_k: bool, gate: str) -> Any:
    """The `(shape, dtype, params) -> ProblemInputs` factory of one gated GEMM kernel:
    shape MxNxK, N each weight's rows (the output's width); keyed as `ops.gated_gemm`."""
    kern = gemm_gated_kernel(a_k, gate)

    def factory(shape: tuple[int, ...], dtype: str, params: dict[str, Any]) -> ProblemInputs:
        if len(shape) != 3:
            raise ValueError(f"{kern.name} takes shapes MxNxK, got {'x'.join(map(str, shape))}")
        M, N, K = shape
        dt, sms = _dtype_and_sms(kern.name, dtype, params, "sms")
        configs: list[GemmConfig] = []
        for c in tune_configs(M, 2 * N, K, sms, dt.itemsize, fused=False):
            c = fit_swizzle(gated_config(c), M, 2 * N)
            if c not in configs:
                configs.append(c)
        words = max([4] + [stream_k_workspace_words(c, sms // (c.cluster_m * c.cluster_n), M, 2 * N, K, 1, sms=sms)
                           for c in configs])

        def layout(device: str) -> list[torch.Tensor]:
            a = _rows((1, M, K), 2 if a_k else 1, dt, device)
            weights = [_rows((1, K, N), 1, dt, device) for _ in range(2)]
            return [a, *weights, _rows((1, M, N), 2, dt, device), torch.zeros(4, dtype=torch.int32, device=device)]

        key = kern.signature.fresh_key(layout("meta"))

        def make() -> tuple[Any, ...]:
            a, b_gate, b_up, out, _ = layout("cuda")
            for t in (a, b_gate, b_up):
                t.copy_(torch.randn(t.shape, device="cuda") / K**0.25)
            return (a, b_gate, b_up, out, torch.zeros(words, dtype=torch.int32, device="cuda"))

        def reference(a: torch.Tensor, b_gate: torch.Tensor, b_up: torch.Tensor, out: torch.Tensor,
                      work: torch.Tensor) -> torch.Tensor:
            from .epilogue import activation_torch

            return activation_torch(gate, a.float() @ b_gate.float()) * (a.float() @ b_up.float())

        return ProblemInputs(key, {"sms": sms}, {"M": M, "N": N, "K": K}, make, reference, configs=configs,
                             outputs=("out",))

    return factory


for _a_k in (True, False):
    for _gate in GATES:
        register_problem(gated_kernel_name(_a_k, _gate), gated_problem(_a_k, _gate))
