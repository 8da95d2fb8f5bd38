"""compose.yaml is valid for Debian's docker-compose and says what we promise (no Docker engine here)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parent.parent
COMPOSE = shutil.which("docker-compose")
pytestmark = pytest.mark.skipif(COMPOSE is None, reason="docker-compose is not installed (apt-get install docker-compose)")


def config(**env: str) -> dict:
    out = subprocess.run([COMPOSE, "-f", "compose.yaml", "config"], cwd=REPO, capture_output=True, text=True,
                         timeout=60, env=os.environ | env)  # fmt: skip
    assert out.returncode == 0, out.stderr
    return yaml.safe_load(out.stdout)


def test_compose_config_is_valid_and_complete():
    services = config()["services"]
    assert {"redis", "worker", "worker-cpu", "demo", "flower"} <= set(services)
    redis = services["redis"]
    cmd = " ".join(redis["command"])
    assert "--appendonly yes" in cmd and "--maxmemory-policy noeviction" in cmd and redis["healthcheck"]["test"]
    gpu = services["worker"]
    devices = gpu["deploy"]["resources"]["reservations"]["devices"]
    assert devices[0]["driver"] == "nvidia" and "gpu" in devices[0]["capabilities"]
    assert gpu["build"]["args"]["EXTRAS"] == "gpu" and gpu["healthcheck"]["test"]
    assert {v.split(":")[1] if isinstance(v, str) else v["target"] for v in gpu["volumes"]} == {"/cache", "/data"}
    assert gpu["depends_on"]["redis"]["condition"] == "service_healthy"
    cpu = services["worker-cpu"]
    assert "deploy" not in cpu and cpu["environment"]["ARRCOC_DEVICE"] == "cpu" and cpu["profiles"] == ["cpu"]
    demo = services["demo"]
    assert "7860" in str(demo["ports"][0]) and demo["depends_on"]["redis"]["condition"] == "service_healthy"
    assert demo["environment"]["ARRCOC_BROKER_URL"] == "redis://redis:6379/0"
    assert demo["command"][:2] == ["arrcoc", "demo"]
    flower = services["flower"]
    assert flower["profiles"] == ["flower"] and "--basic-auth" in " ".join(flower["entrypoint"])


def test_the_gpu_image_installs_the_gpu_extra():
    dockerfile = (REPO / "Dockerfile").read_text()
    assert "ARG EXTRAS=gpu" in dockerfile and '.[${EXTRAS},serve,demo]' in dockerfile
    import tomllib

    extras = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert any(d.startswith("onnxruntime-gpu") for d in extras["gpu"])
