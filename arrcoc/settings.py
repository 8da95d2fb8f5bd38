"""All settings, read from the environment (prefix ARRCOC_) in this one place."""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

from pydantic import field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="ARRCOC_", frozen=True)

    # Model
    variant: str = "arrcoc-texture"
    weights: str | None = None  # None: the weights bundled for the variant
    device: str = "auto"  # auto | cpu | cuda | cuda:N
    backend: str = "eager"  # eager | compiled | onnx: what interactive requests use
    backends: tuple[str, ...] = ("eager", "compiled", "onnx")  # what a worker may serve
    buckets: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64)
    dtype: str = "float32"  # float32 | bfloat16
    query_encoder: str | None = None  # None: bundled all-MiniLM-L6-v2; else HF id or path
    query_cache_size: int = 1024

    # Storage
    cache_dir: Path = Path.home() / ".cache" / "arrcoc"  # Inductor/Triton caches, ONNX files
    data_dir: Path = Path.home() / ".local" / "share" / "arrcoc"  # batch inputs, results

    # Input limits
    max_image_bytes: int = 25 * 1024 * 1024
    max_image_pixels: int = 40_000_000
    min_image_side: int = 16
    max_query_chars: int = 500
    max_batch_items: int = 2000

    # Service
    broker_url: str | None = None  # None: in-process executor
    result_url: str | None = None  # None: same as broker_url
    queue_gpu: str = "gpu"
    queue_bench: str = "bench"
    image_ttl_s: int = 3600
    job_ttl_s: int = 7 * 24 * 3600
    result_expires_s: int = 24 * 3600
    batch_max_delay_ms: float = 5.0
    batch_max_size: int = 32
    task_time_limit_s: int = 600
    max_redeliveries: int = 3
    visibility_timeout_s: int = 3600  # an unacked task is redelivered after this (worker died)
    redis_prefix: str = "arrcoc"  # job store and image keys
    redis_timeout_s: float = 5.0  # socket timeouts: no client call hangs on a dead Redis
    max_archive_bytes: int = 1024 * 1024 * 1024  # batch zip upload
    max_archive_ratio: int = 200  # uncompressed / compressed per entry above this: a zip bomb
    worker_threads: int | None = None  # None: batch_max_size + 4 (threads pool: batching needs them)

    @field_validator("buckets")
    @classmethod
    def _buckets_sorted(cls, v: tuple[int, ...]) -> tuple[int, ...]:
        if not v or any(b < 1 for b in v):
            raise ValueError("ARRCOC_BUCKETS must be positive batch sizes, e.g. [1,2,4,8]")
        return tuple(sorted(set(v)))

    @property
    def results_backend(self) -> str | None:
        return self.result_url or self.broker_url


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    """The process-wide settings. Tests call `get_settings.cache_clear()` after changing env."""
    return Settings()


def default_settings(**overrides: object) -> Settings:
    """Settings from the environment with some fields replaced (for tests and CLIs)."""
    return get_settings().model_copy(update=overrides)


__all__ = ["Settings", "get_settings", "default_settings"]
