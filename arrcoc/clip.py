"""arrcoc-clip-b16: CLIP ViT-B/16's image tower as dense patch embeddings in CLIP's joint space.

The seed documents' benchmark configuration (224 x 224, 16-px patches, 196 patches, 768 hidden,
12 heads, 12 layers) is exactly CLIP ViT-B/16's vision tower, so the tower loads CLIP's weights
(`openai/clip-vit-base-patch16`, or a local directory) with `transformers`.

Dense features: CLIP's last block pools every token into the class token through attention, so
its per-patch outputs are not aligned with the text space. Two training-free changes to that
block alone, selected by `dense` (both skip its residual and MLP, then post_layernorm and the
visual projection give each patch an embedding in the text space):
- "naclip" (the default): NACLIP (Hajimiri, Ben Ayed, Dolz, "Pay Attention to Your Neighbours",
  WACV 2025): attention logits from key-key similarity plus a Gaussian prior on the distance
  between patches, so a patch gathers its similar neighbours. Checked against the authors' own
  last-block function by tools/naclip_parity.py.
- "maskclip": MaskCLIP (Zhou, Loy, Dai, ECCV 2022): the value path alone (v_proj, out_proj per
  patch: no attention at all, the cheapest).
The authors' benchmark figures, and why NACLIP is the default, are in docs/model.md.

Scorers on the G x G patch grid: participatory = per patch, the probability of the query against
a few neutral prompts ("a photo", "the background", ...) at CLIP's own logit scale (MaskCLIP
classifies patches the same way); information and perspectival as arrcoc-texture, from the
texture array computed at S px. The balancer and allocator are arrcoc's, untrained: the
balancer starts from equal weights (see ArrcocClip.__init__).
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .attending import TokenAllocator
from .balancing import TensionBalancer
from .configs import CLIP_HUB_ID, ClipModelConfig  # noqa: F401 -- their home is configs.py
from .encoders import CachedTextEncoder
from .errors import WeightsError
from .knowing import cell_index_map, luminance_entropy, salience
from .model import ArrcocTexture, ModelOutput
from .texture import TextureConstants, texture_from_float
from .vit import CLIPVisionTower, interpolate_positions

CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)  # CLIPImageProcessor's image_mean
CLIP_STD = (0.26862954, 0.26130258, 0.27577711)
# What "nothing in particular" looks like to CLIP: the query must beat these at a patch to score there.
NEUTRAL_PROMPTS = ("a photo.", "the background.", "an object.", "a thing.", "a texture.", "a surface.")
OFFLINE_VARIANT = "arrcoc-texture"  # the variant that needs nothing from the hub


def to_clip_tensor(img, size: int = 224) -> Tensor:
    """RGB PIL image -> uint8 (3, size, size), resized as CLIPImageProcessor resizes (PIL bicubic).

    The whole image is squashed to the square, where CLIP's processor would crop the long side:
    the relevance map must cover every pixel. For a square image the two agree (tested).
    """
    import numpy as np
    from PIL import Image

    resized = img.convert("RGB").resize((size, size), Image.Resampling.BICUBIC)
    return torch.from_numpy(np.ascontiguousarray(np.asarray(resized, dtype=np.uint8).transpose(2, 0, 1)))


def dense_similarity(patches: Tensor, query: Tensor, neutral: Tensor, scale: Tensor) -> tuple[Tensor, Tensor]:
    """patches (B, N, E), query (B, E), neutral (P, E), all unit; scale: CLIP's logit scale.

    -> (cosine (B, N) of each patch with the query, probability (B, N) of the query against the
    neutral prompts at each patch: softmax over [query, neutral...] of scale * cosine).
    """
    b = patches.shape[0]
    targets = torch.cat((query.unsqueeze(1), neutral.unsqueeze(0).expand(b, -1, -1)), dim=1)  # (B, 1+P, E)
    cos = torch.einsum("bne,bke->bnk", patches, targets)  # (B, N, 1+P)
    return cos[..., 0], torch.softmax(scale * cos, dim=-1)[..., 0]


class ArrcocClip(ArrcocTexture):
    """Same forward, ModelOutput and controls as ArrcocTexture (subclassing shares them;
    __init__ builds its own modules); the participatory map and the match score are CLIP's."""

    def __init__(self, config: ClipModelConfig = ClipModelConfig()):
        nn.Module.__init__(self)
        assert config.image_size % config.cell == 0 and config.cell == 16
        self.config = config
        self.constants = TextureConstants(config.grid)
        self.register_buffer("cell_of_pixel", cell_index_map(config.image_size), persistent=False)
        self.register_buffer("clip_mean", torch.tensor(CLIP_MEAN).view(1, 3, 1, 1), persistent=False)
        self.register_buffer("clip_std", torch.tensor(CLIP_STD).view(1, 3, 1, 1), persistent=False)
        self.vision_model = CLIPVisionTower(config.tower)
        self.visual_projection = nn.Linear(config.hidden, config.query_dim, bias=False)
        # set at load from the checkpoint (text tower, logit_scale); persistent so they are part
        # of the weights' fingerprint (the ONNX cache key)
        self.register_buffer(
            "neutral", F.normalize(torch.ones(len(NEUTRAL_PROMPTS), config.query_dim), dim=-1)
        )
        self.register_buffer("logit_scale", torch.tensor(100.0))
        self.balancer = TensionBalancer(config.query_dim)
        # untrained: zero logits give every scorer weight 1/3 for every image and query (rather
        # than a random MLP's arbitrary, query-dependent weights); the user's sliders still apply
        nn.init.zeros_(self.balancer.mlp[2].weight)
        nn.init.zeros_(self.balancer.mlp[2].bias)
        self.allocator = TokenAllocator()
        self.text_encoder: ClipTextEncoder | None = None  # set by load_clip: not a submodule

    def match_score(self, maps: Tensor) -> Tensor:
        """maps (B, 3, G, G) -> (B,): the best patch's probability of the query against the
        neutral prompts (the participatory map's peak; >= 0.5: it beats them all together)."""
        return maps[:, 2].flatten(1).amax(dim=-1)

    def forward(self, images: Tensor, query: Tensor, controls: Tensor) -> ModelOutput:
        """As ArrcocTexture's. Under autocast (a bfloat16 engine) only the CLIP tower runs in the
        lower precision, where nearly all the time goes; its patch embeddings, the texture, the
        scorer maps, the similarity softmax, the balancer and the allocation are float32, so the
        relevance maps and every output are float32 sums of float32 terms."""
        patches = self.dense_embeddings(images)  # (B, G*G, E) float32, unit
        with torch.autocast(images.device.type, enabled=False):
            maps, texture = self.scorer_maps(images, query, patches)
            return self.outputs(maps, texture, query, controls)

    def pixels(self, images: Tensor) -> Tensor:
        """uint8 (B, 3, S, S) -> CLIP's normalised float input (CLIPImageProcessor's rescale + normalise)."""
        return (images.to(torch.float32) / 255.0 - self.clip_mean) / self.clip_std

    def dense_embeddings(self, images: Tensor) -> Tensor:
        """uint8 (B, 3, S, S) -> (B, G*G, E) unit float32 patch embeddings in CLIP's joint space
        (the tower in the caller's precision; normalised in float32)."""
        features = self.visual_projection(self.vision_model.dense(self.pixels(images)))
        with torch.autocast(images.device.type, enabled=False):
            return F.normalize(features.float(), dim=-1)

    def scorer_maps(
        self, images: Tensor, query: Tensor, patches: Tensor | None = None
    ) -> tuple[Tensor, Tensor]:
        """(maps (B, 3, G, G), texture (B, 13, G, G)); `patches`: dense_embeddings(images) if known."""
        b, g = images.shape[0], self.config.grid
        rgb = images.to(torch.float32) / 255.0
        texture, _ = texture_from_float(rgb, self.constants, g, False)
        information = luminance_entropy(images, self.cell_of_pixel, g)
        patches = self.dense_embeddings(images) if patches is None else patches  # (B, G*G, E)
        # the similarity in float32 even under autocast: the logit scale (100) would amplify
        # bfloat16's rounding of the cosines (~4e-3) to whole logits
        with torch.autocast(images.device.type, enabled=False):
            _, prob = dense_similarity(
                patches.float(), F.normalize(query.float(), dim=-1), self.neutral.float(), self.logit_scale
            )
        participatory = prob.view(b, g, g)
        return torch.stack((information, salience(texture), participatory.to(texture.dtype)), dim=1), texture


