"""The ops' argument checks on the CPU: every op checks dtypes, shapes and scalars before
the device, so a CPU caller sees the real problem; a CPU call that is otherwise right is
told the tensor must be on CUDA."""

from __future__ import annotations

import pytest
import torch

import cuteforge.ops as ops

X = torch.randn(4, 8)
W = torch.randn(8)
WG = torch.randn(8, 16, dtype=torch.bfloat16)  # a gated GEMM's (K, N) weight


def _cfg(**kw):  # noqa: ANN003, ANN202
    from cuteforge.kernels.gemm.sm90.config import GemmConfig

    return GemmConfig(**kw)


@pytest.mark.parametrize(("call", "error", "match"), [
    (lambda: ops.rms_norm(X.double(), W), TypeError, "'x' has dtype float64"),
    (lambda: ops.rms_norm(X, torch.randn(7)), ValueError, "'weight' must have shape"),
    (lambda: ops.rms_norm(X, W, eps=-1.0), ValueError, "'eps' must be finite"),
    (lambda: ops.layer_norm(X, W, torch.randn(8).half()), TypeError, "'bias'"),
    (lambda: ops.softmax(X.int()), TypeError, "'x' has dtype int32"),
    (lambda: ops.softmax(X, dim=2), ValueError, "'dim' must be the last dim"),
    (lambda: ops.sum(X.long()), TypeError, "'x' has dtype int64"),
    (lambda: ops.amax(X, dim=5), ValueError, "'dim'=5 is out of range"),
    (lambda: ops.cross_entropy(X, torch.zeros(4, dtype=torch.int32)), TypeError, "'target' must be int64"),
    (lambda: ops.cross_entropy(X, torch.zeros(4, dtype=torch.int64), reduction="avg"), ValueError, "'reduction'"),
    (lambda: ops.gated_gemm(X.bfloat16(), WG, WG[:, :4]), ValueError, "'b_up' has shape"),
    (lambda: ops.gated_gemm(X.bfloat16(), WG[:4], WG[:4]), ValueError, "b_gate has K=4"),
    (lambda: ops.gated_gemm(X.bfloat16(), WG.half(), WG.half()), TypeError, "b_gate is torch.float16"),
    (lambda: ops.gated_gemm(X, WG, WG), TypeError, "'a' has dtype float32"),
    (lambda: ops.gated_gemm(X.bfloat16(), WG, WG, gate="relu"), ValueError, "gate must be one of"),
    (lambda: ops.gated_gemm(X.bfloat16(), WG, WG, config=_cfg(tile_n=144, epi_n=16)), ValueError, "tile_n a multiple of 32"),
    (lambda: ops.gated_gemm(X.bfloat16(), WG, WG), ValueError, "'a' must be a CUDA tensor"),
    (lambda: ops.rms_norm(X, W), ValueError, "'x' must be a CUDA tensor"),
    (lambda: ops.softmax(X), ValueError, "'x' must be a CUDA tensor"),
    (lambda: ops.sum(X), ValueError, "'x' must be a CUDA tensor"),
    (lambda: ops.cross_entropy(X, torch.zeros(4, dtype=torch.int64)), ValueError, "'logits' must be a CUDA tensor"),
    # rows past int32 (expanded: no memory): the kernels index a row in int32
    (lambda: ops.sum(torch.zeros(1).expand(2**31)), ValueError, "'x' has 2147483648 elements in the reduced dim"),
    (lambda: ops.argmax(torch.zeros(2, 1).expand(2, 2**31 + 5)), ValueError, "at most 2147483647"),
    (lambda: ops.cross_entropy(torch.zeros(2, 1).expand(2, 2**31), torch.zeros(2, dtype=torch.int64)), ValueError,
     "'logits' must have 1 to 2147483647 classes"),
    # the registered ops check what the public ones do
    (lambda: torch.ops.cuteforge.rms_norm(X, W, None, -1.0), ValueError, "'eps' must be finite"),
    (lambda: torch.ops.cuteforge.layer_norm(X, W, None, None, float("nan")), ValueError, "'eps' must be finite"),
    (lambda: torch.ops.cuteforge.rms_norm(X, torch.ones(9), None, 1e-6), ValueError, "'weight' must have shape"),
])
def test_the_real_problem_first(call, error, match) -> None:
    with pytest.raises(error, match=match):
        call()


def test_numpy_scalars_are_accepted() -> None:
    import numpy as np

    # every check passes; the CPU tensor is the only problem left
    with pytest.raises(ValueError, match="must be a CUDA tensor"):
        ops.rms_norm(X, W, eps=np.float32(1e-6))
    with pytest.raises(ValueError, match="must be a CUDA tensor"):
        ops.cross_entropy(X, torch.zeros(4, dtype=torch.int64), ignore_index=np.int64(-1))
    with pytest.raises(ValueError, match="must be a CUDA tensor"):
        ops.sum(X, np.int64(1))
    with pytest.raises(ValueError, match="must be a CUDA tensor"):
        ops.softmax(X, dim=np.int64(-1))
    with pytest.raises(ValueError, match="must be a CUDA tensor"):  # another dim moves last, as an int's
        ops.softmax(X, dim=np.int64(0))
    with pytest.raises(TypeError, match="'dim' must be an int, got bool"):
        ops.sum(X, True)


def test_a_column_grid_past_int32_is_refused() -> None:
    from types import SimpleNamespace

    reduce = __import__("cuteforge.ops.reduce", fromlist=["_check_col_grid"])
    cfg = SimpleNamespace(threads_x=8, cluster_n=1)
    reduce._check_col_grid("sum", 2**20, 17, 1, cfg)  # 3 CTAs a row: fits
    with pytest.raises(ValueError, match="cuteforge.ops.sum: argument 'x' would take 4294967298 CTAs"):
        reduce._check_col_grid("sum", 1431655766, 17, 1, cfg)
