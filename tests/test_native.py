"""Native dispatch (alloc + launch in one TVM-FFI call), checked on CPU tensors with a
Python function standing in for a compiled kernel."""

from __future__ import annotations

import shutil

import pytest
import torch

from cuteforge import native

pytestmark = pytest.mark.skipif(
    shutil.which("ninja") is None or (shutil.which("c++") is None and shutil.which("g++") is None),
    reason="native dispatch builds with a C++ compiler and ninja",
)


def _recorder():
    import tvm_ffi

    calls = []

    def body(x, out):
        calls.append((tuple(x.shape), tuple(out.shape), str(out.dtype), out.data_ptr()))

    return tvm_ffi.convert(body), calls


def test_new_rows_allocates_launches_and_returns_out():
    fn, calls = _recorder()
    x = torch.randn(5, 8)[:, :3]  # a strided view is passed through as is
    out = native.launcher("new_rows")(fn, x, 5, native.ffi_dtype(torch.float32))
    assert isinstance(out, torch.Tensor)
    assert out.shape == (5,) and out.dtype == torch.float32 and out.device == x.device
    # the kernel saw exactly the tensor that came back
    assert calls == [((5, 3), (5,), "float32", out.data_ptr())]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.int64])
def test_new_like_is_contiguous_with_x_shape(dtype):
    fn, calls = _recorder()
    x = torch.randn(4, 6)[:, ::2]
    out = native.launcher("new_like")(fn, x, native.ffi_dtype(dtype))
    assert out.shape == x.shape and out.dtype == dtype and out.is_contiguous()
    assert calls[0][1] == (4, 3) and calls[0][3] == out.data_ptr()


def test_zero_rows():
    fn, _ = _recorder()
    out = native.launcher("new_rows")(fn, torch.empty(0, 4), 0, native.ffi_dtype(torch.float32))
    assert out.shape == (0,)


def test_unknown_launcher_is_an_error():
    with pytest.raises(ValueError, match="new_cols"):
        native.launcher("new_cols")


def test_build_is_shared_across_processes(tmp_path):
    import os
    import subprocess
    import sys

    env = {**os.environ, "CUTEFORGE_CACHE_DIR": str(tmp_path)}
    code = "from cuteforge import native; assert native.launcher('new_rows') is not None"
    procs = [subprocess.Popen([sys.executable, "-c", code], env=env) for _ in range(3)]
    assert all(p.wait(timeout=300) == 0 for p in procs)
    builds = list((tmp_path / "native").glob("*/*.so"))
    assert len(builds) == 1, builds