class ClipTextEncoder(CachedTextEncoder):
    """Queries -> CLIP text embeddings (N, E), unit, LRU-cached; the checkpoint's tokenizer.

    Without a tokenizer and text tower (random weights: benchmarks) each query becomes a fixed
    random unit vector seeded by its text, so that end-to-end benchmarks run the whole path; the
    results of a random-weights model say benchmark_only.
    """

    def __init__(
        self,
        tokenizer,
        text_model: nn.Module | None,
        text_projection: nn.Module | None,
        dim: int,
        cache_size: int = 1024,
        max_chars: int = 500,
        device: str = "cpu",
    ):
        super().__init__(cache_size, max_chars)
        self.tokenizer = tokenizer
        self.text_model = text_model.to(device).eval() if text_model is not None else None
        self.text_projection = text_projection.to(device).eval() if text_projection is not None else None
        self.device = device
        self.dim = dim

    @torch.inference_mode()
    def _encode(self, texts: list[str]) -> Tensor:
        if self.tokenizer is None or self.text_model is None:
            return torch.stack([random_embedding(t, self.dim) for t in texts])
        # CLIP's context is 77 tokens; a longer query is cut there, as CLIP itself does
        tok = self.tokenizer(texts, padding=True, truncation=True, max_length=77, return_tensors="pt").to(
            self.device
        )
        pooled = self.text_model(
            input_ids=tok["input_ids"], attention_mask=tok["attention_mask"]
        ).pooler_output
        return F.normalize(self.text_projection(pooled), dim=-1)


