"""arrcoc job status|cancel|fetch ID: look after a batch or benchmark job."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path


def add_parser(sub) -> None:
    p = sub.add_parser("job", help="status, cancel or fetch a batch / benchmark job")
    p.add_argument("action", choices=("status", "cancel", "fetch"))
    p.add_argument("job_id")
    p.add_argument(
        "--out", "-o", type=Path, help="fetch: where to write (default ./<id>.zip, .parquet, .jsonl or .json)"
    )
    p.add_argument(
        "--format",
        choices=("zip", "parquet", "jsonl"),
        default="zip",
        help="fetch, a batch job: the results zip (overlays, results.parquet, summary.csv), its"
        " results.parquet alone, or its rows as JSON lines (converted here from results.parquet)",
    )
    p.add_argument("--json", action="store_true", help="status: print JSON")
    p.add_argument("--broker", help="Redis URL (default ARRCOC_SERVICE__BROKER_URL or the local Redis)")
    p.add_argument("--token", help="the deployment's API token (default ARRCOC_ACCESS__API_TOKEN)")
    p.set_defaults(func=run)


def run(args) -> int:
    from ..service.jobs.types import JobKind
    from ._client import check_output, describe, executor, owner

    check_output(args.out)
    ex = executor(args.broker, args.token)
    try:
        who = owner(ex)
        if args.action == "cancel":
            print(describe(ex.cancel(args.job_id, owner=who)))
            return 0
        st = ex.status(args.job_id, owner=who)
        if args.action == "status":
            if args.json:
                doc = {
                    "job_id": st.job_id,
                    "kind": st.kind.value,
                    "state": st.state.value,
                    "total": st.total,
                    "done": st.done,
                    "failed": st.failed,
                    "message": st.message,
                }
                print(json.dumps(doc))
            else:
                print(describe(st))
            return 0 if st.state.value != "failed" else 1
        if st.kind == JobKind.BENCH:
            out = args.out or Path(f"{args.job_id}.json")
            out.write_text(json.dumps(ex.bench_report(args.job_id, owner=who), indent=2))
        else:
            out = args.out or Path(f"{args.job_id}.{args.format}")
            _fetch_batch(ex.batch_results(args.job_id, owner=who), out, args.format)
        print(out, file=sys.stderr)
        return 0
    finally:
        ex.close()


def _fetch_batch(results_zip: Path, out: Path, fmt: str) -> None:
    """The results zip, or its results.parquet, or that as JSON lines, at `out`."""
    if fmt == "zip":
        shutil.copyfile(results_zip, out)
        return
    import zipfile

    from ..service.jobs.results import RESULTS_NAME, parquet_to_jsonl

    with zipfile.ZipFile(results_zip) as zf, zf.open(RESULTS_NAME) as src:
        if fmt == "parquet":
            with open(out, "wb") as dst:
                shutil.copyfileobj(src, dst, 1 << 20)
        else:
            with open(out, "wb") as dst:
                parquet_to_jsonl(src, dst)
