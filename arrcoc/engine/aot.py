"""AOTInductor: torch.export of the forward per bucket, compiled ahead of time into a package.

    <cache_dir>/aot/<variant>-b<batch>-<dtype>-<device>.pt2    one package per program
    <cache_dir>/aot/<variant>-b<batch>-<dtype>-<device>.json   its key, readable without loading

Programs, as for `compiled`: bucket 1 specialised (b1), and one program with a dynamic batch
dimension for the other buckets (b2-64); `dynamic_batch=False` builds one package per bucket.
An AOTInductor build is slow (a C++ wrapper and every kernel compiled: ~90 s for one program
on two CPU cores), so fewer programs is most of a faster cold build.

A package is keyed by variant, weights version, model fingerprint (code, weights, torch
version: caches.model_fingerprint), batch (the bucket, or the range a dynamic program serves),
dtype, device capability, torch version and build recipe. The
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
import shutil
import subprocess
import time
from pathlib import Path

import torch
from torch import Tensor, nn

from ..errors import EngineError
from .base import Backend, ForwardFn, example_inputs, pad_rows
from .caches import configure_compile_caches, default_cache_dir, model_fingerprint
from .cuda_graph import CudaGraphRunner

log = logging.getLogger(__name__)

KEY_FIELDS = ("variant", "weights_version", "fingerprint", "batch", "dtype", "device", "torch", "recipe")
# how packages are built; a new recipe makes every older package stale. 2: a compiler that links
# the shared libstdc++ (packages of recipe 1 could crash while loading, see shared_runtime_cxx)
RECIPE = "2"
_DTYPE_NAMES = {torch.float32: "float32", torch.bfloat16: "bfloat16"}


def device_tag(device: torch.device) -> str:
    """What a compiled package depends on: the GPU's compute capability, or the CPU's ISA."""
    if device.type == "cuda":
        major, minor = torch.cuda.get_device_capability(device)
        return f"sm{major}{minor}"
    return f"cpu-{platform.machine()}"


def variant_of(model: nn.Module) -> str:
    return getattr(model, "variant_name", type(model).__name__)


def batch_spec(lo: int, hi: int) -> str:
    """'4' for one bucket, '2-64' for a dynamic program serving batches 2..64."""
    return str(hi) if lo == hi else f"{lo}-{hi}"


def package_key(
    model: nn.Module,
    batch: str | int,
    dtype: torch.dtype,
    device: torch.device,
    fingerprint: str | None = None,
) -> dict[str, str]:
    """Every fact a package depends on, as strings (AOTInductor's metadata holds strings)."""
    return {
        "variant": variant_of(model),
        "weights_version": str(getattr(model, "weights_version", "untrained")),
        "fingerprint": fingerprint or model_fingerprint(model),
        "batch": str(batch),
        "dtype": _DTYPE_NAMES[dtype],
        "device": device_tag(device),
        "torch": torch.__version__,
        "recipe": RECIPE,
    }


def package_path(root: Path, key: dict[str, str]) -> Path:
    return root / f"{key['variant']}-b{key['batch']}-{key['dtype']}-{key['device']}.pt2"


def key_mismatch(expected: dict[str, str], found: dict[str, str]) -> list[str]:
    """'field: found != expected' for every key field that differs (empty: the package fits)."""
    return [f"{f}: {found.get(f)!r} != {expected[f]!r}" for f in KEY_FIELDS if found.get(f) != expected[f]]


def read_key(path: Path) -> dict[str, str] | None:
    """The key written beside a package, or None when there is none (or it is unreadable)."""
    try:
        return json.loads(path.with_suffix(".json").read_text())
    except (OSError, ValueError):
        return None


def build_package(
    model: nn.Module,
    batch: tuple[int, int],
    dtype: torch.dtype,
    device: torch.device,
    path: Path,
    key: dict[str, str],
) -> float:
    """torch.export the forward for batch sizes lo..hi (one bucket when lo == hi; a dynamic
    batch dimension otherwise), AOTInductor-compile it to `path`; seconds taken.

    Written atomically (temporary name, then rename), key file last: a reader never sees a
    package without its key, nor a half-written one under the final name.
    """
    t0 = time.perf_counter()
    model = model.to(device).eval()
    fn = ForwardFn(model, device.type, dtype).eval()
    lo, hi = batch
    args = example_inputs(model, hi, device)
    dim = torch.export.Dim("batch", min=lo, max=hi) if lo < hi else None
    dynamic = None if dim is None else ({0: dim}, {0: dim}, {0: dim})
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f"{path.stem}.tmp{os.getpid()}.pt2")
    with torch.inference_mode(False), torch.no_grad():
        program = torch.export.export(fn, args, dynamic_shapes=dynamic, strict=False)
        t_export = time.perf_counter()
        log.info("exported %s in %.1f s; compiling", path.name, t_export - t0)
        torch._inductor.aoti_compile_and_package(
            program, package_path=str(tmp), inductor_configs=_configs(key, device)
        )
    os.replace(tmp, path)
    key_tmp = path.with_name(f"{path.stem}.tmp{os.getpid()}.json")
    key_tmp.write_text(json.dumps(key, indent=1))
    os.replace(key_tmp, path.with_suffix(".json"))
    seconds = time.perf_counter() - t0
    log.info("built %s in %.1f s (AOTInductor %.1f s)", path.name, seconds, seconds - (t_export - t0))
    return seconds


