"""An op whose first call in the process happens while torch.compile's CUDA-graph trees
warm a graph up ("reduce-overhead", "max-autotune"): the tensors the op keeps across calls
(workspaces, per-device constants) must not land in the graph's memory pool, where the
graph trees find them live and refuse the run."""

from __future__ import annotations

import pytest
import torch

from cuteforge import ops, workspace
from cuteforge.ops import gemm_launch

pytestmark = pytest.mark.gpu

if not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0):
    pytest.skip("needs an sm_90 GPU", allow_module_level=True)


def _fresh_process_state() -> None:
    """What a new process has: no kept workspace or constant yet."""
    workspace._WORK.clear()
    gemm_launch._NO_WORK.clear()
    gemm_launch._ONE.clear()
    torch._dynamo.reset()


def _run_graphed(fn, *args: torch.Tensor) -> torch.Tensor:
    compiled = torch.compile(fn, mode="reduce-overhead")
    for _ in range(4):  # warm-up runs, the recording, then replays
        out = compiled(*args)
    torch.cuda.synchronize()
    return out.clone()


def test_gemm_first_called_in_a_graph_warm_up() -> None:
    _fresh_process_state()
    a = torch.randn(256, 512, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(512, 384, device="cuda", dtype=torch.bfloat16)
    out = _run_graphed(lambda x, y: ops.gemm(x, y) * 2, a, b)
    torch.testing.assert_close(out.float(), 2 * (a.float() @ b.float()), rtol=2e-2, atol=2e-1)
    assert gemm_launch._NO_WORK  # made in the warm-up, outside the graph's pool


def test_cross_entropy_first_called_in_a_graph_warm_up() -> None:
    """Compiled, the loss's mean is Inductor's reduction over the per-row op (the reduced
    kernel and its workspace are eager-only): the per-row op's first call, its plan and
    launch, happen in the warm-up."""
    _fresh_process_state()
    x = torch.randn(1000, 32000, device="cuda", dtype=torch.bfloat16)
    t = torch.randint(0, 32000, (1000,), device="cuda")
    out = _run_graphed(lambda x, t: ops.cross_entropy(x, t) + 1, x, t)
    torch.testing.assert_close(out.float(), torch.nn.functional.cross_entropy(x.float(), t) + 1, rtol=1e-2, atol=1e-2)


def test_a_kept_tensor_is_outside_a_pool_routing_this_thread() -> None:
    pool = torch.cuda.MemPool()
    with torch.cuda.use_mem_pool(pool):
        kept = workspace.persistent(0, lambda: torch.zeros(1 << 20, dtype=torch.int32, device="cuda"))
        inside = torch.zeros(1 << 20, dtype=torch.int32, device="cuda")
    segments = pool.snapshot()

    def in_pool(t: torch.Tensor) -> bool:
        return any(s["address"] <= t.data_ptr() < s["address"] + s["total_size"] for s in segments)

    assert in_pool(inside) and not in_pool(kept)
    assert int(kept.abs().sum()) == 0
