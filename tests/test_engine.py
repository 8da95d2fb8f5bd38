"""Engine backends: parity with eager on photos and random inputs at every bucket, buckets,
no recompiles while serving, caches. On CPU the compiled backend compiles buckets 1 and 2 only
(1, 2 and 4 once, for its shared dynamic-batch program); the aot backend builds bucket 1 only
(an AOTInductor C++ build takes about 90 s on two cores)."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import numpy as np
import pytest
import torch

from arrcoc.bench.parity import MIN_OVERLAP_BF16, TOL, compare, photo_batch, random_queries
from arrcoc.engine import create_backend
from arrcoc.engine.base import example_inputs
from arrcoc.engine.buckets import BucketTable
from arrcoc.engine.cuda_graph import ROW_ALIGN, RowLayout
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


def test_packed_rows_give_back_every_output_as_it_was():
    """A CUDA graph packs its outputs' rows into one byte buffer, so a batch comes to the host in
    one copy; unpacked, each output is what it was: dtype, shape, every value (odd sizes padded)."""
    gen = torch.Generator().manual_seed(0)
    outputs = (
        torch.rand(5, 4, 4, generator=gen),
        torch.rand(5, 3, generator=gen),
        torch.randint(-(2**40), 2**40, (5, 7), generator=gen),
        torch.rand(5, generator=gen),
        torch.randint(0, 400, (5, 2, 3), generator=gen, dtype=torch.int64).float()[:, :, :2],
    )
    layout = RowLayout.of(outputs)
    packed = layout.pack(outputs)
    assert packed.dtype == torch.uint8 and packed.shape == (5, layout.row_bytes)
    assert all(f.offset % ROW_ALIGN == 0 for f in layout.fields)
    for n in (5, 2):  # a batch padded to its bucket: the real rows only
        got = layout.unpack(packed[:n].numpy())
        for g, t in zip(got, outputs, strict=True):
            assert g.dtype == t.numpy().dtype and g.shape == (n, *t.shape[1:])
            assert np.array_equal(g, t[:n].numpy())


def test_float32_means_ieee_float32():
    """cuDNN's TF32 convolutions (PyTorch's default) put eager 1.4e-3 off ONNX Runtime on clip-b16."""
    from arrcoc.engine import exact_float32

    saved = torch.backends.cudnn.allow_tf32
    try:
        torch.backends.cudnn.allow_tf32 = True
        exact_float32()
        assert torch.backends.cudnn.allow_tf32 is False and torch.backends.cuda.matmul.allow_tf32 is False
    finally:
        torch.backends.cudnn.allow_tf32 = saved


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
        compiled.run(
            torch.randint(1, 255, (1, 3, 256, 256), dtype=torch.uint8), *example_inputs(model, 1, CPU)[1:]
        )
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
    a = RelevancePipeline("arrcoc-texture", backend=compiled, query_encoder=query_encoder).infer(
        photo, "a cat"
    )[0]
    b = RelevancePipeline("arrcoc-texture", backend=eager, query_encoder=query_encoder).infer(photo, "a cat")[
        0
    ]
    assert a.backend == "compiled" and a.bucket == 1
    assert abs(a.relevance - b.relevance).max() <= 1e-3
    assert set(a.selected.tolist()) == set(b.selected.tolist())


@pytest.mark.slow
def test_cli_infer_with_onnx_backend(tmp_path, examples_dir, monkeypatch, capsys):
    import json

    from arrcoc.cli import main
    from arrcoc.settings import get_settings

    monkeypatch.setenv("ARRCOC_SERVICE__CACHE_DIR", str(CACHE / "cli"))
    get_settings.cache_clear()
    out = tmp_path / "r.json"
    photo = sorted(examples_dir.glob("*.jpg"))[0]
    try:
        assert (
            main(
                [
                    "infer",
                    str(photo),
                    "-q",
                    "the cat",
                    "--backend",
                    "onnx",
                    "--device",
                    "cpu",
                    "--json",
                    str(out),
                ]
            )
            == 0
        )
    finally:
        get_settings.cache_clear()
    doc = json.loads(out.read_text())
    assert doc["backend"] == "onnx" and len(doc["selected"]) == 200


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("backend", ["compiled", "onnx", "aot"])
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
    if backend in ("compiled", "aot"):
        assert sorted(be.graphs.graphs) == [1, 2, 4]
    for batch in (1, 3, 4, 9):  # 3 pads to 4; 9 splits into 4 + 4 + 1
        images = photo_batch(model.config.image_size, batch, cuda)
        query = random_queries(batch, model.config.query_dim, cuda, seed=batch)
        controls = model.default_controls(batch, cuda)
        c = compare(ref.run(images, query, controls), be.run(images, query, controls), controls)
        assert c["max_abs_diff"] <= TOL[torch.float32] and c["topk_agreement_ties"] == 1.0, c
        # what servers call: the outputs on the host (one packed copy from a graph), inputs from the host
        on_host = be.run_host(images.cpu(), query.cpu(), controls.cpu())
        for name, got, want in zip(on_host._fields, on_host, be.run(images, query, controls), strict=True):
            assert isinstance(got, np.ndarray) and np.array_equal(got, want.cpu().numpy()), name
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


# -- aot: AOTInductor packages ------------------------------------------------------------------
AOT_CACHE = CACHE / "aot"  # the bench test's aot run finds the same package here


@pytest.fixture(scope="module")
def aot(model):
    be = create_backend("aot", model, CPU, (1,), cache_dir=AOT_CACHE)
    be.warmup()
    yield be
    be.close()


def perturbed(model):
    """The same variant with one weight changed: a new weights fingerprint."""
    other = seeded_model()
    with torch.no_grad():
        next(other.parameters()).add_(0.01)
    return other


def test_aot_is_a_registered_backend():
    from arrcoc.settings import BACKENDS

    assert "aot" in BACKENDS


def test_aot_key_names_everything_a_package_depends_on(model):
    from arrcoc.engine.aot import KEY_FIELDS, key_mismatch, package_key

    key = package_key(model, 4, torch.float32, CPU)
    assert set(KEY_FIELDS) == set(key) and key["batch"] == "4" and key["torch"] == torch.__version__
    assert key["variant"] == "arrcoc-texture" and key["device"].startswith("cpu")
    assert package_key(perturbed(model), 4, torch.float32, CPU)["fingerprint"] != key["fingerprint"]
    assert key_mismatch(key, {**key, "torch": "2.0.0"}) == [f"torch: '2.0.0' != {torch.__version__!r}"]


def test_aot_builds_with_a_compiler_that_links_the_shared_libstdcxx(tmp_path):
    """A compiler that only has a static libstdc++ is passed over (its wrapper.so crashed while
    loading on the H100), and the chosen one goes to Inductor's settings."""
    from arrcoc.engine.aot import _configs, shared_runtime_cxx

    static_only = tmp_path / "static-g++"  # answers -print-file-name as a static-only GCC does
    static_only.write_text("#!/bin/sh\necho libstdc++.so\n")
    static_only.chmod(0o755)
    chosen = shared_runtime_cxx((str(static_only), "g++"))
    assert chosen is not None and chosen != str(static_only) and Path(chosen).name == "g++"
    assert shared_runtime_cxx((str(static_only),)) is None
    assert _configs({"variant": "x"}, CPU)["cpp.cxx"][1] == shared_runtime_cxx()


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["photos", "random"])
def test_aot_parity_with_eager(aot, eager, model, kind):
    """Bucket 1, and batch 3 split into three calls of the bucket-1 package."""
    for batch in (1, 3):
        images = (
            photo_batch(model.config.image_size, batch, CPU)
            if kind == "photos"
            else example_inputs(model, batch, CPU, seed=11)[0]
        )
        query = random_queries(batch, model.config.query_dim, CPU, seed=batch)
        controls = model.default_controls(batch)
        ref, out = eager.run(images, query, controls), aot.run(images, query, controls)
        assert out._fields == ref._fields and all(a.shape == b.shape for a, b in zip(out, ref, strict=True))
        c = compare(ref, out, controls)
        assert c["finite"] and c["max_abs_diff"] <= TOL[torch.float32], c["diff_by_map"]
        assert c["topk_agreement_ties"] == 1.0 and c["texture_max_diff"] <= 1e-4


