"""Engine backends: parity with eager on photos and random inputs at every bucket, buckets,
no recompiles while serving, caches. On CPU the compiled backend compiles buckets 1 and 2 only."""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest
import torch

from arrcoc.bench.parity import MIN_OVERLAP_BF16, TOL, compare, photo_batch, random_queries
from arrcoc.engine import create_backend
from arrcoc.engine.base import example_inputs
from arrcoc.engine.buckets import BucketTable
from arrcoc.errors import EngineError
from arrcoc.registry import create_model

CACHE = Path(tempfile.gettempdir()) / "arrcoc-test-engine-cache"
CPU = torch.device("cpu")
BUCKETS = (1, 2)


def seeded_model(name: str = "arrcoc-texture"):
    torch.manual_seed(0)
    return create_model(name, None, "cpu")


@pytest.fixture(scope="module")
def model():
    return seeded_model()


@pytest.fixture(scope="module")
def eager(model):
    be = create_backend("eager", model, CPU, BUCKETS)
    be.warmup()
    return be


def warmed(name, model):
    be = create_backend(name, model, CPU, BUCKETS, cache_dir=CACHE / name)
    be.warmup()
    yield be
    be.close()


@pytest.fixture(scope="module")
def compiled(model):
    yield from warmed("compiled", model)


@pytest.fixture(scope="module")
def onnx(model):
    yield from warmed("onnx", model)


def test_bucket_table_maps_every_size_and_splits():
    t = BucketTable((8, 1, 2, 4))
    assert t.buckets == (1, 2, 4, 8)
    assert [t.bucket_for(n) for n in range(1, 9)] == [1, 2, 4, 4, 8, 8, 8, 8]
    assert t.bucket_for(100) == 8
    assert t.split(3) == [(0, 3, 4)]
    assert t.split(19) == [(0, 8, 8), (8, 16, 8), (16, 19, 4)]
    with pytest.raises(EngineError):
        t.bucket_for(0)
    with pytest.raises(EngineError):
        BucketTable(())


def test_unknown_backend_and_run_before_warmup(model):
    with pytest.raises(EngineError, match="Unknown backend"):
        create_backend("tensorrt", model, CPU)
    be = create_backend("compiled", model, CPU, BUCKETS)
    with pytest.raises(EngineError, match="warm"):
        be.run(*example_inputs(model, 1, CPU))


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["compiled", "onnx"])
@pytest.mark.parametrize("kind", ["photos", "random"])
@pytest.mark.parametrize("batch", [1, 2, 3])  # every bucket, and 3 = a split (2 + 1 padded to 1)
def test_parity_with_eager(request, eager, model, backend, kind, batch):
    be = request.getfixturevalue(backend)
    if kind == "photos":
        images = photo_batch(model.config.image_size, batch, CPU)
    else:
        images = example_inputs(model, batch, CPU, seed=11)[0]
    query = random_queries(batch, model.config.query_dim, CPU, seed=batch)
    controls = model.default_controls(batch)
    ref = eager.run(images, query, controls)
    out = be.run(images, query, controls)
    assert out.relevance.shape == (batch, 32, 32) and out.order.dtype == torch.int64
    c = compare(ref, out, controls)
    assert c["finite"]
    assert c["max_abs_diff"] <= TOL[torch.float32], c["diff_by_map"]
    assert c["topk_agreement_ties"] == 1.0
    assert c["texture_max_diff"] <= 1e-4


@pytest.mark.slow
def test_serving_never_recompiles(compiled, model):
    """A stray shape is an EngineError, not a silent compile."""
    before = compiled.recompiles
    compiled.run(*example_inputs(model, 2, CPU, seed=3))
    assert compiled.recompiles == before == 0
    with pytest.raises(EngineError, match="compile"):  # batch 3 is no bucket: the stance refuses it
        compiled._guarded(*example_inputs(model, 3, CPU))
    with pytest.raises(EngineError, match="uint8 images"):
        compiled.run(torch.randint(1, 255, (1, 3, 256, 256), dtype=torch.uint8), *example_inputs(model, 1, CPU)[1:])
    assert compiled.recompiles == 0


@pytest.mark.slow
def test_onnx_export_is_cached(onnx, model):
    again = create_backend("onnx", model, CPU, BUCKETS, cache_dir=CACHE / "onnx")
    again.warmup()
    assert again.onnx_path == onnx.onnx_path and again.stats["export_s"] < 2.0
    x = example_inputs(model, 2, CPU, seed=4)
    assert torch.equal(again.run(*x).relevance, onnx.run(*x).relevance)


