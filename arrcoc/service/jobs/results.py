"""results.parquet: a batch job's results as columns, one row per item, one row group per step.

A step's table is built from the step's arrays (arrcoc.service.host.interface.StepOutputs), each
column in one call, never item by item; maps are fixed-size lists of float32 (G*G, row-major), so
pandas, polars and Hugging Face `datasets` read the file as it is. summary.csv (for people) and
the opt-in results.jsonl are derived from the same tables. No torch here: the submitting side
(`arrcoc job fetch --format jsonl`, the demo's gallery) reads results with this module.
"""

from __future__ import annotations

import io
from collections.abc import Sequence
from pathlib import Path
from typing import IO, TYPE_CHECKING

import numpy as np
import orjson
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv
import pyarrow.parquet as pq

from ...result import BOX_FIELDS, SCORER_NAMES, TENSION_NAMES, WEAK_MATCH, cell_boxes
from ...tuning import PARQUET_WRITE_BATCH
from ..host.interface import MAPS
from .csvcells import FORMULA_START

if TYPE_CHECKING:
    from ..host.interface import StepOutputs

RESULTS_NAME = "results.parquet"
SUMMARY_NAME = "summary.csv"
JSONL_NAME = "results.jsonl"
# the schema's version, in the file's metadata: readers check it, columns are added, never renamed
SCHEMA_VERSION = "arrcoc.batch.results/1"
# Snappy, Parquet's usual codec, which every reader has: the maps' floats barely compress, and zstd
# encodes them far more slowly for a slightly smaller file (docs/service.md, "Batch results").
COMPRESSION = "snappy"
# Dictionary encoding only where values repeat: on the maps' floats it costs more than the rest of
# writing a step and grows the file (docs/service.md, "Batch results").
DICTIONARY = ["status", "variant", "weights_version", "backend"]


def write_options(schema: pa.Schema) -> dict[str, object]:
    """ParquetWriter's options for a table of `schema`. Min/max statistics only on the plain
    columns, which a reader filters on; on the lists (maps, cells, boxes) they would describe
    every value of every row at once, and computing them is a quarter of writing a row group."""
    plain = [f.name for f in schema if not pa.types.is_fixed_size_list(f.type)]
    return {
        "compression": COMPRESSION,
        "use_dictionary": DICTIONARY,
        "write_statistics": plain,
        "write_batch_size": PARQUET_WRITE_BATCH,
    }


# what a step's table is built with per item: (index, file name in the zip, query)
ItemKey = tuple[int, str, str]


def _fixed(values: np.ndarray, width: int, ok: np.ndarray, kind: pa.DataType) -> pa.Array:
    """(n, ...) array -> fixed_size_list<kind>[width] column, null where not `ok`."""
    flat = pa.array(np.ascontiguousarray(values).reshape(-1), type=kind)
    return pa.FixedSizeListArray.from_arrays(flat, width, mask=pa.array(~ok))


def step_table(
    keys: Sequence[ItemKey],
    outputs: StepOutputs,
    errors: Sequence[str | None],
    overlays: Sequence[str | None],
) -> pa.Table:
    """A step's rows: `keys`, `errors` (None where the item ran) and `overlays` (each item's
    picture's name in results.zip, or None) per item, everything else from `outputs`' arrays."""
    n = len(keys)
    ok = np.asarray(outputs.ok, bool)
    bad = pa.array(~ok)
    grid = int(outputs.relevance.shape[-1]) if outputs.relevance.ndim == 3 else 0
    k = int(outputs.selected.shape[1])
    null_if_bad = lambda a, t: pa.array(a, type=t, mask=~ok)  # noqa: E731
    cols: dict[str, pa.Array] = {
        "index": pa.array([key[0] for key in keys], pa.int32()),
        "file": pa.array([key[1] for key in keys], pa.string()),
        "query": pa.array([key[2] for key in keys], pa.string()),
        "status": pc.if_else(bad, "failed", "ok"),
        "error": pa.array(list(errors), pa.string()),
        "overlay": pa.array(list(overlays), pa.string()),
        "match_score": null_if_bad(outputs.match_score.astype(np.float32), pa.float32()),
        "weak_match": null_if_bad(outputs.match_score < WEAK_MATCH, pa.bool_()),
        "k": null_if_bad(np.full(n, k, np.int32), pa.int32()),
        "tokens_used": null_if_bad(outputs.budgets.astype(np.int64).sum(axis=1), pa.int32()),
        "token_budget": null_if_bad(np.full(n, outputs.token_budget, np.int32), pa.int32()),
        "selected": _fixed(outputs.selected.astype(np.int32), k, ok, pa.int32()),
        "budgets": _fixed(outputs.budgets.astype(np.int32), k, ok, pa.int32()),
        "grid": null_if_bad(np.full(n, grid, np.int32), pa.int32()),
    }
    for name in MAPS:
        cols[name] = _fixed(getattr(outputs, name).astype(np.float32), grid * grid, ok, pa.float32())
    cols["balance"] = _fixed(outputs.balance.astype(np.float32), len(SCORER_NAMES), ok, pa.float32())
    cols["tensions"] = _fixed(outputs.tensions.astype(np.float32), len(TENSION_NAMES), ok, pa.float32())
    cols["image_width"] = null_if_bad(outputs.image_size[:, 0], pa.int32())
    cols["image_height"] = null_if_bad(outputs.image_size[:, 1], pa.int32())
    cols["bucket"] = null_if_bad(outputs.bucket, pa.int32())
    for name in ("variant", "weights_version", "backend"):
        cols[name] = pc.if_else(bad, pa.scalar(None, pa.string()), getattr(outputs, name))
    cols["selected_boxes"] = _fixed(selected_boxes(outputs, grid), k * len(BOX_FIELDS), ok, pa.int32())
    return pa.table(cols).replace_schema_metadata(_metadata())