@pytest.mark.slow
def test_aot_package_is_reused_not_rebuilt(aot, model):
    again = create_backend("aot", model, CPU, (1,), cache_dir=AOT_CACHE, build=False)
    again.warmup()  # build=False: it would raise if the package were not found and current
    assert again.built == [] and again.stats["build_s"] == 0.0 and again.stats["load_s"] < 10
    x = example_inputs(model, 1, CPU, seed=4)
    assert torch.equal(again.run(*x).relevance, aot.run(*x).relevance)
    again.close()


@pytest.mark.slow
def test_aot_stale_package_is_rebuilt_never_loaded(aot, model, monkeypatch):
    """New weights: the package on disk is stale. build=False refuses it; build=True hands it to
    the builder before anything is loaded."""
    import arrcoc.engine.aot as aot_mod

    other = perturbed(model)
    strict = create_backend("aot", other, CPU, (1,), cache_dir=AOT_CACHE, build=False)
    with pytest.raises(EngineError, match=r"fingerprint.*arrcoc compile"):
        strict.warmup()
    asked, loaded = [], []
    monkeypatch.setattr(aot_mod, "build_packages", lambda jobs, *a, **k: asked.extend(jobs) or {})
    monkeypatch.setattr(aot_mod.AotBackend, "_load", lambda self, path, key: loaded.append(path))
    be = create_backend("aot", other, CPU, (1,), cache_dir=AOT_CACHE)
    be.prepare()
    assert [r for r, _, _ in asked] == [(1, 1)] and asked[0][2]["fingerprint"] != aot.keys()[(1, 1)][
        "fingerprint"
    ]
    assert loaded == []


