"""ONNX Runtime: torch.onnx.export(dynamo=True) of the same forward, run by ONNX Runtime.

Exports are cached on disk. On CUDA every bucket gets its own static-shape export (a dynamic
batch dimension leaves shape arithmetic and host copies in the graph, which CUDA-graph capture
cannot take) and its own session with the CUDA execution provider, IO binding to static device
buffers and a CUDA graph (`enable_cuda_graph`). CPU fallback of any node is refused (`session.disable_cpu_ep_fallback`),
and a GPU machine without the CUDA provider is an error, not a silent CPU run. On CPU one
export with a dynamic batch dimension and one session with the CPU provider serve every bucket.

Models with a ViT tower (arrcoc-clip-*) have ORT's transformer fusions applied to each export
first (engine/ort_fusion.py: attention, residual + layer norm, activations as single contrib ops;
`fusions="none"` turns them off), cached beside the export.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from ..errors import EngineError
from ..model import ModelOutput
from .base import Backend, ForwardFn, example_inputs, pad_rows
from .caches import model_fingerprint
from .ort_fusion import Fusions, fuse_onnx, fused_path

log = logging.getLogger(__name__)

INPUTS = ("images", "query", "controls")
# `tensions` depends on parameters only: exported, it folds into a constant initializer that is
# also a graph output, and ORT copies it with a synchronous memcpy that breaks CUDA-graph capture.
# The backend computes it once at warmup and expands it per call instead.
CONSTANT_OUTPUTS = ("tensions",)
OUTPUTS = tuple(f for f in ModelOutput._fields if f not in CONSTANT_OUTPUTS)
OPSET = 18
# the CUDA provider's options; float32 means float32, as in eager and Inductor
PROVIDER_OPTIONS = {"use_tf32": "0"}
_NP = {torch.uint8: np.uint8, torch.float32: np.float32, torch.int64: np.int64}
_KEEP = [i for i, f in enumerate(ModelOutput._fields) if f not in CONSTANT_OUTPUTS]


class ExportFn(ForwardFn):
    """ForwardFn without the constant outputs."""

    def forward(self, images: Tensor, query: Tensor, controls: Tensor) -> tuple[Tensor, ...]:
        out = super().forward(images, query, controls)
        return tuple(out[i] for i in _KEEP)


# the exporter's own loggers: at INFO they write a line per optimisation pass and rewrite rule,
# hundreds per export, into the log of whatever process exports (the demo's, a worker's)
EXPORTER_LOGGERS = ("onnx_ir", "onnxscript", "torch.onnx")


@contextmanager
def _quiet_exporters() -> Iterator[None]:
    """The exporter's loggers at WARNING for the export (their warnings and errors still show)."""
    loggers = [logging.getLogger(name) for name in EXPORTER_LOGGERS]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(max(lg.getEffectiveLevel(), logging.WARNING))
    try:
        yield
    finally:
        for lg, level in zip(loggers, levels, strict=True):
            lg.setLevel(level)


def export_onnx(model: torch.nn.Module, path: Path, device: torch.device, batch: int | None = None) -> float:
    """Export ForwardFn(model) to `path` (atomically); seconds taken. batch None: a dynamic
    batch dimension; an int: every shape static (all shape arithmetic constant-folded)."""
    t0 = time.perf_counter()
    fn = ExportFn(model, device.type, torch.float32).eval()
    args = example_inputs(model, batch or 2, device)
    dim = torch.export.Dim("batch", min=1, max=4096)
    dynamic = None if batch else ({0: dim}, {0: dim}, {0: dim})
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".tmp{os.getpid()}")
    with torch.inference_mode(False), torch.no_grad(), _quiet_exporters():
        program = torch.onnx.export(
            fn,
            args,
            dynamo=True,
            opset_version=OPSET,
            input_names=list(INPUTS),
            output_names=list(OUTPUTS),
            dynamic_shapes=dynamic,
            optimize=True,
            verbose=False,
        )
    program.save(str(tmp))
    os.replace(tmp, path)
    return time.perf_counter() - t0


def default_fusions(model: torch.nn.Module) -> Fusions:
    """ALL for a model with a ViT tower (what ORT's fusions are for; parity checked on the CPU
    provider by tests/test_onnx_fusion.py), NONE otherwise (arrcoc-texture: nothing to fuse)."""
    from ..vit import CLIPVisionTower

    return Fusions.ALL if isinstance(getattr(model, "vision_model", None), CLIPVisionTower) else Fusions.NONE


