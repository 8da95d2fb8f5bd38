"""The built-in variants. Importing this module registers them."""

from __future__ import annotations

from .model import ArrcocTexture, TextureModelConfig
from .registry import Variant, register_variant

_texture = TextureModelConfig()
register_variant(
    Variant(
        name="arrcoc-texture",
        build=lambda: ArrcocTexture(_texture),
        image_size=_texture.image_size,
        grid=_texture.grid,
        description="13-channel texture array, 3x3-conv participatory scorer; the default",
        weights_file="arrcoc-texture.safetensors",
    )
)
_compat = TextureModelConfig(compat=True, information="softmax")
register_variant(
    Variant(
        name="arrcoc-texture-compat",
        build=lambda: ArrcocTexture(_compat),
        image_size=_compat.image_size,
        grid=_compat.grid,
        description="arr-coc-0-1's texture channels and softmax-entropy information score",
    )
)

from .vit import ViTModelConfig, build_vit_b16  # noqa: E402

_vit = ViTModelConfig()
register_variant(
    Variant(
        name="arrcoc-vit-b16",
        build=lambda: build_vit_b16(_vit),
        image_size=_vit.image_size,
        grid=_vit.grid,
        description="CLIP ViT-B/16 tower (224 px, 196 patches, 768 hidden, 12x12) feeding the same scorers;"
        " the benchmark configuration: random init unless $ARRCOC_CLIP_VIT_B16 names CLIP weights",
        benchmark_only=True,
        tags=("benchmark",),
    )
)