@pytest.mark.slow
def test_aot_package_whose_own_key_differs_is_refused(aot, model, tmp_path):
    """A package copied in under another model's name (its key file edited to match) is not run:
    the key inside the package decides."""
    import shutil

    from arrcoc.engine.aot import package_key, package_path

    other = perturbed(model)
    key = package_key(other, 1, torch.float32, CPU)
    src = package_path(aot.root, aot.keys()[(1, 1)])
    dst = package_path(tmp_path / "aot", key)
    dst.parent.mkdir(parents=True)
    shutil.copy(src, dst)
    dst.with_suffix(".json").write_text(json.dumps(key))
    be = create_backend("aot", other, CPU, (1,), cache_dir=tmp_path, build=False)
    with pytest.raises(EngineError, match="built for another model or machine"):
        be.warmup()


def test_aot_programs_and_no_build_error(model, tmp_path):
    """Buckets 1..8: two programs (1, and a dynamic 2-8); without packages and with build=False,
    an error that says how to build them."""
    be = create_backend("aot", model, CPU, (1, 2, 4, 8), cache_dir=tmp_path, build=False)
    assert be.programs() == {(1, 1): (1,), (2, 8): (2, 4, 8)}
    assert create_backend("aot", model, CPU, (1, 2, 4), dynamic_batch=False).programs() == {
        (1, 1): (1,),
        (2, 2): (2,),
        (4, 4): (4,),
    }
    with pytest.raises(EngineError, match=r"batch 1 .*missing.*arrcoc compile --backend aot"):
        be.warmup()


# -- compiled: fewer programs, portable artefacts ------------------------------------------------


