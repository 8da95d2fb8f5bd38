"""Test helpers: small deterministic inputs, seeded weights, the same-result check, and a test
module's own worker settings on the test Redis."""

from __future__ import annotations

import contextlib
import io
import os
import time
import uuid
import zipfile
from collections.abc import Iterator, Mapping
from pathlib import Path

import numpy as np
from PIL import Image


def png_bytes(seed: int, size: int = 48) -> bytes:
    rng = np.random.default_rng(seed)
    arr = (rng.random((size, size, 3)) * 255).astype(np.uint8)
    buf = io.BytesIO()
    Image.fromarray(arr).save(buf, "PNG")
    return buf.getvalue()


def make_zip(files: dict[str, bytes], compression: int = zipfile.ZIP_DEFLATED) -> bytes:
    """A zip of `files`; ZIP_STORED keeps them as they are, as zip tools keep photos (a job reads
    such entries in place, from the archive)."""
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", compression) as zf:
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


MAP_ATOL = 1e-5  # maps, scores and weights: float32 kernels may sum in another order per batch size


def _differences(a, b, path: str = "") -> Iterator[tuple[str, float | str]]:
    """Where two JSON documents differ: (key path, largest |difference| or what differs). Floats
    differ only beyond MAP_ATOL; integers (cell indices, budgets), strings and shapes must be equal."""
    if isinstance(a, dict) and isinstance(b, dict):
        if a.keys() != b.keys():
            yield path or "/", f"keys {sorted(a.keys() ^ b.keys())}"
        for key in a.keys() & b.keys():
            yield from _differences(a[key], b[key], f"{path}/{key}")
    elif isinstance(a, list) and isinstance(b, list):
        if len(a) != len(b):
            yield path, f"length {len(a)} != {len(b)}"
            return
        xa, xb = np.asarray(a, dtype=object), np.asarray(b, dtype=object)
        if all(isinstance(v, float) for v in np.ravel(xa)) and all(
            isinstance(v, float) for v in np.ravel(xb)
        ):
            diff = float(np.max(np.abs(np.asarray(a, float) - np.asarray(b, float)), initial=0.0))
            if diff > MAP_ATOL:
                yield path, diff
            return
        for i, (va, vb) in enumerate(zip(a, b, strict=True)):
            yield from _differences(va, vb, f"{path}[{i}]")
    elif isinstance(a, float) and isinstance(b, float | int) or isinstance(b, float) and isinstance(a, int):
        if abs(a - b) > MAP_ATOL:
            yield path, abs(a - b)
    elif a != b:
        yield path, f"{a!r} != {b!r}"


def _order_near_ties_alike(ja: dict, jb: dict) -> None:
    """Two selected cells whose relevance differs by at most MAP_ATOL have no order between them:
    where b lists such a neighbouring pair the other way round from a, b's selection lists
    (cells, budgets, boxes) take a's order. Any other difference stays for the comparison."""
    sel_a, sel_b = ja.get("selected"), jb.get("selected")
    if not sel_a or not sel_b or len(sel_a) != len(sel_b) or "relevance" not in ja:
        return
    rel = np.asarray(ja["relevance"], float).ravel()
    order = list(range(len(sel_b)))
    i = 0
    while i < len(sel_a) - 1:
        x, y = sel_a[i], sel_a[i + 1]
        if (sel_b[order[i]], sel_b[order[i + 1]]) == (y, x) and abs(rel[x] - rel[y]) <= MAP_ATOL:
            order[i], order[i + 1] = order[i + 1], order[i]
            i += 2
        else:
            i += 1
    for key in ("selected", "budgets", "selected_boxes"):
        if isinstance(jb.get(key), list) and len(jb[key]) == len(order):
            jb[key] = [jb[key][j] for j in order]


def assert_same_result(a, b, exact: bool = False) -> None:
    """Two RelevanceResults for the same request are the same answer (its JSON and its texture),
    whichever path served them: only the timings and the bucket may differ. Floats agree within
    MAP_ATOL (a batch of 4 and a batch of 1 may take different CPU kernels); cell indices and
    budgets exactly. `exact` asks for bit-for-bit equality, where the design makes it true (the same
    request through the same batch size: docs/architecture.md)."""
    ja, jb = a.to_json(), b.to_json()
    for key in ("timings_ms", "bucket"):
        ja.pop(key, None), jb.pop(key, None)
    if exact:
        assert ja == jb, f"not bit-exact: {list(_differences(ja, jb))[:5] or 'float bits differ'}"
        assert np.array_equal(a.texture, b.texture)
        return
    _order_near_ties_alike(ja, jb)
    diffs = list(_differences(ja, jb))
    assert not diffs, "results differ: " + ", ".join(f"{k}: {v}" for k, v in diffs[:8])
    tex = float(np.max(np.abs(np.asarray(a.texture, float) - np.asarray(b.texture, float)), initial=0.0))
    assert tex <= MAP_ATOL, f"results differ: texture by {tex}"


BROKER = os.environ["ARRCOC_TEST_REDIS_URL"]  # the tests' Redis database: conftest.py finds or starts it


def merged(*groups: Mapping[str, Mapping[str, object]]) -> dict[str, dict[str, object]]:
    """Settings by group (as Settings.replace and worker_env take them) merged group by group, the
    later ones winning: merged({"engine": {"device": "cpu"}}, {"engine": {"backend": "onnx"}})."""
    out: dict[str, dict[str, object]] = {}
    for g in groups:
        for name, fields in g.items():
            out[name] = out.get(name, {}) | dict(fields)
    return out


@contextlib.contextmanager
def worker_settings(
    root: Path, prefix: str, **extra: Mapping[str, object]
) -> Iterator[dict[str, dict[str, object]]]:
    """Settings by group for a test module's worker (worker_env turns them into ARRCOC_ variables,
    default_settings into the same Settings): seeded weights, a Redis key prefix and queues of its
    own, whose keys are deleted afterwards; `extra` (groups) adds or overrides."""
    tag = uuid.uuid4().hex[:8]
    settings = merged(
        {
            "engine": {"weights": str(seeded_weights(root / "w.safetensors"))},
            "service": {
                "redis_prefix": f"{prefix}-{tag}",
                "queue_gpu": f"gpu-{tag}",
                "queue_bench": f"bench-{tag}",
            },
        },
        extra,
    )
    try:
        yield settings
    finally:
        import redis

        r = redis.Redis.from_url(BROKER)
        keys = [k for pat in (f"{prefix}-{tag}:*", f"*{tag}*") for k in r.scan_iter(pat)]
        if keys:
            r.delete(*keys)


def wait_for(predicate, timeout: float, what: str, every: float = 0.2):
    """predicate()'s first truthy value, polled every `every` s; AssertionError naming `what` after
    `timeout` s."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        value = predicate()
        if value:
            return value
        time.sleep(every)
    raise AssertionError(f"not within {timeout} s: {what}")


def result_rows(zf: zipfile.ZipFile) -> list[dict]:
    """A results zip's rows (results.parquet without the maps), each with `ok` as its status says."""
    import pyarrow.parquet as pq

    table = pq.read_table(
        io.BytesIO(zf.read("results.parquet")),
        columns=["index", "file", "query", "status", "error", "overlay", "match_score"],
    )
    return [r | {"ok": r["status"] == "ok"} for r in table.to_pylist()]
