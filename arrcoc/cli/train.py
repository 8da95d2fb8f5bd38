"""arrcoc train [--out FILE] [--steps N] [--seed N] [--scenes N] ...: train the default weights."""

from __future__ import annotations

import argparse
from pathlib import Path

DEFAULT_OUT = Path(__file__).resolve().parent.parent / "weights" / "arrcoc-texture.safetensors"


def add_arguments(p: argparse.ArgumentParser) -> None:
    from ..train.trainer import TrainConfig

    d = TrainConfig()
    p.add_argument("--out", type=Path, default=DEFAULT_OUT, help="weights file (the report goes beside it)")
    p.add_argument("--variant", default=d.variant)
    p.add_argument("--steps", type=int, default=d.steps)
    p.add_argument("--seed", type=int, default=d.seed)
    p.add_argument("--scenes", type=int, default=d.scenes, help="training scenes (~3 captions each)")
    p.add_argument("--eval-scenes", type=int, default=d.eval_scenes, help="held-out evaluation scenes")
    p.add_argument("--batch", type=int, default=d.batch)
    p.add_argument("--lr", type=float, default=d.lr)
    p.add_argument("--query-noise", type=float, default=d.query_noise, help="noise on query embeddings")
    p.add_argument(
        "--extra-phrasings",
        type=int,
        default=d.extra_phrasings,
        help="extra training captions per object, from the extended training vocabulary",
    )
    p.add_argument(
        "--knowing",
        type=int,
        default=d.knowing,
        help="captions per training scene for the other ways of knowing (detail, salience, plain, edges)",
    )
    p.add_argument(
        "--colour-regions",
        type=float,
        default=d.colour_regions,
        help="share of training scenes with a large area of one colour (a background, one side), captioned by it",
    )
    p.add_argument(
        "--time-limit",
        type=float,
        default=d.time_limit_s,
        help="seconds for the whole run (data, training, evaluation): fewer steps and a shorter schedule if needed; 0: none",
    )
    p.add_argument(
        "--warmup", type=int, default=d.warmup, help="linear warm-up steps before the cosine decay"
    )
    p.add_argument("--threads", type=int, default=d.threads, help="CPU threads")
    p.add_argument("--workers", type=int, default=d.workers, help="processes drawing scenes")
    p.add_argument("--device", default="auto", help="auto | cpu | cuda (cuda: torch.compile + bf16)")
    p.add_argument(
        "--cache-dir",
        type=Path,
        default=None,
        help="where the precomputed scene tensors are cached (default ~/.cache/arrcoc)",
    )
    p.add_argument("--no-cache", action="store_true", help="recompute the scene tensors")
    p.add_argument("--query-encoder", default=None, help="all-MiniLM-L6-v2 HF id or local path")
    p.add_argument("--no-compile", action="store_true", help="CUDA: train eagerly")
    p.add_argument("--no-bf16", action="store_true", help="CUDA: train in fp32 (TF32)")
    p.add_argument("--init", type=Path, default=None, help="fine-tune from these weights")
    p.add_argument(
        "--evaluate-only",
        action="store_true",
        help="score the weights at --out on the held-out set and rewrite their report",
    )
    p.add_argument("--quiet", action="store_true", help="no progress bars")
    p.set_defaults(func=run)


def add_parser(sub) -> None:
    add_arguments(
        sub.add_parser("train", help="train the participatory scorer and balancer on generated scenes")
    )


def run(args) -> int:
    import torch

    from ..errors import InvalidInputError
    from ..train.run import report_paths, run_training
    from ..train.trainer import TrainConfig

    if args.extra_phrasings < 0 or args.knowing < 0 or args.warmup < 1 or args.time_limit < 0:
        raise InvalidInputError(
            "--extra-phrasings, --knowing and --time-limit must be at least 0 and --warmup at least 1."
        )
    if not 0.0 <= args.colour_regions <= 1.0:
        raise InvalidInputError(
            f"--colour-regions is a share of scenes, from 0 to 1 (got {args.colour_regions})."
        )
    if args.steps < 1 or args.scenes < 1 or args.eval_scenes < 1 or args.batch < 1:
        raise InvalidInputError("--steps, --scenes, --eval-scenes and --batch must be at least 1.")
    device = args.device
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    cfg = TrainConfig(
        variant=args.variant,
        scenes=args.scenes,
        eval_scenes=args.eval_scenes,
        steps=args.steps,
        batch=args.batch,
        lr=args.lr,
        seed=args.seed,
        threads=args.threads,
        workers=args.workers,
        query_noise=args.query_noise,
        extra_phrasings=args.extra_phrasings,
        warmup=args.warmup,
        knowing=args.knowing,
        colour_regions=args.colour_regions,
        time_limit_s=args.time_limit,
        compile=not args.no_compile,
        bf16=not args.no_bf16,
        device=device,
    )
    cache = None if args.no_cache else (args.cache_dir or Path.home() / ".cache" / "arrcoc")
    if args.evaluate_only:
        from ..train.run import reevaluate

        report = reevaluate(args.out, cfg, cache, args.query_encoder, progress=not args.quiet)
    else:
        report = run_training(
            cfg, args.out, cache, args.query_encoder, progress=not args.quiet, init=args.init
        )
    acc = report["accuracy"]
    print(f"wrote {args.out} ({report['weights_version']}) and {report_paths(args.out)[1].name}")
    print(
        f"pointing game on held-out scenes/phrasings: trained {acc['trained']['overall']:.3f},"
        f" untrained {acc['untrained']['overall']:.3f}"
    )
    return 0
