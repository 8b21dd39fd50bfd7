"""`torchrun --nproc-per-node 2 -m cuteforge tune KERNEL --shapes ... --distributed`: two ranks on
this machine (gloo, CPU) split the shapes, each tunes its share, and rank 0's tuning store then
holds the records a single-process `cuteforge tune` of the same shapes writes; with
`--bundle OUT` the same records land in a bundle. No GPU: every process measures through the
deterministic `Measurement` of tests/tune_fake_rank.py (the tuner's seam for that)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from test_cache import HERE, SRC

pytest.importorskip("torch.distributed")

KERNEL = "row_reduce"
SHAPES = "4096x512,4096x1024,2048x2048,1024x4096,512x8192"  # N is static: five distinct problems
VOLATILE = ("created", "wall_s")  # when and how long; everything else must match


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _env(cache: Path, logs: Path) -> dict[str, str]:
    env = dict(os.environ, CUTEFORGE_CACHE_DIR=str(cache), CUTEFORGE_ARCH="sm_90a", CUTE_DSL_ARCH="sm_90a",
               CUDA_VISIBLE_DEVICES="", FAKE_TUNE_LOG=str(logs), MASTER_ADDR="127.0.0.1")
    env["PYTHONPATH"] = os.pathsep.join([str(SRC), str(HERE), env.get("PYTHONPATH", "")])
    return env


def _ranks(tmp: Path, name: str, *extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-addr", "127.0.0.1",
         "--master-port", str(_free_port()), str(HERE / "tune_fake_rank.py"), "tune", KERNEL, "--shapes", SHAPES,
         "--distributed", "--workers", "1", "--json", *extra],
        env=_env(tmp / f"{name}-cache", tmp / f"{name}-logs"), capture_output=True, text=True, timeout=600)


def _records(root: Path) -> dict[str, dict[str, Any]]:
    """Tuning records under `root` by relative path, without the fields that record when."""
    out = {}
    for p in sorted(root.glob("*/*/*.json")):
        rec = json.loads(p.read_bytes())
        out["/".join(p.parts[-3:])] = {k: v for k, v in rec.items() if k not in VOLATILE}
    return out


def _sweeps(logs: Path) -> dict[str, list[str]]:
    """Per process (its RANK), the N of every problem it swept."""
    return {p.stem: [line.split("('N', ")[1].split(")")[0] for line in p.read_text().splitlines()]
            for p in sorted(logs.glob("*.log"))}


@pytest.fixture(scope="module")
def single(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The single-process run of the same command, same fake measurement."""
    tmp = tmp_path_factory.mktemp("single")
    ran = subprocess.run([sys.executable, str(HERE / "tune_fake_rank.py"), "tune", KERNEL, "--shapes", SHAPES,
                          "--workers", "1", "--json"], env=_env(tmp / "cache", tmp / "logs"), capture_output=True,
                         text=True, timeout=600)
    assert ran.returncode == 0, ran.stderr[-3000:]
    r = json.loads(ran.stdout)
    assert [s["source"] for s in r["shapes"]] == ["sweep"] * 5
    assert sorted(_sweeps(tmp / "logs")["single"]) == sorted(s.split("x")[1] for s in SHAPES.split(","))
    return tmp


def test_two_ranks_split_the_shapes_and_rank_0_stores_the_single_process_records(tmp_path: Path, single: Path) -> None:
    import torch.distributed as dist

    if not dist.is_gloo_available():
        pytest.skip("this torch has no gloo backend")
    ran = _ranks(tmp_path, "dist")
    assert ran.returncode == 0, ran.stderr[-3000:]
    r = json.loads(ran.stdout)  # rank 0 alone reports
    assert r["ranks"] == 2 and r["command"].endswith("--distributed --workers 1 --json")
    assert [s["shape"] for s in r["shapes"]] == SHAPES.split(",")  # in the order given
    assert [s["rank"] for s in r["shapes"]] == [0, 1, 0, 1, 0]
    assert [s["source"] for s in r["shapes"]] == ["sweep"] * 5

    sweeps = _sweeps(tmp_path / "dist-logs")
    assert sorted(sweeps) == ["0", "1"]
    assert not set(sweeps["0"]) & set(sweeps["1"])  # disjoint shares
    every = sweeps["0"] + sweeps["1"]
    assert sorted(every) == sorted(s.split("x")[1] for s in SHAPES.split(","))  # each problem tuned exactly once

    ours = _records(tmp_path / "dist-cache" / "autotune")
    assert len(ours) == 5 and ours == _records(single / "cache" / "autotune")
    assert len(r["records"]) == 5 and all(Path(p).is_file() for p in r["records"])


def test_two_ranks_write_the_records_into_a_bundle(tmp_path: Path, single: Path) -> None:
    import torch.distributed as dist

    from cuteforge import bundle

    if not dist.is_gloo_available():
        pytest.skip("this torch has no gloo backend")
    out = tmp_path / "tuned"
    ran = _ranks(tmp_path, "b", "--bundle", str(out))
    assert ran.returncode == 0, ran.stderr[-3000:]
    r = json.loads(ran.stdout)
    b = bundle.verify(out)
    assert b["ok"] and b["tuning"] == 5 and r["bundle"]["sha256"] == b["sha256"]
    assert b["objects"] == 0 and r["winners_without_object"] > 0  # the fake measurement compiles nothing: no objects to ship
    assert _records(out / "autotune") == _records(single / "cache" / "autotune")

    again = _ranks(tmp_path, "b2", "--bundle", str(out))  # an existing bundle is never replaced
    assert again.returncode != 0 and "exists" in again.stderr
    assert not list((tmp_path / "b2-logs").glob("*.log"))  # refused before any rank tuned


