"""arrcoc bench (not built yet: see the open issues)."""

from __future__ import annotations


def add_parser(sub) -> None:
    p = sub.add_parser("bench", help="(not available yet)")
    p.set_defaults(func=lambda args: print("arrcoc bench is not available yet") or 1)
