"""All settings, read from the environment in this one place: a few groups (engine, batching, jobs,
limits, access, service), each field from ARRCOC_<GROUP>__<FIELD> (docs/settings.md)."""

from __future__ import annotations

import ipaddress
import json
import os
import re
from collections.abc import Mapping
from functools import lru_cache
from pathlib import Path
from typing import Annotated, Literal, get_args

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from .errors import InvalidInputError

ENV_PREFIX = "ARRCOC_"

# The engine backends, in one place: the engine's factory, the CLI, the demo and the validators
# below all read this.
BACKENDS = ("eager", "compiled", "onnx", "aot")
# The batch sizes an engine compiles and captures a graph for, unless told otherwise: the settings,
# the pipeline, the backends and the benchmark harness all default to this.
DEFAULT_BUCKETS: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64)
# Where `arrcoc worker`, `arrcoc submit` and the Celery executor look for Redis when no
# ARRCOC_SERVICE__BROKER_URL is given (the in-process executor needs none).
DEFAULT_BROKER_URL = "redis://127.0.0.1:6379/0"
# what ARRCOC_ENGINE__DTYPE and the --dtype options take (arrcoc.engine.base.serving_dtype resolves "auto")
DTYPES = ("auto", "float32", "bfloat16")
# How a batch job's overlays are encoded when it asks for them: JPEG (rendered and encoded on the GPU
# when there is one) or PNG (lossless, on the CPU).
OverlayFormat = Literal["jpeg", "png"]
OVERLAY_FORMATS: tuple[str, ...] = get_args(OverlayFormat)
OVERLAY_EXTENSIONS = {"jpeg": ".jpg", "png": ".png"}
# What a batch job's overlay pictures show, chosen per job: the relevance map blended over the photo, or
# the foveated view (the photo as a vision-language model would be given it under the result's token
# budgets: arrcoc.foveate).
OverlayKind = Literal["relevance", "foveated"]
OVERLAY_KINDS: tuple[str, ...] = get_args(OverlayKind)
DEFAULT_OVERLAY_KIND: OverlayKind = "relevance"
# What a batch job asks for when it is submitted: no pictures (its product is results.parquet and
# summary.csv, which a program reads; drawing costs more than running the model) or one of the kinds.
Overlays = Literal["none", "relevance", "foveated"]
OVERLAYS: tuple[str, ...] = get_args(Overlays)
DEFAULT_OVERLAYS: Overlays = "none"


# Every group below is frozen and refuses unknown fields, so a misspelt ARRCOC_<GROUP>__<NAME> is an
# error at startup rather than a setting silently left at its default.
_GROUP = ConfigDict(frozen=True, extra="forbid")


def _list(v: object) -> object:
    """A list field from the environment: "eager,onnx" or JSON '["eager","onnx"]'."""
    if isinstance(v, str):
        v = v.strip()
        return json.loads(v) if v.startswith("[") else [x.strip() for x in v.split(",") if x.strip()]
    return v


