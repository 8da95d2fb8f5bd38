# ARR-COC Serve image: the worker and the demo run from it (compose.yaml picks the command; compose
# builds it once, for the worker service, and the demo runs the same image).
#   GPU (default): CUDA torch from PyPI + onnxruntime-gpu and triton (the `gpu` extra)
#   CPU:           docker build --build-arg EXTRAS=cpu --build-arg TORCH_INDEX=https://download.pytorch.org/whl/cpu .
ARG PYTHON=3.11
FROM python:${PYTHON}-slim

ARG EXTRAS=gpu
# empty: PyPI's torch (a CUDA build on Linux x86_64); a PyTorch index URL picks another build
ARG TORCH_INDEX=

ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONUNBUFFERED=1 \
    HF_HUB_OFFLINE=1 \
    TOKENIZERS_PARALLELISM=false \
    ARRCOC_SERVICE__CACHE_DIR=/cache \
    ARRCOC_SERVICE__DATA_DIR=/data

# gcc and g++ in both images: on the GPU Triton builds its kernel launchers with gcc at run time; on
# the CPU, which serves eager by default, ARRCOC_ENGINE__BACKEND=compiled or aot and the Benchmark tab's
# compiled and aot runs build C++ with Inductor. No curl: the healthchecks use Python.
RUN apt-get update \
 && apt-get install -y --no-install-recommends gcc g++ \
 && rm -rf /var/lib/apt/lists/*

WORKDIR /app

# dependencies first (cached while only the code changes): install against empty packages
COPY pyproject.toml README.md ./
RUN mkdir -p arrcoc worker demo \
 && touch arrcoc/__init__.py worker/__init__.py demo/__init__.py \
 && if [ -n "$TORCH_INDEX" ]; then pip install torch --index-url "$TORCH_INDEX"; fi \
 && pip install ".[${EXTRAS},serve,demo]" \
 && pip uninstall -y arrcoc \
 && rm -rf arrcoc worker demo

COPY arrcoc ./arrcoc
COPY worker ./worker
COPY demo ./demo
COPY docker/healthcheck.py /usr/local/bin/arrcoc-healthcheck
# the stored benchmark reports (JSON only, .dockerignore) that the demo's Benchmark tab lists: it
# reads them beside the installed demo package (demo/jobs.py, BENCH_DIR; -I: that one, not ./demo)
COPY benchmarks ./benchmarks
RUN pip install --no-deps . \
 && ln -s /app/benchmarks "$(python -I -c 'import demo, pathlib; print(pathlib.Path(demo.__file__).parent.parent)')/benchmarks" \
 && useradd --create-home --uid 1000 arrcoc \
 && mkdir -p /cache /data \
 && chown arrcoc:arrcoc /cache /data

USER arrcoc
EXPOSE 7860
CMD ["arrcoc", "worker"]
