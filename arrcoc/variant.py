"""What a registered model variant is: a name, a config, a builder, where its weights come from."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:  # the catalogue reads without torch; only building a model needs it
    from torch import nn


class VariantConfig(Protocol):
    """What the registry needs from a variant's model config (image size and cell grid)."""

    @property
    def image_size(self) -> int: ...

    @property
    def grid(self) -> int: ...


@dataclass(frozen=True)
class Variant:
    name: str
    build: Callable[[VariantConfig], nn.Module]
    config: VariantConfig  # the model config the builder takes; image size and grid come from it
    description: str
    weights_file: str | None = None  # file under arrcoc/weights/, shipped with the package
    # builds the model with weights from outside the package (e.g. CLIP through transformers):
    # (config, weights) -> model carrying `weights_version`; weights as create_model's
    load: Callable[[VariantConfig, str | Path | None], nn.Module] | None = None
    # what it serves on a GPU when the dtype setting is "auto" (ARRCOC_ENGINE__DTYPE); float32 on a CPU
    gpu_dtype: str = "float32"
    benchmark_only: bool = False  # random weights: timing only, never meaningful output
    tags: tuple[str, ...] = field(default_factory=tuple)

    @property
    def image_size(self) -> int:
        return self.config.image_size

    @property
    def grid(self) -> int:
        return self.config.grid
