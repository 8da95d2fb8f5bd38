"""arrcoc submit (not built yet: see the open issues)."""

from __future__ import annotations


def add_parser(sub) -> None:
    p = sub.add_parser("submit", help="(not available yet)")
    p.set_defaults(func=lambda args: print("arrcoc submit is not available yet") or 1)
