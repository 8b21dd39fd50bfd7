"""`workspace.persistent` off CUDA: a tensor to keep that is not on a CUDA device is made in
place, in the calling thread (the helper thread exists for CUDA memory pools only); the
CUDA path is tested on the GPU (tests/gpu/test_graph_trees_gpu.py)."""

from __future__ import annotations

import threading

import pytest
import torch

from cuteforge import workspace


@pytest.mark.parametrize("device", [None, "cpu", torch.device("cpu"), torch.device("meta")])
def test_a_tensor_off_cuda_is_made_in_the_calling_thread(device: object) -> None:
    threads = []

    def make() -> torch.Tensor:
        threads.append(threading.get_ident())
        return torch.zeros(4, dtype=torch.int32, device=device if device is not None else "cpu")

    out = workspace.persistent(device, make)  # type: ignore[arg-type]
    assert threads == [threading.get_ident()] and out.shape == (4,)
