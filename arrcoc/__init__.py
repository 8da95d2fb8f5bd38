"""ARR-COC: query-aware visual relevance, compiled for the GPU.

    from pathlib import Path

    import arrcoc

    pipe = arrcoc.RelevancePipeline("arrcoc-texture", backend="eager")
    [result] = pipe.infer(["arrcoc/examples/coffee.jpg"], "the red one")
    print(result.match_score, result.weak_match, result.selected[:5])  # how well it matched; the top cells

    ex = arrcoc.create_executor()  # in-process, or Celery when ARRCOC_SERVICE__BROKER_URL is set
    result = ex.infer(Path("arrcoc/examples/chelsea.jpg").read_bytes(), "the black one", arrcoc.Controls(k=50))

The default model grounds colours, positions, text and simple shapes, not object categories on
photos ("the red mug" scores a weak match where "the red one" matches): docs/model.md.

The names below are imported on first use, so `import arrcoc` loads neither torch nor a model.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

# public name -> the module that defines it
_EXPORTS = {
    "create_model": "arrcoc.registry",
    "list_variants": "arrcoc.registry",
    "get_variant": "arrcoc.registry",
    "texture_array": "arrcoc.texture",
    "RelevancePipeline": "arrcoc.pipeline",
    "Controls": "arrcoc.request",
    "RelevanceResult": "arrcoc.result",
    "create_executor": "arrcoc.service.client.factory",
    "Executor": "arrcoc.service.client.executor",
    "Settings": "arrcoc.settings",
    "get_settings": "arrcoc.settings",
    "ArrcocError": "arrcoc.errors",
    "InvalidInputError": "arrcoc.errors",
    "ImageError": "arrcoc.errors",
    "WeightsError": "arrcoc.errors",
    "UnknownVariantError": "arrcoc.errors",
    "EngineError": "arrcoc.errors",
    "JobError": "arrcoc.errors",
    "ServiceUnavailableError": "arrcoc.errors",
    "DeadlineExceeded": "arrcoc.errors",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'arrcoc' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # once: later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))


if TYPE_CHECKING:  # for type checkers and IDEs: the same names, imported eagerly
    from .errors import (  # noqa: F401
        ArrcocError,
        DeadlineExceeded,
        EngineError,
        ImageError,
        InvalidInputError,
        JobError,
        ServiceUnavailableError,
        UnknownVariantError,
        WeightsError,
    )
    from .pipeline import RelevancePipeline  # noqa: F401
    from .registry import create_model, get_variant, list_variants  # noqa: F401
    from .request import Controls  # noqa: F401
    from .result import RelevanceResult  # noqa: F401
    from .service.client.executor import Executor  # noqa: F401
    from .service.client.factory import create_executor  # noqa: F401
    from .settings import Settings, get_settings  # noqa: F401
    from .texture import texture_array  # noqa: F401
