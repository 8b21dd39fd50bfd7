"""Test set-up: a private cache dir per session, and sm_90a as the compile target when
there is no GPU (CuTe DSL emits real sm_90a code on a CPU-only machine)."""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
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


def pytest_configure(config: pytest.Config) -> None:
    # before collection: test modules load the extension at import (their skip marks)
    if "CUTEFORGE_TEST_CACHE_DIR" in os.environ:  # the GPU runner may share one across calls
        os.environ["CUTEFORGE_CACHE_DIR"] = os.environ["CUTEFORGE_TEST_CACHE_DIR"]
    else:
        os.environ["CUTEFORGE_CACHE_DIR"] = _SESSION_CACHE = tempfile.mkdtemp(prefix="cuteforge-test-cache-")
        config.add_cleanup(lambda: shutil.rmtree(_SESSION_CACHE, ignore_errors=True))


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords and not HAS_CUDA:
            item.add_marker(skip)


@pytest.fixture
def fresh_warnings(monkeypatch: pytest.MonkeyPatch) -> None:
    """The trust module's once-only warnings afresh, and no CUTEFORGE_LOG (the trust and
    cache tests take it through `pytestmark`)."""
    from cuteforge import trust

    monkeypatch.setattr(trust, "_warned", set())
    monkeypatch.delenv("CUTEFORGE_LOG", raising=False)


@pytest.fixture
def root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A cache root of the test's own (not created yet), through CUTEFORGE_CACHE_DIR."""
    r = tmp_path / "cache"
    monkeypatch.setenv("CUTEFORGE_CACHE_DIR", str(r))
    return r
