#!/usr/bin/env bash
# `arrcoc train` on the GPU machine: several runs sharing one scene cache, all kept in one archive.
#
#   scripts/gpu_train.sh NAME "ARRCOC TRAIN ARGS" [NAME "ARGS"]...  ->  $OUT/train-runs.tar.gz
#
# Each run writes NAME/arrcoc-texture.safetensors with its .sha256 and report (JSON + markdown)
# and NAME.log. Runs stop at TRAIN_TIMEOUT_S each, so the call ends inside its 10 minutes.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-$PWD/artifacts}"
mkdir -p "$OUT"
source scripts/device_env.sh
runs="$(mktemp -d)"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
while [ $# -ge 2 ]; do
  name="$1"; args="$2"; shift 2
  mkdir -p "$runs/$name"
  echo "== $name: arrcoc train $args"
  # shellcheck disable=SC2086
  timeout "${TRAIN_TIMEOUT_S:-540}" $PY -m arrcoc train --device cuda --cache-dir /tmp/arrcoc-cache --quiet \
    --out "$runs/$name/arrcoc-texture.safetensors" $args 2>&1 | grep -vE "Warning|warn\(" | tee "$runs/$name.log"
  grep -E "^\| (\*\*overall|participatory|held-out|training)" "$runs/$name/arrcoc-texture.report.md" 2>/dev/null
  tar -czf "$OUT/train-runs.tar.gz" -C "$runs" .  # after every run: a later timeout loses nothing
done
