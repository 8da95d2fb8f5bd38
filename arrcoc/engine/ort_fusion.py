"""ONNX Runtime's transformer fusions, applied once to an exported graph before a session loads it.

The dynamo exporter writes a ViT block as ~45 plain nodes: attention as MatMul / Softmax with
SDPA's scale split over Q and K (and K transposed through a 3-D reshape), bias adds apart from
their MatMuls, residual adds apart from the layer norms. ORT's session rewrites and its Python
transformers optimizer (`onnxruntime.transformers.optimizer`, tuned for the TorchScript
exporter's graph) match little of it: on arrcoc-clip-b16 the latter fuses only QuickGelu (its
attention and SkipLayerNormalization fusions find nothing; checked with ORT 1.32), and the CUDA
provider launches one kernel per node (several times the kernels the compiled backend launches).
onnxscript's ort_fusions are written for dynamo exports and rewrite the same graph into ORT's
contrib ops (com.microsoft): SkipLayerNormalization (residual + bias + layer norm), Attention
(packed QKV projection + attention), Gelu / BiasGelu; ORT's own QuickGelu fusion then takes
CLIP's activation (x * sigmoid(1.702 x)), which onnxscript does not match.

Every fused op computes the same float32 math in another order (tests/test_onnx_fusion.py holds
the CPU provider to the parity rule); the CUDA provider's Attention kernels (unfused cuBLAS
below ORT_MIN_SEQ_LEN_EFFICIENT_ATTENTION_FP32 tokens, 256 by default; memory-efficient above)
can only be checked on a GPU, so `Fusions.NORM` keeps attention as exported.
"""

from __future__ import annotations

import collections
import hashlib
import logging
import os
import time
from enum import StrEnum
from pathlib import Path

log = logging.getLogger(__name__)

REVISION = 1  # bump when the pass list below changes what a fused file holds


class Fusions(StrEnum):
    NONE = "none"  # the export as is
    NORM = "norm"  # SkipLayerNormalization, Gelu / BiasGelu, QuickGelu; attention as exported
    ALL = "all"  # NORM + Attention (packed QKV)


def fused_path(exported: Path, fusions: Fusions) -> Path:
    """Where the fused graph of `exported` is cached: beside it, keyed by the pass list and the
    versions of the libraries that rewrote it (the exported name already keys model and code)."""
    import onnxruntime
    import onnxscript

    key = hashlib.sha256(
        f"{REVISION}:{onnxscript.__version__}:{onnxruntime.__version__}".encode()
    ).hexdigest()[:8]
    return exported.with_name(f"{exported.stem}-fuse{fusions.value}-{key}.onnx")


def op_counts(model) -> collections.Counter:
    """Nodes by op type of an onnx ModelProto's main graph."""
    return collections.Counter(n.op_type for n in model.graph.node)


def fuse_onnx(src: Path, dst: Path, fusions: Fusions) -> dict[str, int]:
    """Rewrite the model at `src` into `dst` (atomically); fusion counts, node counts before/after."""
    import onnx
    import onnx_ir as ir

    t0 = time.perf_counter()
    model = ir.load(str(src))
    before = len(model.graph)
    counts = _onnxscript_fusions(model, fusions)
    proto = ir.serde.serialize_model(model)
    counts["quick_gelu"] = _quick_gelu(proto)
    counts |= {"nodes_before": before, "nodes_after": len(proto.graph.node)}
    tmp = dst.with_suffix(f".tmp{os.getpid()}")
    onnx.save(proto, str(tmp))
    os.replace(tmp, dst)
    log.info("fused %s (%s) in %.1f s: %s", dst.name, fusions.value, time.perf_counter() - t0, counts)
    return counts


def _onnxscript_fusions(model, fusions: Fusions) -> dict[str, int]:
    """onnxscript's passes in place; fusion name -> how many fired."""
    from onnxscript.rewriter.ort_fusions import optimize_for_ort

    if fusions == Fusions.ALL:
        _, counts = optimize_for_ort(model)
        return {k: v for k, v in counts.items() if v}
    # optimize_for_ort's own sequence without its attention passes (private modules: a change in
    # them changes the cache key through onnxscript's version)
    from onnxscript.optimizer import optimize
    from onnxscript.rewriter.ort_fusions._core import _pre_optimize
    from onnxscript.rewriter.ort_fusions.bias_gelu import fuse_bias_gelu
    from onnxscript.rewriter.ort_fusions.erfgelu import fuse_erfgelu
    from onnxscript.rewriter.ort_fusions.skip_normalization import fuse_skip_layer_normalization

    _pre_optimize(model)
    counts = {
        "erf_gelu": fuse_erfgelu(model),
        "skip_layer_normalization": fuse_skip_layer_normalization(model),
        "bias_gelu": fuse_bias_gelu(model),
    }
    optimize(model)
    return {k: v for k, v in counts.items() if v}


def _quick_gelu(proto) -> int:
    """ORT's transformers-optimizer QuickGelu fusion on `proto` in place; how many fired."""
    from onnxruntime.transformers.fusion_quickgelu import FusionQuickGelu
    from onnxruntime.transformers.onnx_model import OnnxModel

    wrapped = OnnxModel(proto)
    before = op_counts(proto)["QuickGelu"]
    FusionQuickGelu(wrapped).apply()  # replaces Mul / Sigmoid / Mul, appends QuickGelu at the end
    wrapped.topological_sort()
    return op_counts(proto)["QuickGelu"] - before
