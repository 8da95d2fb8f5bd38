"""arrcoc-vit-b16: a CLIP ViT-B/16 vision tower feeding ARR-COC's scorers, balancer, allocator.

The seed documents' benchmark configuration: 224 x 224 input, 16-px patches, 196 patches
(14 x 14 grid), 768 hidden, 12 heads, 12 layers. The tower's module names follow Hugging Face's
CLIPVisionModel (`vision_model.*`), so CLIP ViT-B/16 weights load by name from a local file
(`load_clip_vision`). Without them the tower is randomly initialised and the variant is
labelled benchmark_only: its maps time the real computation but mean nothing.

Scorers: information and perspectival come from the same texture array as arrcoc-texture
(computed at 224 px, 14 x 14 cells); the participatory scorer reads the ViT's patch features
(B, 768, 14, 14) instead of the 13 texture channels.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .attending import TokenAllocator
from .balancing import TensionBalancer
from .errors import WeightsError
from .knowing import ParticipatoryScorer, cell_index_map, luminance_entropy, salience
from .model import ArrcocTexture
from .texture import TextureConstants, texture_from_float

CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
CLIP_STD = (0.26862954, 0.26130258, 0.27577711)
CLIP_WEIGHTS_ENV = "ARRCOC_CLIP_VIT_B16"  # path to CLIP ViT-B/16 weights (safetensors or .bin)


@dataclass(frozen=True)
class ViTModelConfig:
    image_size: int = 224  # CLIP ViT-B/16's input
    cell: int = 16  # patch size = cell size: one patch per cell, G = 14
    hidden: int = 768
    heads: int = 12
    layers: int = 12
    mlp: int = 3072
    participatory_hidden: int = 64
    embed_dim: int = 128
    query_dim: int = 384
    k: int = 40  # of 196 cells: about the same fraction as 200 of 1024
    token_budget: int = 5120  # 128 tokens per selected cell on average

    @property
    def grid(self) -> int:
        return self.image_size // self.cell


def quick_gelu(x: Tensor) -> Tensor:
    return x * torch.sigmoid(1.702 * x)


class CLIPEmbeddings(nn.Module):
    def __init__(self, c: ViTModelConfig):
        super().__init__()
        self.class_embedding = nn.Parameter(torch.randn(c.hidden) * 0.02)
        self.patch_embedding = nn.Conv2d(3, c.hidden, c.cell, stride=c.cell, bias=False)
        self.position_embedding = nn.Embedding(c.grid * c.grid + 1, c.hidden)

    def forward(self, x: Tensor) -> Tensor:
        """x (B, 3, S, S) normalised -> tokens (B, 1 + G*G, D)."""
        patches = self.patch_embedding(x).flatten(2).transpose(1, 2)  # (B, G*G, D)
        cls = self.class_embedding.view(1, 1, -1).expand(x.shape[0], 1, -1)
        return torch.cat((cls, patches), dim=1) + self.position_embedding.weight.unsqueeze(0)


class CLIPAttention(nn.Module):
    def __init__(self, c: ViTModelConfig):
        super().__init__()
        self.heads = c.heads
        self.q_proj, self.k_proj, self.v_proj, self.out_proj = (nn.Linear(c.hidden, c.hidden) for _ in range(4))

    def forward(self, x: Tensor) -> Tensor:
        b, t, d = x.shape
        q, k, v = (p(x).view(b, t, self.heads, d // self.heads).transpose(1, 2) for p in (self.q_proj, self.k_proj, self.v_proj))
        y = F.scaled_dot_product_attention(q, k, v)  # (B, H, T, D/H)
        return self.out_proj(y.transpose(1, 2).reshape(b, t, d))


class CLIPMLP(nn.Module):
    def __init__(self, c: ViTModelConfig):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(c.hidden, c.mlp), nn.Linear(c.mlp, c.hidden)

    def forward(self, x: Tensor) -> Tensor:
        return self.fc2(quick_gelu(self.fc1(x)))


class CLIPEncoderLayer(nn.Module):
    def __init__(self, c: ViTModelConfig):
        super().__init__()
        self.layer_norm1, self.layer_norm2 = nn.LayerNorm(c.hidden, eps=1e-5), nn.LayerNorm(c.hidden, eps=1e-5)
        self.self_attn, self.mlp = CLIPAttention(c), CLIPMLP(c)

    def forward(self, x: Tensor) -> Tensor:
        x = x + self.self_attn(self.layer_norm1(x))
        return x + self.mlp(self.layer_norm2(x))


class CLIPEncoder(nn.Module):
    def __init__(self, c: ViTModelConfig):
        super().__init__()
        self.layers = nn.ModuleList(CLIPEncoderLayer(c) for _ in range(c.layers))

    def forward(self, x: Tensor) -> Tensor:
        for layer in self.layers:
            x = layer(x)
        return x


class CLIPVisionTower(nn.Module):
    """Hugging Face CLIPVisionTransformer's layout ("pre_layrnorm" is their spelling)."""

    def __init__(self, c: ViTModelConfig):
        super().__init__()
        self.embeddings = CLIPEmbeddings(c)
        self.pre_layrnorm = nn.LayerNorm(c.hidden, eps=1e-5)
        self.encoder = CLIPEncoder(c)
        self.post_layernorm = nn.LayerNorm(c.hidden, eps=1e-5)

    def hidden_states(self, x: Tensor) -> Tensor:
        """(B, 1 + G*G, D): the encoder's output, HF's `last_hidden_state`."""
        return self.encoder(self.pre_layrnorm(self.embeddings(x)))

    def forward(self, x: Tensor) -> Tensor:
        """(B, G*G, D): patch tokens (class token dropped), post-layernorm."""
        return self.post_layernorm(self.hidden_states(x)[:, 1:])


