from __future__ import annotations

import os
import shutil
import tempfile
import warnings
from pathlib import Path

import numpy as np
import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

EXAMPLES = Path(__file__).resolve().parent.parent / "arrcoc" / "examples"

# The tests' Redis: ARRCOC_TEST_REDIS_URL if set, else the local default (database 13; tests use key
# prefixes and queues of their own). When nothing answers there, the session starts a redis-server of
# its own on a free port and points ARRCOC_TEST_REDIS_URL (read by tests/helpers.py) at it.
TEST_REDIS_ENV = "ARRCOC_TEST_REDIS_URL"
TEST_REDIS_DEFAULT = "redis://127.0.0.1:6379/13"

# The quick lane (`pytest -m quick`, `./scripts/test.sh --quick`): modules that need no worker
# process, browser, compiler, benchmark run or training, less their tests marked `slow` and the few
# below that start a subprocess or run every backend.
QUICK_MODULES = frozenset(
    {
        "test_images",
        "test_texture",
        "test_model",
        "test_layout",
        "test_compose",
        "test_weights",
        "test_fuzz",
        "test_service",
        "test_abuse",
        "test_decode",
        "test_demo_views",
        "test_engine",
        "test_vit",
    }
)
QUICK_EXCLUDED = frozenset(
    {
        "test_inprocess_serves_each_backend_it_is_allowed",  # compiles and exports
        "test_16bit_png_through_arrcoc_infer_at_bounded_memory",  # a CLI subprocess on a large image
    }
)


def _redis_answers(url: str) -> bool:
    import redis

    try:
        return bool(redis.Redis.from_url(url, socket_timeout=1, socket_connect_timeout=1).ping())
    except (redis.ConnectionError, redis.TimeoutError, OSError):
        return False


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "quick: the everyday lane (conftest.py QUICK_MODULES), minutes on 2 cores"
    )
    url = os.environ.get(TEST_REDIS_ENV) or TEST_REDIS_DEFAULT
    os.environ[TEST_REDIS_ENV] = url
    if _redis_answers(url):
        return
    if shutil.which("redis-server") is None:
        warnings.warn(
            f"no Redis answers at {url} and redis-server is not installed: the tests that use "
            "Redis will fail (./scripts/test.sh installs it)",
            stacklevel=1,
        )
        return
    from arrcoc.bench.processes import RedisServer

    workdir = Path(tempfile.mkdtemp(prefix="arrcoc-test-redis-"))
    server = RedisServer(workdir)
    config.stash[_REDIS] = (server, workdir)
    os.environ[TEST_REDIS_ENV] = f"redis://127.0.0.1:{server.port}/13"


def pytest_unconfigure(config: pytest.Config) -> None:
    started = config.stash.get(_REDIS, None)
    if started is not None:
        server, workdir = started
        server.stop()
        shutil.rmtree(workdir, ignore_errors=True)


_REDIS = pytest.StashKey[tuple]()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        name = getattr(item, "originalname", item.name)
        if (
            item.path.stem in QUICK_MODULES
            and name not in QUICK_EXCLUDED
            and item.get_closest_marker("slow") is None
        ):
            item.add_marker(pytest.mark.quick)


@pytest.fixture(scope="session")
def examples_dir() -> Path:
    return EXAMPLES


@pytest.fixture(scope="session")
def query_encoder():
    from arrcoc.query import QueryEncoder

    return QueryEncoder()


@pytest.fixture(scope="session")
def pipeline(query_encoder):
    from arrcoc.pipeline import RelevancePipeline

    return RelevancePipeline("arrcoc-texture", backend="eager", device="cpu", query_encoder=query_encoder)


@pytest.fixture
def rng() -> np.random.Generator:
    return np.random.default_rng(0)
