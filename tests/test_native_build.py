"""The C++ extension never stalls a call: built before, it is imported straight from its build
directory (no toolchain check); not built, it builds in a background thread while calls take
the Python paths, and the registered ops take their C++ kernels once it is ready."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import torch

from cuteforge.native import build, dispatch

SRC = Path(__file__).resolve().parent.parent / "src"


def test_a_built_extension_loads_without_the_toolchain() -> None:
    mod = build.load(wait=True)
    if mod is None:
        pytest.skip("the C++ extension could not be built here")
    # the child looks in the cache root this process's extension was built under (another
    # test may have moved CUTEFORGE_CACHE_DIR since it was loaded)
    built_in = Path(mod.__file__).resolve().parent
    if built_in.parent.name != "native":
        pytest.skip("the extension was built in a private directory of this process")
    code = (
        "import time, torch\n"
        "from torch.utils import cpp_extension\n"
        "def refuse(*a, **k): raise AssertionError('the toolchain was asked')\n"
        "cpp_extension.load = refuse\n"
        "from cuteforge.native import build\n"
        "t = time.perf_counter(); m = build.load(); ms = (time.perf_counter() - t) * 1e3\n"
        "print(m is not None, build.building(), ms)\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "CUTEFORGE_NATIVE_BUILD"}  # calls' default: background
    env["PYTHONPATH"] = os.pathsep.join([str(SRC), env.get("PYTHONPATH", "")])
    env["CUTEFORGE_CACHE_DIR"] = str(built_in.parent.parent)
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    ready, busy, ms = out.stdout.split()
    assert (ready, busy) == ("True", "False") and float(ms) < 500, out.stdout
    assert "building" not in out.stderr


def test_not_built_it_builds_in_the_background(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    release, module = threading.Event(), object()

    def slow_build() -> object:
        release.wait(60)
        return module

    monkeypatch.setattr(build, "_state", {})
    monkeypatch.setattr(build, "_import_now", lambda: None)
    monkeypatch.setattr(build, "_build_and_load", slow_build)
    memo = {"layout": "a Python launch"}
    build.when_ready(memo.clear)  # what the ops register: forget runs made meanwhile
    assert build.load(wait=False) is None and build.building()
    assert build.load(wait=False) is None  # calls meanwhile take the Python paths
    assert memo
    release.set()
    assert build.load(wait=True) is module and not build.building()
    assert not memo
    assert build.load(wait=False) is module
    err = capsys.readouterr().err
    assert "in the background" in err and "C++ extension ready" in err


def test_registered_ops_retry_while_the_extension_builds(monkeypatch: pytest.MonkeyPatch) -> None:
    from cuteforge.ops.registered import define

    calls: list[int] = []
    state = {"building": True}
    monkeypatch.setattr(dispatch, "register", lambda op, miss, backend: calls.append(1) and False)
    monkeypatch.setattr(build, "building", lambda: state["building"])
    monkeypatch.setattr(build, "_state", {"module": None})

    def impl(x: torch.Tensor) -> torch.Tensor:
        return x + 1

    op = define("cuteforge_test_build::retry", impl, fake=lambda x: torch.empty_like(x), plan=lambda x: None, backend="CPU")
    x = torch.ones(3)
    op(x)
    op(x)
    assert len(calls) == 2  # not given up while the build is under way
    state["building"] = False  # the build failed: the op stays on Python for good
    op(x)
    op(x)
    assert len(calls) == 3
