"""`torchrun --nproc-per-node 2 -m cuteforge precompile --distributed --bundle OUT`: two ranks
on this machine (gloo, CPU) split the specializations, rank 0 writes one bundle whose manifest
equals a single-process `cuteforge bundle create` of the same kernels, and that bundle serves
a fresh cache without compiling. CPU only."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from test_bundle import cli as run_cli
from test_cache import HERE, SRC

pytest.importorskip("torch.distributed")

KERNEL = "gemm_sm90_tn"  # three specializations: a cheap family


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_two_ranks_write_the_single_process_bundle(tmp_path: Path) -> None:
    import torch.distributed as dist

    if not dist.is_gloo_available():
        pytest.skip("this torch has no gloo backend")
    env = dict(os.environ, CUTEFORGE_CACHE_DIR=str(tmp_path / "ranks"), CUTEFORGE_ARCH="sm_90a",
               CUTE_DSL_ARCH="sm_90a", MASTER_ADDR="127.0.0.1", CUDA_VISIBLE_DEVICES="")
    env["PYTHONPATH"] = os.pathsep.join([str(SRC), str(HERE), env.get("PYTHONPATH", "")])
    out = tmp_path / "dist"
    ran = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-addr", "127.0.0.1",
         "--master-port", str(_free_port()), "-m", "cuteforge", "precompile", "--distributed", "--bundle", str(out),
         "--kernel", KERNEL, "--arch", "sm_90a", "--json"],
        env=env, capture_output=True, text=True, timeout=300)
    assert ran.returncode == 0, ran.stderr[-3000:]
    r = json.loads(ran.stdout)  # rank 0 alone reports
    assert r["ranks"] == 2 and r["compiled"] == 3 and r["bundle"]["objects"] == 3
    assert [row["rank"] for row in r["kernels"]] == [0, 1, 0]  # in job order, split over the ranks

    single = run_cli("bundle", "create", str(tmp_path / "single"), "--kernel", KERNEL, "--workers", "1", "--json",
                     cache_dir=tmp_path / "one")
    assert single.returncode == 0, single.stderr[-3000:]
    assert (out / "manifest.json").read_bytes() == (tmp_path / "single" / "manifest.json").read_bytes()
    assert r["bundle"]["sha256"] == json.loads(single.stdout)["sha256"]

    fresh = run_cli("precompile", "--kernel", KERNEL, "--json", cache_dir=tmp_path / "fresh",
                    env={"CUTEFORGE_BUNDLES": f"{out}#sha256={r['bundle']['sha256']}"})
    assert fresh.returncode == 0, fresh.stderr[-3000:]
    f = json.loads(fresh.stdout)
    assert f["compiled"] == 0 and f["loaded"] == 3


def test_distributed_needs_a_launcher(tmp_path: Path) -> None:
    ran = run_cli("precompile", "--distributed", "--bundle", str(tmp_path / "b"), "--kernel", KERNEL, "--json",
                  cache_dir=tmp_path / "c")
    assert ran.returncode == 2
    assert "torchrun" in ran.stderr and not (tmp_path / "b").exists()
