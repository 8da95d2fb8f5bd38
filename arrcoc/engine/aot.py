"""AOTInductor: torch.export of the forward per bucket, compiled ahead of time into a package.

    <cache_dir>/aot/<variant>-b<bucket>-<dtype>-<device>.pt2    one package per bucket
    <cache_dir>/aot/<variant>-b<bucket>-<dtype>-<device>.json   its key, readable without loading

A package is keyed by variant, weights version, model fingerprint (code, weights, torch
version: caches.model_fingerprint), bucket, dtype, device capability and torch version. The
key is written beside the package and inside it (AOTInductor's metadata). warmup() loads every
bucket's package; a missing or stale one is rebuilt (build=True, the default) or is an
EngineError that says how to build it (build=False: a server that must never compile). A
package whose own key differs from its file's is refused with an EngineError, never run.

Nothing is traced or compiled while serving (zero recompiles by construction); on CUDA each
loaded runner is captured as a CUDA graph per bucket (cuda_graph.py), as for `compiled`.
`arrcoc compile` builds the packages ahead of time, in parallel processes on a GPU machine.
"""

from __future__ import annotations

import json
import logging
import os
import platform
import time
from pathlib import Path

import torch
from torch import Tensor, nn

from ..errors import EngineError
from .base import Backend, ForwardFn, example_inputs, pad_rows
from .caches import configure_compile_caches, default_cache_dir, model_fingerprint
from .cuda_graph import CudaGraphRunner

log = logging.getLogger(__name__)

KEY_FIELDS = ("variant", "weights_version", "fingerprint", "bucket", "dtype", "device", "torch")
_DTYPE_NAMES = {torch.float32: "float32", torch.bfloat16: "bfloat16"}


def device_tag(device: torch.device) -> str:
    """What a compiled package depends on: the GPU's compute capability, or the CPU's ISA."""
    if device.type == "cuda":
        major, minor = torch.cuda.get_device_capability(device)
        return f"sm{major}{minor}"
    return f"cpu-{platform.machine()}"


def variant_of(model: nn.Module) -> str:
    return getattr(model, "variant_name", type(model).__name__)


def package_key(
    model: nn.Module, bucket: int, dtype: torch.dtype, device: torch.device, fingerprint: str | None = None
) -> dict[str, str]:
    """Every fact a package depends on, as strings (AOTInductor's metadata holds strings)."""
    return {
        "variant": variant_of(model),
        "weights_version": str(getattr(model, "weights_version", "untrained")),
        "fingerprint": fingerprint or model_fingerprint(model),
        "bucket": str(bucket),
        "dtype": _DTYPE_NAMES[dtype],
        "device": device_tag(device),
        "torch": torch.__version__,
    }


def package_path(root: Path, key: dict[str, str]) -> Path:
    return root / f"{key['variant']}-b{key['bucket']}-{key['dtype']}-{key['device']}.pt2"


def key_mismatch(expected: dict[str, str], found: dict[str, str]) -> list[str]:
    """'field: found != expected' for every key field that differs (empty: the package fits)."""
    return [f"{f}: {found.get(f)!r} != {expected[f]!r}" for f in KEY_FIELDS if found.get(f) != expected[f]]


def read_key(path: Path) -> dict[str, str] | None:
    """The key written beside a package, or None when there is none (or it is unreadable)."""
    try:
        return json.loads(path.with_suffix(".json").read_text())
    except (OSError, ValueError):
        return None


def build_package(model: nn.Module, bucket: int, dtype: torch.dtype, device: torch.device, path: Path,
                  key: dict[str, str]) -> float:  # fmt: skip
    """torch.export the forward at one bucket, AOTInductor-compile it to `path`; seconds taken.

    Written atomically (temporary name, then rename), key file last: a reader never sees a
    package without its key, nor a half-written one under the final name.
    """
    t0 = time.perf_counter()
    model = model.to(device).eval()
    fn = ForwardFn(model, device.type, dtype).eval()
    args = example_inputs(model, bucket, device)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f"{path.stem}.tmp{os.getpid()}.pt2")
    with torch.inference_mode(False), torch.no_grad():
        program = torch.export.export(fn, args, strict=False)
        torch._inductor.aoti_compile_and_package(
            program, package_path=str(tmp), inductor_configs={"aot_inductor.metadata": {"arrcoc_key": json.dumps(key)}}
        )
    os.replace(tmp, path)
    key_tmp = path.with_name(f"{path.stem}.tmp{os.getpid()}.json")
    key_tmp.write_text(json.dumps(key, indent=1))
    os.replace(key_tmp, path.with_suffix(".json"))
    seconds = time.perf_counter() - t0
    log.info("built %s in %.1f s", path.name, seconds)
    return seconds