def random_embedding(text: str, dim: int) -> Tensor:
    """(dim,) a unit vector fixed by `text` (the same in every process and run): a random-weights
    CLIP's query embedding."""
    seed = int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "little") >> 1
    return F.normalize(torch.randn(dim, generator=torch.Generator().manual_seed(seed)), dim=0)


def _from_pretrained(source: str):
    """(CLIPModel, tokenizer or None) from a hub id or a local directory, or a WeightsError."""
    from transformers import AutoTokenizer, CLIPModel

    try:
        hf = CLIPModel.from_pretrained(source, dtype=torch.float32)
    except (OSError, ValueError) as e:
        where = "directory" if Path(source).exists() else "Hugging Face id"
        raise WeightsError(
            f"Could not load CLIP weights from the {where} {source!r} ({str(e).splitlines()[0][:200]})."
            " They come from the Hugging Face hub, cached under $HF_HOME, or from a local directory"
            " written by transformers' save_pretrained. This machine seems offline and they are not"
            f" cached: use the variant {OFFLINE_VARIANT!r}, which works offline with its bundled weights,"
            f" or bring the weights here: on a machine with the hub, `hf download {CLIP_HUB_ID} --local-dir"
            " DIR`, copy DIR here and pass --weights DIR (ARRCOC_ENGINE__WEIGHTS=DIR); or copy that machine's"
            " $HF_HOME (~/.cache/huggingface) here and set HF_HOME to it."
        ) from e
    try:
        tokenizer = AutoTokenizer.from_pretrained(source)
    except (OSError, ValueError) as e:
        raise WeightsError(f"{source!r} has CLIP weights but no tokenizer files ({e}).") from e
    return hf, tokenizer


def load_hf_clip(model: ArrcocClip, hf) -> ArrcocClip:
    """Copy a transformers CLIPModel's image tower, projection and logit scale into `model`;
    position embeddings are interpolated once here to the model's grid."""
    vision = {k: v for k, v in hf.vision_model.state_dict().items() if k != "embeddings.position_ids"}
    key = "embeddings.position_embedding.weight"
    vision[key] = interpolate_positions(vision[key], model.config.grid)
    target = model.vision_model.state_dict()
    bad = [k for k in target if k not in vision or vision[k].shape != target[k].shape]
    if bad or hf.visual_projection.weight.shape != model.visual_projection.weight.shape:
        raise WeightsError(
            f"The CLIP checkpoint does not fit {model.config}: mis-shaped or missing {bad[:5]}."
        )
    with torch.no_grad():
        model.vision_model.load_state_dict({k: vision[k].float() for k in target})
        model.visual_projection.weight.copy_(hf.visual_projection.weight)
        model.logit_scale.copy_(hf.logit_scale.exp())
    return model


def build_clip(config: ClipModelConfig, weights: str | Path | None = "default") -> ArrcocClip:
    """The registered loader. weights: "default" (config.weights, normally the hub id), a hub id
    or a local directory, or None: random weights of the same shapes (benchmarks, no hub)."""
    source = config.weights if weights == "default" else weights
    if source is None:
        return _random_clip(config)
    hf, tokenizer = _from_pretrained(str(source))
    model = load_hf_clip(ArrcocClip(config), hf)
    model.text_encoder = ClipTextEncoder(tokenizer, hf.text_model, hf.text_projection, config.query_dim)
    with torch.no_grad():
        model.neutral.copy_(model.text_encoder.encode(list(NEUTRAL_PROMPTS)))
    commit = getattr(hf.config, "_commit_hash", None)
    model.weights_version = f"{source}@{commit[:12]}" if commit else str(source)
    return model


def _random_clip(config: ClipModelConfig) -> ArrcocClip:
    """Random weights of the real shapes: N(0, 0.02), layer-norm scales 1 (the scale of CLIP's
    own init, which bfloat16 parity depends on); CLIP's logit scale; no text tower (queries
    become fixed random vectors), nothing downloaded. Seeded: the same model every time, the
    global RNG untouched."""
    model = ArrcocClip(config)
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, p in [*model.vision_model.named_parameters(), ("proj", model.visual_projection.weight)]:
            if "norm" in name and name.endswith("weight"):
                p.fill_(1.0)
            else:
                p.normal_(0.0, 0.02, generator=g)
        model.neutral.copy_(F.normalize(torch.randn(model.neutral.shape, generator=g), dim=-1))
    model.text_encoder = ClipTextEncoder(None, None, None, config.query_dim)
    model.weights_version = "random"
    return model
