"""arrcoc-vit-b16: registered, runs the shared forward, loads CLIP weights in Hugging Face layout."""

from __future__ import annotations

import pytest
import torch

from arrcoc.errors import WeightsError
from arrcoc.model import ModelOutput
from arrcoc.registry import create_model, get_variant
from arrcoc.vit import CLIP_WEIGHTS_ENV, ArrcocViT, ViTModelConfig, build_vit_b16, load_clip_vision

TINY = ViTModelConfig(hidden=32, heads=2, layers=2, mlp=64)


def inputs(batch: int, cfg: ViTModelConfig):
    g = torch.Generator().manual_seed(0)
    images = torch.randint(1, 256, (batch, 3, cfg.image_size, cfg.image_size), dtype=torch.uint8, generator=g)
    query = torch.nn.functional.normalize(torch.randn(batch, cfg.query_dim, generator=g), dim=-1)
    return images, query


def test_variant_is_the_benchmark_configuration():
    v = get_variant("arrcoc-vit-b16")
    assert (v.image_size, v.grid, v.benchmark_only) == (224, 14, True)
    model = create_model("arrcoc-vit-b16", "default")
    c = model.config
    assert (c.cell, c.hidden, c.heads, c.layers) == (16, 768, 12, 12)
    assert model.vision_model.embeddings.position_embedding.weight.shape == (197, 768)  # 196 patches + class
    images, query = inputs(1, c)
    with torch.inference_mode():
        out = model(images, query, model.default_controls(1))
    assert isinstance(out, ModelOutput)
    assert out.relevance.shape == (1, 14, 14) and out.texture.shape == (1, 13, 14, 14)
    assert out.order.shape == (1, 196) and int((out.budgets > 0).sum()) == c.k
    assert torch.isfinite(out.relevance).all()


def test_benchmark_only_flows_into_results(query_encoder, examples_dir):
    from arrcoc.pipeline import RelevancePipeline

    pipe = RelevancePipeline("arrcoc-vit-b16", device="cpu", query_encoder=query_encoder)
    [r] = pipe.infer(sorted(examples_dir.glob("*.jpg"))[0], "a rocket")
    assert r.benchmark_only and r.variant == "arrcoc-vit-b16" and r.relevance.shape == (14, 14)


def _hf_tiny_checkpoint(tmp_path):
    transformers = pytest.importorskip("transformers")
    cfg = transformers.CLIPVisionConfig(
        hidden_size=TINY.hidden, intermediate_size=TINY.mlp, num_hidden_layers=TINY.layers,
        num_attention_heads=TINY.heads, image_size=224, patch_size=16, hidden_act="quick_gelu", layer_norm_eps=1e-5,
    )  # fmt: skip
    torch.manual_seed(1)
    hf = transformers.CLIPVisionModel(cfg).eval()
    hf.save_pretrained(tmp_path / "clip-tiny")
    return hf, tmp_path / "clip-tiny"


def test_loads_hugging_face_clip_vision_weights(tmp_path):
    """A tiny CLIP vision checkpoint saved by transformers loads by name and gives the same
    hidden states as Hugging Face's own model."""
    hf, path = _hf_tiny_checkpoint(tmp_path)
    model = load_clip_vision(ArrcocViT(TINY), path).eval()
    assert model.vision_weights.startswith("clip:")
    x = torch.randn(2, 3, 224, 224)
    with torch.inference_mode():
        ours = model.vision_model.hidden_states(x)
        theirs = hf(pixel_values=x).last_hidden_state
    assert (ours - theirs).abs().max() < 1e-4


def test_loader_reads_a_plain_state_dict_with_extra_keys(tmp_path):
    """The key layout of a full CLIPModel checkpoint: vision_model.* plus text tower keys."""
    src = ArrcocViT(TINY)
    state = {f"vision_model.{k}": v.clone() for k, v in src.vision_model.state_dict().items()}
    state["text_model.embeddings.token_embedding.weight"] = torch.zeros(10, 4)
    state["visual_projection.weight"] = torch.zeros(4, TINY.hidden)
    torch.save(state, tmp_path / "pytorch_model.bin")
    dst = load_clip_vision(ArrcocViT(TINY), tmp_path)
    for k, v in src.vision_model.state_dict().items():
        assert torch.equal(dst.vision_model.state_dict()[k], v)


def test_loader_errors_say_what_is_wrong(tmp_path, monkeypatch):
    with pytest.raises(WeightsError, match="does not exist"):
        load_clip_vision(ArrcocViT(TINY), tmp_path / "nope.safetensors")
    torch.save({"foo.weight": torch.zeros(1)}, tmp_path / "x.bin")
    with pytest.raises(WeightsError, match="not a Hugging Face CLIP"):
        load_clip_vision(ArrcocViT(TINY), tmp_path / "x.bin")
    wide = ArrcocViT(ViTModelConfig(hidden=48, heads=2, layers=2, mlp=64))
    torch.save({f"vision_model.{k}": v for k, v in wide.vision_model.state_dict().items()}, tmp_path / "w.bin")
    with pytest.raises(WeightsError, match="does not fit"):
        load_clip_vision(ArrcocViT(TINY), tmp_path / "w.bin")
    # the registered builder reads the path from the environment
    src = ArrcocViT(TINY)
    torch.save({f"vision_model.{k}": v for k, v in src.vision_model.state_dict().items()}, tmp_path / "ok.bin")
    monkeypatch.setenv(CLIP_WEIGHTS_ENV, str(tmp_path / "ok.bin"))
    assert build_vit_b16(TINY).vision_weights == "clip:ok.bin"
