"""ONNX Runtime's own op-by-op profile of the exported model (static batch), by operator type.

    python tools/ort_profile.py --batch 8 [--device cuda] [--threads 1] [--runs 5] [--warmup 1]
                                  [--cudnn-conv-algo-search HEURISTIC] [--fusions none]

Exports the forward at one batch size with arrcoc's exporter (arrcoc.engine.onnx.export_onnx),
fuses it as the onnx backend does (--fusions; engine/ort_fusion.py), runs it `warmup` + `runs`
times under ORT's profiler (CUDA provider on --device cuda: onnxruntime-gpu) and prints, for the
timed runs only, each operator type's kernel time per run, its share of kernel time and how many
nodes of it a run executes; then the total kernel time per run beside the host's wall time per
run and ORT's own model_run time.

The warm-up runs are left out (cuDNN's exhaustive algorithm search on the first Conv alone
inflates Conv many times over): events before the end of the last warm-up `model_run` are
dropped (or, if the profile has no model_run events, each node's first `warmup` kernel_time
events). On the CUDA provider a node's kernel_time is the host time of its Compute (launch,
plus any synchronisation it does); GPU kernel events (category "Kernel"), present only in ORT
builds with CUDA profiling, are tabulated too when there are any.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import tempfile
import time
from pathlib import Path

CONV_ALGO_SEARCH = ("EXHAUSTIVE", "HEURISTIC", "DEFAULT")  # ORT's CUDA EP values; ORT's default: EXHAUSTIVE


def timed_events(events: list[dict], warmup: int) -> tuple[list[dict], int, list[float]]:
    """(events of the timed runs, number of timed runs, ORT's model_run durations in us)."""
    runs = sorted(
        (e for e in events if e.get("cat") == "Session" and e.get("name") == "model_run"),
        key=lambda e: e["ts"],
    )
    if len(runs) > warmup:
        cut = runs[warmup - 1]["ts"] + runs[warmup - 1]["dur"] if warmup else -1
        timed = [e for e in events if e.get("ts", 0) >= cut]
        return timed, len(runs) - warmup, [e["dur"] for e in runs[warmup:]]
    seen: collections.Counter = collections.Counter()  # no run markers: drop each node's first events
    timed = []
    for e in sorted(events, key=lambda e: e.get("ts", 0)):
        if e.get("cat") == "Node" and e.get("name", "").endswith("_kernel_time"):
            seen[e["name"]] += 1
            if seen[e["name"]] <= warmup:
                continue
        timed.append(e)
    return timed, 0, []


def by_op(events: list[dict]) -> tuple[collections.Counter, collections.Counter]:
    us: collections.Counter = collections.Counter()
    count: collections.Counter = collections.Counter()
    for e in events:
        if e.get("cat") == "Node" and e.get("name", "").endswith("_kernel_time"):
            op = e.get("args", {}).get("op_name", "?")
            us[op] += e["dur"]
            count[op] += 1
    return us, count


def gpu_kernels(events: list[dict]) -> collections.Counter:
    us: collections.Counter = collections.Counter()
    for e in events:
        if e.get("cat") == "Kernel":
            us[e.get("name", "?")[:60]] += e.get("dur", 0)
    return us


def print_table(
    title: str, us: collections.Counter, count: collections.Counter | None, runs: int, top: int
) -> float:
    """Rows by time per run; returns the total in ms per run."""
    total = sum(us.values())
    print(title)
    for name, t in us.most_common(top):
        n = f"  x{count[name] / runs:g}" if count is not None else ""
        print(f"  {name:32s} {t / runs / 1e3:9.3f} ms/run  {100 * t / (total or 1):5.1f} %{n}")
    rest = len(us) - min(top, len(us))
    if rest > 0:
        print(f"  ({rest} more: {sum(t for _, t in us.most_common()[top:]) / runs / 1e3:.3f} ms/run)")
    return total / runs / 1e3


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--variant", default="arrcoc-texture")
    p.add_argument("--weights", default="default")
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    p.add_argument("--threads", type=int, default=1, help="intra-op threads (CPU provider)")
    p.add_argument("--runs", type=int, default=5, help="timed runs")
    p.add_argument("--warmup", type=int, default=1, help="untimed runs first, left out of the profile")
    p.add_argument("--top", type=int, default=12)
    p.add_argument(
        "--cudnn-conv-algo-search",
        default=None,
        choices=CONV_ALGO_SEARCH,
        help="CUDA provider's cudnn_conv_algo_search (default: ORT's, EXHAUSTIVE)",
    )
    p.add_argument(
        "--fusions",
        default="default",
        choices=("default", "none", "norm", "all"),
        help="ORT fusions of the export as the onnx backend applies them (default: the model's)",
    )
    args = p.parse_args()
    if args.runs < 1 or args.warmup < 0:
        p.error("--runs must be at least 1 and --warmup at least 0")

    import onnxruntime as ort
    import torch

    from arrcoc.engine.base import example_inputs
    from arrcoc.engine.onnx import INPUTS, default_fusions, export_onnx
    from arrcoc.engine.ort_fusion import Fusions, fuse_onnx, fused_path
    from arrcoc.registry import create_model

    torch.manual_seed(0)
    model = create_model(args.variant, None if args.weights == "none" else args.weights, "cpu")
    tmp = Path(tempfile.mkdtemp(prefix="arrcoc-ortprof-"))
    path = tmp / f"{args.variant}-b{args.batch}.onnx"
    export_onnx(model, path, torch.device("cpu"), args.batch)
    fusions = default_fusions(model) if args.fusions == "default" else Fusions(args.fusions)
    if fusions != Fusions.NONE:
        print(f"fusions {fusions.value}: {fuse_onnx(path, fused_path(path, fusions), fusions)}")
        path = fused_path(path, fusions)
    so = ort.SessionOptions()
    so.enable_profiling = True
    so.profile_file_prefix = str(tmp / "profile")
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    so.intra_op_num_threads = args.threads
    if args.device == "cuda":
        cuda_opts = {"use_tf32": "0"}
        if args.cudnn_conv_algo_search:
            cuda_opts["cudnn_conv_algo_search"] = args.cudnn_conv_algo_search
        providers: list = [("CUDAExecutionProvider", cuda_opts)]
    else:
        providers = ["CPUExecutionProvider"]
    sess = ort.InferenceSession(str(path), so, providers=providers)
    feeds = {
        k: v.numpy()
        for k, v in zip(INPUTS, example_inputs(model, args.batch, torch.device("cpu"), seed=3), strict=True)
    }
    t0 = time.perf_counter()
    for _ in range(args.warmup):
        sess.run(None, feeds)
    warm_ms = (time.perf_counter() - t0) * 1e3
    t0 = time.perf_counter()
    for _ in range(args.runs):
        sess.run(None, feeds)
    wall_ms = (time.perf_counter() - t0) / args.runs * 1e3
    events = json.loads(Path(sess.end_profiling()).read_text())
    timed, marked, model_runs = timed_events(events, args.warmup)
    if marked and marked != args.runs:
        print(
            f"(the profile holds {marked} timed model_run events, not {args.runs}: per-run figures use {args.runs})"
        )
    us, count = by_op(timed)
    provider = sess.get_providers()[0]
    opts = sess.get_provider_options().get(provider, {})
    search = (
        f", cudnn_conv_algo_search {opts.get('cudnn_conv_algo_search', '?')}" if args.device == "cuda" else ""
    )
    print(
        f"{args.variant} batch {args.batch} on {provider}{search}: {args.runs} timed runs after {args.warmup}"
        f" warm-up ({warm_ms:.1f} ms, left out)"
    )
    kernel_ms = print_table(
        "  operator type                    kernel time      share  nodes/run", us, count, args.runs, args.top
    )
    gpu = gpu_kernels(timed)
    gpu_ms = print_table("  GPU kernels (CUPTI)", gpu, None, args.runs, args.top) if gpu else None
    ort_ms = sum(model_runs) / len(model_runs) / 1e3 if model_runs else float("nan")
    line = f"per run: kernel time {kernel_ms:.3f} ms (sum over nodes), ORT model_run {ort_ms:.3f} ms, host wall {wall_ms:.3f} ms"
    print(line + (f", GPU kernels {gpu_ms:.3f} ms" if gpu_ms is not None else "") + " (ms a run)")
    for f in tmp.iterdir():
        os.remove(f)
    tmp.rmdir()


if __name__ == "__main__":
    main()
