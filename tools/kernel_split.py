"""Where a backend's GPU time goes, by kernel kind: the CUDA kernels of the onnx backend (ONNX
Runtime's CUDA provider) and of compiled + graph, recorded by CUPTI (torch.profiler sees every
kernel in the process, ORT's too), summed per call into GEMM, convolution, attention and
everything else (elementwise, reductions, copies), with how many kernels each call launches.

    python tools/kernel_split.py --variant arrcoc-clip-b16 --buckets 1 8 [--backends compiled onnx]
                                   [--onnx-fusions default none]

What it answers (issue 14): whether ONNX Runtime's gap to compiled is in the big kernels (the
vision tower's GEMMs) or in the many small ones Inductor fuses.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import tempfile
from collections import defaultdict
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from arrcoc.bench.startup import bench_weights  # noqa: E402
from arrcoc.engine import create_backend  # noqa: E402
from arrcoc.engine.base import example_inputs  # noqa: E402
from arrcoc.registry import create_model  # noqa: E402

KINDS = (
    ("gemm", re.compile(r"gemm|sm90_|sm80_|cutlass|xmma|matmul|cublas", re.I)),
    ("conv", re.compile(r"conv|implicit|winograd|fft", re.I)),
    ("attention", re.compile(r"fmha|attention|flash|softmax", re.I)),
)


def kind(name: str) -> str:
    return next((k for k, pat in KINDS if pat.search(name)), "other")


def split(run, iters: int) -> dict:
    """Per call: ms and kernel count by kind, the 8 largest kernels."""
    for _ in range(5):
        run()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(iters):
            run()
        torch.cuda.synchronize()
    ms: dict[str, float] = defaultdict(float)
    count: dict[str, int] = defaultdict(int)
    top: dict[str, float] = defaultdict(float)
    for e in prof.events():
        if e.device_type != torch.autograd.DeviceType.CUDA:
            continue
        k = kind(e.name)
        ms[k] += e.device_time / 1e3 / iters
        count[k] += 1
        top[e.name[:90]] += e.device_time / 1e3 / iters
    total = sum(ms.values())
    return {
        "total_kernel_ms": round(total, 4),
        "ms": {k: round(v, 4) for k, v in ms.items()},
        "kernels_per_call": {k: count[k] // iters for k in count},
        "top": sorted(((round(v, 4), n) for n, v in top.items()), reverse=True)[:8],
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--variant", default="arrcoc-clip-b16")
    p.add_argument("--buckets", type=int, nargs="+", default=[1, 8])
    p.add_argument("--backends", nargs="+", default=["compiled", "onnx"])
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--json", type=Path, default=None)
    p.add_argument("--cache-dir", type=Path, default=None, help="default: a fresh temporary dir (cold)")
    p.add_argument(
        "--onnx-fusions",
        nargs="+",
        default=["default"],
        help="onnx once per value: default, none, norm, all (engine/ort_fusion.py)",
    )
    args = p.parse_args()
    device = torch.device("cuda")
    torch.manual_seed(0)
    model = create_model(args.variant, bench_weights(args.variant, "default"), device)
    cache = args.cache_dir or Path(tempfile.mkdtemp(prefix="kernel-split-"))
    rows = []
    runs = [(n, f) for n in args.backends for f in (args.onnx_fusions if n == "onnx" else [None])]
    for name, fusions in runs:
        options = {} if fusions in (None, "default") else {"fusions": fusions}
        be = create_backend(name, model, device, tuple(args.buckets), cache_dir=cache, **options)
        be.warmup()
        label = f"{name}[{be.stats['fusions']}]" if name == "onnx" else name
        for b in args.buckets:
            ins = example_inputs(model, b, device, seed=7)
            with torch.inference_mode():
                row = {"backend": label, "bucket": b} | split(lambda be=be, ins=ins: be.run(*ins), args.iters)
            rows.append(row)
            print(json.dumps(row), flush=True)
        be.close()
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
