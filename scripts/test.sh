#!/usr/bin/env bash
# The test command: set up from nothing (system packages, venv) and run the whole suite.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "$(id -u)" = 0 ] && { ! command -v chromium >/dev/null || ! command -v docker-compose >/dev/null; }; then
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium docker-compose >/dev/null
fi
./scripts/setup.sh
export HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
.venv/bin/python -m ruff check arrcoc worker demo tests
exec .venv/bin/python -m pytest -q "$@"