def shared_runtime_cxx(candidates: tuple[str, ...] | None = None) -> str | None:
    """The first C++ compiler (CXX, then g++, c++) that links libstdc++ as a shared library.

    A package's wrapper.so must use the libstdc++.so every torch process has loaded. A CXX that
    ships only a static libstdc++ (some GCC builds installed under /opt) gives wrapper.so a private
    copy whose std::locale facet ids differ from the process's: std::regex (AOTInductor parses the
    device string with one) then fetches the wrong facet and every CUDA package, even a toy model's,
    segfaults while loading (how this was found: git history of BENCHMARKS.md, 2026-11-23).
    """
    for name in candidates or (os.environ.get("CXX", ""), "g++", "c++"):
        path = shutil.which(name) if name else None
        if path is None:
            continue
        try:
            found = subprocess.run(
                [path, "-print-file-name=libstdc++.so"], capture_output=True, text=True, timeout=30
            ).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            continue
        if os.path.isabs(found) and os.path.exists(found):
            return path
    return None


def _configs(key: dict[str, str], device: torch.device) -> dict:
    """AOTInductor settings: the key as metadata, and a compiler that links the shared libstdc++."""
    configs: dict = {"aot_inductor.metadata": {"arrcoc_key": json.dumps(key)}}
    cxx = shared_runtime_cxx() if platform.system() == "Linux" else None
    if cxx is not None:
        configs["cpp.cxx"] = (None, cxx)
    return configs


class PackageRunner:
    """A loaded package, called with flat tensors: `boxed_run` straight away, where
    AOTICompiledModel parses its input and output tree specs again on every call."""

    def __init__(self, loader):
        self.loader = loader

    def __call__(self, *inputs: Tensor) -> list[Tensor]:
        return self.loader.boxed_run(list(inputs))

    def get_metadata(self) -> dict[str, str]:
        return self.loader.get_metadata()


def load_runner(path: Path, device: torch.device, single_threaded: bool) -> PackageRunner:
    """Load a package with AOTInductor's C++ loader. Not through `aoti_load_package`: before
    loading, that compares the package's device facts with this machine's, and to know the CPU's
    vector ISA it compiles and imports test programs (on a many-core host, longer than loading the
    package itself) only to log a warning; a package's key already pins the device and the torch version.
    single_threaded: no per-call locking or CUDA events, which a CUDA-graph capture forbids."""
    index = (device.index or 0) if device.type == "cuda" else -1
    return PackageRunner(torch._C._aoti.AOTIModelPackageLoader(str(path), "model", single_threaded, 1, index))


def _build_in_child(
    model: nn.Module, batch: tuple[int, int], dtype: torch.dtype, device: str, path: str, key: dict
) -> float:
    if not logging.getLogger().handlers:  # a spawned process: say what it builds, and how long it took
        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(processName)s %(name)s: %(message)s")
    configure_compile_caches(Path(path).parent.parent)  # same Inductor/Triton caches as the parent
    return build_package(model, batch, dtype, torch.device(device), Path(path), key)


