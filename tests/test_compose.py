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
pytestmark = pytest.mark.skipif(
    COMPOSE is None, reason="docker-compose is not installed (apt-get install docker-compose)"
)


def config(**env: str) -> dict:
    out = subprocess.run(
        [COMPOSE, "-f", "compose.yaml", "config"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        env=os.environ | env,
    )
    assert out.returncode == 0, out.stderr
    return yaml.safe_load(out.stdout)


def test_compose_config_is_valid_and_complete():
    services = config()["services"]
    assert {"redis", "worker", "worker-cpu", "demo", "flower"} <= set(services)
    redis = services["redis"]
    cmd = " ".join(redis["command"])
    assert (
        "--appendonly yes" in cmd and "--maxmemory-policy noeviction" in cmd and redis["healthcheck"]["test"]
    )
    gpu = services["worker"]
    devices = gpu["deploy"]["resources"]["reservations"]["devices"]
    assert devices[0]["driver"] == "nvidia" and "gpu" in devices[0]["capabilities"]
    assert gpu["build"]["args"]["EXTRAS"] == "gpu" and gpu["healthcheck"]["test"]
    assert {v.split(":")[1] if isinstance(v, str) else v["target"] for v in gpu["volumes"]} == {
        "/cache",
        "/data",
    }
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
    assert "ARG EXTRAS=gpu" in dockerfile and ".[${EXTRAS},serve,demo]" in dockerfile
    import tomllib

    extras = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert any(d.startswith("onnxruntime-gpu") for d in extras["gpu"])


def _targets(service: dict) -> dict[str, str]:
    """Mount target -> volume name of a service's named volumes."""
    out = {}
    for v in service.get("volumes", []):
        source, target = v.split(":")[:2] if isinstance(v, str) else (v.get("source"), v["target"])
        out[target] = source
    return out


@pytest.mark.parametrize(
    ("demo", "worker", "profile"), [("demo", "worker", "gpu"), ("demo-cpu", "worker-cpu", "cpu")]
)
def test_the_demo_waits_for_a_healthy_worker_and_mounts_the_hub_cache(demo, worker, profile):
    services = config()["services"]
    d, w = services[demo], services[worker]
    assert d["profiles"] == w["profiles"] == [profile], "each profile starts its own worker and demo"
    assert d["depends_on"] == {
        "redis": {"condition": "service_healthy"},
        worker: {"condition": "service_healthy"},
    }
    assert w["healthcheck"]["test"]
    for s in (d, w):  # HF_HOME lies on the cache volume: hub files survive a restart, offline runs find them
        hf_home = s["environment"]["HF_HOME"]
        mounts = _targets(s)
        assert any(hf_home.startswith(t.rstrip("/") + "/") and mounts[t] == "cache" for t in mounts), (
            hf_home,
            mounts,
        )
        assert mounts.get("/data") == "data"
    assert d["command"][-2:] == ["--port", d["environment"]["GRADIO_SERVER_PORT"]]


def test_the_worker_healthcheck_expects_as_many_nodes_as_compose_starts():
    w = config(ARRCOC_WORKER_PROCESSES="4", ARRCOC_ENGINE_PROCESSES="1")["services"]["worker"]["environment"]
    assert w["ARRCOC_WORKER_PROCESSES"] == "4" and w["ARRCOC_ENGINE_PROCESSES"] == "1"
    assert 'os.environ.get("ARRCOC_WORKER_PROCESSES"' in (REPO / "docker" / "healthcheck.py").read_text()


def _docker_ignored(path: str) -> bool:
    """Docker's .dockerignore rule for the patterns we use: the last matching line wins, `!` keeps."""
    import fnmatch

    ignored = False
    for line in (REPO / ".dockerignore").read_text().splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        keep = line.startswith("!")
        pattern = line.lstrip("!").rstrip("/")
        parts = path.split("/")
        prefixes = [
            "/".join(parts[: i + 1]) for i in range(len(parts))
        ]  # a pattern naming a folder covers it
        if any(
            fnmatch.fnmatchcase(p, pattern) or fnmatch.fnmatchcase(p, pattern.replace("**/", ""))
            for p in prefixes
        ):
            ignored = not keep
    return ignored


def test_the_image_carries_the_stored_benchmark_reports():
    reports = sorted(p.name for p in (REPO / "benchmarks").glob("*.json"))
    assert reports, "the repo has stored reports"
    assert not any(_docker_ignored(f"benchmarks/{name}") for name in reports)
    assert _docker_ignored("benchmarks/2026-11-22-h100-texture-e7cbf7c.png") and _docker_ignored(
        "tests/test_compose.py"
    )
    dockerfile = (REPO / "Dockerfile").read_text()
    assert "COPY benchmarks ./benchmarks" in dockerfile and "ln -s /app/benchmarks" in dockerfile


def test_the_readme_says_what_compose_starts():
    readme = (REPO / "README.md").read_text()
    section = readme[readme.index("## Serving with Redis and GPU workers") :]
    section = section[: section.index("\n## ", 3)]
    for fact in (
        "arrcoc-clip-b16",
        "14×14",
        "arrcoc-texture",
        "NVIDIA Container Toolkit",
        "HF_HUB_OFFLINE",
        "HF_HOME",
        "ARRCOC_WORKER_PROCESSES",
        "ARRCOC_ENGINE_PROCESSES",
        "16-core",
        "not measured here",
        "GRADIO_SERVER_PORT",
        "--port",
    ):
        assert fact in section, fact
