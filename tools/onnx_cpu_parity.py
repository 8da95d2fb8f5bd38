"""ONNX export vs eager on ONNX Runtime's CPU provider, per output map, at static batch sizes.

    python tools/onnx_cpu_parity.py [--variant arrcoc-clip-b16] 8 64

Separates the exported graph from the CUDA provider: if the CPU provider matches eager at a batch
where the GPU run does not, the graph is right and the drift is the provider's. Random weights for
hub variants (as `arrcoc bench`), the bundled example photos, random unit queries.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import numpy as np
import onnxruntime as ort
import torch

from arrcoc.bench.parity import photo_batch, random_queries
from arrcoc.bench.startup import bench_weights
from arrcoc.engine.onnx import INPUTS, ExportFn, export_onnx
from arrcoc.registry import create_model


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--variant", default="arrcoc-clip-b16")
    p.add_argument("batches", type=int, nargs="+")
    args = p.parse_args()
    cpu = torch.device("cpu")
    torch.manual_seed(0)
    model = create_model(args.variant, bench_weights(args.variant, "default"), cpu)
    fn = ExportFn(model, "cpu", torch.float32).eval()
    tmp = Path(tempfile.mkdtemp(prefix="arrcoc-onnx-parity-"))
    for batch in args.batches:
        inputs = (
            photo_batch(model.config.image_size, batch, cpu),
            random_queries(batch, model.config.query_dim, cpu),
            model.default_controls(batch, cpu),
        )
        with torch.no_grad():
            ref = fn(*inputs)
        path = tmp / f"b{batch}.onnx"
        export_onnx(model, path, cpu, batch)
        sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        outs = sess.run(None, {k: v.numpy() for k, v in zip(INPUTS, inputs, strict=True)})
        for out, r, o in zip(sess.get_outputs(), ref, outs, strict=True):
            if r.dtype.is_floating_point:
                print(
                    f"batch {batch:3d}  {out.name:14s} max |onnx - eager| {float(np.abs(r.numpy() - o).max()):.2e}"
                )


if __name__ == "__main__":
    main()
