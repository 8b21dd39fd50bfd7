#!/usr/bin/env bash
# Create .venv with cuteforge and its test extras, on a machine that has only python3.
# Where no NVIDIA GPU is present, torch is pinned to 2.13.0, which the package index here
# serves as a CPU build, so set-up does not pull gigabytes of CUDA packages.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  # Some distributions ship python3 without the venv module; virtualenv does the same job.
  "$PY" -m venv .venv 2>/dev/null || { rm -rf .venv; "$PY" -m pip install -q --user virtualenv && "$PY" -m virtualenv -q .venv; }
fi
.venv/bin/python -m pip install -q --upgrade pip >/dev/null 2>&1 || true
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
  .venv/bin/python -m pip install -q "torch>=2.8"
else
  .venv/bin/python -m pip install -q "torch==2.13.0"
fi
.venv/bin/python -m pip install -q -e ".[test]"
