"""arrcoc-clip-b16 against transformers' own CLIPModel, without the real weights.

A randomly initialised CLIPModel with CLIP ViT-B/16's real configuration is saved with
save_pretrained (plus a character-level CLIP tokenizer: the real vocabulary is not on this
machine), loaded through arrcoc exactly as a hub checkpoint is, and compared with transformers:
vision hidden states, pooled image embedding, text embedding, the dense (MaskCLIP) features, the
448-px position interpolation; the similarity step on a case whose answer is known; the
preprocessing against CLIPImageProcessor. Engine parity (compiled, ONNX) is in test_vit.py.
"""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from arrcoc.clip import (
    CLIP_MEAN,
    CLIP_STD,
    NEUTRAL_PROMPTS,
    ClipModelConfig,
    build_clip,
    dense_similarity,
    random_embedding,
    to_clip_tensor,
)
from arrcoc.errors import WeightsError
from arrcoc.query import query_encoder_for
from arrcoc.registry import create_model, get_variant
from arrcoc.result import WEAK_MATCH

transformers = pytest.importorskip("transformers")
TOL = 2e-4  # float32, 12 layers: our tower vs transformers' (different op order, same math)
# CLIP ViT-B/16's widths with 2 layers per tower: every test but the real-config one (CPU time)
SMALL = ClipModelConfig(layers=2, text_layers=2)


def char_tokenizer():
    """A CLIP tokenizer whose vocabulary is every byte-level character (no merges): real CLIP
    tokenization rules and special-token ids (49406/49407), without the real vocab files."""
    from transformers.convert_slow_tokenizer import bytes_to_unicode
    from transformers.models.clip.tokenization_clip import CLIPTokenizer

    chars = list(bytes_to_unicode().values())
    vocab = {c: i for i, c in enumerate(chars)} | {c + "</w>": 256 + i for i, c in enumerate(chars)}
    vocab |= {"<|startoftext|>": 49406, "<|endoftext|>": 49407}
    return CLIPTokenizer(vocab=vocab, merges=[])


def save_clip(path, config: ClipModelConfig):
    """A random transformers CLIPModel of `config`, saved as a hub checkpoint is laid out.

    Filled with N(0, 0.02) (layer-norm scales 1) rather than transformers' own init, which
    takes ~20 s for the full model on this CPU; the loader does not care how weights were made.
    """
    from transformers.initialization import no_init_weights

    with no_init_weights():
        hf = transformers.CLIPModel(config.hf_config()).eval()
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, p in hf.named_parameters():
            if "norm" in name and name.endswith("weight"):
                p.fill_(1.0)
            else:
                p.normal_(0.0, 0.02, generator=g)
        hf.logit_scale.fill_(np.log(100.0))
    hf.save_pretrained(path)
    char_tokenizer().save_pretrained(path)
    return hf


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    """(transformers' model, the directory it was saved to): ViT-B/16 widths, 2 layers."""
    path = tmp_path_factory.mktemp("clip-small")
    return save_clip(path, SMALL), path


@pytest.fixture(scope="module")
def ours(small):
    return build_clip(SMALL, str(small[1]))


def photo(examples_dir, size: int = 224) -> torch.Tensor:
    return to_clip_tensor(Image.open(sorted(examples_dir.glob("*.jpg"))[0]), size).unsqueeze(0)


def test_default_config_is_clip_vit_b16():
    c = ClipModelConfig().hf_config()
    v, t = c.vision_config, c.text_config
    assert (v.image_size, v.patch_size, v.hidden_size, v.num_hidden_layers, v.num_attention_heads) == (
        224,
        16,
        768,
        12,
        12,
    )
    assert (v.intermediate_size, v.hidden_act, t.hidden_size, c.projection_dim) == (
        3072,
        "quick_gelu",
        512,
        512,
    )
    assert get_variant("arrcoc-clip-b16").grid == 14 and get_variant("arrcoc-clip-b16-448").grid == 28


