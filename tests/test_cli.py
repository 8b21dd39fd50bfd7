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

import cuteforge


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
    assert info["versions"]["cuteforge"] == cuteforge.__version__
    text = cli("info", cache=cache)
    assert text.returncode == 0 and "target arch" in text.stdout and f"cuteforge      {cuteforge.__version__}" in text.stdout


def test_version(tmp_path: Path) -> None:
    r = cli("--version", cache=tmp_path)
    assert r.returncode == 0 and r.stdout.strip() == f"cuteforge {cuteforge.__version__}"


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
    assert "per family" in lib.stdout and "row_reduce" in lib.stdout
    assert "precompile for sm_90a" in lib.stderr and "[1/" in lib.stderr  # plain progress lines off a terminal

    human = cli("cache", "stats", cache=cache)
    assert human.returncode == 0 and human.stdout.startswith("cache dir") and "row_reduce" in human.stdout
    # a closed pipe ends quietly
    pipe = subprocess.run(f"{sys.executable} -m cuteforge cache ls | head -1", shell=True, capture_output=True, text=True,
                          env=dict(os.environ, CUTEFORGE_CACHE_DIR=str(cache)), timeout=300)
    assert pipe.returncode == 0 and "Traceback" not in pipe.stderr and len(pipe.stdout.splitlines()) == 1


def test_cache_clear_asks_unless_yes(tmp_path: Path) -> None:
    r = cli("cache", "clear", cache=tmp_path)  # no terminal to ask on: refuse, delete nothing
    assert r.returncode == 2 and "--yes" in r.stderr and "Traceback" not in r.stderr
    r = cli("cache", "clear", "--yes", "--json", cache=tmp_path)
    assert r.returncode == 0 and json.loads(r.stdout)["removed"] == 0


USER_KERNEL = '''
import cutlass, cutlass.cute as cute
from cuda.bindings.driver import CUstream
import cuteforge
from cuteforge import Signature, TensorArg

@cuteforge.kernel(signature=Signature(TensorArg("x", ("M",)), TensorArg("y", ("M",), dtype_like="x")), archs=("sm_80+",))
def scale(spec):
    factor = float(spec.param("factor"))

    @cute.kernel
    def scale_body(x: cute.Tensor, y: cute.Tensor):
        tidx, _, _ = cute.arch.thread_idx()
        bidx, _, _ = cute.arch.block_idx()
        i = bidx * 128 + tidx
        if i < x.shape[0]:
            y[i] = (x[i].to(cutlass.Float32) * factor).to(y.element_type)

    @cute.jit
    def run(x: cute.Tensor, y: cute.Tensor, stream: CUstream):
        scale_body(x, y).launch(grid=(cute.ceil_div(x.shape[0], 128), 1, 1), block=(128, 1, 1), stream=stream)
    return run
'''


def test_user_kernel_compiles_without_a_gpu_and_show_finds_it(tmp_path: Path) -> None:
    mod = tmp_path / "my_kernels.py"
    mod.write_text(USER_KERNEL)
    code = ("import sys, torch, cuteforge; sys.path.insert(0, sys.argv[1]); import my_kernels as m\n"
            "x = torch.empty(1000, device='meta')\n"
            "print(cuteforge.compile_only(m.scale, x, torch.empty_like(x), arch='sm_90a', factor=3.0))\n")
    env = dict(os.environ, CUTEFORGE_CACHE_DIR=str(tmp_path / "c"))
    r = subprocess.run([sys.executable, "-c", code, str(tmp_path)], env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    assert Path(r.stdout.strip()).exists()
    r = cli("show", f"{mod}:scale", cache=tmp_path / "c")
    assert r.returncode == 0 and "kernel         scale" in r.stdout and "cache entries  1" in r.stdout, r.stderr
    r = cli("show", f"{mod}:scale", "--ptx", "--tensors", "float32[1000];float32[1000]", "--param", "factor=3.0",
            cache=tmp_path / "c")
    assert r.returncode == 0 and ".target sm_90a" in r.stdout, r.stderr
    r = cli("show", f"{mod}:scale", "--source", cache=tmp_path / "c")
    assert r.returncode == 0 and "def scale_body" in r.stdout


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
    r = cli("show", "row_reduce", "--json", cache=tmp_path)
    assert r.returncode == 0, r.stderr
    info = json.loads(r.stdout)
    assert info["static"] == ["N"] and info["signature"][0]["dims"] == ["M", "N"] and info["candidates"]
    assert len(info["specializations"]) > 1
    human = cli("show", "row_reduce", cache=tmp_path)
    assert human.returncode == 0 and "specializations" in human.stdout and "[1]" in human.stdout
    src = cli("show", "row_reduce", "--source", cache=tmp_path)
    assert src.returncode == 0 and "@cute.kernel" in src.stdout and "reduce/row.py" in src.stdout  # device code
    ptx = cli("show", "row_reduce", "--ptx", "--spec", "1", cache=tmp_path)
    assert ptx.returncode == 0 and ".target sm_90a" in ptx.stdout and "ld.global" in ptx.stdout
    assert info["specializations"][1]["key"] in ptx.stdout.splitlines()[0]
    bad = cli("show", "row_reduce", "--ptx", "--spec", "9999", cache=tmp_path)
    assert bad.returncode == 2 and "--spec 9999" in bad.stderr


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
