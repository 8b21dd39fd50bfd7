"""Authoring API details on CPU: compile logging and artifacts, arch-aware configs."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).parent


def test_log_source_and_artifacts(tmp_path: Path) -> None:
    env = dict(os.environ, CUTEFORGE_CACHE_DIR=str(tmp_path), CUTEFORGE_ARCH="sm_90a", CUTE_DSL_ARCH="sm_90a", CUTEFORGE_LOG="source,artifacts")
    env["PYTHONPATH"] = os.pathsep.join([str(HERE.parent / "src"), str(HERE), env.get("PYTHONPATH", "")])
    r = subprocess.run([sys.executable, str(HERE / "cache_worker.py"), "4.0"], env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert "compiled test_scale in" in r.stderr
    assert "kernels_for_tests.py" in r.stderr  # the source path is logged
    ptx = list((tmp_path / "artifacts" / "test_scale").glob("*.ptx"))
    cubin = list((tmp_path / "artifacts" / "test_scale").glob("*.cubin"))
    assert len(ptx) == 1 and len(cubin) == 1
    text = ptx[0].read_text()
    assert ".target sm_90a" in text and ".entry" in text
    assert cubin[0].read_bytes()[:4] == b"\x7fELF"


def test_reduce_configs_respect_the_arch() -> None:
    from cuteforge.kernels.reduce.spec import row_reduce
    from cuteforge.signature import BoundKey

    key = BoundKey(("float32", "float32"), (("N", 262144),), (4, 4))
    hopper = row_reduce.configs(row_reduce.spec(key, (("op", "sum"),), arch="sm_90a"))
    ampere = row_reduce.configs(row_reduce.spec(key, (("op", "sum"),), arch="sm_80"))
    assert any(c.cluster_n > 1 for c in hopper)
    assert ampere and all(c.cluster_n == 1 for c in ampere)


def test_config_for_uses_clusters_only_for_few_long_rows_on_sm90() -> None:
    from cuteforge.kernels.reduce.spec import config_for

    assert config_for("sm_90a", 262144, 32, 8).cluster_n > 1
    assert config_for("sm_90a", 262144, 32, 32768).cluster_n == 1
    assert config_for("sm_80", 262144, 32, 8).cluster_n == 1


def test_every_library_kernel_with_configs_validates_its_own_candidates() -> None:
    """Each family declares a `validate` hook that accepts its own candidates for a standard
    problem: a hook with the wrong signature would drop every candidate (or none)."""
    from cuteforge import kernels
    from cuteforge.autotune.candidates import candidates
    from cuteforge.kernel import REGISTRY

    kernels.load_all()
    checked = 0
    for k in list(REGISTRY.values()):
        if k.configs is None or k.specializations is None or k.validate_config is None:
            continue
        key, params = next(iter(k.specializations()))
        spec = k.spec(key, tuple(sorted(params.items())), arch="sm_90a")
        valid, invalid = candidates(k, spec)
        assert valid, f"{k.name}: every candidate rejected: {list(invalid.values())[:3]}"
        checked += 1
    assert checked >= 3


def test_validate_hook_drops_bad_configs_before_compiling() -> None:
    from cuteforge.autotune.candidates import candidates
    from cuteforge.kernels.reduce.row import RowReduceConfig
    from cuteforge.kernels.reduce.spec import row_reduce
    from cuteforge.signature import BoundKey

    key = BoundKey(("float32", "float32"), (("N", 64),), (4, 4))
    spec = row_reduce.spec(key, (("op", "sum"),), arch="sm_90a")
    good, bad = RowReduceConfig(threads=64, threads_per_row=64), RowReduceConfig(threads=64, threads_per_row=48)
    valid, invalid = candidates(row_reduce, spec, [good, bad])
    assert valid == [good] and "power of 2" in invalid[bad]
