"""compose.yaml is valid for Debian's docker-compose and says what we promise (no Docker engine here)."""

from __future__ import annotations

import os
import re
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


# The two stacks: the GPU one is compose.yaml with compose.gpu.yaml over it, as .env's COMPOSE_FILE
# says; the CPU one is compose.yaml alone
STACKS = {"gpu": {}, "cpu": {"COMPOSE_FILE": "compose.yaml"}}


def config(stack: str = "gpu", **env: str) -> dict:
    """The stack as docker-compose resolves it, from the files and .env a user's command reads."""
    environ = {k: v for k, v in os.environ.items() if not k.startswith("COMPOSE_")} | STACKS[stack] | env
    out = subprocess.run(
        [COMPOSE, "config"], cwd=REPO, capture_output=True, text=True, timeout=60, env=environ
    )
    assert out.returncode == 0, out.stderr
    return yaml.safe_load(out.stdout)


def seconds(duration: str) -> float:
    """A compose duration ("1m30s", "10s") in seconds."""
    units = {"h": 3600, "m": 60, "s": 1, "ms": 1e-3}
    parts = re.findall(r"(\d+(?:\.\d+)?)(ms|h|m|s)", duration)
    assert parts and "".join(n + u for n, u in parts) == duration, duration
    return sum(float(n) * units[u] for n, u in parts)


def test_compose_config_is_valid_and_complete():
    services = config("gpu")["services"]
    assert set(services) == {"redis", "worker", "demo", "flower"}
    redis = services["redis"]
    cmd = " ".join(redis["command"])
    assert (
        "--appendonly yes" in cmd and "--maxmemory-policy noeviction" in cmd and redis["healthcheck"]["test"]
    )
    gpu = services["worker"]
    devices = gpu["deploy"]["resources"]["reservations"]["devices"]
    assert devices[0]["driver"] == "nvidia" and "gpu" in devices[0]["capabilities"]
    assert gpu["build"]["args"]["EXTRAS"] == "gpu" and not gpu["build"]["args"]["TORCH_INDEX"]
    assert gpu["image"] == "arrcoc:gpu" and gpu["healthcheck"]["test"]
    assert (
        gpu["environment"]["ARRCOC_ENGINE__DEVICE"] == "cuda"
        and gpu["environment"]["ARRCOC_ENGINE__BACKEND"] == "compiled"
    )
    assert {v.split(":")[1] if isinstance(v, str) else v["target"] for v in gpu["volumes"]} == {
        "/cache",
        "/data",
    }
    assert gpu["depends_on"]["redis"]["condition"] == "service_healthy"
    demo = services["demo"]
    assert "7860" in str(demo["ports"][0]) and demo["depends_on"]["redis"]["condition"] == "service_healthy"
    assert demo["environment"]["ARRCOC_SERVICE__BROKER_URL"] == "redis://redis:6379/0"
    assert demo["command"][:2] == ["arrcoc", "demo"]
    flower = services["flower"]
    assert flower["profiles"] == ["flower"] and "--basic-auth" in " ".join(flower["entrypoint"])


def test_the_cpu_stack_has_the_same_services_without_a_gpu():
    """`docker compose restart worker`, `logs demo`, ... name the same services in both stacks."""
    gpu, cpu = config("gpu")["services"], config("cpu")["services"]
    assert set(cpu) == set(gpu) == {"redis", "worker", "demo", "flower"}
    worker = cpu["worker"]
    assert "deploy" not in worker and worker["environment"]["ARRCOC_ENGINE__DEVICE"] == "cpu"
    assert worker["build"]["args"]["EXTRAS"] == "cpu" and "/whl/cpu" in worker["build"]["args"]["TORCH_INDEX"]
    assert worker["image"] == "arrcoc:cpu" and worker["environment"]["ARRCOC_ENGINE__BACKEND"] == "eager"
    for services in (gpu, cpu):  # plain `up` starts them: no profile to name
        assert not any("profiles" in services[name] for name in ("redis", "worker", "demo"))


@pytest.mark.parametrize("stack", STACKS)
def test_each_stack_builds_one_image_that_the_demo_runs_too(stack):
    services = config(stack)["services"]
    assert [name for name, s in services.items() if "build" in s] == ["worker"]
    assert services["demo"]["image"] == services["worker"]["image"] == f"arrcoc:{stack}"


