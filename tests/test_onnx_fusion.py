"""ORT's transformer fusions on the onnx backend's export (engine/ort_fusion.py, issue 14): they
fire on the CLIP tower's dynamo graph, are the CLIP default, cached under a key of their own, and
keep the float32 parity rule against eager on the CPU provider.

A small random tower (64 wide, 3 layers: two full blocks, then MaskCLIP's value path) keeps the
export short; the real shapes' node counts and parity are in BENCHMARKS.md (CPU) and
tools/gpu_engines.sh ortfuse (the CUDA provider's kernels).
"""

from __future__ import annotations

import onnx
import pytest
import torch

from arrcoc.bench.parity import TOL, compare, photo_batch, random_queries
from arrcoc.clip import ClipModelConfig, build_clip
from arrcoc.engine import create_backend
from arrcoc.engine.onnx import default_fusions
from arrcoc.engine.ort_fusion import Fusions, fused_path, op_counts
from arrcoc.errors import EngineError
from arrcoc.model import ArrcocTexture

pytest.importorskip("onnxruntime")
CPU = torch.device("cpu")
BUCKETS = (1, 2)
TINY = ClipModelConfig(hidden=64, heads=2, layers=3, mlp=128, query_dim=32)
FULL_BLOCKS = TINY.layers - 1  # the last block is MaskCLIP's value path: no attention, no MLP


@pytest.fixture(scope="module")
def model():
    m = build_clip(TINY, None)
    m.variant_name = "arrcoc-clip-fusion-test"
    return m


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return tmp_path_factory.mktemp("onnx-fusion")


@pytest.fixture(scope="module")
def eager(model):
    be = create_backend("eager", model, CPU, BUCKETS)
    be.warmup()
    return be


@pytest.fixture(scope="module")
def fused(model, cache):
    be = create_backend("onnx", model, CPU, BUCKETS, cache_dir=cache)  # CLIP: fused by default
    be.warmup()
    yield be
    be.close()


def test_clip_fuses_by_default_texture_does_not(model):
    assert default_fusions(model) == Fusions.ALL
    assert default_fusions(ArrcocTexture()) == Fusions.NONE


def test_the_fusions_fire(fused, cache, model):
    assert fused.fusions == Fusions.ALL and "-fuseall-" in fused.onnx_path.name
    plain = create_backend("onnx", model, CPU, BUCKETS, cache_dir=cache, fusions="none")
    plain.warmup()
    try:
        before = op_counts(onnx.load(str(plain.onnx_path), load_external_data=False))
        after = op_counts(onnx.load(str(fused.onnx_path), load_external_data=False))
    finally:
        plain.close()
    assert plain.onnx_path != fused.onnx_path and "fuse" not in plain.onnx_path.name
    assert (before["Attention"], before["SkipLayerNormalization"], before["QuickGelu"]) == (0, 0, 0)
    # per full block: one Attention, one QuickGelu, two residual + layer norms fused
    assert after["Attention"] == after["QuickGelu"] == FULL_BLOCKS
    assert after["SkipLayerNormalization"] >= 2 * FULL_BLOCKS - 1
    # the texture maps' nodes stay; each block loses ~25 (596 -> 306 nodes for clip-b16 at batch 1)
    assert (
        after["Softmax"] < before["Softmax"]
        and sum(before.values()) - sum(after.values()) >= 20 * FULL_BLOCKS
    )
    counts = fused.stats["fused"]["dyn"]
    assert counts["attention"] == counts["quick_gelu"] == FULL_BLOCKS


def test_fused_matches_eager(fused, eager, model):
    for batch in (1, 2, 3):  # every bucket, and 3 = a split (2 + 1)
        images = photo_batch(224, batch, CPU)
        query = random_queries(batch, TINY.query_dim, CPU, seed=batch)
        controls = model.default_controls(batch)
        c = compare(eager.run(images, query, controls), fused.run(images, query, controls), controls)
        assert c["finite"] and c["max_abs_diff"] <= TOL[torch.float32], c["diff_by_map"]
        assert c["topk_agreement_ties"] == 1.0 and c["texture_max_diff"] <= 1e-4


def test_the_fused_file_is_cached_and_keyed(fused, cache, model, monkeypatch):
    again = create_backend("onnx", model, CPU, BUCKETS, cache_dir=cache)
    again.warmup()
    assert again.onnx_path == fused.onnx_path and "fused" not in again.stats  # loaded, not fused again
    again.close()
    exported = fused.onnx_path.with_name(fused.onnx_path.name.split("-fuseall-")[0] + ".onnx")
    assert exported.is_file() and fused_path(exported, Fusions.ALL) == fused.onnx_path
    assert fused_path(exported, Fusions.NORM) != fused.onnx_path
    import onnxscript

    monkeypatch.setattr(onnxscript, "__version__", onnxscript.__version__ + ".other")
    assert fused_path(exported, Fusions.ALL) != fused.onnx_path  # another rewriter: another file


def test_unknown_fusions_are_refused(model):
    with pytest.raises(EngineError, match="fusions"):
        create_backend("onnx", model, CPU, BUCKETS, fusions="everything")


def test_a_failed_fusion_falls_back_only_by_default(model, cache, monkeypatch):
    import arrcoc.engine.onnx as onnx_backend

    def broken(src, dst, fusions):
        raise RuntimeError("no such pass")

    monkeypatch.setattr(onnx_backend, "fused_path", lambda p, f: p.with_name(f"never-{f.value}-{p.name}"))
    monkeypatch.setattr(onnx_backend, "fuse_onnx", broken)
    be = create_backend("onnx", model, CPU, BUCKETS, cache_dir=cache)
    be.warmup()  # the default: the plain export, said so in the stats
    assert be.fusions == Fusions.NONE and be.stats["fusions"].startswith("none (fusing failed")
    assert "fuse" not in be.onnx_path.name
    be.close()
    with pytest.raises(EngineError, match="no such pass"):  # asked for: an error, not a silent slow run
        create_backend("onnx", model, CPU, BUCKETS, cache_dir=cache, fusions="all").warmup()
