"""arrcoc compile [--backend aot] [--variant V] [--buckets ...] [--cache-dir D]: build ahead of time.

aot: every missing or stale AOTInductor package (one per bucket, in parallel processes on a GPU
machine), then loads each to check it. compiled / onnx: a full warmup, which fills the cache dir
(Inductor/Triton caches and portable artefacts, ONNX files). Run it once into the cache volume
(compose) or before shipping a cache dir (Spaces); a worker then starts from what it finds.
"""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path

from ..settings import BACKENDS, DTYPES


def add_parser(sub) -> None:
    p = sub.add_parser("compile", help="build AOTInductor packages (or fill compile caches) ahead of time")
    p.add_argument("--backend", default="aot", choices=[b for b in BACKENDS if b != "eager"])
    p.add_argument("--variant", default=None, help="model variant (default: settings)")
    p.add_argument("--weights", default="default", help="weights file; 'none' for untrained")
    p.add_argument("--device", default=None, help="default: settings (auto)")
    p.add_argument(
        "--dtype",
        default=None,
        choices=DTYPES,
        help="auto: the variant's own on a GPU (CLIP: bfloat16), float32 on a CPU (default: settings)",
    )
    p.add_argument("--buckets", nargs="+", type=int, default=None, help="default: settings")
    p.add_argument(
        "--cache-dir", type=Path, default=None, help="default: settings (ARRCOC_SERVICE__CACHE_DIR)"
    )
    p.add_argument("--processes", type=int, default=None, help="aot: parallel builds (default: per device)")
    p.set_defaults(func=run)


def run(args) -> int:
    from ..engine import create_backend, resolve_device
    from ..engine.base import serving_dtype
    from ..registry import create_model, get_variant
    from ..settings import get_settings

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(processName)s %(name)s: %(message)s")
    settings = get_settings()
    device = resolve_device(args.device or settings.engine.device)
    variant = args.variant or settings.engine.variant
    model = create_model(variant, None if args.weights == "none" else args.weights, device)
    cache_dir = args.cache_dir or settings.service.cache_dir
    backend = create_backend(
        args.backend,
        model,
        device,
        tuple(args.buckets or settings.engine.buckets),
        serving_dtype(
            args.dtype or settings.engine.dtype, device, get_variant(variant).gpu_dtype, args.backend
        ),
        cache_dir,
    )
    if args.processes is not None and hasattr(backend, "processes"):
        backend.processes = args.processes
    t0 = time.perf_counter()
    backend.warmup()  # aot: builds what is missing or stale, then loads every package
    summary = {
        "variant": variant,
        "backend": args.backend,
        "device": str(device),
        "buckets": list(backend.buckets),
        "cache_dir": str(cache_dir),
        "seconds": round(time.perf_counter() - t0, 2),
        "built": getattr(backend, "built", None),
        "stats": backend.stats,
    }
    backend.close()
    print(json.dumps(summary, default=str))
    return 0
