"""python -m arrcoc.bench ...: `arrcoc bench` without loading the other subcommands' modules."""

from __future__ import annotations

import argparse
import sys

from ..cli import bench as bench_cli
from ..errors import ArrcocError


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m arrcoc.bench")
    bench_cli.add_parser(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["bench", *(sys.argv[1:] if argv is None else argv)])
    try:
        return int(args.func(args) or 0)
    except ArrcocError as e:
        print(f"arrcoc bench: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
