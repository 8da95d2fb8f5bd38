"""The built-in variants. Importing this module registers them."""

from __future__ import annotations

from .model import ArrcocTexture, TextureModelConfig
from .registry import Variant, register_variant
from .vit import ViTModelConfig, build_vit_b16

register_variant(
    Variant(
        name="arrcoc-texture",
        build=ArrcocTexture,
        config=TextureModelConfig(),
        description="13-channel texture array, 3x3-conv participatory scorer; the default",
        weights_file="arrcoc-texture.safetensors",
    )
)
register_variant(
    Variant(
        name="arrcoc-texture-compat",
        build=ArrcocTexture,
        config=TextureModelConfig(compat=True, information="softmax"),
        description="arr-coc-0-1's texture channels and softmax-entropy information score",
    )
)
register_variant(
    Variant(
        name="arrcoc-vit-b16",
        build=build_vit_b16,
        config=ViTModelConfig(),
        description="CLIP ViT-B/16 tower (224 px, 196 patches, 768 hidden, 12x12) feeding the same scorers;"
        " the benchmark configuration: random init unless $ARRCOC_CLIP_VIT_B16 names CLIP weights",
        benchmark_only=True,
        tags=("benchmark",),
    )
)
