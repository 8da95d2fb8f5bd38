"""arrcoc infer IMAGE --query TEXT [--backend eager] [--json OUT] [--png OUT]"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from ..settings import BACKENDS, DTYPES


def add_parser(sub) -> None:
    p = sub.add_parser("infer", help="relevance heatmap of one image for one query")
    p.add_argument("image", type=Path)
    p.add_argument("--query", "-q", required=True)
    p.add_argument("--backend", default="eager", choices=BACKENDS)
    p.add_argument("--variant", default=None, help="model variant (default: settings)")
    p.add_argument("--weights", default="default", help="weights file; 'none' for untrained")
    p.add_argument("--device", default="auto")
    p.add_argument(
        "--dtype",
        choices=DTYPES,
        default=None,
        help="auto: bfloat16 for CLIP on a GPU, else float32 (default: settings, ARRCOC_ENGINE__DTYPE)",
    )
    p.add_argument("--k", type=int, default=None, help="cells to select (default 200)")
    p.add_argument("--token-budget", type=int, default=None)
    p.add_argument("--json", dest="json_out", type=Path, help="write the result JSON here ('-': stdout)")
    p.add_argument(
        "--png",
        dest="png_out",
        type=Path,
        help="write the heatmap overlay PNG here (captioned: query, match score, colour scale)",
    )
    p.add_argument(
        "--foveated",
        dest="foveated_out",
        type=Path,
        help="write the foveated view (what a VLM would be given under the budgets) here, at the photo's size",
    )
    p.set_defaults(func=run)


def run(args) -> int:
    from ..pipeline import RelevancePipeline
    from ..request import Controls
    from ..settings import get_settings
    from ._client import check_output, match_line, read_input, save_overlay

    data = read_input(
        args.image, "image file"
    )  # a missing file or a folder: one line, before the model loads
    check_output(args.json_out)
    check_output(args.png_out)
    check_output(args.foveated_out)
    settings = get_settings()
    weights = None if args.weights == "none" else args.weights
    pipe = RelevancePipeline(
        args.variant or settings.engine.variant,
        weights,
        args.backend,
        args.device,
        buckets=(1,),
        cache_dir=settings.service.cache_dir,
        dtype=args.dtype or settings.engine.dtype,
    )
    pipe.warmup()
    controls = Controls(k=args.k, token_budget=args.token_budget)
    prepared = pipe.prepare(data, args.query, controls)
    pipe.run([prepared])  # warm-up, not timed: loads the query encoder, first-call kernel setup
    [result] = pipe.run([prepared])
    doc = result.to_json()
    if args.json_out is not None:
        text = json.dumps(doc)
        if str(args.json_out) == "-":
            sys.stdout.write(text + "\n")
        else:
            args.json_out.write_text(text)
    if args.png_out is not None:
        save_overlay(args.png_out, data, result)
    if args.foveated_out is not None:
        from ..foveate import foveated_image
        from ..images import load_image

        foveated_image(load_image(data), result.budget_map).save(args.foveated_out)
    if args.json_out is None or str(args.json_out) != "-":
        top = ", ".join(f"({i // result.grid},{i % result.grid})" for i in result.selected[:5])
        bal = " ".join(f"{n}={w:.2f}" for n, w in zip(doc["balance_names"], doc["balance"], strict=True))
        print(
            f"{args.image.name}: '{result.query}' [{result.variant} {result.weights_version} {result.backend}]"
        )
        print(match_line(result))
        print(f"  top cells (row,col): {top}   weights: {bal}")
        print(
            f"  {result.k} cells, {doc['tokens_used']} tokens; model {result.timings_ms['model_ms']:.1f} ms (after one warm-up run)"
        )
    return 0
