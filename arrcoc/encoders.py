"""The one interface of query encoders, and which one a model takes.

arrcoc-texture takes all-MiniLM-L6-v2 sentence embeddings (arrcoc/query.py's QueryEncoder);
arrcoc-clip-b16 takes CLIP's own text embeddings (arrcoc/clip.py's ClipTextEncoder), loaded with
its image tower from the same checkpoint. Callers ask `arrcoc.query.query_encoder_for(model)`
instead of building a QueryEncoder themselves, so the embedding always lives in the space the
model scores in. Both cache their embeddings per query string the same way (CachedTextEncoder).
"""

from __future__ import annotations

import threading
from abc import ABC, abstractmethod
from collections import OrderedDict
from typing import Protocol, runtime_checkable

import torch
from torch import Tensor

from .request import MAX_QUERY_CHARS, validate_query


@runtime_checkable
class TextEncoder(Protocol):
    """Text -> (N, dim) float32 unit vectors on the CPU; thread-safe."""

    max_chars: int

    def encode(self, queries: list[str] | str) -> Tensor: ...


class CachedTextEncoder(ABC):
    """An LRU cache per query string around `_encode` (a batch of new strings -> vectors)."""

    def __init__(self, cache_size: int = 1024, max_chars: int = MAX_QUERY_CHARS):
        self.cache_size = cache_size
        self.max_chars = max_chars
        self._cache: OrderedDict[str, Tensor] = OrderedDict()
        self._lock = threading.Lock()

    @abstractmethod
    def _encode(self, texts: list[str]) -> Tensor:
        """(N, dim) unit vectors for N validated, distinct strings (called under the lock)."""

    def encode(self, queries: list[str] | str) -> Tensor:
        if isinstance(queries, str):
            queries = [queries]
        # a cached string is a validated one (validating is idempotent): only new strings are checked
        texts = [
            q if isinstance(q, str) and q in self._cache else validate_query(q, self.max_chars)
            for q in queries
        ]
        with self._lock:
            missing = list(dict.fromkeys(t for t in texts if t not in self._cache))
            if missing:
                for t, v in zip(missing, self._encode(missing).float().cpu(), strict=True):
                    self._cache[t] = v
            for t in texts:
                self._cache.move_to_end(t)
            out = torch.stack([self._cache[t] for t in texts])
            while len(self._cache) > self.cache_size:
                self._cache.popitem(last=False)
        return out
