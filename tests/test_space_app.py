"""app.py, the Hugging Face Space's launcher, with the `spaces` package installed and no GPU.

It runs in a fresh Python (app.py sets the Space's environment at import, as on a Space): the
demo's executor is the SpacesExecutor, the start prepares the engine through the GPU-decorated
function (a no-op decorator off ZeroGPU, as on a CPU Space), and a request through the demo's
service door comes back from `gpu_infer` as a real result of the Space's variant (CLIP ViT-B/16,
random weights of its real shapes here: the hub is not reachable from the tests), eager on the CPU.
What ZeroGPU itself does (a forked GPU worker per call) cannot run here.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

SCRIPT = """
import json, sys
import app
import spaces
from arrcoc.service.client import zerogpu
from arrcoc.request import Controls
from demo import service

ex = service.executor()
photo = open("arrcoc/examples/coffee.jpg", "rb").read()
result = service.infer(photo, "the red cup", Controls())
try:
    service.infer(b"not an image", "the red cup", Controls())
    error = None
except Exception as e:  # a user's error comes back through gpu_infer as itself
    error = [type(e).__name__, str(e)]
print("RESULT " + json.dumps({
    "executor": type(ex).__name__, "gpu_is_spaces": zerogpu.GPU is spaces.GPU,
    "shared_runtime": zerogpu._runtime is ex.runtime, "variant": result.variant,
    "weights_version": result.weights_version, "backend": result.backend, "grid": result.grid,
    "dtype": str(ex.runtime.pipeline.backend.dtype), "device": str(ex.runtime.pipeline.device),
    "benchmark_only": result.benchmark_only, "error": error, "title": app.demo.title,
}))
"""


def test_space_app_runs_its_model_work_through_the_gpu_functions(tmp_path):
    spaces = pytest.importorskip("spaces")  # the demo extra installs it
    env = dict(
        os.environ,
        SPACE_ID="arrcoc-test/space",
        ARRCOC_ENGINE__WEIGHTS="random",
        ARRCOC_ENGINE__DEVICE="cpu",
        ARRCOC_SERVICE__DATA_DIR=str(tmp_path / "data"),
        ARRCOC_SERVICE__CACHE_DIR=str(tmp_path / "cache"),
        HF_HUB_OFFLINE="1",
        TOKENIZERS_PARALLELISM="false",
        PYTHONPATH=os.pathsep.join(
            filter(None, (str(ROOT), str(Path(spaces.__file__).parent.parent), os.environ.get("PYTHONPATH")))
        ),
    )
    for key in (
        "ARRCOC_ENGINE__VARIANT",
        "ARRCOC_ENGINE__BACKEND",
        "ARRCOC_ENGINE__BACKENDS",
        "ARRCOC_SERVICE__BROKER_URL",
        "SPACES_ZERO_GPU",
    ):
        env.pop(key, None)
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600
    )
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    assert done.returncode == 0 and lines, done.stdout[-3000:] + done.stderr[-3000:]
    got = json.loads(lines[-1].removeprefix("RESULT "))
    assert got["executor"] == "SpacesExecutor" and got["gpu_is_spaces"] and got["shared_runtime"]
    assert (got["variant"], got["backend"], got["grid"]) == ("arrcoc-clip-b16", "eager", 14)
    assert got["device"] == "cpu" and got["dtype"] == "torch.float32"  # a CPU Space: eager float32
    assert got["weights_version"] == "random" and got["benchmark_only"]
    assert got["error"] is not None and got["error"][0] == "ImageError", got["error"]
    assert got["title"].startswith("ARR-COC")


TINY_VARIANT = "arrcoc-clip-tiny-space-test"


@pytest.fixture()
def zero_gpu_settings(tmp_path):
    """Settings of a small CLIP variant (random weights), as the GPU side of a ZeroGPU Space sees them."""
    from arrcoc.clip import ClipModelConfig, build_clip
    from arrcoc.registry import get_variant, register_variant
    from arrcoc.settings import default_settings
    from arrcoc.variant import Variant

    try:
        get_variant(TINY_VARIANT)
    except Exception:
        register_variant(
            Variant(
                name=TINY_VARIANT,
                build=lambda c: None,
                load=build_clip,
                description="test",
                config=ClipModelConfig(hidden=64, heads=2, layers=2, mlp=128, query_dim=32),
                tags=("clip", "hub"),
                gpu_dtype="bfloat16",
            )
        )
    return default_settings(
        engine={
            "variant": TINY_VARIANT,
            "weights": "random",
            "device": "cpu",
            "backend": "eager",
            "backends": ("eager",),
        },
        service={"data_dir": tmp_path / "data", "cache_dir": tmp_path / "cache", "broker_url": None},
    )


def _in_forked_worker(queue, image: bytes, query: str) -> None:
    """What a ZeroGPU worker does with a call: run the function in a process forked from the app's
    and send its value back pickled."""
    from arrcoc.request import Controls
    from arrcoc.service.client import zerogpu

    queue.put(zerogpu.gpu_infer(image, query, Controls(), 60.0, None))


def test_on_zero_gpu_requests_run_in_a_forked_worker_and_come_back_pickled(zero_gpu_settings, monkeypatch):
    """ZeroGPU's shape without its platform: SPACES_ZERO_GPU set, the app's own Runtime is eager on
    the CPU (batch and benchmark jobs), and a request's gpu_infer runs in a forked process that
    builds its Runtime from the app's settings; the result, or a user's error, comes back pickled."""
    import multiprocessing

    from arrcoc.errors import ImageError
    from arrcoc.service.client import zerogpu

    monkeypatch.setenv("SPACES_ZERO_GPU", "true")
    ex = zerogpu.SpacesExecutor(zero_gpu_settings.replace(engine={"device": "auto"}))
    try:
        assert (
            zerogpu.on_zero_gpu() and zerogpu._runtime is None
        )  # the GPU side's Runtime: built where it runs
        engine = ex.settings.engine
        assert (engine.device, engine.backend) == ("cpu", "eager")  # the app's own: jobs on the CPU
        photo = (ROOT / "arrcoc" / "examples" / "coffee.jpg").read_bytes()
        ctx = multiprocessing.get_context("fork")
        queue = ctx.Queue()
        results = []
        for image in (photo, b"not an image"):
            child = ctx.Process(target=_in_forked_worker, args=(queue, image, "the red cup"))
            child.start()
            results.append(queue.get(timeout=300))
            child.join(60)
        ok, bad = results
        assert ok.variant == TINY_VARIANT and ok.grid == 14 and ok.weights_version == "random"
        assert isinstance(bad, ImageError)
        assert zerogpu._runtime is None  # the forked worker's Runtime stayed there
    finally:
        ex.close()


def test_python_app_py_exits_0_on_sigterm(tmp_path):
    """A Space stops or restarts its container with SIGTERM: `python app.py` closes its server and
    exits 0 at once, rather than being killed when the platform's grace period ends."""
    import signal
    import urllib.request

    from tests.demo_server import free_port
    from tests.helpers import wait_for

    port = free_port()
    env = dict(
        os.environ,
        GRADIO_SERVER_NAME="127.0.0.1",
        GRADIO_SERVER_PORT=str(port),
        ARRCOC_SERVICE__DATA_DIR=str(tmp_path / "data"),
        ARRCOC_SERVICE__CACHE_DIR=str(tmp_path / "cache"),
        HF_HUB_OFFLINE="1",
    )
    for key in (
        "SPACE_ID",
        "ARRCOC_SERVICE__BROKER_URL",
    ):  # the in-process demo, as `python app.py` runs locally
        env.pop(key, None)

    def answers() -> bool:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=5) as r:
                return r.status == 200
        except OSError:
            return False

    app = subprocess.Popen(
        [sys.executable, "app.py"],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        wait_for(lambda: answers() or app.poll() is not None, 300, "python app.py serves")
        assert app.poll() is None, app.stdout.read()[-3000:]
        app.send_signal(signal.SIGTERM)
        assert app.wait(timeout=30) == 0, app.stdout.read()[-3000:]
        assert not answers()
    finally:
        if app.poll() is None:
            app.kill()
            app.wait(30)