class EngineSettings(BaseModel):
    """What the engine serves and how a worker group runs it (ARRCOC_ENGINE__*)."""

    model_config = _GROUP

    variant: str = "arrcoc-texture"
    weights: str | None = None  # None: the weights bundled for the variant
    device: str = "auto"  # auto | cpu | cuda | cuda:N
    # a worker group over several devices (`arrcoc worker --devices`): "all" (every visible GPU)
    # or a list such as "cuda:0,cuda:1"; empty: the one `device`. Engine and Celery processes
    # (processes, worker_processes) are counted per device
    devices: Annotated[tuple[str, ...], NoDecode] = ()
    backend: str = "eager"  # eager | compiled | onnx: what interactive requests use
    # lists: "eager,onnx" or JSON '["eager","onnx"]'
    backends: Annotated[tuple[str, ...], NoDecode] = BACKENDS  # what a worker may serve
    buckets: Annotated[tuple[int, ...], NoDecode] = DEFAULT_BUCKETS
    # auto | float32 | bfloat16. auto: each variant's own dtype on a GPU (Variant.gpu_dtype:
    # bfloat16 for the CLIP variants, float32 for the texture ones) and float32 on a CPU;
    # float32 serves float32 everywhere
    dtype: str = "auto"
    query_encoder: str | None = None  # None: bundled all-MiniLM-L6-v2; else HF id or path
    query_cache_size: int = 1024
    # engine processes per device in a worker group (each Celery process sends to the least loaded):
    # one engine process's Python (decode and engine stages, a connection thread per request) is
    # bound by its GIL while the GPU idles (docs/service.md); several share the device as model
    # instances do in Triton's instance groups. At most worker_processes of them are started.
    processes: int = Field(1, ge=1, le=16)
    # an engine process that exits is started again, at most this many times in ten minutes
    # (past that the whole group stops and its supervisor exits non-zero)
    restarts: int = Field(5, ge=0, le=100)
    # the engine process's GIL switch interval (sys.setswitchinterval): how long a thread may keep
    # the GIL while others wait for it; there, the batch threads share it with a connection thread
    # per request in flight
    switch_interval_ms: float = Field(0.5, gt=0, le=100)
    # Celery processes per device feeding the group's engine processes (docs/service.md: one
    # process's consumer is bound by its GIL; several feed one batcher). 1 (and no devices): the
    # engine runs inside the worker process.
    worker_processes: int = 1
    worker_threads: int | None = None  # None: worker.config.worker_threads decides

    _lists = field_validator("devices", "backends", "buckets", mode="before")(_list)

    @field_validator("dtype")
    @classmethod
    def _known_dtype(cls, v: str) -> str:
        name = {"fp32": "float32", "bf16": "bfloat16"}.get(v.strip().lower(), v.strip().lower())
        if name not in DTYPES:
            raise ValueError(f"ARRCOC_ENGINE__DTYPE must be one of {', '.join(DTYPES)}")
        return name

    @field_validator("devices")
    @classmethod
    def _known_devices(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        if v == ("all",) or all(d == "cpu" or re.fullmatch(r"cuda(:\d+)?", d) for d in v):
            return v
        raise ValueError(
            "ARRCOC_ENGINE__DEVICES must be all, or devices such as cuda:0,cuda:1 (cpu for a test group)"
        )

    @field_validator("backend")
    @classmethod
    def _known_backend(cls, v: str) -> str:
        if v not in BACKENDS:
            raise ValueError(f"ARRCOC_ENGINE__BACKEND must be one of {', '.join(BACKENDS)}")
        return v

    @field_validator("backends")
    @classmethod
    def _known_backends(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        if not v or any(b not in BACKENDS for b in v):
            raise ValueError(
                f"ARRCOC_ENGINE__BACKENDS must name some of {', '.join(BACKENDS)}, e.g. eager,onnx"
            )
        return v

    @field_validator("buckets")
    @classmethod
    def _buckets_sorted(cls, v: tuple[int, ...]) -> tuple[int, ...]:
        if not v or any(b < 1 for b in v):
            raise ValueError("ARRCOC_ENGINE__BUCKETS must be positive batch sizes, e.g. 1,2,4,8")
        return tuple(sorted(set(v)))

    def served_backend(self, backend: str | None) -> str:
        """The backend a request runs on (None: ARRCOC_ENGINE__BACKEND), or a clear error if this
        server does not serve it."""
        name = backend or self.backend
        if name not in self.backends:
            raise InvalidInputError(
                f"This server does not serve the {name!r} backend; it serves"
                f" {', '.join(self.backends)} (ARRCOC_ENGINE__BACKENDS)."
            )
        return name


class BatchingSettings(BaseModel):
    """How requests are gathered into engine batches, and how a batch job's chunks run
    (ARRCOC_BATCHING__*)."""

    model_config = _GROUP

    # 32: with many callers on a GPU fewer, larger batches spend less of the batcher's one thread
    # per request on nvJPEG's and the engine's per-call costs (docs/service.md#dynamic-batching;
    # tools/interactive_probe.py and `arrcoc bench e2e` measure it)
    max_size: int = 32
    max_delay_ms: float = 5.0
    # wait the batching delay even when idle: off, a request arriving in a quiet period (the last
    # batch was a single request and nobody is waiting) runs at once instead of waiting for company
    idle_wait: bool = False
    # a batch chunk's steps at once on an accelerator, each carried from its files to its recorded
    # results by a thread of its own: while one is written, the next decodes and runs
    # (docs/service.md#concurrency); a CPU host runs one
    steps_in_flight: int = Field(4, ge=1, le=4)
    # items per batch-job task (a unit of redelivery and progress); a job's last quarter goes in
    # tasks a quarter as large (arrcoc.service.jobs.batch.chunks_of)
    chunk_items: int = 256


class JobSettings(BaseModel):
    """Batch and benchmark jobs: their outputs, lifetimes and retries (ARRCOC_JOBS__*)."""

    model_config = _GROUP

    overlay_format: OverlayFormat = "jpeg"
    overlay_max_side: int = Field(1024, ge=64, le=4096)  # batch-job overlays: at most this many pixels a side
    overlay_jpeg_quality: int = Field(90, ge=10, le=100)
    # results.jsonl in a batch job's results zip beside results.parquet (the same rows as JSON lines):
    # off by default, as it is several times the Parquet file and built at the job's end
    results_jsonl: bool = False
    ttl_s: int = 7 * 24 * 3600  # a job's record and files are kept this long
    result_expires_s: int = 24 * 3600
    task_time_limit_s: int = 600
    max_redeliveries: int = 3
    # an unacked task is redelivered after this (its worker died); a live worker renews it for the
    # tasks it holds every quarter of it, so a long chunk is not delivered twice
    visibility_timeout_s: int = Field(60, ge=4)
    # in-process: how long a batch job runs before the job thread turns to another owner's waiting
    # job (jobs of different owners take turns; Celery workers interleave jobs by chunk)
    slice_s: float = Field(5.0, gt=0)
    # the reaper: expired job folders and the demo's temporary files are removed this often
    reap_interval_s: int = 600
    temp_max_age_s: int = 3600
    # Benchmark jobs: caps on what one job may ask for, and how long it may hold the device
    max_bench_iterations: int = 1000
    max_bench_warmup: int = 100
    max_bench_buckets: int = 8
    max_bench_variants: int = 4
    bench_time_limit_s: int = 1800


class LimitSettings(BaseModel):
    """What one request, upload or client may ask for (ARRCOC_LIMITS__*)."""

    model_config = _GROUP

    max_image_bytes: int = 25 * 1024 * 1024
    max_image_pixels: int = 40_000_000
    min_image_side: int = 16
    max_query_chars: int = 500
    max_batch_items: int = 2000
    max_archive_bytes: int = 1024 * 1024 * 1024  # batch zip upload
    max_archive_ratio: int = 200  # uncompressed / compressed, for every entry: above this, a zip bomb
    # what a batch zip may expand to on disk, all entries together (checked before anything is
    # written, from the central directory, and again while writing: declared sizes are not trusted)
    max_unpacked_bytes: int = 2 * 1024 * 1024 * 1024
    max_archive_entries: int = 4096  # files + folders in a batch zip (junk such as __MACOSX included)
    max_manifest_bytes: int = 8 * 1024 * 1024
    # a batch job's work: its items' pixels as they are decoded, summed (a JPEG counted at the
    # reduced size it is decoded at, anything else at full size), in millions; checked at
    # submission from the images' headers: 2,000 items of 16 MP
    max_job_megapixels: float = Field(32_000.0, gt=0)
    # the data store's disk (inputs and results of every batch job): in all, and per owner (a
    # token, a browser, a session); a job reserves what it may write before writing; 0: no limit
    max_data_bytes: int = Field(50 * 1024**3, ge=0)
    max_owner_bytes: int = Field(10 * 1024**3, ge=0)
    # rate limits per client (token, browser or address) and minute, on the demo; 0: no limit
    infer_per_min: int = 60
    jobs_per_min: int = 6
    # every other call (job status, cancel, the page's own follow-up events and polls): one open
    # page polls once a second, so this leaves room for a few tabs
    status_per_min: int = 300


class AccessSettings(BaseModel):
    """Who may run jobs and benchmarks (ARRCOC_ACCESS__*; docs/security.md)."""

    model_config = _GROUP

    # None: open (a private deployment behind its own network). Set: the demo's job and benchmark
    # endpoints and `arrcoc submit/job` require this token.
    api_token: str | None = None
    # which job kinds need the token when one is set: "batch,bench", or "bench" for a public Space
    # where anyone may run batch jobs (bound to their browser) but only token holders benchmark
    token_scope: Annotated[tuple[str, ...], NoDecode] = ("batch", "bench")
    # without a token, benchmarks (which hold the device for minutes) are closed to everyone who
    # comes through the demo; true opens them to anonymous callers (a private deployment)
    open_benchmarks: bool = False
    # addresses or networks of the reverse proxies in front of the demo (e.g. "10.0.0.0/8,127.0.0.1"):
    # X-Forwarded-For is believed only from these; from anyone else the peer's address is the
    # client's. Loopback by default: a proxy on the same host (nginx, Gradio's server-side renderer)
    trusted_proxies: Annotated[tuple[str, ...], NoDecode] = ("127.0.0.1", "::1")

    _lists = field_validator("token_scope", "trusted_proxies", mode="before")(_list)

    @field_validator("token_scope")
    @classmethod
    def _known_scope(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        if any(k not in ("batch", "bench") for k in v):
            raise ValueError("ARRCOC_ACCESS__TOKEN_SCOPE must name some of batch, bench, e.g. bench")
        return tuple(v)

    @field_validator("trusted_proxies")
    @classmethod
    def _proxy_networks(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        for p in v:
            try:
                ipaddress.ip_network(p, strict=False)
            except ValueError:
                raise ValueError(
                    f"ARRCOC_ACCESS__TRUSTED_PROXIES: {p!r} is not an address or network, e.g. 10.0.0.0/8"
                ) from None
        return tuple(v)

    @field_validator("api_token")
    @classmethod
    def _token_strength(cls, v: str | None) -> str | None:
        if v is not None and v.strip() and len(v.strip()) < 16:
            raise ValueError(
                "ARRCOC_ACCESS__API_TOKEN must be at least 16 characters (e.g. `openssl rand -hex 16`)"
            )
        return v.strip() or None if v is not None else None

    def token_required(self, kind: str) -> bool:
        """Whether jobs of this kind ("batch", "bench") need the API token."""
        return self.api_token is not None and kind in self.token_scope


class ServiceSettings(BaseModel):
    """Where the service keeps its queue, state and files (ARRCOC_SERVICE__*)."""

    model_config = _GROUP

    broker_url: str | None = None  # None: in-process executor
    result_url: str | None = None  # None: same as broker_url
    queue_gpu: str = "gpu"
    queue_bench: str = "bench"
    redis_prefix: str = "arrcoc"  # job store and image keys
    redis_timeout_s: float = 5.0  # socket timeouts: no client call hangs on a dead Redis
    image_ttl_s: int = 3600  # an interactive request's image waits in Redis at most this long
    cache_dir: Path = Path.home() / ".cache" / "arrcoc"  # Inductor/Triton caches, ONNX files
    data_dir: Path = Path.home() / ".local" / "share" / "arrcoc"  # batch inputs, results

    @property
    def results_backend(self) -> str | None:
        return self.result_url or self.broker_url

    @property
    def queue_url(self) -> str:
        """The Redis that carries tasks and job state (a worker or `arrcoc submit` needs one)."""
        return self.broker_url or DEFAULT_BROKER_URL


# The flat names settings had before they were grouped (ARRCOC_<OLD> -> ARRCOC_<GROUP>__<NEW>):
# one still set is an error at startup that names its new variable, so that no setting (the API
# token least of all) is silently ignored after an upgrade.
MOVED: dict[str, str] = {
    "variant": "engine.variant",
    "weights": "engine.weights",
    "device": "engine.device",
    "devices": "engine.devices",
    "backend": "engine.backend",
    "backends": "engine.backends",
    "buckets": "engine.buckets",
    "dtype": "engine.dtype",
    "query_encoder": "engine.query_encoder",
    "query_cache_size": "engine.query_cache_size",
    "engine_processes": "engine.processes",
    "engine_restarts": "engine.restarts",
    "engine_switch_interval_ms": "engine.switch_interval_ms",
    "worker_processes": "engine.worker_processes",
    "worker_threads": "engine.worker_threads",
    "batch_max_size": "batching.max_size",
    "batch_max_delay_ms": "batching.max_delay_ms",
    "batch_idle_wait": "batching.idle_wait",
    "batch_steps_in_flight": "batching.steps_in_flight",
    "batch_chunk_items": "batching.chunk_items",
    "overlay_format": "jobs.overlay_format",
    "overlay_max_side": "jobs.overlay_max_side",
    "overlay_jpeg_quality": "jobs.overlay_jpeg_quality",
    "results_jsonl": "jobs.results_jsonl",
    "job_ttl_s": "jobs.ttl_s",
    "result_expires_s": "jobs.result_expires_s",
    "task_time_limit_s": "jobs.task_time_limit_s",
    "max_redeliveries": "jobs.max_redeliveries",
    "visibility_timeout_s": "jobs.visibility_timeout_s",
    "job_slice_s": "jobs.slice_s",
    "reap_interval_s": "jobs.reap_interval_s",
    "temp_max_age_s": "jobs.temp_max_age_s",
    "max_bench_iterations": "jobs.max_bench_iterations",
    "max_bench_warmup": "jobs.max_bench_warmup",
    "max_bench_buckets": "jobs.max_bench_buckets",
    "max_bench_variants": "jobs.max_bench_variants",
    "bench_time_limit_s": "jobs.bench_time_limit_s",
    "max_image_bytes": "limits.max_image_bytes",
    "max_image_pixels": "limits.max_image_pixels",
    "min_image_side": "limits.min_image_side",
    "max_query_chars": "limits.max_query_chars",
    "max_batch_items": "limits.max_batch_items",
    "max_archive_bytes": "limits.max_archive_bytes",
    "max_archive_ratio": "limits.max_archive_ratio",
    "max_unpacked_bytes": "limits.max_unpacked_bytes",
    "max_archive_entries": "limits.max_archive_entries",
    "max_manifest_bytes": "limits.max_manifest_bytes",
    "max_job_megapixels": "limits.max_job_megapixels",
    "max_data_bytes": "limits.max_data_bytes",
    "max_owner_bytes": "limits.max_owner_bytes",
    "rate_limit_infer_per_min": "limits.infer_per_min",
    "rate_limit_jobs_per_min": "limits.jobs_per_min",
    "rate_limit_status_per_min": "limits.status_per_min",
    "api_token": "access.api_token",
    "token_scope": "access.token_scope",
    "open_benchmarks": "access.open_benchmarks",
    "trusted_proxies": "access.trusted_proxies",
    "broker_url": "service.broker_url",
    "result_url": "service.result_url",
    "queue_gpu": "service.queue_gpu",
    "queue_bench": "service.queue_bench",
    "redis_prefix": "service.redis_prefix",
    "redis_timeout_s": "service.redis_timeout_s",
    "image_ttl_s": "service.image_ttl_s",
    "cache_dir": "service.cache_dir",
    "data_dir": "service.data_dir",
}


def env_name(path: str) -> str:
    """The variable a setting is read from: env_name("batching.max_size") == "ARRCOC_BATCHING__MAX_SIZE"."""
    return ENV_PREFIX + path.replace(".", "__").upper()


def settings_env(**groups: Mapping[str, object]) -> dict[str, str]:
    """The environment variables that set these fields, for a child process:
    settings_env(batching={"max_size": 4}) == {"ARRCOC_BATCHING__MAX_SIZE": "4"} (lists as "a,b")."""
    env = {}
    for group, values in groups.items():
        fields = Settings.model_fields[group].annotation.model_fields  # KeyError: no such group
        for name, value in values.items():
            if name not in fields:
                raise KeyError(f"no setting {group}.{name}")
            text = ",".join(map(str, value)) if isinstance(value, (list, tuple)) else str(value)
            env[env_name(f"{group}.{name}")] = text
    return env


def moved_variables(environ: Mapping[str, str]) -> list[str]:
    """Old flat variables still set, each with the one that replaced it ("OLD -> NEW")."""
    names = {k.upper() for k in environ}
    return [
        f"{ENV_PREFIX}{old.upper()} -> {env_name(new)}"
        for old, new in MOVED.items()
        if f"{ENV_PREFIX}{old.upper()}" in names
    ]


class Settings(BaseSettings):
    """All settings, in groups; each field is read from ARRCOC_<GROUP>__<FIELD> (docs/settings.md)."""

    model_config = SettingsConfigDict(env_prefix=ENV_PREFIX, env_nested_delimiter="__", frozen=True)

    engine: EngineSettings = EngineSettings()
    batching: BatchingSettings = BatchingSettings()
    jobs: JobSettings = JobSettings()
    limits: LimitSettings = LimitSettings()
    access: AccessSettings = AccessSettings()
    service: ServiceSettings = ServiceSettings()

    @model_validator(mode="before")
    @classmethod
    def _no_old_names(cls, data: object) -> object:
        if moved := moved_variables(os.environ):
            raise ValueError(
                "settings moved into groups; rename these environment variables: " + ", ".join(moved)
            )
        return data

    def replace(self, **groups: BaseModel | Mapping[str, object]) -> Settings:
        """These settings with some fields of some groups replaced, and validated as values from
        the environment are: `s.replace(batching={"max_size": 4}, service={"broker_url": None})`."""
        update: dict[str, BaseModel] = {}
        for name, values in groups.items():
            if name not in type(self).model_fields:
                raise TypeError(
                    f"no settings group {name!r}; the groups are {', '.join(type(self).model_fields)}"
                )
            group = getattr(self, name)
            update[name] = (
                values
                if isinstance(values, BaseModel)
                # the fields set before stay set, and only they: model_fields_set still tells a
                # value someone chose from a default (Runtime's CPU buckets read it)
                else type(group).model_validate(group.model_dump(exclude_unset=True) | dict(values))
            )
        return self.model_copy(update=update)


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    """The process-wide settings. Tests call `get_settings.cache_clear()` after changing env."""
    return Settings()


def default_settings(**groups: BaseModel | Mapping[str, object]) -> Settings:
    """Settings from the environment with some fields replaced, group by group (for tests and
    CLIs): `default_settings(batching={"max_size": 4})` (Settings.replace)."""
    return get_settings().replace(**groups)


__all__ = [
    "BACKENDS",
    "DEFAULT_BUCKETS",
    "DEFAULT_BROKER_URL",
    "DTYPES",
    "AccessSettings",
    "BatchingSettings",
    "EngineSettings",
    "JobSettings",
    "LimitSettings",
    "ServiceSettings",
    "Settings",
    "default_settings",
    "env_name",
    "get_settings",
    "settings_env",
]
