#!/usr/bin/env bash
# The test command: set up from nothing (system packages, venv) and run the whole suite.
#   ./scripts/test.sh           the whole suite (CI's command)
#   ./scripts/test.sh --quick   the everyday lane (pytest -m quick; tests/conftest.py says which)
# Other arguments go to pytest. The suite uses the Redis at ARRCOC_TEST_REDIS_URL (default
# 127.0.0.1:6379 db 13) and starts a redis-server of its own when none answers there.
set -euo pipefail
cd "$(dirname "$0")/.."
args=()
for a in "$@"; do
  if [ "$a" = --quick ]; then args+=(-m quick); else args+=("$a"); fi
done
# as root, Debian's chromium (the browser tests), docker-compose (tests/test_compose.py checks
# compose.yaml with it) and redis-server (a Redis of the session's own when none answers)
if [ "$(id -u)" = 0 ] && { ! command -v chromium >/dev/null || ! command -v docker-compose >/dev/null \
    || ! command -v redis-server >/dev/null; }; then
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium docker-compose redis-server >/dev/null
fi
./scripts/setup.sh
export HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
.venv/bin/python -m ruff check arrcoc worker demo tests
.venv/bin/python -m ruff format --check arrcoc worker demo tests tools app.py
exec .venv/bin/python -m pytest -q ${args[@]+"${args[@]}"}
