"""Record the machine code of every kernel the precompile grid builds, and compare two records.

A refactor of device code is behaviour-preserving when every standard specialization
(`Kernel.specializations`, the grid `cuteforge precompile` builds) compiles to the same
code. For each one this writes, names aside (the DSL names kernels after their Python
function and argument types):

- ``.ptx``: the kernel's PTX;
- ``.sass``: its SASS (nvdisasm), where a disassembler is available;
- ``.host``: the lowered host function (grid, block, shared memory, cluster shape of the
  launch), without the embedded binary;
- ``index.json``: per entry, the compile key and the config the specialization resolves to.

    CUTE_DSL_ARCH=sm_90a python scripts/compare_machine_code.py record /tmp/base [--jobs 2]
    python scripts/compare_machine_code.py compare /tmp/base /tmp/after

No GPU is needed: the DSL compiles for the target arch on the CPU.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import difflib
import hashlib
import json
import multiprocessing
import os
import re
import sys
from pathlib import Path

ARCH = os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")

# Kernel and host function names carry the Python function's (or class's) name and the
# argument types; every identifier the DSL derives from them contains "cutlass_".
_NAMES = re.compile(r"\b\w*cutlass_\w+")
_NAME_ARRAYS = re.compile(r"!llvm\.array<\d+ x i8>")
_BLOB = re.compile(r'(llvm\.mlir\.global internal constant @\w*binary\w*\()"[^"]*"')


def normalise(text: str) -> str:
    """The text with kernel / host function names and name-sized byte arrays made uniform."""
    text = _BLOB.sub(r'\1"<binary>"', text)
    text = _NAMES.sub("NAME", text)
    return _NAME_ARRAYS.sub("!llvm.array<N x i8>", text)


def _extra() -> list[tuple[str, object, dict]]:
    """Kernels the precompile grid leaves out, on their default configs: the norm backward
    (register, row-staged, cluster-staged, part ring; with and without partials), the
    norm forward's long-row paths (cp_async, staged, lagged, short chains, a residual), the
    column reduction, and the row reduction's other ops."""
    from cuteforge.signature import BoundKey

    out: list[tuple[str, object, dict]] = []
    for kind, d in (("rms", "bfloat16"), ("layer", "bfloat16"), ("rms", "float32"), ("layer", "float32")):
        v = 8 if d == "bfloat16" else 4
        for n, has_dw in ((1024, True), (2560, True), (8192, True), (65536, True), (262144, True),
                          (4096, False), (6144, False), (8192, False), (262144, False)):
            key = BoundKey((d, d, d, d, "float32", "float32", d, "float32", "float32"), (("N", n),), (v, v, v, v, 4, 4, v, 4, 4))
            out.append(("norm_bwd", key, {"kind": kind, "has_bias": kind == "layer", "has_dsum": False, "has_dw": has_dw}))
        for n, res in ((32768, False), (65536, False), (262144, False), (65536, True)):
            key = BoundKey((d,) * 6 + ("float32", "float32"), (("N", n),), (v,) * 6 + (4, 4))
            out.append(("norm_fwd", key, {"kind": kind, "eps": 1e-5, "has_bias": kind == "layer", "has_residual": res}))
    for d, v in (("bfloat16", 8), ("float32", 4)):
        out.append(("col_reduce", BoundKey((d, d), (), (v, v)), {"op": "sum"}))
    for d, v in (("bfloat16", 8), ("float32", 4)):  # the other ops (the grid builds sum)
        for op in ("mean", "amax", "amin", "argmax"):
            o, vo = ("int64", 2) if op == "argmax" else (d, v)
            out.append(("col_reduce", BoundKey((d, o), (), (v, vo)), {"op": op}))
            for n in (1000, 4096):
                out.append(("row_reduce", BoundKey((d, o), (("N", n),), (v, vo)), {"op": op}))
    return out


def _jobs(extra: bool) -> list[tuple[str, int]]:
    """(kernel, index): index < 1000 a standard specialization, 1000 + i the i-th extra."""
    from cuteforge import kernels
    from cuteforge.kernel import REGISTRY

    kernels.load_all()
    grid = [(name, i) for name in sorted(REGISTRY) if REGISTRY[name].specializations for i, _ in enumerate(REGISTRY[name].specializations())]
    if extra:
        grid += [(name, 1000 + i) for i, (name, _, _) in enumerate(_extra())]
    return grid


