"""arrcoc train (not built yet: see the open issues)."""

from __future__ import annotations


def add_parser(sub) -> None:
    p = sub.add_parser("train", help="(not available yet)")
    p.set_defaults(func=lambda args: print("arrcoc train is not available yet") or 1)
