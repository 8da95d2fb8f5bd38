#!/usr/bin/env bash
# Set up (first run only) and start the demo on http://127.0.0.1:7860, in-process, no Redis.
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x .venv/bin/arrcoc ] || ./scripts/setup.sh
export HF_HUB_OFFLINE=1
exec .venv/bin/arrcoc demo "$@"