def _build_in_child(model: nn.Module, bucket: int, dtype: torch.dtype, device: str, path: str, key: dict) -> float:
    configure_compile_caches(Path(path).parent.parent)  # same Inductor/Triton caches as the parent
    return build_package(model, bucket, dtype, torch.device(device), Path(path), key)


def build_packages(jobs: list[tuple[int, Path, dict]], model: nn.Module, dtype: torch.dtype, device: torch.device,
                   processes: int = 1) -> dict[int, float]:  # fmt: skip
    """Build [(bucket, path, key)]: one after another, or in `processes` fresh processes (each
    compiles one bucket; the C++/CUDA compile of a package is mostly single-threaded)."""
    processes = max(1, min(processes, len(jobs)))
    if processes == 1:
        return {b: build_package(model, b, dtype, device, p, k) for b, p, k in jobs}
    import copy
    import multiprocessing as mp
    from concurrent.futures import ProcessPoolExecutor

    # a CPU copy is pickled to the children: moving `model` itself would reallocate its weights
    # under any CUDA graph another backend has already captured over them
    cpu_model = copy.deepcopy(model).to("cpu")
    threads = os.environ.get("TORCHINDUCTOR_COMPILE_THREADS")
    # each child runs its own pool of Triton compile workers: share the cores, do not multiply them
    os.environ["TORCHINDUCTOR_COMPILE_THREADS"] = str(max(1, (os.cpu_count() or 2) // processes))
    try:
        with ProcessPoolExecutor(processes, mp_context=mp.get_context("spawn")) as pool:
            futures = {
                b: pool.submit(_build_in_child, cpu_model, b, dtype, str(device), str(p), k) for b, p, k in jobs
            }
            return {b: f.result() for b, f in futures.items()}
    finally:
        if threads is None:
            os.environ.pop("TORCHINDUCTOR_COMPILE_THREADS", None)
        else:
            os.environ["TORCHINDUCTOR_COMPILE_THREADS"] = threads


def default_build_processes(device: torch.device, missing: int) -> int:
    """Parallel builds on a GPU machine (many cores); one at a time on a small CPU machine."""
    if device.type != "cuda":
        return 1
    return max(1, min(missing, (os.cpu_count() or 2) // 2, 8))


class AotBackend(Backend):
    name = "aot"

    def __init__(self, *args, cuda_graphs: bool = True, build: bool = True, processes: int | None = None,
                 **kwargs):  # fmt: skip
        super().__init__(*args, **kwargs)
        self.use_graphs = cuda_graphs and self.device.type == "cuda"
        self.build = build  # False: only load packages (a missing or stale one is an EngineError)
        self.processes = processes
        self.runners: dict[int, object] = {}
        self.graphs: CudaGraphRunner | None = None
        self.built: list[int] = []  # buckets this warmup built (the rest were loaded as found)

    @property
    def root(self) -> Path:
        return (self.cache_dir or default_cache_dir()) / "aot"

    def keys(self) -> dict[int, dict[str, str]]:
        fingerprint = model_fingerprint(self.model)
        return {b: package_key(self.model, b, self.dtype, self.device, fingerprint) for b in self.buckets}

    def stale(self, keys: dict[int, dict[str, str]] | None = None) -> dict[int, tuple[Path, dict[str, str], list[str]]]:
        """bucket -> (path, expected key, why) for every package that is missing or out of date."""
        out = {}
        for bucket, key in (keys or self.keys()).items():
            path = package_path(self.root, key)
            found = read_key(path) if path.is_file() else None
            why = ["missing"] if found is None else key_mismatch(key, found)
            if why:
                out[bucket] = (path, key, why)
        return out

    def prepare(self, keys: dict[int, dict[str, str]] | None = None) -> dict[int, float]:
        """Build every missing or stale package (what `arrcoc compile` runs); bucket -> seconds."""
        todo = self.stale(keys)
        if not todo:
            return {}
        configure_compile_caches(self.cache_dir)
        log.info("building AOTInductor packages for buckets %s (%s)", sorted(todo),
                 "; ".join(f"b{b}: {', '.join(w)}" for b, (_, _, w) in sorted(todo.items())))  # fmt: skip
        jobs = [(b, p, k) for b, (p, k, _) in sorted(todo.items(), reverse=True)]
        processes = self.processes or default_build_processes(self.device, len(jobs))
        times = build_packages(jobs, self.model, self.dtype, self.device, processes)
        self.built = sorted(times)
        return times

    def warmup(self) -> None:
        if self.warmed:
            return
        t0 = time.perf_counter()
        keys = self.keys()  # once: the packages built below are loaded under the same key
        todo = self.stale(keys)
        if todo and not self.build:
            lines = "; ".join(f"bucket {b} ({p.name}): {', '.join(w)}" for b, (p, _, w) in sorted(todo.items()))
            raise EngineError(
                f"No usable AOTInductor package for {lines}. Build them with `arrcoc compile --backend aot"
                f" --cache-dir {self.cache_dir or default_cache_dir()}` on a machine like this one."
            )
        try:
            built = self.prepare(keys) if todo else {}
        except EngineError:
            raise
        except Exception as e:  # export or AOTInductor failed: say which backend, keep the cause
            raise EngineError(f"Building the AOTInductor packages failed ({type(e).__name__}: {str(e)[:500]}).") from e
        self.stats["build_s"] = time.perf_counter() - t0 if built else 0.0
        t1 = time.perf_counter()
        for bucket in sorted(self.buckets, reverse=True):
            self.runners[bucket] = self._load(package_path(self.root, keys[bucket]), keys[bucket])
        self.stats["load_s"] = time.perf_counter() - t1
        self.stats["compile_s"] = time.perf_counter() - t0  # build (if any) + load
        if self.use_graphs:
            self.graphs = CudaGraphRunner(self._call, self._static_inputs, self.device)
            try:
                st = self.graphs.capture(self.buckets)
            except RuntimeError as e:
                raise EngineError(f"CUDA-graph capture over the AOTInductor runners failed: {str(e)[:500]}") from e
            self.stats["capture_s"], self.stats["capture_mem_mb"] = st.capture_s, st.memory_mb
        self.warmed = True
        log.info("aot ready in %.1f s (built %s, load %.2f s)", self.stats["compile_s"], self.built or "none",
                 self.stats["load_s"])  # fmt: skip

    def _load(self, path: Path, key: dict[str, str]):
        try:
            runner = torch._inductor.aoti_load_package(
                str(path), run_single_threaded=self.use_graphs, device_index=self.device.index or 0
            ) if self.device.type == "cuda" else torch._inductor.aoti_load_package(str(path))  # fmt: skip
        except Exception as e:
            raise EngineError(f"Could not load the AOTInductor package {path} ({e}); delete it and rebuild"
                              " with `arrcoc compile --backend aot`.") from e  # fmt: skip
        inner = json.loads(runner.get_metadata().get("arrcoc_key", "{}"))
        why = key_mismatch(key, inner)
        if why:
            raise EngineError(
                f"The AOTInductor package {path} was built for another model or machine ({'; '.join(why)});"
                " it is not run. Delete it and rebuild with `arrcoc compile --backend aot`."
            )
        return runner

    def _static_inputs(self, bucket: int) -> tuple[Tensor, ...]:
        return example_inputs(self.model, bucket, self.device, seed=1000)

    def _call(self, *inputs: Tensor) -> tuple[Tensor, ...]:
        bucket = inputs[0].shape[0]
        runner = self.runners.get(bucket)
        if runner is None:
            raise EngineError(f"No AOTInductor package is loaded for bucket {bucket} (have {sorted(self.runners)}).")
        return tuple(runner(*inputs))

    @torch.inference_mode()
    def _run_bucket(self, bucket: int, images: Tensor, query: Tensor, controls: Tensor) -> tuple[Tensor, ...]:
        if self.graphs is not None:
            return self.graphs.replay(bucket, images, query, controls)
        n = images.shape[0]
        out = self._call(*(pad_rows(t, bucket).contiguous() for t in (images, query, controls)))
        return tuple(t[:n].clone() for t in out)  # caller-owned, whatever the runner reuses

    def close(self) -> None:
        if self.graphs is not None:
            self.graphs.close()
            self.graphs = None
        self.runners.clear()
