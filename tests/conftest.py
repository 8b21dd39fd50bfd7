"""Test set-up: a private cache dir per session, and sm_90a as the compile target when
there is no GPU (CuTe DSL emits real sm_90a code on a CPU-only machine)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))


def _has_cuda() -> bool:
    try:
        import torch

        return torch.cuda.is_available()
    except Exception:
        return False


HAS_CUDA = _has_cuda()
# the tests that use the C++ extension wait for its build (calls do not: native/build.py)
os.environ.setdefault("CUTEFORGE_NATIVE_BUILD", "wait")
if not HAS_CUDA:
    os.environ.setdefault("CUTEFORGE_ARCH", "sm_90a")
    os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")


@pytest.fixture(scope="session", autouse=True)
def _session_cache(tmp_path_factory: pytest.TempPathFactory):
    if "CUTEFORGE_TEST_CACHE_DIR" in os.environ:  # the GPU runner may share one across calls
        os.environ["CUTEFORGE_CACHE_DIR"] = os.environ["CUTEFORGE_TEST_CACHE_DIR"]
    else:
        os.environ["CUTEFORGE_CACHE_DIR"] = str(tmp_path_factory.mktemp("cuteforge-cache"))
    yield


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords and not HAS_CUDA:
            item.add_marker(skip)
