"""Property tests (hypothesis) for the parsers that take user input: manifests, zips, queries,
controls, benchmark requests, CLI numbers. Whatever comes in, the answer is a value that keeps the
rules, or an InvalidInputError that says why: never another exception, never a silent change."""

from __future__ import annotations

import argparse
import io
import math
import unicodedata
import uuid
import zipfile
from pathlib import Path

import pytest
from abuse_inputs import du, png_bytes
from helpers import make_zip
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from arrcoc.errors import InvalidInputError
from arrcoc.request import _CONTROL, Controls, validate_query
from arrcoc.service.jobs import archive
from arrcoc.service.jobs.bench import check_bench_request
from arrcoc.service.jobs.types import BenchRequest
from arrcoc.settings import default_settings

FAST = settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
S = default_settings()

anything = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20) | st.binary(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
    max_leaves=6,
)


@FAST
@given(st.binary(max_size=400))
def test_decode_manifest_is_utf8_or_a_clear_error(raw):
    try:
        text = archive.decode_manifest(raw, "manifest.csv")
    except InvalidInputError as e:
        assert "not UTF-8" in str(e)
        return
    assert text == raw.decode("utf-8-sig")  # exactly the bytes' text: no replacement characters added


@FAST
@given(
    st.text(max_size=300),
    st.sampled_from(["manifest.csv", "manifest.jsonl"]),
    st.none() | st.text(max_size=10),
)
def test_parse_manifest_gives_text_rows_or_a_clear_error(raw, name, default):
    try:
        rows = archive.parse_manifest(raw, name, default, 500)
    except InvalidInputError as e:
        assert str(e)
        return
    assert rows
    for file, query in rows:
        assert isinstance(file, str) and file == file.strip() and file
        assert isinstance(query, str) and query == query.strip()


@FAST
@given(
    st.text(max_size=300),
    st.sampled_from(["manifest.csv", "manifest.jsonl"]),
    st.integers(1, 4),
)
def test_a_manifest_read_from_the_zip_a_line_at_a_time_reads_as_its_text(raw, name, limit):
    """The zip's manifest is decompressed and decoded a piece at a time: the same rows, or the same
    error, as its whole text gives; never more rows than the item limit."""
    assume(not raw.startswith("\ufeff"))  # a BOM is the file's, not the text's
    try:
        data = raw.encode()
    except UnicodeEncodeError:  # a lone surrogate: no UTF-8 file holds it
        assume(False)

    def outcome(read):
        try:
            return read()
        except InvalidInputError as e:
            return str(e)

    with zipfile.ZipFile(io.BytesIO(make_zip({name: data}))) as zf:
        s = default_settings(limits={"max_batch_items": limit})
        streamed = outcome(lambda: archive._read_manifest(zf, zf.getinfo(name), "q", s))
    whole = outcome(lambda: archive.parse_manifest(raw, name, "q", 500, limit))
    assert streamed == whole
    assert isinstance(whole, str) or len(whole) <= limit


@FAST
@given(st.lists(st.fixed_dictionaries({"file": anything, "query": anything}), min_size=1, max_size=5))
def test_jsonl_values_of_the_wrong_type_are_refused_not_converted(rows):
    import json

    rows = [json.loads(json.dumps(r, default=str)) for r in rows]  # what a JSONL file can hold
    raw = "\n".join(json.dumps(r) for r in rows)
    try:
        out = archive.parse_manifest(raw, "manifest.jsonl", None, 500)
    except InvalidInputError:
        return
    for (file, query), row in zip(out, rows, strict=True):
        assert isinstance(row["file"], str) and file == row["file"].strip()
        assert isinstance(row["query"], str) and query == row["query"].strip()


@FAST
@given(st.text(max_size=600))
def test_validate_query_keeps_its_rules(text):
    try:
        q = validate_query(text, 500)
    except InvalidInputError:
        return
    assert 0 < len(q) <= 500 and q == " ".join(q.split())
    assert not any(ord(c) in _CONTROL for c in q)
    assert any(c.isalnum() for c in q)
    # what the tokenizer takes: valid UTF-8, no invisible format characters
    q.encode("utf-8")
    assert not any(unicodedata.category(c) in ("Cs", "Cf") for c in q)


@FAST
@given(anything)
def test_validate_query_refuses_what_is_not_text(value):
    assume(not isinstance(value, str))
    with pytest.raises(InvalidInputError, match="must be text"):
        validate_query(value, 500)


