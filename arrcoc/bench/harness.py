"""run_benchmark: every variant x backend x bucket, timed interleaved, checked against eager."""

from __future__ import annotations

import gc
import logging
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from ..engine import create_backend, resolve_device
from ..engine.base import Backend, example_inputs, parse_dtype
from ..engine.compiled import compile_count
from ..errors import EngineError, JobCancelled
from ..registry import create_model, get_variant
from ..settings import BACKENDS, DEFAULT_BUCKETS
from .env import collect_env
from .parity import MIN_OVERLAP_BF16, TOL, compare, photo_batch, random_queries
from .startup import bench_weights, measure_startup
from .timing import summarize, time_interleaved

SCHEMA = "arrcoc-bench/1"
log = logging.getLogger(__name__)
Progress = Callable[[float, str], None]


@dataclass
class BenchConfig:
    variants: tuple[str, ...] = ("arrcoc-texture", "arrcoc-clip-b16")
    backends: tuple[str, ...] = BACKENDS
    buckets: tuple[int, ...] = DEFAULT_BUCKETS
    iters: int = 100  # timed iterations per backend and bucket
    warmup_iters: int = 10  # untimed calls per backend and bucket before timing
    device: str = "auto"
    dtype: str = "float32"
    weights: str | None = "default"  # see bench_weights: "default" is random for hub variants
    cache_dir: Path | None = None  # None: a fresh temporary dir, so compile_s is a cold compile
    startup: bool = False  # also measure cold/warm start in separate processes (slow)
    input_sets: int = 3  # random input sets rotated through while timing (no cache-warm replays)
    backend_options: dict[str, dict] = field(default_factory=dict)  # backend -> its class's options
    notes: dict[str, str] = field(default_factory=dict)

    def to_json(self) -> dict:
        d = asdict(self)
        d["cache_dir"] = str(self.cache_dir) if self.cache_dir else None
        return d


# What `arrcoc bench` runs on a CPU unless told otherwise: a run of seconds that still compares two
# backends. compiled and aot spend minutes building their programs on a CPU, and the full matrix
# (two variants, seven buckets, 100 iterations) is a GPU's workload; flags still ask for any of it.
CPU_DEFAULTS = BenchConfig(
    variants=("arrcoc-texture",), backends=("eager", "onnx"), buckets=(1, 4), iters=10, warmup_iters=2
)


def device_defaults(device_type: str) -> BenchConfig:
    """The benchmark a device gets when nothing is asked for: the full set, or CPU_DEFAULTS on a CPU."""
    return CPU_DEFAULTS if device_type == "cpu" else BenchConfig()


def run_benchmark(config: BenchConfig, progress: Progress | None = None) -> dict:
    """Run the benchmark; return the JSON-safe report (see SCHEMA and BENCHMARKS.md)."""
    device = resolve_device(config.device)
    dtype = parse_dtype(config.dtype)
    backends = ("eager",) + tuple(b for b in config.backends if b != "eager")
    startup_jobs = (
        [(v, b) for v in config.variants for b in backends if b != "eager"] if config.startup else []
    )
    total = len(config.variants) * (len(backends) + len(config.buckets)) + len(startup_jobs)
    done, doing = 0, "timing"

    def step(msg: str | None, advance: bool = True) -> None:
        """One more step done (msg None: a timed iteration, progress only; advance False: what the
        next step is doing). The callback may raise to stop the run (a cancelled job's
        JobCancelled): that error is let through."""
        nonlocal done, doing
        done += msg is not None and advance
        doing = msg if msg is not None and not advance else doing
        if progress is not None:
            progress(done / total, msg or doing)

    report = {
        "schema": SCHEMA,
        "env": collect_env(device),
        "config": config.to_json(),
        "results": [],
        "startup": [],
        "warmup": [],
        "errors": [],
        "recompiles_after_warmup": 0,
    }
    with tempfile.TemporaryDirectory(prefix="arrcoc-bench-") as tmp:
        cache = Path(config.cache_dir) if config.cache_dir else Path(tmp)
        for variant in config.variants:
            _bench_variant(variant, backends, config, device, dtype, cache, report, step)
    for variant, backend in startup_jobs:
        try:
            report["startup"].append(
                measure_startup(variant, backend, config.buckets, str(device), config.weights)
            )
        except JobCancelled:
            raise
        except Exception as e:  # one failed start must not lose the rest of the report
            report["errors"].append(
                {"variant": variant, "backend": backend, "stage": "startup", "error": str(e)[-2000:]}
            )
        step(f"startup {variant} {backend}")
    return report


def _warm(name: str, model, device, config, dtype, cache: Path) -> tuple[Backend, dict]:
    cuda = device.type == "cuda"
    if cuda:
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        base, free0 = torch.cuda.memory_allocated(device), torch.cuda.mem_get_info(device)[0]
    t0 = time.perf_counter()
    options = dict(config.backend_options.get(name, {}))
    if "disabled_optimizers" in options:
        options["disabled_optimizers"] = tuple(options["disabled_optimizers"])
    be = create_backend(name, model, device, config.buckets, dtype, cache / name, **options)
    be.warmup()
    info = {"backend": name, "warmup_s": time.perf_counter() - t0, **be.stats}
    if cuda:
        with torch.inference_mode():
            be.run(*example_inputs(model, max(config.buckets), device, seed=5))
        torch.cuda.synchronize(device)
        info["peak_mem_mb"] = (torch.cuda.max_memory_allocated(device) - base) / 2**20
        info["device_mem_used_mb"] = (free0 - torch.cuda.mem_get_info(device)[0]) / 2**20
    return be, info


