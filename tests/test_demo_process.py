"""The demo as its users run it: `arrcoc demo` (what scripts/demo.sh and compose start) in a process
of its own against a real Redis, watched by the container's healthcheck (docker/healthcheck.py
demo) with and without a real Celery worker, and stopped by SIGTERM as `docker stop` stops it."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.demo_server import free_port
from tests.helpers import wait_for

ROOT = Path(__file__).resolve().parent.parent
HEALTHCHECK = ROOT / "docker" / "healthcheck.py"


def answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=5) as r:
            return r.status == 200
    except OSError:
        return False


@pytest.fixture
def broker(tmp_path) -> Iterator[str]:
    """A redis-server of its own: a ping over the tests' shared Redis reaches other tests' workers."""
    if shutil.which("redis-server") is None:
        pytest.skip("redis-server is not installed")
    port = free_port()
    server = subprocess.Popen(
        ["redis-server", "--port", str(port), "--save", "", "--appendonly", "no", "--dir", str(tmp_path)],
        stdout=subprocess.DEVNULL,
    )
    import redis

    def up() -> bool:
        try:
            return bool(redis.Redis(port=port, socket_timeout=2).ping())
        except redis.RedisError:
            return False

    try:
        wait_for(up, 60, "redis-server answers")
        yield f"redis://127.0.0.1:{port}/0"
    finally:
        server.terminate()
        server.wait(30)


def healthcheck(env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(HEALTHCHECK), "demo"], env=env, capture_output=True, text=True, timeout=120
    )


def celery_worker(broker: str, env: dict[str, str]) -> subprocess.Popen:
    """A Celery worker process on the broker: what the healthcheck's ping reaches."""
    return subprocess.Popen(
        [sys.executable, "-m", "celery", "-b", broker, "worker", "-P", "solo", "-n", "probe@%h"]
        + ["--without-gossip", "--without-mingle", "-l", "WARNING"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def test_the_demo_is_healthy_only_with_a_worker_and_exits_0_on_sigterm(broker, tmp_path):
    port = free_port()
    env = os.environ | {
        "ARRCOC_SERVICE__BROKER_URL": broker,
        "GRADIO_SERVER_PORT": str(port),
        "ARRCOC_SERVICE__DATA_DIR": str(tmp_path / "data"),
        "ARRCOC_SERVICE__CACHE_DIR": str(tmp_path / "cache"),
        "HF_HUB_OFFLINE": "1",
    }
    arrcoc = Path(sys.executable).with_name("arrcoc")  # the console script scripts/demo.sh runs
    demo = subprocess.Popen(
        [str(arrcoc), "demo", "--host", "127.0.0.1", "--port", str(port)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    worker = None
    try:
        wait_for(lambda: answers(f"http://127.0.0.1:{port}/") or demo.poll() is not None, 300, "the demo")
        assert demo.poll() is None, demo.stdout.read()[-3000:]

        alone = healthcheck(env)  # the page answers, but nothing would serve a request
        assert alone.returncode == 1 and "no worker answered" in alone.stderr, alone.stderr

        worker = celery_worker(broker, env)
        wait_for(lambda: healthcheck(env).returncode == 0, 120, "healthy once a worker answers", every=1)

        demo.send_signal(signal.SIGTERM)  # what `docker stop` sends (through init: true's tini)
        assert demo.wait(timeout=30) == 0, demo.stdout.read()[-3000:]
        assert not answers(f"http://127.0.0.1:{port}/")
    finally:
        for p in (demo, worker):
            if p is not None and p.poll() is None:
                p.kill()
                p.wait(30)