def selected_boxes(outputs: StepOutputs, grid: int) -> np.ndarray:
    """(n, K, 5) int32: each selected cell's box in its photo's pixels and its tokens, as the
    `selected_boxes` of `arrcoc infer --json` (arrcoc.result.BOX_FIELDS), for the step at once."""
    boxes = cell_boxes(outputs.selected, max(grid, 1), outputs.image_size)  # (n, K, 4)
    return np.concatenate((boxes, outputs.budgets[..., None]), axis=-1).astype(np.int32)


def _metadata() -> dict[bytes, bytes]:
    return {
        b"arrcoc.schema": SCHEMA_VERSION.encode(),
        b"arrcoc.balance_names": ",".join(SCORER_NAMES).encode(),
        b"arrcoc.tension_names": ",".join(TENSION_NAMES).encode(),
        b"arrcoc.selected_boxes_format": ",".join(BOX_FIELDS).encode(),
    }


def to_bytes(table: pa.Table) -> bytes:
    """A table as a Parquet file of one row group."""
    buf = io.BytesIO()
    pq.write_table(table, buf, row_group_size=max(1, table.num_rows), **write_options(table.schema))
    return buf.getvalue()


def to_ipc(table: pa.Table) -> bytes:
    """A step's rows as an Arrow IPC file: its arrays as they are, no encoding (a part's rows,
    encoded to Parquet once, when they go into results.parquet)."""
    sink = pa.BufferOutputStream()
    with pa.ipc.new_file(sink, table.schema) as writer:
        writer.write_table(table)
    return sink.getvalue().to_pybytes()


def from_ipc(data: bytes | pa.Buffer) -> pa.Table:
    return pa.ipc.open_file(pa.BufferReader(data)).read_all()


class ResultsWriter:
    """results.parquet being written: each `add` one row group. The file's schema is that of the
    first step with a result (a step whose items all failed knows neither K nor the grid): steps
    before it wait, small as they are, and are written first in its schema."""

    def __init__(self, path: Path):
        self.path = path
        self._writer: pq.ParquetWriter | None = None
        self._waiting: list[pa.Table] = []
        self.rows = 0

    def add(self, table: pa.Table) -> None:
        if table.num_rows == 0:
            return
        if self._writer is None:
            if not pc.any(pc.equal(table["status"], "ok")).as_py():
                self._waiting.append(table)
                return
            self._writer = pq.ParquetWriter(self.path, table.schema, **write_options(table.schema))
            for waiting in self._waiting:
                self._write(waiting)
            self._waiting = []
        self._write(table)

    def _write(self, table: pa.Table) -> None:
        assert self._writer is not None
        schema = self._writer.schema
        if not table.schema.equals(schema):  # rows without results: nulls of the file's types
            n = table.num_rows
            table = pa.table(
                [
                    table[f.name]
                    if table.schema.field(f.name).type == f.type
                    else pa.nulls(n, f.type)
                    if table[f.name].null_count == n
                    else table[f.name].cast(f.type)
                    for f in schema
                ],
                schema=schema,
            )
        self._writer.write_table(table, row_group_size=table.num_rows)
        self.rows += table.num_rows

    def close(self) -> None:
        if self._writer is None and self._waiting:  # no item of the job ran
            self._writer = pq.ParquetWriter(
                self.path, self._waiting[0].schema, **write_options(self._waiting[0].schema)
            )
            for waiting in self._waiting:
                self._write(waiting)
            self._waiting = []
        if self._writer is None:  # a job with no rows still has a (empty) file
            pq.write_table(
                pa.table({"index": pa.array([], pa.int32())}).replace_schema_metadata(_metadata()), self.path
            )
        else:
            self._writer.close()
        self._writer = None

    def discard(self) -> None:
        """Given up: the file goes."""
        if self._writer is not None:
            self._writer.close()
            self._writer = None
        self._waiting = []
        self.path.unlink(missing_ok=True)