def test_distributed_tune_needs_a_launcher(tmp_path: Path) -> None:
    ran = subprocess.run([sys.executable, "-m", "cuteforge", "tune", KERNEL, "--shapes", "1024x1024", "--distributed",
                          "--json"], env=_env(tmp_path / "c", tmp_path / "l"), capture_output=True, text=True, timeout=300)
    assert ran.returncode == 2
    assert "torchrun" in ran.stderr


def test_the_ranks_wait_for_each_other_as_long_as_configured(monkeypatch: pytest.MonkeyPatch) -> None:
    """gloo's default of 30 minutes would end a long tune in its gather; the wait is 12 hours
    unless CUTEFORGE_DISTRIBUTED_TIMEOUT says otherwise, and a bad value names the variable."""
    from cuteforge import distributed

    monkeypatch.delenv("CUTEFORGE_DISTRIBUTED_TIMEOUT", raising=False)
    assert distributed._timeout_s() == 12 * 3600
    monkeypatch.setenv("CUTEFORGE_DISTRIBUTED_TIMEOUT", "90")
    assert distributed._timeout_s() == 90
    for bad in ("soon", "0", "-5"):
        monkeypatch.setenv("CUTEFORGE_DISTRIBUTED_TIMEOUT", bad)
        with pytest.raises(distributed.DistributedError, match="CUTEFORGE_DISTRIBUTED_TIMEOUT"):
            distributed._timeout_s()


PROBLEMS = [{"kernel": KERNEL, "shapes": "4096x512,2048x2048,1024x4096"},
            {"kernel": "softmax_fwd", "shapes": ["8192x1024", "4096x4096"], "dtype": "bfloat16"}]


def _problems_file(tmp: Path) -> Path:
    f = tmp / "problems.json"
    f.write_text(json.dumps(PROBLEMS))
    return f


def test_a_problem_set_in_one_command_alone_and_over_two_ranks(tmp_path: Path) -> None:
    """`cuteforge tune --problems FILE`: one process tunes every entry; under torchrun the
    (kernel, shape) problems of all entries are dealt to the ranks at once, each tuned
    exactly once, and rank 0 stores the single process's records."""
    import torch.distributed as dist

    f = _problems_file(tmp_path)
    alone = subprocess.run([sys.executable, str(HERE / "tune_fake_rank.py"), "tune", "--problems", str(f), "--workers",
                            "1", "--json"], env=_env(tmp_path / "one", tmp_path / "one-logs"), capture_output=True,
                           text=True, timeout=600)
    assert alone.returncode == 0, alone.stderr[-3000:]
    r = json.loads(alone.stdout)
    assert r["kernels"] == [KERNEL, "softmax_fwd"]
    assert [(s["kernel"], s["shape"], s["dtype"]) for s in r["shapes"]] == [
        (KERNEL, "4096x512", "float32"), (KERNEL, "2048x2048", "float32"), (KERNEL, "1024x4096", "float32"),
        ("softmax_fwd", "8192x1024", "bfloat16"), ("softmax_fwd", "4096x4096", "bfloat16")]
    if not dist.is_gloo_available():
        pytest.skip("this torch has no gloo backend")
    ran = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-addr", "127.0.0.1",
         "--master-port", str(_free_port()), str(HERE / "tune_fake_rank.py"), "tune", "--problems", str(f),
         "--distributed", "--workers", "1", "--json"],
        env=_env(tmp_path / "two", tmp_path / "two-logs"), capture_output=True, text=True, timeout=600)
    assert ran.returncode == 0, ran.stderr[-3000:]
    d = json.loads(ran.stdout)
    assert [(s["kernel"], s["shape"]) for s in d["shapes"]] == [(s["kernel"], s["shape"]) for s in r["shapes"]]
    assert [s["rank"] for s in d["shapes"]] == [0, 1, 0, 1, 0]  # dealt across the entries, not per entry
    logs = {p.stem: p.read_text().splitlines() for p in (tmp_path / "two-logs").glob("*.log")}
    assert sorted(logs) == ["0", "1"] and len(logs["0"]) == 3 and len(logs["1"]) == 2  # each problem once
    assert _records(tmp_path / "two" / "autotune") == _records(tmp_path / "one" / "autotune")
    assert len(_records(tmp_path / "one" / "autotune")) == 5


@pytest.mark.parametrize("args, part", [
    (["tune", "row_reduce", "--problems", "F"], "give no KERNEL"),
    (["tune", "row_reduce"], "give KERNEL and --shapes, or --problems FILE"),
    (["tune", "--problems", "MISSING"], "cannot read it"),
    (["tune", "--problems", "BAD"], "entry 1: unknown keys ['shape']"),
])
def test_problem_set_arguments_are_checked(tmp_path: Path, args: list[str], part: str) -> None:
    (tmp_path / "BAD").write_text(json.dumps([PROBLEMS[0], {"kernel": KERNEL, "shapes": "8x8", "shape": "8x8"}]))
    args = [str(tmp_path / a) if a in ("F", "MISSING", "BAD") else a for a in args]
    if "F" in [Path(a).name for a in args]:
        _problems_file(tmp_path).rename(tmp_path / "F")
    ran = subprocess.run([sys.executable, "-m", "cuteforge", *args], env=_env(tmp_path / "c", tmp_path / "l"),
                         capture_output=True, text=True, timeout=300)
    assert ran.returncode == 2 and part in ran.stderr, ran.stderr[-2000:]
