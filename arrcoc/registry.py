"""Variant registry: names -> a small config + a builder + where its weights live (timm-style).

The built-in catalogue is arrcoc/variants.py; `register_variant` adds more (a plugin, a test).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from . import variants
from .errors import UnknownVariantError
from .variant import Variant

if TYPE_CHECKING:  # names, configs and weight paths read without torch; create_model loads it
    import torch
    from torch import nn

WEIGHTS_DIR = Path(__file__).parent / "weights"
# weights="random" (ARRCOC_ENGINE__WEIGHTS=random, --weights random): a variant that loads its weights
# from outside (CLIP) gets random weights of its real shapes, nothing downloaded; one with bundled
# weights is left untrained. For benchmarks: such results say benchmark_only.
RANDOM_WEIGHTS = "random"


_VARIANTS: dict[str, Variant] = {v.name: v for v in variants.BUILTIN}


def register_variant(variant: Variant) -> Variant:
    if variant.name in _VARIANTS:
        raise ValueError(f"variant {variant.name!r} registered twice")
    _VARIANTS[variant.name] = variant
    return variant


def get_variant(name: str) -> Variant:
    try:
        return _VARIANTS[name]
    except KeyError:
        raise UnknownVariantError(
            f"Unknown model variant {name!r}. Known variants: {', '.join(list_variants())}."
        ) from None


def list_variants() -> list[str]:
    return sorted(_VARIANTS)


def default_weights_path(name: str) -> Path | None:
    v = get_variant(name)
    return WEIGHTS_DIR / v.weights_file if v.weights_file else None


def create_model(
    name: str = "arrcoc-texture",
    weights: str | Path | None = "default",
    device: str | torch.device = "cpu",
) -> nn.Module:
    """Build a registered variant. weights: "default" (bundled), None (untrained), or a path;
    "random" (RANDOM_WEIGHTS): as None, for every variant.
    For a variant with its own `load` (CLIP): "default" (its hub id), a hub id or a local
    directory, or None (random weights of the same shapes).

    The returned module carries `weights_version` ("untrained" when none were loaded).
    """
    from .weights import load_weights

    variant = get_variant(name)
    if weights == RANDOM_WEIGHTS:
        weights = None
    if variant.load is not None:
        model = variant.load(variant.config, weights)
        model.variant_name = name
        return model.to(device).eval()
    model = variant.build(variant.config)
    model.variant_name = name
    model.weights_version = "untrained"
    path = default_weights_path(name) if weights == "default" else weights
    if path is not None:
        if weights == "default" and not Path(path).is_file():
            path = None  # variant ships no weights yet: stay untrained, and say so
        else:
            path = Path(path)
            sidecar = path.with_name(path.name + ".sha256")  # shipped next to bundled weights
            expected = sidecar.read_text().split()[0] if sidecar.is_file() else None
            model.weights_version = load_weights(model, path, name, expected)
    return model.to(device).eval()
