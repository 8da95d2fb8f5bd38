"""Test helpers: small deterministic inputs, seeded weights, the same-result check, and a test
module's own worker settings on the test Redis."""

from __future__ import annotations

import contextlib
import io
import uuid
import zipfile
from collections.abc import Iterator
from pathlib import Path

import numpy as np
from PIL import Image


def png_bytes(seed: int, size: int = 48) -> bytes:
    rng = np.random.default_rng(seed)
    arr = (rng.random((size, size, 3)) * 255).astype(np.uint8)
    buf = io.BytesIO()
    Image.fromarray(arr).save(buf, "PNG")
    return buf.getvalue()


def make_zip(files: dict[str, bytes]) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as zf:
        for name, data in files.items():
            zf.writestr(name, data)
    return buf.getvalue()


def seeded_weights(path: Path, variant: str = "arrcoc-texture", seed: int = 0) -> Path:
    """A deterministic weights file, so separate processes build the same model."""
    import torch

    from arrcoc.registry import create_model
    from arrcoc.weights import save_weights

    torch.manual_seed(seed)
    save_weights(create_model(variant, None, "cpu"), path, variant, f"test-seed{seed}")
    return path


def assert_same_result(a, b) -> None:
    """Two RelevanceResults for the same request are the same answer (its JSON and its texture),
    whichever path served them: only the timings and the bucket may differ."""
    ja, jb = a.to_json(), b.to_json()
    for key in ("timings_ms", "bucket"):
        ja.pop(key, None), jb.pop(key, None)
    assert ja == jb
    assert np.array_equal(a.texture, b.texture)


BROKER = "redis://127.0.0.1:6379/13"  # the tests' Redis database


@contextlib.contextmanager
def worker_settings(root: Path, prefix: str, **extra: str) -> Iterator[dict[str, str]]:
    """ARRCOC_* settings (as strings) for a test module's worker: seeded weights, a Redis key
    prefix and queues of its own, whose keys are deleted afterwards; `extra` adds or overrides."""
    tag = uuid.uuid4().hex[:8]
    settings = {"weights": str(seeded_weights(root / "w.safetensors")), "redis_prefix": f"{prefix}-{tag}",
                "queue_gpu": f"gpu-{tag}", "queue_bench": f"bench-{tag}"} | extra  # fmt: skip
    try:
        yield settings
    finally:
        import redis

        r = redis.Redis.from_url(BROKER)
        keys = [k for pat in (f"{prefix}-{tag}:*", f"*{tag}*") for k in r.scan_iter(pat)]
        if keys:
            r.delete(*keys)