class ArrcocViT(ArrcocTexture):
    """Same forward, ModelOutput and controls as ArrcocTexture; the participatory scorer reads
    ViT patch features. (Subclassing shares forward(); __init__ builds its own modules.)"""

    def __init__(self, config: ViTModelConfig = ViTModelConfig()):
        nn.Module.__init__(self)
        assert config.image_size % config.cell == 0 and config.cell == 16
        self.config = config
        self.constants = TextureConstants(config.grid)
        self.register_buffer("cell_of_pixel", cell_index_map(config.image_size), persistent=False)
        self.register_buffer("clip_mean", torch.tensor(CLIP_MEAN).view(1, 3, 1, 1), persistent=False)
        self.register_buffer("clip_std", torch.tensor(CLIP_STD).view(1, 3, 1, 1), persistent=False)
        self.vision_model = CLIPVisionTower(config)
        self.participatory = ParticipatoryScorer(
            config.hidden, config.participatory_hidden, config.query_dim, config.embed_dim
        )
        self.balancer = TensionBalancer(config.query_dim)
        self.allocator = TokenAllocator()
        self.vision_weights = "random"  # or "clip:<file name>" once load_clip_vision ran

    def scorer_maps(self, images: Tensor, query: Tensor) -> tuple[Tensor, Tensor]:
        """(maps (B, 3, G, G), texture (B, 13, G, G))."""
        c = self.config
        b, g = images.shape[0], c.grid
        rgb = images.to(torch.float32) / 255.0
        texture, _ = texture_from_float(rgb, self.constants, g, False)
        information = luminance_entropy(images, self.cell_of_pixel, g)
        feats = self.vision_model((rgb - self.clip_mean) / self.clip_std)  # (B, G*G, D)
        feats = feats.transpose(1, 2).reshape(b, c.hidden, g, g)
        participatory = self.participatory(feats.to(texture.dtype), query)
        return torch.stack((information, salience(texture), participatory), dim=1), texture


def _read_state(path: Path) -> dict[str, Tensor]:
    if not path.is_file():
        raise WeightsError(f"CLIP weights file {path} does not exist.")
    try:
        if path.suffix == ".safetensors":
            from safetensors.torch import load_file

            return load_file(str(path))
        state = torch.load(str(path), map_location="cpu", weights_only=True)
    except Exception as e:
        raise WeightsError(f"{path} is not a readable CLIP checkpoint ({e}).") from e
    return state.get("state_dict", state) if isinstance(state, dict) else state


def load_clip_vision(model: ArrcocViT, path: str | Path) -> ArrcocViT:
    """Load CLIP vision weights in Hugging Face layout (`vision_model.*`, as in
    openai/clip-vit-base-patch16's model.safetensors or pytorch_model.bin) into model."""
    path = Path(path)
    if path.is_dir():
        found = [path / n for n in ("model.safetensors", "pytorch_model.bin") if (path / n).is_file()]
        if not found:
            raise WeightsError(f"No model.safetensors or pytorch_model.bin in {path}.")
        path = found[0]
    state = _read_state(path)
    anchor = "embeddings.patch_embedding.weight"  # its prefix names the vision tower's keys
    prefix = next((k[: -len(anchor)] for k in sorted(state) if k.endswith(anchor) and "text" not in k), None)
    if prefix is None:
        raise WeightsError(f"{path} has no `vision_model.*` tensors: not a Hugging Face CLIP checkpoint.")
    vision = {k[len(prefix):]: v for k, v in state.items() if k.startswith(prefix)}
    vision.pop("embeddings.position_ids", None)
    target = model.vision_model.state_dict()
    bad = [k for k in target if k not in vision or tuple(vision[k].shape) != tuple(target[k].shape)]
    if bad:
        raise WeightsError(f"{path} does not fit {model.config}: missing or mis-shaped {bad[:5]}.")
    model.vision_model.load_state_dict({k: vision[k].float() for k in target})
    model.vision_weights = f"clip:{path.name}"
    return model


def build_vit_b16(config: ViTModelConfig = ViTModelConfig()) -> ArrcocViT:
    """The registered builder: CLIP weights from $ARRCOC_CLIP_VIT_B16 when set, else random."""
    model = ArrcocViT(config)
    path = os.environ.get(CLIP_WEIGHTS_ENV)
    return load_clip_vision(model, path) if path else model