# -- what is derived from the tables ----------------------------------------------------------------
SUMMARY_FIELDS = (
    "index",
    "file",
    "query",
    "status",
    "error",
    "overlay",
    "k",
    "tokens_used",
    "match_score",
    "weak_match",
    "top_row",
    "top_col",
    "weight_information",
    "weight_perspectival",
    "weight_participatory",
    "backend",
    "bucket",
)
# a text cell a spreadsheet would run as a formula (arrcoc.service.jobs.csvcells), as an RE2 pattern
_FORMULA_START = "^[" + "".join("\\" + c if c in "-]\\^" else c for c in FORMULA_START) + "]"


def neutralised(column: pa.Array | pa.ChunkedArray) -> pa.Array | pa.ChunkedArray:
    """Text cells that a spreadsheet would run as a formula, prefixed with a quote (shown, not run)."""
    risky = pc.match_substring_regex(column, _FORMULA_START)
    return pc.if_else(pc.fill_null(risky, False), pc.binary_join_element_wise("'", column, ""), column)


def summary_table(table: pa.Table) -> pa.Table:
    """summary.csv's columns of results rows: the most relevant cell as row and column of the grid,
    the balancer's weights by name, text cells neutralised."""
    if "selected" not in table.column_names:  # no row ran
        return pa.table({name: pa.array([None] * table.num_rows, pa.string()) for name in SUMMARY_FIELDS})
    top = pc.list_element(table["selected"], 0)
    grid = table["grid"]
    weights = {f"weight_{name}": pc.list_element(table["balance"], i) for i, name in enumerate(SCORER_NAMES)}
    cols = {
        "index": table["index"],
        "file": neutralised(table["file"]),
        "query": neutralised(table["query"]),
        "status": table["status"],
        "error": neutralised(table["error"]),
        "overlay": table["overlay"],
        "k": table["k"],
        "tokens_used": table["tokens_used"],
        "match_score": table["match_score"],
        "weak_match": table["weak_match"],
        "top_row": pc.divide(top, grid),
        "top_col": pc.subtract(top, pc.multiply(pc.divide(top, grid), grid)),
        **weights,
        "backend": table["backend"],
        "bucket": table["bucket"],
    }
    return pa.table(cols)


def write_summary(table: pa.Table, out: IO[bytes], header: bool) -> None:
    """Rows of results as summary.csv's lines (with its header line when `header`)."""
    pacsv.write_csv(
        summary_table(table), out, pacsv.WriteOptions(include_header=header, quoting_style="needed")
    )


def summary_lines(table: pa.Table, header: bool = False) -> bytes:
    """`write_summary`'s lines as bytes: a step's, made beside the other steps' and appended in order."""
    buf = io.BytesIO()
    write_summary(table, buf, header)
    return buf.getvalue()


def _matrix(column: pa.ChunkedArray | pa.Array, width: int) -> np.ndarray:
    """A fixed-size-list column -> (n, width) numpy array (rows of nulls as they are stored)."""
    arr = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
    return (
        arr.values.slice(arr.offset * width, len(arr) * width)
        .to_numpy(zero_copy_only=False)
        .reshape(len(arr), width)
    )


def write_jsonl(table: pa.Table, out: IO[bytes]) -> None:
    """Rows of results as JSON lines, the same fields and values as the Parquet file (maps as
    G x G lists, selected_boxes as K rows of five, as `arrcoc infer --json` gives them): the
    opt-in results.jsonl."""
    if table.num_rows == 0:
        return
    plain = [c for c in table.column_names if not pa.types.is_fixed_size_list(table.schema.field(c).type)]
    rows = table.select(plain).to_pylist()
    ok = np.asarray(table["status"].to_numpy(zero_copy_only=False) == "ok")
    lists = {
        c: _matrix(table[c], table.schema.field(c).type.list_size)
        for c in table.column_names
        if c not in plain
    }
    grid = int(round(np.sqrt(lists["relevance"].shape[1]))) if "relevance" in lists else 0
    for i, row in enumerate(rows):
        if ok[i]:
            for c, m in lists.items():
                if c in MAPS:
                    row[c] = m[i].reshape(grid, grid)
                else:
                    row[c] = m[i].reshape(-1, len(BOX_FIELDS)) if c == "selected_boxes" else m[i]
        else:
            row.update(dict.fromkeys(lists))
        out.write(orjson.dumps(row, option=orjson.OPT_SERIALIZE_NUMPY) + b"\n")


def parquet_to_jsonl(source: str | Path | IO[bytes], out: IO[bytes]) -> int:
    """results.parquet as results.jsonl, one row group at a time (bounded memory); the rows written."""
    f = pq.ParquetFile(source)
    for g in range(f.num_row_groups):
        write_jsonl(f.read_row_group(g), out)
    return f.metadata.num_rows


__all__ = [
    "MAPS",
    "RESULTS_NAME",
    "SCHEMA_VERSION",
    "SUMMARY_FIELDS",
    "ResultsWriter",
    "from_ipc",
    "neutralised",
    "parquet_to_jsonl",
    "step_table",
    "to_bytes",
    "to_ipc",
    "write_jsonl",
    "summary_lines",
    "write_summary",
]
