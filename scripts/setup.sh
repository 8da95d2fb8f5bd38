#!/usr/bin/env bash
# Create .venv with everything the demo and the tests need. Idempotent; safe to re-run.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
.venv/bin/python -m pip install -q --upgrade pip
# the CPU build of torch first (it lies on this machine's disk), so nothing pulls a CUDA build
.venv/bin/python -m pip install -q "torch==2.13.0" || .venv/bin/python -m pip install -q torch --index-url https://download.pytorch.org/whl/cpu
.venv/bin/python -m pip install -q -e ".[dev]"
