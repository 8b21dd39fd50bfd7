"""The product speaks of the product: no development sessions, issue numbers of our own
tracker, or history version tags in the source, tests, docs, README, scripts, benchmarks or
file names. Upstream projects' issues may be cited where the line names the project."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCOPE = ("src", "tests", "docs", "README.md", "scripts", "benchmarks", "examples")
TEXT = {".py", ".md", ".txt", ".toml", ".sh", ".cfg", ".json", ".cpp", ".h", ".cu", ".j2", ".jinja", ".yml", ".yaml", ".html"}

WORDS = [
    re.compile(r"\bsessions?\s*#?\d+", re.I),                       # a numbered work session
    re.compile(r"\bissues?\s*#?\d+(?:'s)?", re.I),                  # a numbered tracker entry
    re.compile(r"(?<![\w.])v\d+\.\d+(?:\.\d+)?[a-z]?\b(?!\.\d)"),   # "v2.27" used as a history tag
    re.compile(r"(?<![A-Za-z0-9/])[sS]\d{2}[a-z]?(?=[_\-\s.,;:)]|$)"),  # a short work tag in names
]
# A reference to another project's tracker is fine where the line names that project.
UPSTREAM = re.compile(r"CUTLASS|cutlass|PyTorch|pytorch|torch/|triton|Triton|JAX|jax-ml|tvm|TVM|quack|NVIDIA/|github\.com/", re.I)
# Things that look like the patterns but are not history: PTX / SASS register and
# instruction spellings, hardware names.
NOT_HISTORY = re.compile(r"\b(?:S2R|S2UR|S32|s32|s64|s16|s8)\b|\bv\d\.\d+\s*(?:of|API)")

SELF = Path(__file__).resolve()


def _files() -> list[Path]:
    try:
        out = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard", *SCOPE],
                             cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()
        files = [ROOT / f for f in out]
    except (OSError, subprocess.CalledProcessError):  # an sdist: no git
        files = [p for s in SCOPE for p in ((ROOT / s).rglob("*") if (ROOT / s).is_dir() else [ROOT / s])]
    return sorted(p for p in files if p.is_file() and p.resolve() != SELF)


def _hits(text: str) -> list[str]:
    out = []
    for line in text.splitlines():
        for rx in WORDS:
            for m in rx.finditer(line):
                if rx is WORDS[1] and UPSTREAM.search(line):
                    continue
                if NOT_HISTORY.search(m.group(0)) or NOT_HISTORY.search(line[max(0, m.start() - 4): m.end() + 8]):
                    continue
                out.append(m.group(0))
    return out


def test_patterns_catch_history_and_spare_the_rest() -> None:
    assert _hits("measured in sess" + "ion 35") and _hits("iss" + "ue 6's sweep") and _hits("gemm_s" + "36_sweep.py")
    assert _hits("the v" + "2.27 kernel") and _hits("see S" + "25b")
    assert not _hits("see CUTLASS iss" + "ue #3398") and not _hits("sm_90a, s32 register, float32, stages=3")
    assert not _hits("nvidia-cutlass-dsl 4.8.1, python3.10")


def test_file_names_carry_no_history() -> None:
    bad = [str(p.relative_to(ROOT)) for p in _files() if _hits(p.name.replace(".", " ", p.name.count(".") - 1))]
    assert not bad, f"file names with session / version tags: {bad}"


@pytest.mark.parametrize("top", SCOPE)
def test_no_history_words(top: str) -> None:
    bad = {}
    for p in _files():
        rel = p.relative_to(ROOT)
        if rel.parts[0] != top or p.suffix not in TEXT:
            continue
        try:
            hits = _hits(p.read_text(encoding="utf-8"))
        except UnicodeDecodeError:
            continue
        if hits:
            bad[str(rel)] = sorted(set(hits))[:6]
    assert not bad, "development history in the product:\n" + "\n".join(f"  {k}: {v}" for k, v in sorted(bad.items()))
