"""The `cuteforge` command on a machine with no GPU: info, precompile (twice), cache, library,
viz, and one-line errors with exit code 2."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest


def cli(*args: str, cache: Path) -> subprocess.CompletedProcess:
    env = dict(os.environ, CUTEFORGE_CACHE_DIR=str(cache))
    env.pop("CUTEFORGE_ARCH", None)  # the CLI must default to sm_90a without a GPU
    env.pop("CUTE_DSL_ARCH", None)
    return subprocess.run([sys.executable, "-m", "cuteforge", *args], env=env, capture_output=True, text=True, timeout=900)


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("cli-cache")


def test_info_json(cache: Path) -> None:
    r = cli("info", "--json", cache=cache)
    assert r.returncode == 0, r.stderr
    info = json.loads(r.stdout)
    assert info["versions"]["nvidia-cutlass-dsl"] == "4.8.1"
    assert info["cache_dir"] == str(cache)
    if info["gpu"] is None:
        assert info["gpu_text"] == "no GPU" and info["target_arch"] == "sm_90a" and info["compile_only"]
    text = cli("info", cache=cache)
    assert text.returncode == 0 and "target arch" in text.stdout


def test_precompile_twice_second_compiles_nothing(cache: Path) -> None:
    # One family keeps this test short; `library` below builds every family's set.
    first = cli("precompile", "--arch", "sm_90a", "--json", "--kernel", "row_reduce", cache=cache)
    assert first.returncode == 0, first.stderr
    r1 = json.loads(first.stdout)
    assert r1["arch"] == "sm_90a" and r1["compiled"] == len(r1["kernels"]) > 0 and r1["loaded"] == 0
    assert {k["kernel"] for k in r1["kernels"]} == {"row_reduce"}
    second = cli("precompile", "--arch", "sm_90a", "--json", "--kernel", "row_reduce", cache=cache)
    r2 = json.loads(second.stdout)
    assert r2["compiled"] == 0 and r2["loaded"] == len(r1["kernels"])
    # Loads are far cheaper than the compiles they replace.
    assert r2["total_ms"] < r1["total_ms"] / 5

    stats = json.loads(cli("cache", "stats", "--json", cache=cache).stdout)
    assert stats["entries"] == len(r1["kernels"]) and stats["kernels"] == ["row_reduce"]
    assert stats["cumulative"]["compiles"] == len(r1["kernels"])
    ls = json.loads(cli("cache", "ls", "--json", cache=cache).stdout)
    assert len(ls) == len(r1["kernels"]) and all(Path(e["path"]).exists() for e in ls)

    lib = cli("library", cache=cache)  # the main job, no GPU: an AOT build of every family
    assert lib.returncode == 0, lib.stderr
    assert "ahead of time" in lib.stdout
    m = re.search(r"(\d+) compiled, (\d+) loaded", lib.stdout)
    assert m and int(m[2]) == len(r1["kernels"]) and int(m[1]) > 0, lib.stdout[-2000:]


def test_cache_clear(tmp_path: Path) -> None:
    r = cli("cache", "clear", "--json", cache=tmp_path)
    assert r.returncode == 0 and json.loads(r.stdout)["removed"] == 0


def test_viz_layout_to_svg_and_png(tmp_path: Path) -> None:
    r = cli("viz", "layout", "(4,8):(8,1)", cache=tmp_path)
    assert r.returncode == 0 and r.stdout.lstrip().startswith("<svg")
    png = tmp_path / "l.png"
    r = cli("viz", "tv", "(4,32):(32,1)", "(4,4):(4,1)", "-o", str(png), cache=tmp_path)
    assert r.returncode == 0, r.stderr
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    r = cli("viz", "mma", "sm80_16x8x16", "C", "2x2x1", cache=tmp_path)
    assert r.returncode == 0, r.stderr
    assert r.stdout.lstrip().startswith("<svg") and "T127" in r.stdout and "TiledMma C" in r.stdout


def test_show(tmp_path: Path) -> None:
    r = cli("show", "row_reduce", cache=tmp_path)
    assert r.returncode == 0, r.stderr
    info = json.loads(r.stdout)
    assert info["static"] == ["N"] and info["signature"][0]["dims"] == ["M", "N"] and info["example_candidates"]
    src = cli("show", "row_reduce", "--source", cache=tmp_path)
    assert src.returncode == 0 and "def row_reduce(spec" in src.stdout
    ptx = cli("show", "row_reduce", "--ptx", cache=tmp_path)
    assert ptx.returncode == 0 and ".target sm_90a" in ptx.stdout and "ld.global" in ptx.stdout


def test_bench_report_from_recorded_results(tmp_path: Path) -> None:
    results = Path(__file__).parent / "data"
    html = tmp_path / "r.html"
    r = cli("bench", "--from", str(results / "h200-sum.json"), "--from", str(results / "h200-autotune.json"),
            "--plot", str(tmp_path / "plots"), "--report", str(html), cache=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "NVIDIA H200" in html.read_text() and list((tmp_path / "plots").glob("*.png"))


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (("precompile", "--kernel", "no_such_kernel"), "unknown kernel 'no_such_kernel'"),
        (("show", "no_such_kernel"), "unknown kernel 'no_such_kernel'"),
        (("bench", "sum"), "--from"),  # no GPU here: measuring is impossible, say how to report
        (("bench", "--from", "no/such/file.json"), "no/such/file.json"),
        (("tune", "no_such_kernel", "--shapes", "4x4", "--compile-only"), "unknown kernel 'no_such_kernel'"),
        (("tune", "row_reduce", "--shapes", "4by4", "--compile-only"), "4by4"),
        (("precompile", "--arch", "hopper"), "arch must look like 'sm_90a'"),
        (("viz", "layout", "(4,8):(8"), "(4,8):(8"),
        (("viz", "mma", "sm70_8x8x4"), "unknown MMA preset 'sm70_8x8x4'"),
        (("viz", "layout", "(4,8):(1,2,3)"), "(4,8):(1,2,3)"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(args: tuple[str, ...], needle: str, tmp_path: Path) -> None:
    r = cli(*args, cache=tmp_path)
    assert r.returncode == 2
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and needle in lines[0] and "Traceback" not in r.stderr


def test_show_sass_is_sass_or_one_clear_line(cache: Path) -> None:
    import shutil

    from cuteforge.compiler import _wheel_nvdisasm

    r = cli("show", "row_reduce", "--sass", cache=cache)
    if shutil.which("nvdisasm") or shutil.which("cuobjdump") or _wheel_nvdisasm():
        assert r.returncode == 0 and "EXIT" in r.stdout, r.stderr[-800:]  # every kernel ends in one
    else:  # no CUDA toolkit here: a one-line error, exit 2, never a traceback
        assert r.returncode == 2 and "nvdisasm or cuobjdump" in r.stderr and "Traceback" not in r.stderr
        assert "pip install nvidia-cuda-nvdisasm" in r.stderr


def test_disassemble_finds_the_nvdisasm_wheel(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Without a CUDA toolkit on PATH, `disassemble` runs the nvdisasm that the
    nvidia-cuda-nvdisasm wheel puts under the `nvidia` namespace package (here a stand-in
    script in a stand-in package)."""
    import sys
    import types

    from cuteforge import compiler

    exe = tmp_path / "nvidia" / "cu13" / "bin" / "nvdisasm"
    exe.parent.mkdir(parents=True)
    exe.write_text('#!/bin/sh\necho "Function : from the wheel $2"\n')
    exe.chmod(0o755)
    pkg = types.ModuleType("nvidia")
    pkg.__path__ = [str(tmp_path / "nvidia")]
    monkeypatch.setitem(sys.modules, "nvidia", pkg)
    monkeypatch.setattr(compiler.shutil, "which", lambda _tool: None)
    assert compiler._wheel_nvdisasm() == str(exe)
    assert compiler.disassemble("k.cubin").strip() == "Function : from the wheel k.cubin"
    exe.chmod(0o644)  # not executable: not taken, and the error names both ways to get one
    with pytest.raises(RuntimeError, match="pip install nvidia-cuda-nvdisasm"):
        compiler.disassemble("k.cubin")