@FAST
@given(
    anything | st.floats(0, 10),
    anything | st.floats(0, 10),
    anything | st.integers(1, 1024),
    anything | st.integers(),
)
def test_controls_are_numbers_in_range_or_a_clear_error(scale, scale2, k, budget):
    try:
        c = Controls(scale, scale2, 1.0, k, budget).validated(1024, 200, 25600)
    except InvalidInputError:
        return
    for v in (c.scale_information, c.scale_perspectival, c.scale_participatory):
        assert isinstance(v, float) and math.isfinite(v) and 0 <= v <= 10
    assert isinstance(c.k, int) and 1 <= c.k <= 1024
    assert isinstance(c.token_budget, int) and 64 * c.k <= c.token_budget <= 400 * 1024


@FAST
@given(
    st.lists(anything | st.sampled_from(["arrcoc-texture"]), max_size=6),
    st.lists(anything | st.sampled_from(["eager", "onnx"]), max_size=6),
    st.lists(anything | st.integers(-5, 100), max_size=12),
    anything | st.integers(-5, 10**7),
    anything | st.integers(-5, 500),
    anything | st.sampled_from(["auto", "cpu", "cuda:0"]),
    st.dictionaries(st.text(max_size=12), anything, max_size=2),
)
def test_bench_requests_within_caps_or_a_clear_error(
    variants, backends, buckets, iterations, warmup, device, options
):
    req = BenchRequest(tuple(variants), tuple(backends), tuple(buckets), iterations, warmup, device, options)
    try:
        ok = check_bench_request(req, S)
    except InvalidInputError:
        return
    assert (
        1 <= len(ok.variants) <= S.jobs.max_bench_variants
        and 1 <= len(ok.buckets) <= S.jobs.max_bench_buckets
    )
    assert 1 <= ok.iterations <= S.jobs.max_bench_iterations and 0 <= ok.warmup <= S.jobs.max_bench_warmup
    assert all(1 <= b <= max(S.engine.buckets) for b in ok.buckets) and set(ok.options) <= {
        "input_sets",
        "dtype",
    }
    assert BenchRequest.from_wire(ok.to_wire()) == ok


VALID_ZIP = make_zip(
    {"a.png": png_bytes(), "d/b.png": png_bytes(seed=1), "manifest.csv": b"file,query\na.png,sky\n"}
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.tuples(st.integers(0, len(VALID_ZIP) - 1), st.integers(0, 255)), min_size=1, max_size=8))
def test_damaged_zips_give_a_clear_error_and_write_within_budget(tmp_path, flips):
    data = bytearray(VALID_ZIP)
    for at, byte in flips:
        data[at] = byte
    s = default_settings(service={"data_dir": tmp_path}, limits={"max_unpacked_bytes": 64 * 1024})
    jd = Path(tmp_path) / "jobs" / f"batch-{uuid.uuid4().hex[:16]}"
    jd.mkdir(parents=True)
    try:
        items = archive.unpack(bytes(data), None, jd, s)
    except InvalidInputError as e:
        assert str(e)
    else:
        assert items and all((jd / it.path).is_file() and it.length >= 0 for it in items)
    assert du(jd) <= 64 * 1024 + 4096  # the budget (+ items.jsonl)


@FAST
@given(st.text(max_size=12))
def test_cli_seconds_are_finite_and_positive(text):
    from arrcoc.cli._client import seconds

    try:
        v = seconds(text)
    except argparse.ArgumentTypeError:
        return
    assert math.isfinite(v) and v > 0


def test_zip_names_round_trip_without_loss(tmp_path):
    """Every safe, distinct name comes back as one item (hypothesis-free: the names most likely to
    collide after normalisation)."""
    names = ["a.png", "A.png", "dir/a.png", "dir/sub/a.png", "é.png", "space name.png", "a.PNG"]
    jd = tmp_path / "jobs" / "batch-0000000000000001"
    jd.mkdir(parents=True)
    items = archive.unpack(
        make_zip({n: png_bytes(seed=i) for i, n in enumerate(names)}),
        "q",
        jd,
        default_settings(service={"data_dir": tmp_path}),
    )
    assert sorted(it.file for it in items) == sorted(names)
    with zipfile.ZipFile(io.BytesIO(make_zip({n: b"x" for n in names}))) as zf:
        assert len(zf.namelist()) == len(names)
