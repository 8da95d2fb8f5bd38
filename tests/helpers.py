"""Test helpers: small deterministic inputs, seeded weights, and the same-result check."""

from __future__ import annotations

import io
import zipfile
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
