"""The built-in variants (arrcoc.registry serves them by name)."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

from .configs import ClipModelConfig, TextureModelConfig
from .variant import Variant


def _lazy(module: str, name: str) -> Callable[..., Any]:
    """A builder imported on its first call: the catalogue (names, configs) reads without torch."""

    def call(*args: Any) -> Any:
        return getattr(importlib.import_module(module), name)(*args)

    call.__qualname__ = call.__name__ = f"{module}.{name}"
    return call


ArrcocTexture = _lazy("arrcoc.model", "ArrcocTexture")
ArrcocClip = _lazy("arrcoc.clip", "ArrcocClip")
build_clip = _lazy("arrcoc.clip", "build_clip")
DENSE_NAMES = {"naclip": "NACLIP's neighbourhood attention", "maskclip": "MaskCLIP's value path"}

BUILTIN: tuple[Variant, ...] = (
    Variant(
        name="arrcoc-texture",
        build=ArrcocTexture,
        config=TextureModelConfig(),
        description="13-channel texture array, 3x3-conv participatory scorer; the default",
        weights_file="arrcoc-texture.safetensors",
    ),
    Variant(
        name="arrcoc-texture-compat",
        build=ArrcocTexture,
        config=TextureModelConfig(compat=True, information="softmax"),
        description="arr-coc-0-1's texture channels and softmax-entropy information score",
    ),
    *(
        Variant(
            name=f"arrcoc-clip-b16{suffix}",
            build=ArrcocClip,
            load=build_clip,
            # 4x the cells at 448: K and the budget keep the same share of them
            config=ClipModelConfig(
                image_size=size,
                k=40 * (size // 224) ** 2,
                token_budget=5120 * (size // 224) ** 2,
                dense=dense,
            ),
            description=f"CLIP ViT-B/16 ({size} px, {(size // 16) ** 2} patches, 768 hidden, 12x12): dense"
            f" patch-text similarity ({DENSE_NAMES[dense]}) with CLIP's text tower; weights from the hub"
            " (openai/clip-vit-base-patch16) or a local directory",
            tags=("clip", "hub"),
            # a 12-layer ViT is matmul-bound: bfloat16 tensor cores; the tower alone runs in
            # bfloat16, its outputs and every map in float32 (ArrcocClip.forward)
            gpu_dtype="bfloat16",
        )
        for size, suffix, dense in (
            (224, "", "naclip"),
            (448, "-448", "naclip"),
            (224, "-maskclip", "maskclip"),
        )
    ),
)