@pytest.mark.slow
def test_compiled_shares_one_dynamic_program_across_buckets(eager, model, tmp_path):
    """Buckets 1, 2, 4: two programs (1, and one dynamic batch for 2 and 4), every bucket served
    with no recompile, parity with eager; the portable cache artefacts are written."""
    from arrcoc.engine.compiled import compile_count

    torch._dynamo.reset()  # programs compiled by earlier tests in this process would be reused
    be = create_backend("compiled", model, CPU, (1, 2, 4), cache_dir=tmp_path)
    before = compile_count()
    be.warmup()
    assert be.dynamic_batch and be.stats["programs"] == 2 and compile_count() - before == 2
    assert be.stats["artefacts_saved"] == 1 and list((tmp_path / "compiled").glob("*.bin"))
    assert be.stats["compile_phases"]  # where the compile time went
    again = create_backend("compiled", model, CPU, (1, 2, 4), cache_dir=tmp_path)
    again.warmup()  # same cache dir: its Inductor cache already holds the artefacts
    assert again.stats["artefacts_loaded"] == 0 and again.stats["artefacts_saved"] == 0
    elsewhere = tmp_path / "new-host"
    (elsewhere / "compiled").mkdir(parents=True)
    for f in (tmp_path / "compiled").glob("*.bin"):
        (elsewhere / "compiled" / f.name).write_bytes(f.read_bytes())
    moved = create_backend("compiled", model, CPU, (1, 2, 4), cache_dir=elsewhere)
    moved.warmup()  # only the artefacts file was copied: loaded first
    assert moved.stats["artefacts_loaded"] == 1
    again.close()
    moved.close()
    for batch in (2, 3, 4, 6):  # 3 pads to 4, 6 splits into 4 + 2
        images = example_inputs(model, batch, CPU, seed=21)[0]
        query = random_queries(batch, model.config.query_dim, CPU, seed=batch)
        controls = model.default_controls(batch)
        c = compare(eager.run(images, query, controls), be.run(images, query, controls), controls)
        assert c["max_abs_diff"] <= TOL[torch.float32] and c["topk_agreement_ties"] == 1.0, c["diff_by_map"]
    assert be.recompiles == 0
    with pytest.raises(EngineError, match="compile"):  # batch 5 is no bucket, and 9 is past the range
        be._guarded(*example_inputs(model, 9, CPU))
    be.close()


def test_histogram_by_pooled_comparison_equals_scatter_add():
    """The information map's histogram (a pooled one-hot, for ONNX Runtime) counts exactly what
    the scatter-add it replaced counted, on random images and on bin edges."""
    import math

    from arrcoc.knowing import HIST_BINS, cell_histogram, cell_index_map, luminance_entropy

    g = torch.Generator().manual_seed(5)
    images = torch.randint(0, 256, (2, 3, 512, 512), dtype=torch.uint8, generator=g)
    images[1, :, :64] = torch.tensor([255, 0, 0], dtype=torch.uint8).view(
        3, 1, 1
    )  # grey 76245: a bin edge region
    px = images.to(torch.int64)
    bins = (px[:, 0] * 299 + px[:, 1] * 587 + px[:, 2] * 114) * HIST_BINS // 255001
    index = cell_index_map(512).view(1, -1) * HIST_BINS + bins.reshape(2, -1)
    counts = (
        torch.zeros(2, 1024 * HIST_BINS)
        .scatter_add(1, index, torch.ones(index.shape))
        .view(2, 1024, HIST_BINS)
    )
    assert torch.equal(
        cell_histogram(images, 32) * 256, counts.permute(0, 2, 1).reshape(2, HIST_BINS, 32, 32)
    )
    p = counts / 256
    ref = (-(p * torch.log(p.clamp_min(1e-12))).sum(-1) / math.log(HIST_BINS)).view(2, 32, 32).clamp(0, 1)
    assert torch.allclose(luminance_entropy(images), ref, rtol=0, atol=1e-6)
