"""Hugging Face Spaces entry point (README front matter: app_file: app.py).

Spaces runs `python app.py`; the demo uses the in-process executor there (no Redis needed), with
every interactive request's model work inside a `@spaces.GPU` function
(arrcoc.service.client.zerogpu): on ZeroGPU hardware that is where the GPU is; on a CPU Space the
`spaces` package makes the decorator a no-op and the same code runs eager on the CPU.
"""

import os
from pathlib import Path

# `spaces` before torch: on ZeroGPU it must see torch's CUDA set-up first. Not on a Space: absent is fine.
try:
    import spaces  # noqa: F401
except ImportError:
    pass


def space_environment() -> None:
    """What a Space serves unless its settings (variables) say otherwise. This file is the
    Space's launcher, as compose.yaml is the containers'."""
    if not os.environ.get("SPACE_ID"):
        return
    # the hub is reachable: CLIP ViT-B/16 (objects), served in bfloat16 on a GPU (ARRCOC_ENGINE__DTYPE=auto)
    os.environ.setdefault("ARRCOC_ENGINE__VARIANT", "arrcoc-clip-b16")
    # the Space's proxy reaches the container from the platform's private network: its
    # X-Forwarded-For names the visitor, so rate limits count visitors, not the proxy
    os.environ.setdefault(
        "ARRCOC_ACCESS__TRUSTED_PROXIES", "10.0.0.0/8,172.16.0.0/12,192.168.0.0/16,127.0.0.1,::1"
    )
    data = Path("/data")  # the Space's persistent storage, when it has some: survives restarts
    if data.is_dir() and os.access(data, os.W_OK):
        # aot packages, compile caches
        os.environ.setdefault("ARRCOC_SERVICE__CACHE_DIR", str(data / "arrcoc-cache"))
        os.environ.setdefault("HF_HOME", str(data / "huggingface"))  # CLIP's weights, downloaded once
    if os.environ.get("SPACES_ZERO_GPU", "").lower() in ("1", "t", "true"):
        # no compiling at request time there: AOTInductor packages, built once at the start
        os.environ.setdefault("ARRCOC_ENGINE__BACKEND", "aot")
        os.environ.setdefault("ARRCOC_ENGINE__BACKENDS", "aot")


space_environment()

from arrcoc.service.client.zerogpu import SpacesExecutor  # noqa: E402
from demo import service  # noqa: E402
from demo.app import build_demo  # noqa: E402

if os.environ.get("SPACE_ID"):
    executor = SpacesExecutor()
    service.set_executor(executor)
    executor.prepare()  # ZeroGPU: the aot packages built (first start) or loaded; CPU: the model loaded

demo = build_demo()

if __name__ == "__main__":
    from arrcoc.cli.demo import serve, stop_on_sigterm

    stop_on_sigterm()  # a Space restarts or stops its container with SIGTERM
    serve(demo, server_name=os.environ.get("GRADIO_SERVER_NAME", "0.0.0.0"))
