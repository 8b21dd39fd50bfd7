"""`cuteforge precompile --workers N`: the standard specializations compile in the GPU-blind
processes of the compile pool, which write the kernel cache; a bundle built so serves a
fresh cache. CPU only."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from test_bundle import cli as run_cli

from cuteforge.signature import BoundKey


def test_two_workers_compile_tiny_kernels_into_the_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import kernels_for_tests as kt

    from cuteforge import cli

    monkeypatch.setenv("CUTEFORGE_CACHE_DIR", str(tmp_path))
    key = BoundKey(("float32", "float32"), (), (4, 4))
    specs = [(kt.scale, kt.scale.spec(key, (("factor", f),), arch="sm_90a")) for f in (2.0, 3.0, 5.0, 7.0)]
    rows = cli.precompile(specs=specs, workers=2, progress=False)
    assert [r["status"] for r in rows] == ["compiled"] * 4, rows
    assert [r["params"]["factor"] for r in rows] == [2.0, 3.0, 5.0, 7.0]  # in job order
    assert all(Path(r["entry"]).is_file() for r in rows)
    assert all(r["worker"] and r["worker"] != os.getpid() for r in rows)
    again = cli.precompile(specs=specs, workers=1, progress=False)
    assert [r["status"] for r in again] == ["loaded"] * 4


def test_cli_workers_then_a_bundle_serves_a_fresh_cache(tmp_path: Path) -> None:
    made = run_cli("bundle", "create", str(tmp_path / "b"), "--kernel", "gemm_sm90_tn", "--workers", "2", "--json",
                   cache_dir=tmp_path / "ci")
    assert made.returncode == 0, made.stderr[-3000:]
    r = json.loads(made.stdout)
    assert r["objects"] == r["compiled"] == 3 and r["loaded"] == 0
    assert "2 workers" in made.stderr
    fresh = run_cli("precompile", "--kernel", "gemm_sm90_tn", "--json", cache_dir=tmp_path / "fresh",
                    env={"CUTEFORGE_BUNDLES": f"{tmp_path / 'b'}#sha256={r['sha256']}"})
    assert fresh.returncode == 0, fresh.stderr[-3000:]
    f = json.loads(fresh.stdout)
    assert f["compiled"] == 0 and f["loaded"] == 3
