"""arrcoc eval selection [--scenes N] [--json OUT] [--markdown OUT]: selection at equal tokens."""

from __future__ import annotations

import json
import sys
from pathlib import Path


def add_parser(sub) -> None:
    from ..eval.selection import SelectionEvalConfig

    d = SelectionEvalConfig()
    p = sub.add_parser("eval", help="evaluations of the model's selection")
    which = p.add_subparsers(dest="evaluation", required=True)
    s = which.add_parser(
        "selection",
        help="ARR-COC's selected cells against random, uniform and each scorer alone, "
        "at equal tokens, on held-out synthetic scenes",
    )
    s.add_argument("--scenes", type=int, default=d.scenes, help="held-out scenes (~4 queries each)")
    s.add_argument(
        "--seed", type=int, default=d.seed, help="training seed; the scenes are its held-out split"
    )
    s.add_argument(
        "--k", dest="ks", type=int, nargs="+", default=list(d.ks), help="cells selected (one column each)"
    )
    s.add_argument("--patch", type=int, default=d.patch, help="the VLM's patch size in pixels")
    s.add_argument("--variant", default="arrcoc-texture")
    s.add_argument("--weights", default="default", help="weights file; 'none' for untrained")
    s.add_argument("--threads", type=int, default=2, help="CPU threads")
    s.add_argument("--json", dest="json_out", type=Path, help="write the report JSON here")
    s.add_argument(
        "--markdown", dest="md_out", type=Path, help="write the tables (markdown) here; always printed"
    )
    s.set_defaults(func=run)


def run(args) -> int:
    import torch

    from ..errors import InvalidInputError
    from ..eval.selection import SelectionEvalConfig, evaluate_selection, to_markdown
    from ..query import query_encoder_for
    from ..registry import create_model
    from ._client import check_output

    check_output(args.json_out)
    check_output(args.md_out)
    if args.scenes < 1:
        raise InvalidInputError(f"--scenes must be at least 1, got {args.scenes}.")
    torch.set_num_threads(max(1, args.threads))
    model = create_model(args.variant, None if args.weights == "none" else args.weights, torch.device("cpu"))
    if any(not 1 <= k <= model.config.grid**2 for k in args.ks):
        raise InvalidInputError(f"--k must be between 1 and {model.config.grid**2} (the number of cells).")
    cfg = SelectionEvalConfig(scenes=args.scenes, seed=args.seed, ks=tuple(args.ks), patch=args.patch)
    tick = lambda done, total: print(f"\r  {done}/{total} scenes", end="", file=sys.stderr, flush=True)  # noqa: E731
    report = evaluate_selection(model, query_encoder_for(model), cfg, progress=tick)
    print(file=sys.stderr)
    md = to_markdown(report)
    sys.stdout.write(md)
    if args.json_out is not None:
        args.json_out.write_text(json.dumps(report, indent=1))
    if args.md_out is not None:
        args.md_out.write_text(md)
    return 0