class OnnxBackend(Backend):
    name = "onnx"

    def __init__(
        self,
        *args,
        cuda_graphs: bool = True,
        provider_options: dict[str, str] | None = None,
        disabled_optimizers: tuple[str, ...] = (),
        fusions: str | None = None,
        **kwargs,
    ):
        super().__init__(*args, **kwargs)
        if self.dtype != torch.float32:
            raise EngineError("The onnx backend runs float32 only; use the compiled backend for bfloat16.")
        self.use_graphs = cuda_graphs
        try:  # None: the model's default (default_fusions)
            self.fusions = Fusions(fusions) if fusions is not None else default_fusions(self.model)
        except ValueError:
            raise EngineError(
                f"Unknown onnx fusions {fusions!r}; choose one of {[f.value for f in Fusions]}."
            ) from None
        self._fusions_asked = fusions is not None
        self.stats["fusions"] = self.fusions.value
        # CUDA provider options over PROVIDER_OPTIONS, and ORT graph rewrites to leave out
        # (tools/ort_options.py measures their effect on parity and speed)
        self.provider_options = {**PROVIDER_OPTIONS, **(provider_options or {})}
        self.disabled_optimizers = list(disabled_optimizers)
        self.sessions: dict[int, object] = {}
        self.bindings: dict[int, tuple] = {}
        self.onnx_path: Path | None = None

    # -- warmup ---------------------------------------------------------------------------------
    def warmup(self) -> None:
        if self.warmed:
            return
        import onnxruntime as ort

        self._ort = ort
        providers = ort.get_available_providers()
        if self.device.type == "cuda" and "CUDAExecutionProvider" not in providers:
            raise EngineError(
                f"This machine has a GPU but ONNX Runtime offers only {providers}: install"
                " onnxruntime-gpu (pip install 'arrcoc[gpu]') or run the onnx backend with --device cpu."
            )
        with torch.inference_mode():
            full = ForwardFn(self.model, self.device.type, torch.float32)(
                *example_inputs(self.model, 1, self.device)
            )
        self._constants = {f: full[ModelOutput._fields.index(f)][:1].clone() for f in CONSTANT_OUTPUTS}
        t0 = time.perf_counter()
        if self.device.type == "cuda":  # static shapes per bucket: nothing left to compute on the host
            self.onnx_paths = {b: self._exported(b) for b in self.buckets}
        else:
            self.onnx_path = self._exported(None)
        self.stats["export_s"] = time.perf_counter() - t0
        t1 = time.perf_counter()
        if self.device.type == "cuda":
            self._stream = torch.cuda.Stream(self.device)
            mem0 = torch.cuda.mem_get_info(self.device)[0]
            for bucket in sorted(self.buckets, reverse=True):
                self._cuda_session(bucket)
            torch.cuda.synchronize(self.device)
            self.stats["capture_mem_mb"] = (mem0 - torch.cuda.mem_get_info(self.device)[0]) / 2**20
        else:
            self.sessions[0] = ort.InferenceSession(
                str(self.onnx_path), self._options(), providers=["CPUExecutionProvider"]
            )
        self.stats["session_s"] = time.perf_counter() - t1
        self.stats["compile_s"] = self.stats["export_s"] + self.stats["session_s"]
        self.warmed = True
        log.info("onnx ready in %.1f s (export %.1f s)", self.stats["compile_s"], self.stats["export_s"])

    def _exported(self, batch: int | None) -> Path:
        key = self._key = getattr(self, "_key", None) or model_fingerprint(self.model)
        shape = f"b{batch}" if batch else "dyn"
        name = (
            f"{getattr(self.model, 'variant_name', type(self.model).__name__)}-{key}-{shape}-op{OPSET}.onnx"
        )
        root = (self.cache_dir or Path(os.environ.get("TMPDIR", "/tmp")) / "arrcoc-cache") / "onnx"
        path = root / name
        if not path.is_file():
            log.info("exporting %s", path)
            export_onnx(self.model, path, self.device, batch)
        if self.fusions == Fusions.NONE:
            return path
        fused = fused_path(path, self.fusions)
        if not fused.is_file():
            t0 = time.perf_counter()
            try:
                counts = fuse_onnx(path, fused, self.fusions)
            except Exception as e:  # an onnxscript / ORT without these passes: asked for, an error;
                if self._fusions_asked:  # by default, the plain export (slower, same outputs)
                    raise EngineError(f"ORT fusions {self.fusions.value!r} failed on {path.name}: {e}") from e
                log.warning("ORT fusions failed on %s, running it unfused: %s", path.name, e)
                self.fusions, self.stats["fusions"] = Fusions.NONE, f"none (fusing failed: {str(e)[:200]})"
                return path
            self.stats["fuse_s"] = self.stats.get("fuse_s", 0.0) + time.perf_counter() - t0
            self.stats.setdefault("fused", {})[shape] = counts
        return fused

    def _options(self, bucket: int | None = None):
        so = self._ort.SessionOptions()
        so.graph_optimization_level = self._ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        so.log_severity_level = 3
        if bucket is not None:
            so.add_session_config_entry("session.disable_cpu_ep_fallback", "1")
        return so

    def _cuda_session(self, bucket: int) -> None:
        ort = self._ort
        opts = {
            **self.provider_options,
            "device_id": str(self.device.index or 0),
            "user_compute_stream": str(self._stream.cuda_stream),
        }
        if self.use_graphs:
            opts["enable_cuda_graph"] = "1"
        t0 = time.perf_counter()
        try:
            sess = ort.InferenceSession(
                str(self.onnx_paths[bucket]),
                self._options(bucket),
                providers=[("CUDAExecutionProvider", opts)],
                **({"disabled_optimizers": self.disabled_optimizers} if self.disabled_optimizers else {}),
            )
        except Exception as e:
            raise EngineError(
                f"ONNX Runtime could not place every node of bucket {bucket} on the CUDA provider"
                f" (CPU fallback is refused so it cannot silently run slow): {e}"
            ) from e
        if sess.get_providers()[0] != "CUDAExecutionProvider":
            raise EngineError(f"ONNX Runtime session runs on {sess.get_providers()}, not CUDA.")
        ins = example_inputs(self.model, bucket, self.device, seed=2000)
        with torch.inference_mode():
            outs = ExportFn(self.model, self.device.type, torch.float32)(*ins)  # output shapes/dtypes
        outs = tuple(torch.empty_like(o) for o in outs)
        binding = sess.io_binding()
        for name, t in zip(INPUTS, ins, strict=True):
            binding.bind_input(
                name, "cuda", self.device.index or 0, _NP[t.dtype], list(t.shape), t.data_ptr()
            )
        for name, t in zip(OUTPUTS, outs, strict=True):
            binding.bind_output(
                name, "cuda", self.device.index or 0, _NP[t.dtype], list(t.shape), t.data_ptr()
            )
        self.sessions[bucket] = sess
        self.bindings[bucket] = (binding, ins, outs)
        torch.cuda.synchronize(self.device)
        try:
            for _ in range(3):  # ORT runs once normally, then captures the graph, then replays
                sess.run_with_iobinding(binding)
        except Exception as e:
            raise EngineError(f"ONNX Runtime failed to run or capture bucket {bucket} on CUDA: {e}") from e
        torch.cuda.synchronize(self.device)
        self.stats["capture_s"] += time.perf_counter() - t0

    # -- serving --------------------------------------------------------------------------------
    @torch.inference_mode()
    def _run_bucket(self, bucket: int, images: Tensor, query: Tensor, controls: Tensor) -> tuple[Tensor, ...]:
        n = images.shape[0]
        if self.device.type != "cuda":
            feeds = {
                k: pad_rows(v, bucket).cpu().numpy()
                for k, v in zip(INPUTS, (images, query, controls), strict=True)
            }
            outs = self.sessions[0].run(list(OUTPUTS), feeds)
            return self._with_constants(tuple(torch.from_numpy(o[:n].copy()) for o in outs), n)
        if bucket not in self.bindings:
            raise EngineError(f"No ONNX Runtime session was prepared for bucket {bucket}.")
        binding, ins, outs = self.bindings[bucket]
        cur = torch.cuda.current_stream(self.device)
        self._stream.wait_stream(cur)
        with torch.cuda.stream(self._stream):
            for dst, src in zip(ins, (images, query, controls), strict=True):
                dst[:n].copy_(src, non_blocking=True)
            self.sessions[bucket].run_with_iobinding(binding)
            result = tuple(o[:n].clone() for o in outs)
        cur.wait_stream(self._stream)
        return self._with_constants(result, n)

    def _with_constants(self, outs: tuple[Tensor, ...], n: int) -> tuple[Tensor, ...]:
        it = iter(outs)
        return tuple(
            self._constants[f].expand(n, -1).clone() if f in self._constants else next(it)
            for f in ModelOutput._fields
        )

    def close(self) -> None:
        self.bindings.clear()
        self.sessions.clear()
