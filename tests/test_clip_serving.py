"""Serving the CLIP variant: the dtype it serves (bfloat16 on a GPU by default, float32 on request
and on a CPU), bfloat16's parity with float32 as the reports state it, and `arrcoc bench e2e
--variant` on random weights of a registered variant's shapes.

A tiny CLIP (64 wide, 2 layers) keeps the CPU time short; the real shapes are test_clip.py's.
"""

from __future__ import annotations

import pytest
import torch

from arrcoc.bench.parity import MIN_OVERLAP_BF16, TOL, dtype_parity, photo_batch, random_queries
from arrcoc.clip import ClipModelConfig, build_clip
from arrcoc.engine import create_backend
from arrcoc.engine.base import ForwardFn, serving_dtype
from arrcoc.errors import EngineError
from arrcoc.registry import create_model, get_variant, register_variant
from arrcoc.settings import Settings
from arrcoc.variant import Variant

CPU = torch.device("cpu")
TINY = ClipModelConfig(hidden=64, heads=2, layers=2, mlp=128, query_dim=32)
TINY_VARIANT = "arrcoc-clip-tiny-serving-test"


@pytest.fixture(scope="module")
def model():
    m = build_clip(TINY, None)
    m.variant_name = "arrcoc-clip-tiny"
    return m


def test_clip_serves_bfloat16_on_a_gpu_float32_on_a_cpu_and_float32_on_request():
    clip, texture = get_variant("arrcoc-clip-b16"), get_variant("arrcoc-texture")
    assert clip.gpu_dtype == "bfloat16" and texture.gpu_dtype == "float32"
    gpu = torch.device("cuda")  # a device name only: nothing runs there
    assert serving_dtype("auto", gpu, clip.gpu_dtype) == torch.bfloat16
    assert serving_dtype("auto", gpu, texture.gpu_dtype) == torch.float32
    assert serving_dtype("auto", CPU, clip.gpu_dtype) == torch.float32  # bfloat16 on a CPU only when asked
    assert serving_dtype("float32", gpu, clip.gpu_dtype) == torch.float32  # the setting to serve float32
    assert serving_dtype("bfloat16", CPU, texture.gpu_dtype) == torch.bfloat16
    assert serving_dtype("auto", gpu, clip.gpu_dtype, "onnx") == torch.float32  # ONNX Runtime: float32 only
    assert serving_dtype("auto", gpu, clip.gpu_dtype, "compiled") == torch.bfloat16
    with pytest.raises(EngineError, match="float32 or bfloat16"):
        serving_dtype("float16", CPU)


def test_the_dtype_setting_reads_the_environment_and_refuses_unknown_values(monkeypatch):
    assert Settings().engine.dtype == "auto"
    for given, expected in (
        ("float32", "float32"),
        ("FP32", "float32"),
        ("bf16", "bfloat16"),
        ("auto", "auto"),
    ):
        monkeypatch.setenv("ARRCOC_ENGINE__DTYPE", given)
        assert Settings().engine.dtype == expected
    monkeypatch.setenv("ARRCOC_ENGINE__DTYPE", "half")
    with pytest.raises(ValueError, match="ARRCOC_ENGINE__DTYPE must be one of auto, float32, bfloat16"):
        Settings()


def test_the_dtype_flag_reaches_the_settings():
    from arrcoc.cli import build_parser
    from arrcoc.cli.worker import worker_settings

    args = build_parser().parse_args(["worker", "--dtype", "float32"])
    assert worker_settings(args).engine.dtype == "float32"
    for argv in (
        ["demo", "--dtype", "float32"],
        ["infer", "x.jpg", "-q", "a", "--dtype", "bfloat16"],
        ["bench", "e2e", "--dtype", "float32", "--variant", "arrcoc-clip-b16"],
    ):
        assert build_parser().parse_args(argv).dtype == argv[argv.index("--dtype") + 1]


def test_under_bfloat16_only_the_tower_is_lowered(model):
    """Inside autocast every output of ArrcocClip (maps, weights, budgets, match) is float32:
    the tower's bfloat16 stops at its patch embeddings."""
    images, query = photo_batch(224, 2, CPU), random_queries(2, TINY.query_dim, CPU)
    with torch.inference_mode(), torch.autocast("cpu", dtype=torch.bfloat16):
        out = model(images, query, model.default_controls(2))
        patches = model.vision_model.dense(model.pixels(images))
    assert patches.dtype == torch.bfloat16  # the tower did run in bfloat16
    assert all(t.dtype == torch.float32 for t in out if t.is_floating_point()), [t.dtype for t in out]


