"""The memory-bound ops run what `cuteforge tune` stored for their call: for each family,
tune the command line's problem with a single candidate that is not the op's heuristic
(so the store holds a known winner), then call the op on a fresh tensor of the same
shape and check that the kernel was fetched with that config and the answer is right.
The shapes are unusual (3001 rows) so no earlier call in the process has memoized them.
The winner is forced with a fake timer over two real, reference-checked candidates (a
single candidate is never stored)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F

import cuteforge.ops as ops
from cuteforge.autotune import tune
from cuteforge.kernels.cross_entropy.device import ce_config
from cuteforge.kernels.cross_entropy.spec import cross_entropy_bwd, cross_entropy_fwd
from cuteforge.kernels.norm import config as norm_config
from cuteforge.kernels.norm.spec import norm_fwd
from cuteforge.kernels.reduce import row
from cuteforge.kernels.softmax.spec import softmax_bwd, softmax_fwd
from cuteforge.tune_cli import problem_factory

pytestmark = pytest.mark.gpu

M, N = 3001, 1000


def _ce_alt(bits: int) -> Any:
    base = ce_config(N, bits)
    return next(c for c in row.candidate_configs(N, bits) if c.cluster_n == 1 and c != base)


def _run_softmax_bwd() -> torch.Tensor:
    x = torch.randn(M, N, device="cuda", requires_grad=True)
    y = ops.log_softmax(x)
    dy = torch.randn_like(y)
    (dx,) = torch.autograd.grad(y, x, dy)
    ref = dy - torch.exp(y.detach()) * dy.sum(-1, keepdim=True)
    torch.testing.assert_close(dx, ref, rtol=1e-4, atol=1e-5)
    return dx


def _run_ce_bwd() -> torch.Tensor:
    logits = torch.randn(M, N, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    t = torch.randint(0, N, (M,), device="cuda")
    (g,) = torch.autograd.grad(ops.cross_entropy(logits, t, reduction="sum"), logits)
    ref = torch.softmax(logits.detach().float(), -1)
    ref[torch.arange(M), t] -= 1
    torch.testing.assert_close(g.float(), ref, rtol=2e-2, atol=2e-2)
    return g


def _run_norm() -> torch.Tensor:
    x = torch.randn(M, N, device="cuda", dtype=torch.bfloat16)
    w, b = torch.randn(N, device="cuda", dtype=torch.bfloat16), torch.randn(N, device="cuda", dtype=torch.bfloat16)
    y = ops.layer_norm(x, w, b)
    torch.testing.assert_close(y.float(), F.layer_norm(x.float(), (N,), w.float(), b.float(), 1e-5), rtol=2e-2, atol=5e-2)
    return y


def _run_softmax() -> torch.Tensor:
    x = torch.randn(M, N, device="cuda", dtype=torch.float16)
    y = ops.softmax(x)
    torch.testing.assert_close(y.float(), torch.softmax(x.float(), -1), rtol=1e-2, atol=1e-3)
    return y


def _run_ce() -> torch.Tensor:
    logits = torch.randn(M, N, device="cuda", dtype=torch.float32)
    t = torch.randint(0, N, (M,), device="cuda")
    loss = ops.cross_entropy(logits, t, reduction="none")
    torch.testing.assert_close(loss, F.cross_entropy(logits, t, reduction="none"), rtol=1e-4, atol=1e-4)
    return loss


CASES = {
    # kernel name, its Kernel, dtype, params, a valid candidate that is not the op's heuristic, op call
    "norm_fwd": (norm_fwd, "bfloat16", {"kind": "layer"},
                 lambda: norm_config.candidate_configs(N, 16, False, "layer")[2], _run_norm),
    "softmax_fwd": (softmax_fwd, "float16", {}, None, _run_softmax),
    "softmax_bwd": (softmax_bwd, "float32", {"mode": "log_softmax_bwd"}, None, _run_softmax_bwd),
    "cross_entropy_fwd": (cross_entropy_fwd, "float32", {}, lambda: _ce_alt(32), _run_ce),
    "cross_entropy_bwd": (cross_entropy_bwd, "bfloat16", {}, lambda: _ce_alt(16), _run_ce_bwd),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_op_runs_the_stored_winner(name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    kernel, dtype, params, alt_of, run = CASES[name]
    monkeypatch.setenv("CUTEFORGE_CACHE_DIR", str(tmp_path))
    p = problem_factory(name)((M, N), dtype, dict(params))
    alt = alt_of() if alt_of is not None else p.configs[1]
    heuristic = p.configs[0] if p.configs else kernel.spec(p.key, tuple(sorted(p.params.items())), None).config
    assert alt != heuristic
    torch.manual_seed(0)
    # both run and are checked against the reference; a fake timer makes `alt` the winner
    res = tune(kernel, p.make_tensors(), p.params, configs=[heuristic, alt], reference=p.reference, outputs=p.outputs,
               dims=p.dims, timer=lambda c, fn, sets: 1.0 if c == alt else 2.0, rounds=3)
    assert res.source == "sweep" and res.best_config == alt and not res.errors, (res.source, res.errors)

    seen: list[Any] = []
    get = kernel.get

    def spy(key: Any, params: Any = (), config: Any = None) -> Any:
        seen.append(config)
        return get(key, params, config)

    monkeypatch.setattr(kernel, "get", spy)
    run()
    assert alt in seen, f"{name}: the op fetched {seen}, not the stored {alt}"
