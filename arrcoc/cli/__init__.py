"""`arrcoc` command line. Each subcommand lives in its own module with add_parser(sub)."""

from __future__ import annotations

import argparse
import importlib
import sys

from pydantic import ValidationError

from ..errors import ArrcocError

# module name under arrcoc.cli -> registers one or more subcommands
COMMANDS = ("infer", "train", "bench", "compile", "worker", "submit", "job", "demo", "eval")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="arrcoc", description="ARR-COC query-aware visual relevance")
    sub = parser.add_subparsers(dest="command", required=True)
    for name in COMMANDS:
        importlib.import_module(f"{__name__}.{name}").add_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except ArrcocError as e:  # the user's to fix: one line, no traceback
        print(f"arrcoc: error: {e}", file=sys.stderr)
        return 2
    except ValidationError as e:  # a setting from the environment (docs/settings.md): what to fix
        print(f"arrcoc: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
