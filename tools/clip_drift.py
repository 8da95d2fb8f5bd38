"""Where arrcoc-clip-b16's ONNX Runtime output drifts from eager at bucket 64 (issue 14), layer by
layer, each against a float64 reference of the same weights and inputs.

    python tools/clip_drift.py [--buckets 8 64] [--json out.json]

Exports a probe of the image tower (every layer's hidden state, the dense features, the unit
patch embeddings and the participatory probability) once per bucket, runs it with ONNX Runtime's
CUDA provider (float32, no TF32, the backend's graph optimisations) and prints per stage the
relative max |diff| of ORT and of eager float32 against float64, and of ORT against eager (and of
eager with cuDNN's TF32 convolutions, PyTorch's default, which the engine turns off: the drift the
first run of this script found). If ORT is no farther from float64 than eager is, the drift is
float32's own, not ORT's.
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
import tempfile
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from arrcoc.bench.parity import photo_batch, random_queries  # noqa: E402
from arrcoc.bench.startup import bench_weights  # noqa: E402
from arrcoc.clip import dense_similarity  # noqa: E402
from arrcoc.engine.base import example_inputs  # noqa: E402
from arrcoc.engine.onnx import OPSET, PROVIDER_OPTIONS  # noqa: E402
from arrcoc.registry import create_model  # noqa: E402


class Probe(torch.nn.Module):
    """images uint8, query unit -> (hidden states (L, B, T, D), dense (B, N, D), patches (B, N, E), prob (B, N))."""

    def __init__(self, model):
        super().__init__()
        self.m = model

    def forward(self, images, query):
        m = self.m
        dtype = m.visual_projection.weight.dtype
        x = (images.to(dtype) / 255.0 - m.clip_mean.to(dtype)) / m.clip_std.to(dtype)
        tower = m.vision_model
        h = tower.pre_layrnorm(tower.embeddings(x))
        states = []
        for layer in tower.encoder.layers[:-1]:
            h = layer(h)
            states.append(h)
        last = tower.encoder.layers[-1]
        dense = tower.post_layernorm(last.self_attn.value_path(last.layer_norm1(h[:, 1:])))
        proj = m.visual_projection(dense)
        patches = F.normalize(proj, dim=-1)
        _, prob = dense_similarity(
            patches, F.normalize(query, dim=-1), m.neutral.to(dtype), m.logit_scale.to(dtype)
        )
        return torch.stack(states), dense, proj, patches, prob


NAMES = ("states", "dense", "proj", "patches", "prob")


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    """max |a - b| over max |b| (per stage)."""
    return float((a.double() - b.double()).abs().max() / b.double().abs().max().clamp_min(1e-30))


def absd(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b.double()).abs().max())


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--buckets", type=int, nargs="+", default=[8, 64])
    p.add_argument("--json", type=Path, default=None)
    args = p.parse_args()
    import onnxruntime as ort

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.manual_seed(0)
    model = create_model("arrcoc-clip-b16", bench_weights("arrcoc-clip-b16", "default"), device).eval()
    probe32 = Probe(model).eval()
    encoder, model.text_encoder = model.text_encoder, None  # holds a lock: not copyable
    probe64 = Probe(copy.deepcopy(model).double()).eval()
    model.text_encoder = encoder
    tmp = Path(tempfile.mkdtemp(prefix="clip-drift-"))
    report = []
    for b in args.buckets:
        for kind, images in (
            ("photos", photo_batch(model.config.image_size, b, device)),
            ("random", example_inputs(model, b, device, seed=99)[0]),
        ):
            query = random_queries(b, model.config.query_dim, device, seed=0 if kind == "photos" else 1)
            with torch.inference_mode():
                ref = probe64(images, query.double())
                eag = probe32(images, query)
                chunks = [probe32(images[i : i + 8], query[i : i + 8]) for i in range(0, b, 8)]
                eag8 = [torch.cat([c[j] for c in chunks], dim=1 if j == 0 else 0) for j in range(len(NAMES))]
                from torch.nn.attention import SDPBackend, sdpa_kernel

                with sdpa_kernel(SDPBackend.MATH):  # eager's own attention kernel choice, ruled in or out
                    math = probe32(images, query)
                torch.backends.cudnn.allow_tf32 = True  # PyTorch's default for cuDNN convolutions
                tf32 = probe32(images, query)
                torch.backends.cudnn.allow_tf32 = False
            path = tmp / f"probe-b{b}-{kind}.onnx"
            with torch.no_grad():
                torch.onnx.export(
                    probe32,
                    (images, query),
                    dynamo=True,
                    opset_version=OPSET,
                    optimize=True,
                    input_names=["images", "query"],
                    output_names=list(NAMES),
                ).save(str(path))
            so = ort.SessionOptions()
            so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
            so.log_severity_level = 3
            providers = (
                [("CUDAExecutionProvider", dict(PROVIDER_OPTIONS))] if device.type == "cuda" else []
            ) + ["CPUExecutionProvider"]
            rows = {}
            for level_name, level in (
                ("all", ort.GraphOptimizationLevel.ORT_ENABLE_ALL),
                ("none", ort.GraphOptimizationLevel.ORT_DISABLE_ALL),
            ):
                so.graph_optimization_level = level
                sess = ort.InferenceSession(str(path), so, providers=providers)
                outs = sess.run(None, {"images": images.cpu().numpy(), "query": query.cpu().numpy()})
                rows[level_name] = [torch.from_numpy(o) for o in outs]
            for j, name in enumerate(NAMES):
                e, r, e8 = eag[j].cpu(), ref[j].cpu(), eag8[j].cpu()
                line = {
                    "bucket": b,
                    "inputs": kind,
                    "stage": name,
                    "eager_vs_f64": rel(e, r),
                    "eager_b8chunks_vs_eager": rel(e8, e),
                    "eager_math_sdpa_vs_f64": rel(math[j].cpu(), r),
                    "eager_math_sdpa_vs_eager": rel(math[j].cpu(), e),
                    "eager_tf32conv_vs_f64": rel(tf32[j].cpu(), r),
                }
                for lv, outs in rows.items():
                    line[f"ort_{lv}_vs_f64"] = rel(outs[j], r)
                    line[f"ort_{lv}_vs_eager"] = rel(outs[j], e)
                if name == "prob":  # the participatory map: absolute, as the parity rule reads it
                    line["abs"] = {
                        "eager_vs_f64": absd(e, r),
                        "ort_all_vs_f64": absd(rows["all"][j], r),
                        "ort_all_vs_eager": absd(rows["all"][j], e),
                        "ort_none_vs_eager": absd(rows["none"][j], e),
                        "eager_b8chunks_vs_eager": absd(e8, e),
                        "eager_math_sdpa_vs_eager": absd(math[j].cpu(), e),
                        "eager_tf32conv_vs_eager": absd(tf32[j].cpu(), e),
                    }
                if name == "states":  # per layer
                    line["per_layer_ort_all_vs_eager"] = [
                        rel(rows["all"][j][i], e[i]) for i in range(e.shape[0])
                    ]
                    line["per_layer_eager_vs_f64"] = [rel(e[i], r[i]) for i in range(e.shape[0])]
                    line["per_layer_ort_all_vs_f64"] = [
                        rel(rows["all"][j][i], r[i]) for i in range(e.shape[0])
                    ]
                if name == "proj":
                    line["proj_norm_min"] = float(r.norm(dim=-1).min())
                    line["proj_norm_median"] = float(r.norm(dim=-1).median())
                report.append(line)
                print(json.dumps(line), flush=True)
    if args.json:
        args.json.write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
