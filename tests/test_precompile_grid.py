"""The standard specializations `cuteforge precompile` builds cover common model sizes, keyed
as the ops key a contiguous call (checked against each family's tuning problem factory, which
keys a problem as its op does), and `--shapes` adds row lengths. No compile: the grid only."""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest

from cuteforge import kernels
from cuteforge.autotune.problems import problem_factory
from cuteforge.cli.common import CliError
from cuteforge.cli.precompile import precompile_specs, row_lengths
from cuteforge.kernels.softmax.spec import kernel_params
from cuteforge.signature import BoundKey

HIDDEN = (2048, 4096, 5120, 8192)
VOCAB = (32000, 50257, 128256, 151936)
DTYPES = ("float32", "bfloat16", "float16")


@pytest.fixture(scope="module")
def grid() -> set[tuple[str, Any, Any]]:
    kernels.load_all()
    return {(k.name, s.key, s.params) for k, s in precompile_specs()}


def _covered(grid: set[tuple[str, Any, Any]], kernel: str, n: int, dtype: str, params: dict[str, Any]) -> bool:
    p = problem_factory(kernel)((64, n), dtype, dict(params))
    compile_params = tuple(sorted(p.params.items()))
    if kernel.startswith("softmax"):  # the op adds same_heads for realigned contiguous rows (ops/softmax.py)
        compile_params = kernel_params(p.params["mode"], p.key, True)
    return (kernel, p.key, compile_params) in grid


@pytest.mark.parametrize("dtype", DTYPES)
def test_norms_cover_model_hidden_sizes(grid: set[tuple[str, Any, Any]], dtype: str) -> None:
    for n in HIDDEN:
        assert _covered(grid, "norm_fwd", n, dtype, {"kind": "rms", "eps": 1e-6}), (n, dtype)
        assert _covered(grid, "norm_fwd", n, dtype, {"kind": "layer"}), (n, dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_cross_entropy_and_softmax_cover_vocabularies(grid: set[tuple[str, Any, Any]], dtype: str) -> None:
    for n in VOCAB:
        assert _covered(grid, "cross_entropy_fwd", n, dtype, {}), (n, dtype)
        assert _covered(grid, "cross_entropy_bwd", n, dtype, {}), (n, dtype)
        for mode in ("softmax", "log_softmax"):
            assert _covered(grid, "softmax_fwd", n, dtype, {"mode": mode}), (n, dtype, mode)


@pytest.mark.parametrize("dtype", DTYPES)
def test_norm_backward_covers_model_hidden_sizes(grid: set[tuple[str, Any, Any]], dtype: str) -> None:
    """The key ops/norm_launch.py binds for a training step's backward (x, weight, dy, dy as
    dsum, two (M,) float32 statistics, dx, two (Q, N) float32 partials), written out."""
    width = {"float32": 4, "bfloat16": 8, "float16": 8}[dtype]
    for n in HIDDEN:
        key = BoundKey((dtype,) * 4 + ("float32",) * 2 + (dtype,) + ("float32",) * 2, (("N", n),),
                       (width,) * 4 + (4, 4, width, 4, 4))
        assert ("norm_bwd", key, (("has_bias", False), ("has_dsum", False), ("kind", "rms"))) in grid, (n, dtype)
        assert ("norm_bwd", key, (("has_bias", True), ("has_dsum", False), ("kind", "layer"))) in grid, (n, dtype)
        # frozen weights: the op names has_dw only when False (ops/norm_launch.py, sorted)
        frozen = (("has_bias", False), ("has_dsum", False), ("has_dw", False), ("kind", "rms"))
        assert ("norm_bwd", key, frozen) in grid, (n, dtype)


@pytest.mark.parametrize("w_dtype", DTYPES)
@pytest.mark.parametrize("r, q, n", [(1, 132, 1024), (2, 264, 4096), (1, 528, 5120), (2, 7, 8192)])
def test_norm_backward_partial_sums_are_covered(monkeypatch, w_dtype: str, r: int, q: int, n: int) -> None:
    """The column sum of the dweight partials that ops/norm_launch.py asks for (its key,
    parameters and config, as `_partials_sum` hands them to the kernel) is one that
    `cuteforge precompile` builds."""
    import torch

    from cuteforge.kernels.reduce.spec import col_reduce
    from cuteforge.ops import norm_launch

    asked = []

    class Recorder:  # binds as the op does on fresh CUDA buffers, records the kernel request
        class signature:
            bind = staticmethod(lambda tensors, where="": col_reduce.signature.fresh_key(tensors))

        @staticmethod
        def get(key, params, config):
            asked.append((key, params, config))

    monkeypatch.setattr(norm_launch, "col_reduce", Recorder)
    norm_launch._partials_sum(r, q, n, torch.empty(n, dtype=getattr(torch, w_dtype), device="meta"))
    specs = {(s.key, s.params): s.config for k, s in precompile_specs(["col_reduce"])}
    ((key, params, config),) = asked
    assert specs[(key, params)] == config


def test_grid_size() -> None:
    """What a full precompile compiles: a change here is a change in compile time (docs/bundles.md)."""
    counts = Counter(k.name for k, _ in precompile_specs())
    assert sum(counts.values()) == 488, counts
    assert counts["gemm_sm90_tn_silu_mul"] == 2  # SwiGLU's gated GEMM, bf16 and fp16
    assert counts["norm_fwd"] == 30 and counts["norm_bwd"] == 48 and counts["softmax_fwd"] == 90 and counts["softmax_bwd"] == 66
    assert counts["col_reduce"] == 3  # the norms' sums of their dweight partials, per weight dtype
    assert counts["row_reduce"] == 5 * 11 * 3 and counts["cross_entropy_fwd_reduce"] == 2 * 4 * (3 + 2) + 4 * 2  # fp32 out for bf16, fp16; its sum


def test_every_reduction_and_the_no_grad_loss(grid: set[tuple[str, Any, Any]]) -> None:
    for dtype in ("float32", "bfloat16"):
        for op in ("sum", "mean", "amax", "amin", "argmax"):
            assert _covered(grid, "row_reduce", 16384, dtype, {"op": op}), (op, dtype)
    names = {params for k, _, params in grid if k == "cross_entropy_fwd_reduce"}
    assert {dict(p)["lse"] for p in names} == {True, False}


def test_shapes_add_row_lengths() -> None:
    assert row_lengths("7168,4096x14336, 7168") == (7168, 14336)
    assert row_lengths(None) == ()
    with pytest.raises(CliError, match="--shapes"):
        row_lengths("4096xabc")
    base = precompile_specs(["norm_fwd", "softmax_fwd", "gemm_sm90_tn"])
    more = precompile_specs(["norm_fwd", "softmax_fwd", "gemm_sm90_tn"], (7168, 4096))  # 4096 is standard already
    added = Counter(k.name for k, _ in more) - Counter(k.name for k, _ in base)
    assert added == {"norm_fwd": 6, "softmax_fwd": 6}, added  # (rms, layer) and (softmax, log_softmax) x 3 dtypes
    more_bwd = Counter(k.name for k, _ in precompile_specs(["norm_bwd"], (7168,)))
    assert more_bwd == {"norm_bwd": 48 + 12}, more_bwd
    grid = {(k.name, s.key, s.params) for k, s in more}
    for dtype in DTYPES:
        assert _covered(grid, "norm_fwd", 7168, dtype, {"kind": "layer"})
        assert _covered(grid, "softmax_fwd", 7168, dtype, {"mode": "log_softmax"})
