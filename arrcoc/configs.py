"""The variants' model configs and the texture array's channel names: plain data, no torch.

The model modules (model.py, clip.py, vit.py, texture.py) take these and re-export them; the
catalogue (variants.py, registry.py) and the submitting side (the demo's page) read them without
loading the engine.
"""

from __future__ import annotations

from dataclasses import dataclass

CHANNEL_NAMES = (
    "red",
    "green",
    "blue",
    "lightness",
    "a*",
    "sobel_x",
    "sobel_y",
    "edge_magnitude",
    "y",
    "x",
    "eccentricity",
    "b*",
    "local_contrast",
)
COMPAT_CHANNEL_NAMES = CHANNEL_NAMES[:11] + ("edge_magnitude_copy", "lightness_copy")

CLIP_HUB_ID = "openai/clip-vit-base-patch16"
# How the last block makes per-patch features (arrcoc/clip.py and docs/model.md say why):
# maskclip: its value path alone; naclip: neighbourhood attention over key-key similarity.
DENSE_METHODS = ("maskclip", "naclip")


@dataclass(frozen=True)
class TowerConfig:
    image_size: int = 224  # S: CLIP ViT-B/16 is trained at 224; 448 interpolates its positions
    patch: int = 16  # one patch per relevance cell
    hidden: int = 768
    heads: int = 12
    layers: int = 12
    mlp: int = 3072
    eps: float = 1e-5  # CLIP's layer_norm_eps
    dense: str = "naclip"  # the last block's dense formulation: DENSE_METHODS
    neighbourhood_std: float = 5.0  # NACLIP's Gaussian prior, in patches (the authors' default)

    def __post_init__(self) -> None:
        if self.dense not in DENSE_METHODS:
            raise ValueError(f"dense must be one of {', '.join(DENSE_METHODS)}, not {self.dense!r}")

    @property
    def grid(self) -> int:
        return self.image_size // self.patch


@dataclass(frozen=True)
class TextureModelConfig:
    image_size: int = 512  # S: images are resized to S x S
    cell: int = 16  # pixels per cell side; G = S / cell = 32
    compat: bool = False  # arr-coc-0-1's texture channels 11-12 and bilinear sampling
    information: str = "entropy"  # "entropy" (luminance histogram) | "softmax" (arr-coc-0-1)
    hidden: int = 64  # participatory conv width (the grid is only 32 x 32; 32 was too narrow for shapes)
    embed_dim: int = 64  # joint cell/query space
    query_dim: int = 384  # all-MiniLM-L6-v2
    k: int = 200  # cells selected by default (of 1024)
    token_budget: int = 25600  # default total: 128 tokens per selected cell on average

    @property
    def grid(self) -> int:
        return self.image_size // self.cell


@dataclass(frozen=True)
class ClipModelConfig:
    image_size: int = 224  # S; 448 runs the tower on a 28 x 28 grid, positions interpolated at load
    cell: int = 16  # CLIP ViT-B/16's patch: one patch per relevance cell
    hidden: int = 768
    heads: int = 12
    layers: int = 12
    mlp: int = 3072
    query_dim: int = 512  # CLIP's joint space (projection_dim): the text tower's output
    text_hidden: int = 512  # text tower shape: only used to build random weights (benchmarks)
    text_layers: int = 12
    text_heads: int = 8
    text_mlp: int = 2048
    pretrained_size: int = 224  # the checkpoint's image size (its position grid is 14 x 14)
    weights: str = CLIP_HUB_ID  # default source: a Hugging Face id or a local directory
    resample: str = "bicubic"  # CLIPImageProcessor's resize
    k: int = 40  # of 196 cells: about the same fraction as texture's 200 of 1024
    dense: str = "naclip"  # the last block's dense formulation (DENSE_METHODS)
    neighbourhood_std: float = 5.0  # NACLIP's Gaussian prior in patches: the authors' setting
    token_budget: int = 5120  # 128 tokens per selected cell on average

    @property
    def grid(self) -> int:
        return self.image_size // self.cell

    @property
    def tower(self) -> TowerConfig:
        return TowerConfig(
            self.image_size,
            self.cell,
            self.hidden,
            self.heads,
            self.layers,
            self.mlp,
            dense=self.dense,
            neighbourhood_std=self.neighbourhood_std,
        )

    def hf_config(self):
        """transformers' CLIPConfig of the same shapes, at the checkpoint's image size."""
        from transformers import CLIPConfig

        vision = dict(
            hidden_size=self.hidden,
            intermediate_size=self.mlp,
            num_hidden_layers=self.layers,
            num_attention_heads=self.heads,
            image_size=self.pretrained_size,
            patch_size=self.cell,
            projection_dim=self.query_dim,
        )
        text = dict(
            hidden_size=self.text_hidden,
            intermediate_size=self.text_mlp,
            num_hidden_layers=self.text_layers,
            num_attention_heads=self.text_heads,
            projection_dim=self.query_dim,
        )
        return CLIPConfig(text_config=text, vision_config=vision, projection_dim=self.query_dim)