@pytest.mark.parametrize("stack", STACKS)
def test_the_demo_waits_for_a_healthy_worker_and_mounts_the_hub_cache(stack):
    services = config(stack)["services"]
    d, w = services["demo"], services["worker"]
    assert d["depends_on"] == {
        "redis": {"condition": "service_healthy"},
        "worker": {"condition": "service_healthy"},
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


@pytest.mark.parametrize("stack", STACKS)
def test_signals_reach_the_demo_and_the_worker_through_an_init(stack):
    """Under `init: true` PID 1 is Docker's init, which passes `docker stop`'s SIGTERM on: the demo
    closes and exits 0 (tests/test_demo_process.py), the worker finishes its batch."""
    services = config(stack)["services"]
    assert services["demo"]["init"] is True and services["worker"]["init"] is True


@pytest.mark.parametrize("stack", STACKS)
def test_healthchecks_see_a_ready_service_within_seconds(stack):
    """A check every few seconds from the start: a worker is marked healthy seconds after it is
    ready, not at a first check half a minute later; the start period forgives the first
    compile's failures without delaying a success."""
    services = config(stack)["services"]
    worker, demo = services["worker"]["healthcheck"], services["demo"]["healthcheck"]
    for check in (worker, demo):
        assert seconds(check["interval"]) <= 10 and check["retries"] >= 3
    assert seconds(worker["start_period"]) >= 600  # the first start compiles every bucket
    assert seconds(demo["start_period"]) >= 60
    assert demo["test"][-2:] == ["arrcoc-healthcheck", "demo"]  # with a worker: tests/test_demo_process.py


def test_the_worker_healthcheck_expects_as_many_nodes_as_compose_starts():
    for stack in STACKS:
        w = config(stack, ARRCOC_ENGINE__WORKER_PROCESSES="4", ARRCOC_ENGINE__PROCESSES="1")["services"][
            "worker"
        ]
        assert w["environment"]["ARRCOC_ENGINE__WORKER_PROCESSES"] == "4"
        assert w["environment"]["ARRCOC_ENGINE__PROCESSES"] == "1"
    assert (
        'os.environ.get("ARRCOC_ENGINE__WORKER_PROCESSES"' in (REPO / "docker" / "healthcheck.py").read_text()
    )


def test_the_image_build():
    dockerfile = (REPO / "Dockerfile").read_text()
    assert "ARG EXTRAS=gpu" in dockerfile and ".[${EXTRAS},serve,demo]" in dockerfile
    # the compiler stays in both images: Inductor's C++ on the CPU, Triton's launchers on the GPU
    assert "g++" in dockerfile
    import tomllib

    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())
    extras = pyproject["project"]["optional-dependencies"]
    assert any(d.startswith("onnxruntime-gpu") for d in extras["gpu"])
    # an SPDX expression, not the TOML table setuptools stops accepting after 2027-02-18
    assert pyproject["project"]["license"] == "Apache-2.0"
    assert "setuptools>=77" in pyproject["build-system"]["requires"]


def _targets(service: dict) -> dict[str, str]:
    """Mount target -> volume name of a service's named volumes."""
    out = {}
    for v in service.get("volumes", []):
        source, target = v.split(":")[:2] if isinstance(v, str) else (v.get("source"), v["target"])
        out[target] = source
    return out


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
        "ARRCOC_ENGINE__WORKER_PROCESSES",
        "ARRCOC_ENGINE__PROCESSES",
        "16-core",
        "not measured here",
        "GRADIO_SERVER_PORT",
        "--port",
    ):
        assert fact in section, fact
    # the CPU stack is named where the commands are, and how a command picks it
    assert "COMPOSE_FILE=compose.yaml docker compose up --build" in section
    assert "could not select device driver" in section


def test_every_compose_command_in_the_readme_names_services_of_both_stacks():
    """A command such as `docker compose restart worker` does the same in both stacks, and none
    picks a stack by a profile that no longer exists."""
    readme = (REPO / "README.md").read_text()
    commands = re.findall(r"docker\s+compose\s+([a-z]+)((?:\s+[a-z][a-z-]*)*)", readme)
    assert commands
    services = {stack: set(config(stack)["services"]) for stack in STACKS}
    named = [(verb, name) for verb, names in commands for name in names.split()]
    assert ("restart", "worker") in named
    for verb, name in named:
        assert all(name in s for s in services.values()), (verb, name)
    assert not re.search(r"COMPOSE_PROFILES=\S*(cpu|gpu)", readme)
