"""Where compiled artefacts live, so that a restarted process starts warm.

<cache_dir>/inductor   Inductor's FX-graph, AOTAutograd and kernel caches
<cache_dir>/triton     Triton's compiled kernels
<cache_dir>/onnx       exported ONNX files, keyed by variant, weights and versions
<cache_dir>/aot        AOTInductor packages, one per bucket (engine/aot.py)
<cache_dir>/compiled   portable compile-cache artefacts of the compiled backend
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import torch
from torch import nn


def configure_compile_caches(cache_dir: Path | None) -> None:
    """Point Inductor and Triton at cache_dir (before the first compile of the process)."""
    if cache_dir is None:
        return
    ind, tri = Path(cache_dir) / "inductor", Path(cache_dir) / "triton"
    ind.mkdir(parents=True, exist_ok=True)
    tri.mkdir(parents=True, exist_ok=True)
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(ind)
    os.environ["TRITON_CACHE_DIR"] = str(tri)
    import torch._inductor.config as inductor_config

    inductor_config.fx_graph_cache = True
    if hasattr(inductor_config, "autotune_local_cache"):
        inductor_config.autotune_local_cache = True


PACKAGE = Path(__file__).resolve().parent.parent


def code_fingerprint() -> str:
    """Hash of the model code (arrcoc/*.py and the engine): a new export whenever it changes."""
    h = hashlib.sha256()
    for f in sorted(PACKAGE.glob("*.py")) + sorted((PACKAGE / "engine").glob("*.py")):
        h.update(f.name.encode())
        h.update(f.read_bytes())
    return h.hexdigest()[:16]


def model_fingerprint(model: nn.Module) -> str:
    """Hash of the code and of parameter names, shapes and values: a new export whenever
    the weights or the code change."""
    h = hashlib.sha256()
    h.update(code_fingerprint().encode())
    h.update(type(model).__name__.encode())
    h.update(repr(getattr(model, "config", "")).encode())
    for k, v in sorted(model.state_dict().items()):
        h.update(f"{k}:{tuple(v.shape)}:{v.dtype}".encode())
        h.update(v.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
    h.update(torch.__version__.encode())
    return h.hexdigest()[:16]


def default_cache_dir() -> Path:
    """Where artefacts go when a backend is given no cache dir (tests, one-off runs)."""
    return Path(os.environ.get("TMPDIR", "/tmp")) / "arrcoc-cache"