def test_onnx_refuses_bf16(model):
    with pytest.raises(EngineError, match="float32"):
        create_backend("onnx", model, CPU, BUCKETS, torch.bfloat16)


def test_bf16_within_its_stated_tolerance(eager, model):
    """bfloat16 (autocast) against float32: maps within TOL[bf16], most selected cells shared."""
    be = create_backend("eager", model, CPU, BUCKETS, torch.bfloat16)
    be.warmup()
    images = photo_batch(model.config.image_size, 2, CPU)
    query = random_queries(2, model.config.query_dim, CPU)
    controls = model.default_controls(2)
    ref, out = eager.run(images, query, controls), be.run(images, query, controls)
    c = compare(ref, out, controls)
    assert c["finite"] and c["max_abs_diff"] <= TOL[torch.bfloat16], c["diff_by_map"]
    for i in range(2):
        shared = set(ref.order[i, :200].tolist()) & set(out.order[i, :200].tolist())
        assert len(shared) >= MIN_OVERLAP_BF16 * 200


@pytest.mark.slow
def test_pipeline_serves_through_compiled_backend(compiled, eager, examples_dir, query_encoder):
    from arrcoc.pipeline import RelevancePipeline

    photo = sorted(examples_dir.glob("*.jpg"))[0]
    a = RelevancePipeline("arrcoc-texture", backend=compiled, query_encoder=query_encoder).infer(photo, "a cat")[0]
    b = RelevancePipeline("arrcoc-texture", backend=eager, query_encoder=query_encoder).infer(photo, "a cat")[0]
    assert a.backend == "compiled" and a.bucket == 1
    assert abs(a.relevance - b.relevance).max() <= 1e-3
    assert set(a.selected.tolist()) == set(b.selected.tolist())


@pytest.mark.slow
def test_cli_infer_with_onnx_backend(tmp_path, examples_dir, monkeypatch, capsys):
    import json

    from arrcoc.cli import main
    from arrcoc.settings import get_settings

    monkeypatch.setenv("ARRCOC_CACHE_DIR", str(CACHE / "cli"))
    get_settings.cache_clear()
    out = tmp_path / "r.json"
    photo = sorted(examples_dir.glob("*.jpg"))[0]
    try:
        assert main(["infer", str(photo), "-q", "the cat", "--backend", "onnx", "--device", "cpu", "--json", str(out)]) == 0
    finally:
        get_settings.cache_clear()
    doc = json.loads(out.read_text())
    assert doc["backend"] == "onnx" and len(doc["selected"]) == 200


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("backend", ["compiled", "onnx"])
def test_cuda_graph_backends_match_eager_on_gpu(backend):
    """On a GPU: one CUDA graph per bucket, padded and split batches, parity, no recompiles."""
    if backend == "onnx":
        ort = pytest.importorskip("onnxruntime")
        if "CUDAExecutionProvider" not in ort.get_available_providers():
            pytest.skip("onnxruntime-gpu is not installed")
    cuda = torch.device("cuda")
    model = seeded_model().to(cuda)
    ref = create_backend("eager", model, cuda, (1, 2, 4))
    be = create_backend(backend, model, cuda, (1, 2, 4), cache_dir=CACHE / f"gpu-{backend}")
    be.warmup()
    if backend == "compiled":
        assert sorted(be.graphs.graphs) == [1, 2, 4]
    for batch in (1, 3, 4, 9):  # 3 pads to 4; 9 splits into 4 + 4 + 1
        images = photo_batch(model.config.image_size, batch, cuda)
        query = random_queries(batch, model.config.query_dim, cuda, seed=batch)
        controls = model.default_controls(batch, cuda)
        c = compare(ref.run(images, query, controls), be.run(images, query, controls), controls)
        assert c["max_abs_diff"] <= TOL[torch.float32] and c["topk_agreement_ties"] == 1.0, c
    if backend == "compiled":
        assert be.recompiles == 0
    be.close()


def test_onnx_keeps_small_epsilons_on_flat_images(eager, onnx, model):
    """Regression: the ONNX exporter folded `+ 1e-8` away as adding zero, so on flat regions the
    edge magnitude (and every map after it) differed from eager by up to 1e-3."""
    images = torch.full((1, 3, 512, 512), 90, dtype=torch.uint8)
    images[:, :, :, 300:] = 200  # one vertical edge; everything else is perfectly flat
    query = random_queries(1, model.config.query_dim, CPU, seed=3)
    ref, out = eager.run(images, query), onnx.run(images, query)
    assert torch.isfinite(out.texture).all()
    assert (ref.texture - out.texture).abs().max() <= 1e-5
    assert (ref.relevance - out.relevance).abs().max() <= 1e-4