def build_packages(
    jobs: list[tuple[tuple[int, int], Path, dict]],
    model: nn.Module,
    dtype: torch.dtype,
    device: torch.device,
    processes: int = 1,
) -> dict[tuple[int, int], float]:
    """Build [((lo, hi), path, key)]: one after another, or in `processes` fresh processes (each
    compiles one program; the C++ compile of a package is mostly single-threaded)."""
    processes = max(1, min(processes, len(jobs)))
    if processes == 1:
        return {b: build_package(model, b, dtype, device, p, k) for b, p, k in jobs}
    import copy
    import multiprocessing as mp
    from concurrent.futures import ProcessPoolExecutor

    # a CPU copy is pickled to the children: moving `model` itself would reallocate its weights
    # under any CUDA graph another backend has already captured over them
    # (without its query encoder: it holds a lock and a tokenizer, which neither pickle nor matter
    # to the forward a package compiles)
    encoder = model.__dict__.pop("text_encoder", None)
    try:
        cpu_model = copy.deepcopy(model).to("cpu")
    finally:
        if encoder is not None:
            model.text_encoder = encoder
    threads = os.environ.get("TORCHINDUCTOR_COMPILE_THREADS")
    # each child runs its own pool of Triton compile workers: share the cores, do not multiply them
    os.environ["TORCHINDUCTOR_COMPILE_THREADS"] = str(max(1, (os.cpu_count() or 2) // processes))
    try:
        with ProcessPoolExecutor(processes, mp_context=mp.get_context("spawn")) as pool:
            futures = {
                b: pool.submit(_build_in_child, cpu_model, b, dtype, str(device), str(p), k)
                for b, p, k in jobs
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

    def __init__(
        self,
        *args,
        cuda_graphs: bool = True,
        build: bool = True,
        processes: int | None = None,
        dynamic_batch: bool = True,
        **kwargs,
    ):
        super().__init__(*args, **kwargs)
        self.dynamic_batch = dynamic_batch and len([b for b in self.buckets if b > 1]) > 1
        self.use_graphs = cuda_graphs and self.device.type == "cuda"
        self.build = build  # False: only load packages (a missing or stale one is an EngineError)
        self.processes = processes
        self.runners: dict[int, object] = {}
        self.graphs: CudaGraphRunner | None = None
        self.built: list[str] = []  # programs this warmup built ('1', '2-64'; the rest were found)

    @property
    def root(self) -> Path:
        return (self.cache_dir or default_cache_dir()) / "aot"

    def programs(self) -> dict[tuple[int, int], tuple[int, ...]]:
        """(lo, hi) batch range of each program -> the buckets it serves."""
        if not self.dynamic_batch:
            return {(b, b): (b,) for b in self.buckets}
        big = tuple(b for b in self.buckets if b > 1)
        out = {(1, 1): (1,)} if 1 in self.buckets else {}
        out[(big[0], big[-1])] = big
        return out

    def keys(self) -> dict[tuple[int, int], dict[str, str]]:
        fingerprint = model_fingerprint(self.model)
        return {
            r: package_key(self.model, batch_spec(*r), self.dtype, self.device, fingerprint)
            for r in self.programs()
        }

    def stale(
        self, keys: dict | None = None
    ) -> dict[tuple[int, int], tuple[Path, dict[str, str], list[str]]]:
        """(lo, hi) -> (path, expected key, why) for every package that is missing or out of date."""
        out = {}
        for bucket, key in (keys or self.keys()).items():
            path = package_path(self.root, key)
            found = read_key(path) if path.is_file() else None
            why = ["missing"] if found is None else key_mismatch(key, found)
            if why:
                out[bucket] = (path, key, why)
        return out

    def prepare(self, keys: dict | None = None) -> dict[tuple[int, int], float]:
        """Build every missing or stale package (what `arrcoc compile` runs); (lo, hi) -> seconds."""
        todo = self.stale(keys)
        if not todo:
            return {}
        configure_compile_caches(self.cache_dir)
        log.info(
            "building AOTInductor packages %s",
            "; ".join(f"b{batch_spec(*r)}: {', '.join(w)}" for r, (_, _, w) in sorted(todo.items())),
        )
        jobs = [(b, p, k) for b, (p, k, _) in sorted(todo.items(), reverse=True)]
        processes = self.processes or default_build_processes(self.device, len(jobs))
        times = build_packages(jobs, self.model, self.dtype, self.device, processes)
        self.built = [batch_spec(*r) for r in sorted(times)]
        return times

    def warmup(self) -> None:
        if self.warmed:
            return
        t0 = time.perf_counter()
        keys = self.keys()  # once: the packages built below are loaded under the same key
        todo = self.stale(keys)
        if todo and not self.build:
            lines = "; ".join(
                f"batch {batch_spec(*r)} ({p.name}): {', '.join(w)}" for r, (p, _, w) in sorted(todo.items())
            )
            raise EngineError(
                f"No usable AOTInductor package for {lines}. Build them with `arrcoc compile --backend aot"
                f" --cache-dir {self.cache_dir or default_cache_dir()}` on a machine like this one."
            )
        try:
            built = self.prepare(keys) if todo else {}
        except EngineError:
            raise
        except Exception as e:  # export or AOTInductor failed: say which backend, keep the cause
            raise EngineError(
                f"Building the AOTInductor packages failed ({type(e).__name__}: {str(e)[:500]})."
            ) from e
        self.stats["build_s"] = time.perf_counter() - t0 if built else 0.0
        t1 = time.perf_counter()
        for r, served in self.programs().items():
            runner = self._load(package_path(self.root, keys[r]), keys[r])
            self.runners.update(dict.fromkeys(served, runner))
        self.stats["load_s"] = time.perf_counter() - t1
        self.stats["compile_s"] = time.perf_counter() - t0  # build (if any) + load
        if self.use_graphs:
            self.graphs = CudaGraphRunner(self._call, self._static_inputs, self.device)
            try:
                st = self.graphs.capture(self.buckets)
            except RuntimeError as e:
                raise EngineError(
                    f"CUDA-graph capture over the AOTInductor runners failed: {str(e)[:500]}"
                ) from e
            self.stats["capture_s"], self.stats["capture_mem_mb"] = st.capture_s, st.memory_mb
        self.warmed = True
        log.info(
            "aot ready in %.1f s (built %s, load %.2f s)",
            self.stats["compile_s"],
            self.built or "none",
            self.stats["load_s"],
        )

    def _load(self, path: Path, key: dict[str, str]):
        try:
            runner = load_runner(path, self.device, single_threaded=self.use_graphs)
        except Exception as e:
            raise EngineError(
                f"Could not load the AOTInductor package {path} ({e}); delete it and rebuild"
                " with `arrcoc compile --backend aot`."
            ) from e
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
            raise EngineError(
                f"No AOTInductor package is loaded for bucket {bucket} (have {sorted(self.runners)})."
            )
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
