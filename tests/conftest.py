from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

EXAMPLES = Path(__file__).resolve().parent.parent / "arrcoc" / "examples"


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