def _compile_one(job: tuple[str, int, str]) -> dict[str, str]:
    name, index, out = job
    from cuteforge import compiler, kernels
    from cuteforge.kernel import REGISTRY

    kernels.load_all()
    k = REGISTRY[name]
    key, params = list(k.specializations())[index] if index < 1000 else _extra()[index - 1000][1:]
    spec = k.spec(key, tuple(sorted(params.items())), arch=ARCH)
    result = compiler.compile_jit(k.builder(spec), k.signature.fake_args(key), spec.arch, keep_artifacts=True)
    ident = hashlib.sha256(repr((key, sorted(params.items()))).encode()).hexdigest()[:12]
    stem = Path(out) / name / f"{index:03d}-{ident}"
    stem.parent.mkdir(parents=True, exist_ok=True)
    stem.with_suffix(".ptx").write_text(normalise(result.ptx or ""))
    stem.with_suffix(".host").write_text(normalise(str(result.compiled.ir_module)))
    try:
        stem.with_suffix(".sass").write_text(normalise(compiler.sass(result.cubin or b"")))
    except RuntimeError:
        pass
    return {"file": str(stem.relative_to(out)), "key": repr(key), "params": repr(sorted(params.items())), "config": repr(spec.config)}


def record(out: str, jobs: int, only: list[str] | None, extra: bool) -> int:
    grid = [(n, i) for n, i in _jobs(extra) if not only or n in only]
    Path(out).mkdir(parents=True, exist_ok=True)
    index = {}
    ctx = multiprocessing.get_context("spawn")
    with concurrent.futures.ProcessPoolExecutor(max_workers=jobs, mp_context=ctx) as pool:
        futures = {pool.submit(_compile_one, (n, i, out)): (n, i) for n, i in grid}
        for done, fut in enumerate(concurrent.futures.as_completed(futures), 1):
            entry = fut.result()
            index[entry["file"]] = entry
            print(f"[{done}/{len(grid)}] {entry['file']}", flush=True)
    Path(out, "index.json").write_text(json.dumps(dict(sorted(index.items())), indent=1))
    return 0


def _by_key(index: dict[str, dict[str, str]]) -> dict[tuple[str, ...], str]:
    """Entries by kernel, compile key, parameters and config: the running number in an
    entry's name shifts when the grid grows, what it compiles does not."""
    return {(name.split("/")[0], e["key"], e["params"], e["config"]): name for name, e in index.items()}


def compare(base: str, new: str) -> int:
    old_index = json.loads(Path(base, "index.json").read_text())
    new_index = json.loads(Path(new, "index.json").read_text())
    old_by, new_by = _by_key(old_index), _by_key(new_index)
    problems = [f"missing after: {old_by[k]}" for k in sorted(old_by.keys() - new_by.keys())]
    problems += [f"new entry: {new_by[k]}" for k in sorted(new_by.keys() - old_by.keys())]
    same = 0
    for k in sorted(old_by.keys() & new_by.keys()):
        f, g = old_by[k], new_by[k]
        differs = False
        for suffix in (".ptx", ".sass", ".host"):
            a, b = Path(base, f + suffix), Path(new, g + suffix)
            if not a.exists() and not b.exists():
                continue
            ta = normalise(a.read_text()) if a.exists() else ""  # again: records of an older normalise
            tb = normalise(b.read_text()) if b.exists() else ""
            if ta != tb:
                differs = True
                diff = list(difflib.unified_diff(ta.splitlines(), tb.splitlines(), lineterm="", n=1))
                problems.append(f"{f}{suffix} differs ({len(diff)} diff lines):\n  " + "\n  ".join(diff[:12]))
        same += not differs
    common = len(old_by.keys() & new_by.keys())
    print(f"{same}/{common} specializations in both records identical ({len(old_by)} distinct before, {len(new_by)} after)")
    for p in problems:
        print(p)
    return 1 if any(not p.startswith("new entry") for p in problems) else 0


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("record", help="compile the precompile grid and write its normalised code")
    r.add_argument("out")
    r.add_argument("--jobs", type=int, default=1, help="compile processes")
    r.add_argument("--kernel", action="append", help="only these kernels (repeatable)")
    r.add_argument("--extra", action="store_true", help="also the kernels the grid leaves out (norm backward, long-row norm forward, column reduction, other reduce ops)")
    c = sub.add_parser("compare", help="compare two records")
    c.add_argument("base")
    c.add_argument("new")
    a = p.parse_args()
    if a.cmd == "record":
        return record(a.out, a.jobs, a.kernel, a.extra)
    return compare(a.base, a.new)


if __name__ == "__main__":
    sys.exit(main())
