"""CSV cells that a spreadsheet shows as text, never runs (OWASP's CSV injection guidance).

A cell that begins with `=`, `+`, `-`, `@`, a tab or a carriage return is read as a formula by
Excel, LibreOffice and Google Sheets (`=HYPERLINK(...)` in a file name or a query); so is one that
begins with a line feed or a space before such a character (spreadsheets trim them), or with `;`
(a file opened with `;` as its separator starts the next cell there: `;=cmd`). Such a text cell gets
a leading single quote, which those programs take as "this is text". Numbers are written as they
are. Every CSV the project writes passes its rows through `safe_row`.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

FORMULA_START = ("=", "+", "-", "@", "\t", "\r", "\n", " ", ";")


def safe_cell(value: Any) -> Any:
    if isinstance(value, str) and value.startswith(FORMULA_START):
        return "'" + value
    return value


def safe_row(row: dict[str, Any]) -> dict[str, Any]:
    return {k: safe_cell(v) for k, v in row.items()}


def safe_rows(rows: Iterable[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    return (safe_row(r) for r in rows)