def test_bfloat16_runs_and_its_parity_with_float32_is_measured():
    """CLIP ViT-B/16's widths with 2 layers (TINY's 64-wide tower gives the same map for every
    patch, which no precision moves): bfloat16 moves the maps a little, within its tolerance."""
    model = build_clip(ClipModelConfig(layers=2, text_layers=2), None)
    images, query = photo_batch(224, 5, CPU), random_queries(5, 512, CPU)
    be = create_backend("eager", model, CPU, (1, 2, 4, 8), torch.bfloat16)
    be.warmup()
    out = be.run(images, query)
    assert be.dtype == torch.bfloat16 and torch.isfinite(out.relevance).all()
    par = dtype_parity(model, images, query)
    assert par.dtype == "bfloat16" and par.images == 5 and par.finite
    assert 0 < par.relevance_max_abs_diff <= TOL[torch.bfloat16]  # bfloat16 does change something
    assert (
        par.maps_max_abs_diff >= par.relevance_max_abs_diff and par.match_max_abs_diff <= TOL[torch.bfloat16]
    )
    assert MIN_OVERLAP_BF16 <= par.topk_overlap_min <= par.topk_overlap_mean <= 1.0 and par.top1_same >= 4
    doc = par.to_json()
    assert set(doc) >= {"relevance_max_abs_diff", "topk_overlap_mean", "match_max_abs_diff"}
    # the engine's bfloat16 output is the parity's bfloat16 side
    with torch.inference_mode():
        ref = ForwardFn(model, "cpu", torch.bfloat16)(images, query, model.default_controls(5))
    assert torch.equal(ref[0], out.relevance)


def test_parity_of_float32_with_itself_is_exact(model):
    images, query = photo_batch(224, 2, CPU), random_queries(2, TINY.query_dim, CPU)
    par = dtype_parity(model, images, query, dtype=torch.float32)
    assert par.maps_max_abs_diff == 0.0 and par.topk_overlap_min == 1.0 and par.top1_same == 2


@pytest.fixture(scope="module")
def tiny_variant():
    """A registered CLIP variant of TINY's shapes: what `--variant` takes, small enough for a CPU."""
    try:
        get_variant(TINY_VARIANT)
    except Exception:
        register_variant(
            Variant(
                name=TINY_VARIANT,
                build=lambda c: None,
                load=build_clip,
                config=TINY,
                description="test",
                tags=("clip", "hub"),
                gpu_dtype="bfloat16",
            )
        )
    return TINY_VARIANT


def test_random_weights_for_every_variant(tiny_variant):
    clip = create_model(tiny_variant, "random")
    assert clip.weights_version == "random" and clip.text_encoder is not None
    assert create_model("arrcoc-texture", "random").weights_version == "untrained"


def test_end_to_end_benchmark_of_a_named_variant_on_random_weights(tiny_variant, tmp_path):
    """`arrcoc bench e2e --variant NAME --dtype bfloat16` on a CPU, in-process, tiny: the report
    says which variant ran, that its weights were random, in which dtype, and bfloat16's parity."""
    from arrcoc.bench.e2e import E2EConfig, markdown, run_e2e, write

    cfg = E2EConfig(
        device="cpu",
        backend="eager",
        variant=tiny_variant,
        dtype="bfloat16",
        items=8,
        large_items=0,
        png_items=0,
        requests=4,
        clients=2,
        celery=False,
        rounds=1,
    )
    report = run_e2e(cfg, progress=lambda m: None)
    sv = report["serving"]
    assert sv == {
        "variant": tiny_variant,
        "weights_version": "random",
        "random_weights": True,
        "dtype": "bfloat16",
        "image_size": 224,
        "grid": 14,
    }
    job = report["batch_inprocess"]["jpeg_800x600"]
    assert job["items"] == 8 and job["failed"] == 0
    assert report["interactive_inprocess_1"]["ok"] == report["interactive_inprocess_1"]["requests"]
    par = report["dtype_parity"]
    assert par["dtype"] == "bfloat16" and par["images"] == 12 and par["finite"]
    assert (
        par["relevance_max_abs_diff"] <= TOL[torch.bfloat16] and par["topk_overlap_min"] >= MIN_OVERLAP_BF16
    )
    text = markdown(report)
    assert text.splitlines()[0].count(f"{tiny_variant} bfloat16") == 1
    assert f"**{tiny_variant} with random weights of its real shapes**" in text
    assert f"relevance max |Δ| {par['relevance_max_abs_diff']}" in text
    assert write(report, tmp_path / "e2e")[0].is_file()


@pytest.mark.slow
def test_bfloat16_forward_is_one_graph_and_exports(model):
    """What the compiled and aot backends capture in bfloat16 (ForwardFn under autocast, with the
    model's own float32 region inside): one graph, no breaks; torch.export gives the same outputs."""
    fn = ForwardFn(model, "cpu", torch.bfloat16).eval()
    images, query = photo_batch(224, 2, CPU), random_queries(2, TINY.query_dim, CPU)
    args = (images, query, model.default_controls(2))
    explained = torch._dynamo.explain(fn)(*args)
    assert explained.graph_break_count == 0 and explained.graph_count == 1, explained.break_reasons
    with torch.inference_mode():
        ref = fn(*args)
    exported = torch.export.export(fn, args).module()(*args)
    assert all(torch.equal(a, b) for a, b in zip(ref, exported, strict=True))