def test_real_config_loads_through_the_registry(tmp_path, examples_dir):
    """CLIP ViT-B/16's real configuration (12 + 12 layers), saved by transformers and loaded
    by name and directory, as ARRCOC_ENGINE__WEIGHTS / --weights give it: image and text embeddings."""
    hf = save_clip(tmp_path, ClipModelConfig())
    model = create_model("arrcoc-clip-b16", str(tmp_path))
    assert model.weights_version == str(tmp_path) and len(model.vision_model.encoder.layers) == 12
    x = model.pixels(photo(examples_dir))
    tok = transformers.AutoTokenizer.from_pretrained(tmp_path)(["a rocket"], return_tensors="pt")
    with torch.inference_mode():
        pooled = model.visual_projection(model.vision_model.pooled(x))
        assert (pooled - hf.get_image_features(pixel_values=x).pooler_output).abs().max() < TOL
        text = torch.nn.functional.normalize(hf.get_text_features(**tok).pooler_output, dim=-1)
    assert (model.text_encoder.encode("a rocket") - text).abs().max() < 1e-5


def test_image_tower_matches_transformers(small, ours, examples_dir):
    """Last hidden state and the pooled, projected image embedding, on a real photo."""
    hf, _ = small
    assert ours.weights_version == str(
        small[1]
    ) and ours.vision_model.embeddings.position_embedding.weight.shape == (197, 768)
    images = photo(examples_dir)
    x = ours.pixels(images)
    with torch.inference_mode():
        theirs = hf.vision_model(pixel_values=x)
        assert (ours.vision_model.hidden_states(x) - theirs.last_hidden_state).abs().max() < TOL
        pooled = ours.visual_projection(ours.vision_model.pooled(x))
        assert (pooled - hf.get_image_features(pixel_values=x).pooler_output).abs().max() < TOL


def test_text_tower_matches_transformers(small, ours):
    hf, path = small
    encoder = query_encoder_for(ours)
    assert encoder is ours.text_encoder
    queries = ["the red mug", "a cat's face, seen from the left"]
    tok = transformers.AutoTokenizer.from_pretrained(path)(queries, padding=True, return_tensors="pt")
    with torch.inference_mode():
        theirs = torch.nn.functional.normalize(hf.get_text_features(**tok).pooler_output, dim=-1)
    assert (encoder.encode(queries) - theirs).abs().max() < 1e-5
    assert (ours.neutral - encoder.encode(list(NEUTRAL_PROMPTS))).abs().max() < 1e-6
    assert abs(float(ours.logit_scale) - float(hf.logit_scale.detach().exp())) < 1e-4


def test_dense_features_are_maskclips_value_path(small, examples_dir):
    """Per patch: the last block's v_proj and out_proj on its layer-normed input (no attention,
    residual or MLP), post_layernorm, visual projection - built here from transformers' modules."""
    hf, path = small
    ours = build_clip(dataclasses.replace(SMALL, dense="maskclip"), str(path))
    x = ours.pixels(photo(examples_dir))
    with torch.inference_mode():
        h = hf.vision_model(pixel_values=x, output_hidden_states=True).hidden_states[-2][
            :, 1:
        ]  # into the last block
        last = hf.vision_model.encoder.layers[-1]
        v = last.self_attn.out_proj(last.self_attn.v_proj(last.layer_norm1(h)))
        expected = torch.nn.functional.normalize(
            hf.visual_projection(hf.vision_model.post_layernorm(v)), dim=-1
        )
        got = ours.dense_embeddings(photo(examples_dir))
    assert got.shape == (1, 196, 512) and (got - expected).abs().max() < 1e-4


