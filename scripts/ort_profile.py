"""ONNX Runtime's own op-by-op profile of the exported model (static batch), by operator type.

    python scripts/ort_profile.py --batch 8 [--device cuda] [--threads 1] [--runs 5]

Exports the forward at one batch size with arrcoc's exporter (arrcoc.engine.onnx.export_onnx),
runs it `runs` times under ORT's profiler (CUDA provider on --device cuda: onnxruntime-gpu) and
prints the wall time per run and the operator types by their share of kernel time.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import tempfile
import time
from pathlib import Path


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--variant", default="arrcoc-texture")
    p.add_argument("--weights", default="default")
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    p.add_argument("--threads", type=int, default=1, help="intra-op threads (CPU provider)")
    p.add_argument("--runs", type=int, default=5)
    p.add_argument("--top", type=int, default=12)
    args = p.parse_args()

    import onnxruntime as ort
    import torch

    from arrcoc.engine.base import example_inputs
    from arrcoc.engine.onnx import INPUTS, export_onnx
    from arrcoc.registry import create_model

    torch.manual_seed(0)
    model = create_model(args.variant, None if args.weights == "none" else args.weights, "cpu")
    tmp = Path(tempfile.mkdtemp(prefix="arrcoc-ortprof-"))
    path = tmp / f"{args.variant}-b{args.batch}.onnx"
    export_onnx(model, path, torch.device("cpu"), args.batch)
    so = ort.SessionOptions()
    so.enable_profiling = True
    so.profile_file_prefix = str(tmp / "profile")
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    so.intra_op_num_threads = args.threads
    providers = [("CUDAExecutionProvider", {"use_tf32": "0"})] if args.device == "cuda" else ["CPUExecutionProvider"]
    sess = ort.InferenceSession(str(path), so, providers=providers)
    feeds = {k: v.numpy() for k, v in zip(INPUTS, example_inputs(model, args.batch, torch.device("cpu"), seed=3),
                                          strict=True)}  # fmt: skip
    sess.run(None, feeds)  # warm-up (also profiled; averaged in below)
    t0 = time.perf_counter()
    for _ in range(args.runs):
        sess.run(None, feeds)
    wall = (time.perf_counter() - t0) / args.runs
    events = json.loads(Path(sess.end_profiling()).read_text())
    by_op: collections.Counter = collections.Counter()
    count: collections.Counter = collections.Counter()
    for e in events:
        if e.get("cat") == "Node" and e["name"].endswith("_kernel_time"):
            by_op[e["args"]["op_name"]] += e["dur"]
            count[e["args"]["op_name"]] += 1
    total, n = sum(by_op.values()) or 1, args.runs + 1
    print(f"{args.variant} batch {args.batch} on {sess.get_providers()[0]}: {wall * 1e3:.2f} ms a run (host clock)")
    for op, us in by_op.most_common(args.top):
        print(f"  {op:24s} {us / n / 1e3:9.3f} ms  {100 * us / total:5.1f} %  x{count[op] // n}")
    for f in tmp.iterdir():
        os.remove(f)
    tmp.rmdir()


if __name__ == "__main__":
    main()
