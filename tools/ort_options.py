"""Which ONNX Runtime settings keep parity, and what they cost: the onnx backend under several
CUDA-provider options, disabled graph rewrites and fusions of the export (engine/ort_fusion.py),
each checked against eager and timed with its CUDA graphs, beside compiled + graph in the same
process (issue 14: arrcoc-clip-b16 at bucket 64 drifted 1.35e-3 on the participatory map; ORT's
CPU provider matches to 5.7e-6).

    python tools/ort_options.py --variant arrcoc-clip-b16 --buckets 1 8 64 [--configs ...]

One line per config and bucket: worst max |onnx - eager| over every map (and which map), top-K
agreement, p50 ms, and p50 over compiled's. A config ORT refuses is reported, not fatal.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from arrcoc.bench.parity import TOL, compare, photo_batch, random_queries  # noqa: E402
from arrcoc.bench.startup import bench_weights  # noqa: E402
from arrcoc.bench.timing import summarize, time_interleaved  # noqa: E402
from arrcoc.engine import create_backend  # noqa: E402
from arrcoc.engine.base import example_inputs  # noqa: E402
from arrcoc.registry import create_model  # noqa: E402

_FUSIONS = [
    "AttentionFusion",
    "LayerNormFusion",
    "SimplifiedLayerNormFusion",
    "SkipLayerNormFusion",
    "GeluFusion",
    "BiasGeluFusion",
    "FastGeluFusion",
    "MatMulScaleFusion",
    "BiasSoftmaxFusion",
]
_MEA_FP32 = {"ORT_MIN_SEQ_LEN_EFFICIENT_ATTENTION_FP32": "1"}  # ORT's default: 256 tokens (clip-b16 has 197)
# name -> (provider options, disabled optimizers, environment, fusions (engine/ort_fusion.py; None: the default))
CONFIGS: dict[str, tuple[dict, list, dict, str | None]] = {
    "default": ({}, [], {}, None),
    "unfused": ({}, [], {}, "none"),
    "fused-norm": ({}, [], {}, "norm"),
    "fused-mea": ({}, [], _MEA_FP32, "all"),
    "conv-heuristic": ({"cudnn_conv_algo_search": "HEURISTIC"}, [], {}, None),
    "conv-default": ({"cudnn_conv_algo_search": "DEFAULT"}, [], {}, None),
    "no-attention-fusion": ({}, ["AttentionFusion"], {}, None),
    "no-fused-attention-kernels": (
        {},
        [],
        {
            "ORT_DISABLE_FLASH_ATTENTION": "1",
            "ORT_DISABLE_FUSED_ATTENTION": "1",
            "ORT_DISABLE_MEMORY_EFFICIENT_ATTENTION": "1",
            "ORT_DISABLE_TRT_FLASH_ATTENTION": "1",
        },
        None,
    ),
    "no-transformer-fusions": ({}, _FUSIONS, {}, None),
    "conv-default+no-transformer-fusions": ({"cudnn_conv_algo_search": "DEFAULT"}, _FUSIONS, {}, None),
}


def parity(be, reference, model, bucket: int, device) -> dict:
    """Worst compare() over the example photos and random images."""
    worst: dict = {}
    for i, images in enumerate(
        (
            photo_batch(model.config.image_size, bucket, device),
            example_inputs(model, bucket, device, seed=99)[0],
        )
    ):
        query = random_queries(bucket, model.config.query_dim, device, seed=i)
        controls = model.default_controls(bucket, device)
        with torch.inference_mode():
            c = compare(reference.run(images, query, controls), be.run(images, query, controls), controls)
        if not worst or c["max_abs_diff"] > worst["max_abs_diff"]:
            worst = c
    return worst


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--variant", default="arrcoc-clip-b16")
    p.add_argument("--weights", default="default", help="'default': random weights for hub variants")
    p.add_argument("--buckets", type=int, nargs="+", default=[1, 8, 64])
    p.add_argument("--configs", nargs="+", default=list(CONFIGS), choices=list(CONFIGS))
    p.add_argument("--iters", type=int, default=50)
    p.add_argument("--no-compiled", action="store_true", help="skip compiled + graph (no ratio)")
    p.add_argument("--cache-dir", type=Path, default=None)
    p.add_argument("--json", type=Path, default=None)
    args = p.parse_args()
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    cache = args.cache_dir or Path(tempfile.mkdtemp(prefix="ort-options-"))
    torch.manual_seed(0)
    model = create_model(args.variant, bench_weights(args.variant, args.weights), device)
    buckets = tuple(args.buckets)
    reference = create_backend("eager", model, device, buckets)
    reference.warmup()
    compiled = None
    if not args.no_compiled and device.type == "cuda":
        t = time.perf_counter()
        compiled = create_backend("compiled", model, device, buckets, cache_dir=cache)
        compiled.warmup()
        print(f"compiled ready in {time.perf_counter() - t:.1f} s", flush=True)
    rows = []
    for name in args.configs:
        options, disabled, env, fusions = CONFIGS[name]
        saved = {k: os.environ.get(k) for k in env}
        os.environ.update(env)
        t = time.perf_counter()
        try:
            be = create_backend(
                "onnx",
                model,
                device,
                buckets,
                cache_dir=cache,
                provider_options=options,
                disabled_optimizers=tuple(disabled),
                fusions=fusions,
            )
            be.warmup()
        except Exception as e:  # a config ORT refuses: say so, go on
            print(f"{name:38s} FAILED: {type(e).__name__}: {str(e)[:300]}", flush=True)
            rows.append({"config": name, "error": str(e)[:1000]})
            continue
        finally:
            for k, v in saved.items():
                os.environ.pop(k) if v is None else os.environ.__setitem__(k, v)
        ready_s = time.perf_counter() - t
        for shape, counts in be.stats.get("fused", {}).items():  # node counts of each fused export
            print(f"{name:38s} fused {shape}: {counts}", flush=True)
        for b in buckets:
            par = parity(be, reference, model, b, device)
            sets = [example_inputs(model, b, device, seed=100 + s) for s in range(3)]
            calls = {"onnx": lambda i, be=be, sets=sets: be.run(*sets[i % 3])}
            if compiled is not None:
                calls["compiled"] = lambda i, sets=sets: compiled.run(*sets[i % 3])
            with torch.inference_mode():
                times = time_interleaved(calls, args.iters, 10, device)
            p50 = summarize(times["onnx"])["p50_ms"]
            ref = summarize(times["compiled"])["p50_ms"] if compiled is not None else None
            worst_map = max(par["diff_by_map"], key=par["diff_by_map"].get)
            ok = par["max_abs_diff"] <= TOL[torch.float32] and par["topk_agreement_ties"] == 1.0
            row = {
                "config": name,
                "bucket": b,
                "fusions": be.stats.get("fusions"),
                "ready_s": round(ready_s, 1),
                "onnx_p50_ms": p50,
                "compiled_p50_ms": ref,
                "ratio": p50 / ref if ref else None,
                "max_abs_diff": par["max_abs_diff"],
                "worst_map": worst_map,
                "diff_by_map": par["diff_by_map"],
                "parity_ok": ok,
                "topk_agreement_ties": par["topk_agreement_ties"],
            }
            rows.append(row)
            print(
                f"{name:38s} b{b:<3d} max|d| {par['max_abs_diff']:.3g} ({worst_map}) "
                f"{'ok ' if ok else 'OFF'} onnx {p50:.3f} ms"
                + (f"  compiled {ref:.3f}  x{p50 / ref:.2f}" if ref else ""),
                flush=True,
            )
        be.close()
        del be
        torch.cuda.empty_cache() if device.type == "cuda" else None
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    best = pick(rows, args.configs)
    if best:  # for `arrcoc bench --onnx-options` (tools/gpu_engines.sh ortopt)
        options, disabled, env, fusions = CONFIGS[best]
        print(f"BEST {best}")
        print(
            "BEST_OPTIONS "
            + json.dumps(
                {"provider_options": options, "disabled_optimizers": disabled}
                | ({"fusions": fusions} if fusions else {})
            )
        )
        print("BEST_ENV " + " ".join(f"{k}={v}" for k, v in env.items()))
    return 0


def pick(rows: list[dict], names: list[str]) -> str | None:
    """The config with parity at every bucket and the lowest worst-bucket ratio to compiled
    (the lowest worst p50 without compiled)."""
    scores = {}
    for n in names:
        mine = [r for r in rows if r["config"] == n]
        if mine and all(r.get("parity_ok") for r in mine):
            scores[n] = max(r["ratio"] if r["ratio"] is not None else r["onnx_p50_ms"] for r in mine)
    return min(scores, key=scores.get) if scores else None


if __name__ == "__main__":
    raise SystemExit(main())