def test_dense_features_are_naclips_neighbourhood_attention(small, ours, examples_dir):
    """The default: NACLIP's last block, written out here from transformers' modules with plain
    matmuls and a prior built cell by cell: per head softmax(k k^T / sqrt(d) + prior) v over every
    token (class included), out_proj, no residual or MLP; post_layernorm, projection, patches only.
    (tools/naclip_parity.py checks the same against the authors' own code.)"""
    hf, _ = small
    assert ours.config.dense == "naclip" and get_variant("arrcoc-clip-b16").config.dense == "naclip"
    g, std = 14, ours.config.neighbourhood_std
    prior = torch.zeros(1 + g * g, 1 + g * g)
    for a in range(g * g):
        for b in range(g * g):
            d2 = (a // g - b // g) ** 2 + (a % g - b % g) ** 2
            prior[1 + a, 1 + b] = float(np.exp(-d2 / (2 * std**2)))
    x = ours.pixels(photo(examples_dir))
    with torch.inference_mode():
        h = hf.vision_model(pixel_values=x, output_hidden_states=True).hidden_states[-2]  # (1, 197, 768)
        last = hf.vision_model.encoder.layers[-1]
        y = last.layer_norm1(h)
        heads, dh = 12, 64
        k = last.self_attn.k_proj(y).view(1, -1, heads, dh).transpose(1, 2)
        v = last.self_attn.v_proj(y).view(1, -1, heads, dh).transpose(1, 2)
        attn = torch.softmax(k @ k.transpose(-1, -2) / dh**0.5 + prior, dim=-1)
        out = last.self_attn.out_proj((attn @ v).transpose(1, 2).reshape(1, -1, heads * dh))
        expected = torch.nn.functional.normalize(
            hf.visual_projection(hf.vision_model.post_layernorm(out[:, 1:])), dim=-1
        )
        got = ours.dense_embeddings(photo(examples_dir))
    assert got.shape == (1, 196, 512) and (got - expected).abs().max() < 1e-4
    assert torch.allclose(ours.vision_model.prior, prior, atol=1e-7)


@pytest.mark.skipif(
    not os.environ.get("NACLIP_CHECKOUT"), reason="set NACLIP_CHECKOUT to a sinahmr/NACLIP checkout"
)
def test_naclip_matches_the_authors_code():
    """tools/naclip_parity.py on the authors' checkout (not part of this repository)."""
    import subprocess
    import sys

    tool = Path(__file__).resolve().parent.parent / "tools" / "naclip_parity.py"
    done = subprocess.run(
        [sys.executable, str(tool), os.environ["NACLIP_CHECKOUT"], "--sizes", "224"],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0 and "PASS" in done.stdout, done.stdout + done.stderr


def test_448_interpolates_positions_once_like_transformers(small, examples_dir):
    hf, path = small
    big = build_clip(
        ClipModelConfig(image_size=448, layers=2, text_layers=2, k=160, token_budget=20480), str(path)
    )
    assert big.vision_model.embeddings.position_embedding.weight.shape == (
        785,
        768,
    )  # loaded already interpolated
    x = big.pixels(photo(examples_dir, 448))
    with torch.inference_mode():
        theirs = hf.vision_model(pixel_values=x, interpolate_pos_encoding=True).last_hidden_state
        assert (big.vision_model.hidden_states(x) - theirs).abs().max() < TOL
        out = big(photo(examples_dir, 448), big.text_encoder.encode("a cat"), big.default_controls(1))
    assert out.relevance.shape == (1, 28, 28) and int((out.budgets > 0).sum()) == 160


def test_dense_similarity_known_answer():
    """Patch 2 is the query itself, patch 0 a neutral prompt, patch 1 halfway between."""
    e = torch.eye(4)
    query = e[3:4]  # (1, 4)
    neutral = e[:2]  # (2, 4)
    half = torch.nn.functional.normalize(e[0] + e[3], dim=0)
    patches = torch.stack((e[0], half, e[3], e[2])).unsqueeze(0)  # (1, 4 patches, 4)
    cos, prob = dense_similarity(patches, query, neutral, torch.tensor(100.0))
    assert torch.allclose(cos, torch.tensor([[0.0, 2**-0.5, 1.0, 0.0]]), atol=1e-6)
    # patch 0: the neutral prompt wins outright; 1: a tie between query and neutral 0;
    # 2: the query wins outright; 3: orthogonal to all three, so 1/3
    assert torch.allclose(prob, torch.tensor([[0.0, 0.5, 1.0, 1 / 3]]), atol=1e-6)


def test_preprocessing_matches_clip_image_processor(ours):
    from transformers.models.clip.image_processing_pil_clip import CLIPImageProcessorPil

    proc = CLIPImageProcessorPil()
    assert tuple(proc.image_mean) == CLIP_MEAN and tuple(proc.image_std) == CLIP_STD
    rng = np.random.default_rng(0)
    img = Image.fromarray(rng.integers(0, 256, (500, 500, 3), dtype=np.uint8))  # square: no crop either way
    theirs = proc(images=img, return_tensors="pt")["pixel_values"]  # bicubic resize, rescale, normalise
    ours_px = to_clip_tensor(img, 224)
    assert ours_px.dtype == torch.uint8 and ours_px.shape == (3, 224, 224)
    # one uint8 step is 1/255/0.26 = 0.015 after normalising: PIL's bicubic on both sides
    assert (ours.pixels(ours_px.unsqueeze(0)) - theirs).abs().max() < 0.016


def test_pipeline_result_has_a_match_score(ours, examples_dir):
    from arrcoc.engine import create_backend
    from arrcoc.pipeline import RelevancePipeline

    ours.variant_name = "arrcoc-clip-b16"
    backend = create_backend("eager", ours, torch.device("cpu"), (1,))
    pipe = RelevancePipeline(
        "arrcoc-clip-b16", backend=backend
    )  # asks the model for its encoder: CLIP's text tower
    assert pipe.encoder is ours.text_encoder
    [r] = pipe.infer(sorted(examples_dir.glob("*.jpg"))[0], "a rocket")
    doc = json.loads(json.dumps(r.to_json()))
    assert r.variant == "arrcoc-clip-b16" and r.relevance.shape == (14, 14) and not r.benchmark_only
    assert 0.0 <= doc["match_score"] <= 1.0 and doc["weak_match"] == (doc["match_score"] < WEAK_MATCH)
    assert doc["match_score"] == pytest.approx(float(r.participatory.max()), abs=1e-6)
    assert np.allclose(r.balance, 1 / 3)  # untrained balancer: equal weights, as the model card says


def test_offline_without_weights_is_a_clear_error(tmp_path):
    """Offline (HF_HUB_OFFLINE=1 in the test run), weights that are not cached: an error naming the
    variant that works offline and both ways of bringing the weights onto the machine."""
    for source in ("arrcoc-test/no-such-clip", str(tmp_path)):  # a hub id; an empty directory
        with pytest.raises(WeightsError) as err:
            create_model("arrcoc-clip-b16", source)
        text = str(err.value)
        assert "'arrcoc-texture'" in text and "--weights DIR" in text and "ARRCOC_ENGINE__WEIGHTS" in text
        assert "HF_HOME" in text and "openai/clip-vit-base-patch16 --local-dir" in text


def test_random_weights_build_without_the_hub(small):
    """The benchmark path: real shapes, no download, no tokenizer; a query becomes a fixed random
    unit vector (the same for the same text), so end-to-end benchmarks run; "random" names it."""
    m = create_model("arrcoc-clip-b16", "random")
    assert m.weights_version == "random" and m.vision_model.embeddings.position_embedding.weight.shape == (
        197,
        768,
    )
    assert len(m.vision_model.encoder.layers) == 12 and m.visual_projection.weight.shape == (512, 768)
    shapes = {
        k: v.shape for k, v in small[0].vision_model.state_dict().items() if k != "embeddings.position_ids"
    }
    assert {
        k: v.shape
        for k, v in m.vision_model.state_dict().items()
        if ".layers." not in k or ".layers.0." in k or ".layers.1." in k
    } == shapes
    enc = query_encoder_for(m)
    a, b = enc.encode(["a cat", "a dog"])
    assert torch.allclose(a.norm(), torch.tensor(1.0)) and a.shape == (512,) and (a - b).abs().max() > 0.1
    assert torch.equal(enc.encode("a cat")[0], a) and torch.equal(random_embedding("a cat", 512), a)
