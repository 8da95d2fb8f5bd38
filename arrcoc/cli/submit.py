"""arrcoc submit infer|batch|bench|loadtest: send work to the Celery workers through Redis."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

from ..settings import BACKENDS, DEFAULT_BROKER_URL, DEFAULT_OVERLAYS, OVERLAYS
from ._client import seconds

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
LOADTEST_QUERIES = (
    "the red mug",
    "a cat's face",
    "the sky",
    "text on a sign",
    "a person",
    "the rocket",
    "something shiny",
    "the table edge",
)


def add_parser(sub) -> None:
    p = sub.add_parser(
        "submit", help="send work to the workers (ARRCOC_SERVICE__BROKER_URL, default local Redis)"
    )
    p.add_argument("--broker", help=f"Redis URL (default ARRCOC_SERVICE__BROKER_URL or {DEFAULT_BROKER_URL})")
    p.add_argument("--token", help="the deployment's API token (default ARRCOC_ACCESS__API_TOKEN)")
    kinds = p.add_subparsers(dest="kind", required=True)

    q = kinds.add_parser("infer", help="one image + one query; prints or writes the `arrcoc infer` JSON")
    q.add_argument("image", type=Path)
    q.add_argument("--query", "-q", required=True)
    q.add_argument("--k", type=int)
    q.add_argument("--token-budget", type=int)
    q.add_argument("--json", dest="json_out", type=Path, help="write the result JSON here ('-': stdout)")
    q.add_argument("--png", dest="png_out", type=Path, help="write the heatmap overlay PNG here")
    q.add_argument(
        "--backend",
        choices=BACKENDS,
        help="one the workers serve (ARRCOC_ENGINE__BACKENDS); default their ARRCOC_ENGINE__BACKEND",
    )
    q.add_argument("--timeout", type=seconds, default=120.0, help="seconds to wait for the result")
    q.set_defaults(func=run_infer)

    b = kinds.add_parser("batch", help="a zip of images (one query, or manifest.csv/.jsonl with file,query)")
    b.add_argument("archive", type=Path)
    b.add_argument("--query", "-q", help="the query for every image (or per-file queries in a manifest)")
    b.add_argument("--k", type=int)
    b.add_argument("--token-budget", type=int)
    b.add_argument(
        "--overlays",
        choices=OVERLAYS,
        default=DEFAULT_OVERLAYS,
        help="pictures to draw beside results.parquet: none (the default; rows only, fastest), the"
        " relevance map over each photo, or the foveated view (the photo as a vision-language model"
        " would see it under the result's token budgets)",
    )
    b.add_argument("--out", "-o", type=Path, help="results zip (default ./<job id>.zip)")
    b.add_argument("--no-follow", action="store_true", help="print the job id and return")
    b.add_argument(
        "--timeout",
        type=seconds,
        help="give up following after this many seconds (default: 300 s"
        " while no worker picks the job up, no limit once it runs); the job goes on",
    )
    b.set_defaults(func=run_batch)

    n = kinds.add_parser("bench", help="run the benchmark harness on a worker, device held exclusively")
    n.add_argument("--variants", default="arrcoc-texture")
    n.add_argument("--backends", default="eager,compiled,onnx")
    n.add_argument("--buckets", default="1,8,64")
    n.add_argument("--iterations", type=int, default=100)
    n.add_argument("--warmup", type=int, default=10)
    n.add_argument("--device", default="auto")
    n.add_argument("--out", "-o", type=Path, help="report JSON (default ./<job id>.json)")
    n.add_argument("--no-follow", action="store_true")
    n.add_argument("--timeout", type=seconds, help="give up following after this many seconds (see batch)")
    n.set_defaults(func=run_bench)

    t = kinds.add_parser("loadtest", help="N concurrent clients of `infer`: throughput and latency")
    t.add_argument("--clients", type=int, default=32)
    t.add_argument("--requests", type=int, default=256, help="in total")
    t.add_argument("--image", type=Path, default=EXAMPLES / "coffee.jpg")
    t.add_argument("--json", dest="json_out", type=Path)
    t.add_argument("--timeout", type=seconds, default=300.0)
    t.add_argument(
        "--processes",
        type=int,
        default=1,
        help="client processes the clients are spread over (one process's GIL caps its threads)",
    )
    t.set_defaults(func=run_loadtest)


def _controls(args):
    from ..request import Controls

    return Controls(k=args.k, token_budget=args.token_budget)


def run_infer(args) -> int:
    from ._client import check_output, executor, match_line, read_input, save_overlay

    image = read_input(args.image, "image file")
    check_output(args.json_out)
    check_output(args.png_out)
    ex = executor(args.broker, args.token)
    try:
        result = ex.infer(image, args.query, _controls(args), timeout=args.timeout, backend=args.backend)
    finally:
        ex.close()
    doc = result.to_json()
    if args.json_out is not None and str(args.json_out) == "-":
        sys.stdout.write(json.dumps(doc) + "\n")
    elif args.json_out is not None:
        args.json_out.write_text(json.dumps(doc))
    if args.png_out is not None:
        save_overlay(args.png_out, args.image, result)
    if args.json_out is None:
        print(
            f"{args.image.name}: '{result.query}' [{result.variant} {result.weights_version} {result.backend}]"
            f" bucket {result.bucket}; {result.k} cells, {doc['tokens_used']} tokens"
        )
        print(match_line(result))
    return 0


def run_batch(args) -> int:
    from ._client import check_output, executor, follow, owner, read_input

    archive = read_input(args.archive, "zip file")
    check_output(args.out)
    ex = executor(args.broker, args.token)
    try:
        who = owner(ex)
        job_id = ex.submit_batch(archive, args.query, _controls(args), owner=who, overlays=args.overlays)
        print(job_id, flush=True)
        if args.no_follow:
            return 0
        st = follow(ex, job_id, timeout=args.timeout, owner=who)
        if st.state.value not in ("done", "cancelled"):
            return 1
        out = args.out or Path(f"{job_id}.zip")
        shutil.copyfile(ex.batch_results(job_id, owner=who), out)
        print(f"results: {out}", file=sys.stderr)
        return 0
    finally:
        ex.close()


def run_bench(args) -> int:
    from ..errors import InvalidInputError
    from ..service.jobs.types import BenchRequest
    from ._client import check_output, executor, follow, owner

    split = lambda s: tuple(x.strip() for x in s.split(",") if x.strip())  # noqa: E731
    try:
        buckets = tuple(int(b) for b in split(args.buckets))
    except ValueError:
        raise InvalidInputError(
            f"--buckets takes whole numbers separated by commas, e.g. 1,8; got {args.buckets!r}."
        ) from None
    req = BenchRequest(
        split(args.variants), split(args.backends), buckets, args.iterations, args.warmup, args.device
    )
    check_output(args.out)
    ex = executor(args.broker, args.token)
    try:
        who = owner(ex)
        job_id = ex.submit_bench(req, owner=who)  # checked against the caps before anything is queued
        print(job_id, flush=True)
        if args.no_follow:
            return 0
        st = follow(ex, job_id, timeout=args.timeout, owner=who)
        if st.state.value != "done":
            return 1
        out = args.out or Path(f"{job_id}.json")
        out.write_text(json.dumps(ex.bench_report(job_id, owner=who), indent=2))
        print(f"report: {out}", file=sys.stderr)
        return 0
    finally:
        ex.close()


def run_loadtest(args) -> int:
    import functools

    from ..bench.load import run_load
    from ._client import check_output, executor, read_input

    check_output(args.json_out)
    report = run_load(
        functools.partial(executor, args.broker, args.token),
        read_input(args.image, "image file"),
        LOADTEST_QUERIES,
        args.clients,
        args.requests,
        args.timeout,
        args.processes,
    )
    text = json.dumps(report, indent=2)
    if args.json_out:
        args.json_out.write_text(text)
    print(text)
    return 0 if not report["errors"] else 1