def _bench_variant(
    variant, backends, config: BenchConfig, device, dtype, cache: Path, report: dict, step
) -> None:
    torch.manual_seed(0)
    step(f"{variant}: loading the model", advance=False)
    model = create_model(variant, bench_weights(variant, config.weights), device)
    v = get_variant(variant)
    ready: dict[str, Backend] = {}
    warm_info: dict[str, dict] = {}
    for name in backends:
        step(f"{variant}: preparing {name} (building and warming up)", advance=False)
        try:
            ready[name], warm_info[name] = _warm(name, model, device, config, dtype, cache)
            report["warmup"].append({"variant": variant, **warm_info[name]})
        except EngineError as e:
            report["errors"].append({"variant": variant, "backend": name, "stage": "warmup", "error": str(e)})
        step(f"{variant}: {name} ready")
    if "eager" not in ready:
        raise EngineError(f"eager failed for {variant}: {report['errors']}")
    reference = ready["eager"]
    if dtype != torch.float32:  # lower precision is judged against float32 eager
        reference = create_backend("eager", model, device, config.buckets, torch.float32)
        reference.warmup()
    compiles0 = compile_count()
    rows = []
    for bucket in config.buckets:
        step(f"{variant}: timing batches of {bucket}", advance=False)
        rows += _bench_bucket(
            variant,
            v.benchmark_only,
            bucket,
            ready,
            reference,
            warm_info,
            model,
            config,
            device,
            tick=lambda: step(None),
        )
        step(f"{variant}: bucket {bucket}")
    recompiles = compile_count() - compiles0
    report["recompiles_after_warmup"] += recompiles
    for r in rows:
        r["recompiles_after_warmup"] = recompiles
    report["results"] += rows
    for be in ready.values():
        be.close()
    del ready, reference, model
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def _parity(bucket, ready, reference, model, device) -> dict[str, dict]:
    """Parity on the example photos and on random images (never zeros), per backend."""
    cfg = model.config
    photos = photo_batch(cfg.image_size, bucket, device)
    randoms = example_inputs(model, bucket, device, seed=99)[0]
    out: dict[str, dict] = {}
    for name, be in ready.items():
        worst: dict = {}
        for i, images in enumerate((photos, randoms)):
            query = random_queries(bucket, cfg.query_dim, device, seed=i)
            controls = model.default_controls(bucket, device)
            with torch.inference_mode():
                ref = reference.run(images, query, controls)
                got = be.run(images, query, controls)
            c = compare(ref, got, controls)
            if not worst or c["max_abs_diff"] > worst["max_abs_diff"]:
                prev, worst = worst, dict(c)
                for key in ("topk_agreement", "topk_agreement_ties", "topk_overlap"):
                    worst[key] = min(c[key], prev.get(key, 1.0))
            else:
                for key in ("topk_agreement", "topk_agreement_ties", "topk_overlap"):
                    worst[key] = min(worst[key], c[key])
        out[name] = worst
    return out


def _bench_bucket(
    variant, benchmark_only, bucket, ready, reference, warm_info, model, config, device, tick=None
) -> list[dict]:
    parity = _parity(bucket, ready, reference, model, device)
    sets = [example_inputs(model, bucket, device, seed=100 + s) for s in range(max(1, config.input_sets))]

    def caller(be: Backend):
        def call(i: int):
            with torch.inference_mode():
                return be.run(*sets[i % len(sets)])

        return call

    times = time_interleaved(
        {n: caller(be) for n, be in ready.items()}, config.iters, config.warmup_iters, device, tick=tick
    )
    eager_p50 = summarize(times["eager"])["p50_ms"]
    dtype = parse_dtype(config.dtype)
    tol = TOL[dtype]
    rows = []
    for name, ms in times.items():
        s = summarize(ms)
        p = parity[name]
        w = warm_info[name]
        compile_s = w.get("compile_s", 0.0) + w.get("capture_s", 0.0) if name != "eager" else 0.0
        saved = (eager_p50 - s["p50_ms"]) / 1e3
        rows.append(
            {
                "variant": variant,
                "backend": name,
                "bucket": bucket,
                "dtype": config.dtype,
                "benchmark_only": benchmark_only,
                "weights_version": getattr(model, "weights_version", "?"),
                **s,
                "throughput_per_s": bucket / (s["mean_ms"] / 1e3),
                "speedup_vs_eager": eager_p50 / s["p50_ms"],
                "max_abs_diff": p["max_abs_diff"],
                "texture_max_diff": p["texture_max_diff"],
                "diff_by_map": p["diff_by_map"],
                "budget_max_diff": p["budget_max_diff"],
                "topk_agreement": p["topk_agreement"],
                "topk_agreement_ties": p["topk_agreement_ties"],
                "topk_overlap": p["topk_overlap"],
                "parity_ok": bool(
                    p["finite"]
                    and p["max_abs_diff"] <= tol
                    and (
                        p["topk_agreement_ties"] == 1.0
                        if dtype == torch.float32
                        else p["topk_overlap"] >= MIN_OVERLAP_BF16
                    )
                ),
                "tolerance": tol,
                "compile_s": w.get("compile_s", 0.0),
                "export_s": w.get("export_s"),
                "capture_s": w.get("capture_s", 0.0),
                "capture_mem_mb": w.get("capture_mem_mb", 0.0),
                "peak_mem_mb": w.get("peak_mem_mb"),
                "break_even_calls": (compile_s / saved) if name != "eager" and saved > 0 else None,
            }
        )
    return rows
