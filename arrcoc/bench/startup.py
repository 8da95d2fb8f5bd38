"""Cold and warm start of a backend, each in its own process.

Cold: a fresh, empty cache dir. Warm: a second process on the same dir (Inductor/Triton
caches and the ONNX file filled by the first). `ready_s` is the time from the start of the
process's work (after imports) to every bucket ready; `process_s` the whole process.

    python -m arrcoc.bench.startup --variant arrcoc-texture --backend compiled --cache-dir D
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def bench_weights(variant: str, weights: str | None) -> str | None:
    """The weights a benchmark loads: as given, except that "default" for a variant whose
    weights come from the hub (arrcoc-clip-b16) means random weights of the same shapes: speed
    does not depend on the values, and a benchmark must run where the hub is not reachable.
    Pass a hub id or directory explicitly to time the real weights."""
    from ..registry import get_variant  # here, not at the top: the child times its own imports

    return None if weights == "default" and "hub" in get_variant(variant).tags else weights


def _child(args: argparse.Namespace) -> dict:
    t0 = time.perf_counter()
    import torch

    from ..engine import create_backend, resolve_device
    from ..registry import create_model

    t_import = time.perf_counter() - t0
    t1 = time.perf_counter()
    torch.manual_seed(0)  # the same random weights in both runs: the same ONNX cache key
    device = resolve_device(args.device)
    model = create_model(args.variant, bench_weights(args.variant, args.weights), device)
    t_model = time.perf_counter()
    probes = _probe(device) if args.probe else {}  # apart from model_s, backend_init_s and warmup_s
    t_made = time.perf_counter()
    backend = create_backend(args.backend, model, device, tuple(args.buckets), cache_dir=Path(args.cache_dir))
    t_init = time.perf_counter()
    backend.warmup()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    t_ready = time.perf_counter()
    # where ready_s went: the model built and on the device, the backend made, its warmup
    split = {"model_s": t_model - t1, "backend_init_s": t_init - t_made, "warmup_s": t_ready - t_init}
    return {"ready_s": t_ready - t1, "import_s": t_import, **split, **probes, "stats": backend.stats}


def _probe(device) -> dict[str, float]:
    """--probe: pay, and time, what a backend's warmup would otherwise pay inside its own timings:
    importing the compiler (Dynamo, Inductor), the first cuBLAS matmul and the first cuDNN conv."""
    import torch

    out = {}
    t = time.perf_counter()
    import torch._dynamo  # noqa: F401
    import torch._inductor.config  # noqa: F401

    out["probe_compiler_import_s"] = time.perf_counter() - t
    if device.type == "cuda":
        for name, fn in (
            ("probe_cublas_s", lambda: torch.ones(64, 64, device=device) @ torch.ones(64, 64, device=device)),
            (
                "probe_cudnn_s",
                lambda: torch.nn.functional.conv2d(
                    torch.ones(1, 3, 16, 16, device=device), torch.ones(4, 3, 3, 3, device=device)
                ),
            ),
        ):
            t = time.perf_counter()
            fn()
            torch.cuda.synchronize(device)
            out[name] = time.perf_counter() - t
    return out


_PARTS = ("import_s", "model_s", "backend_init_s", "warmup_s")


def measure_startup(
    variant: str,
    backend: str,
    buckets: tuple[int, ...],
    device: str = "auto",
    weights: str | None = "default",
    timeout: float = 900.0,
    cache_root: Path | None = None,
) -> dict:
    """{variant, backend, cold_s, warm_s, ...}: two child processes sharing one fresh cache dir."""
    with tempfile.TemporaryDirectory(prefix="arrcoc-startup-", dir=cache_root) as cache:
        runs = []
        for _ in ("cold", "warm"):
            cmd = [
                sys.executable,
                "-m",
                "arrcoc.bench.startup",
                "--variant",
                variant,
                "--backend",
                backend,
                "--device",
                device,
                "--cache-dir",
                cache,
                "--weights",
                str(weights),
                "--buckets",
                *map(str, buckets),
            ]
            env = dict(os.environ)
            env.pop("TORCHINDUCTOR_CACHE_DIR", None)
            env.pop("TRITON_CACHE_DIR", None)
            t0 = time.perf_counter()
            out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
            wall = time.perf_counter() - t0
            if out.returncode != 0:
                raise RuntimeError(f"startup run failed ({' '.join(cmd)}):\n{out.stderr[-3000:]}")
            doc = json.loads(out.stdout.strip().splitlines()[-1])
            doc["process_s"] = wall
            runs.append(doc)
    cold, warm = runs
    return {
        "variant": variant,
        "backend": backend,
        "buckets": list(buckets),
        "cold_s": cold["ready_s"],
        "warm_s": warm["ready_s"],
        "warm_over_cold": warm["ready_s"] / cold["ready_s"] if cold["ready_s"] > 0 else None,
        "cold_process_s": cold["process_s"],
        "warm_process_s": warm["process_s"],
        "cold_stats": cold["stats"],
        "warm_stats": warm["stats"],
        "cold_parts": {k: cold.get(k) for k in _PARTS},
        "warm_parts": {k: warm.get(k) for k in _PARTS},
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--variant", required=True)
    p.add_argument("--backend", required=True)
    p.add_argument("--device", default="auto")
    p.add_argument("--weights", default="default")
    p.add_argument("--cache-dir", required=True)
    p.add_argument("--buckets", type=int, nargs="+", required=True)
    p.add_argument(
        "--probe",
        action="store_true",
        help="time compiler imports, cuBLAS and cuDNN init before the backend (apart from warmup_s)",
    )
    args = p.parse_args(argv)
    args.weights = None if args.weights in ("none", "None") else args.weights
    print(json.dumps(_child(args)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
