"""The DSL is imported only to compile: importing the ops, or registering every kernel
family, imports no `cutlass` module (a process whose kernels are all in the cache never
needs it); the first compile does."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

_REPORT = "import sys; print(sorted(m for m in sys.modules if m.split('.')[0] == 'cutlass'))"


def _dsl_modules(code: str) -> str:
    r = subprocess.run([sys.executable, "-c", f"{code}\n{_REPORT}"], env=dict(os.environ), capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    return r.stdout.strip().splitlines()[-1]


def test_registering_every_kernel_imports_no_dsl() -> None:
    code = ("import cuteforge.kernels as k; k.load_all()\n"
            "from cuteforge.kernels.cross_entropy.config import WORK_ZERO, reduce_fits, work_words\n"
            "from cuteforge.kernels.reduce.config import RowReduceConfig\n"
            "from cuteforge.kernels.gemm.epilogue import ACTIVATIONS, GemmEpilogue\n"
            "from cuteforge.kernels.gemm.sm90.config import GemmConfig\n"
            "from cuteforge.kernels.gemm.spec import AB_DTYPES, FP8_DTYPES, gemm_fp8_kernel, gemm_kernel\n"
            "from cuteforge.kernel import REGISTRY; assert 'row_reduce' in REGISTRY and 'cross_entropy_fwd' in REGISTRY")
    assert _dsl_modules(code) == "[]"


def test_import_ops_imports_no_dsl() -> None:
    assert _dsl_modules("import cuteforge.ops") == "[]"


def test_device_names_still_import_from_their_old_homes() -> None:
    code = ("import cuteforge.kernels as k; k.load_all()\n"
            "from cuteforge.kernel import REGISTRY\n"
            "from cuteforge.kernels.reduce import make_row_reduce\n"
            "import cuteforge.kernels.reduce.row as row; assert make_row_reduce is row.make_row_reduce\n"
            "from cuteforge.kernels.cross_entropy.device import WORK_ZERO, reduce_fits, work_words\n"
            "from cuteforge.kernels.cross_entropy import config; assert WORK_ZERO == config.WORK_ZERO")
    assert "'cutlass'" in _dsl_modules(code)


def test_a_cached_kernels_lookup_imports_no_dsl(tmp_path) -> None:
    """A new process finds a cached kernel (its spec, default config, entry, linked library)
    without importing the DSL or tvm-ffi: the first process compiles it, the second loads it."""
    code = ("import torch, cuteforge.ops\n"
            "from cuteforge.kernels.reduce.spec import row_reduce\n"
            "x = torch.empty(64, 4096, dtype=torch.bfloat16); out = torch.empty(64, dtype=torch.float32)\n"
            "fn = row_reduce.get(row_reduce.signature.fresh_key((x, out)), (('op', 'sum'),))\n"
            "print(type(fn).__name__)")
    env = dict(os.environ, CUTEFORGE_CACHE_DIR=str(tmp_path / "cache"), CUTEFORGE_ARCH="sm_90a", CUTE_DSL_ARCH="sm_90a")
    for _ in range(2):
        r = subprocess.run([sys.executable, "-c", f"{code}\n{_REPORT}\nprint(sorted(m for m in sys.modules "
                            "if m.split('.')[0] == 'tvm_ffi'))"], env=env, capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, r.stderr[-3000:]
    kind, dsl, ffi = r.stdout.strip().splitlines()[-3:]
    if kind != "LinkedKernel":
        pytest.skip("no C compiler to link kernels with here")
    assert dsl == "[]" and ffi == "[]", r.stdout
