"""`arrcoc eval selection` on a few held-out scenes: every method scored alike, ARR-COC ahead of
random cells and of uniform downsampling at equal tokens, and bad input a clear error."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from arrcoc.eval.selection import METHODS, TWO_OBJECTS, SelectionEvalConfig, evaluate_selection, to_markdown
from arrcoc.registry import create_model

torch.set_num_threads(2)
ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def report(query_encoder) -> dict:
    model = create_model("arrcoc-texture")
    return evaluate_selection(model, query_encoder, SelectionEvalConfig(scenes=12, ks=(8, 200), batch=6))


def test_every_method_and_metric_is_reported(report) -> None:
    assert set(report["results"]) == {"object captions", TWO_OBJECTS}
    assert report["data"]["object_captions"] >= 24 and report["data"]["two_object_queries"] >= 6
    assert report["tokens"] == {"8": 71.5, "200": 251.5}, "K + (1024 - K) / 16 at patch 16, 4-px base"
    res = report["results"]["object captions"]
    for m in METHODS[:-1]:
        assert set(res[m]) == {
            "pointing",
            "recall@8",
            "recall@200",
            "found@8",
            "found@200",
            "psnr@8",
            "psnr@200",
        }, m
        assert all(
            0 <= res[m][k] <= 1 for k in ("pointing", "recall@8", "recall@200", "found@8", "found@200")
        )
    assert set(res["uniform downsampling"]) == {"psnr@8", "psnr@200"}
    md = to_markdown(report)
    assert md.count("| ARR-COC (top) |") == 2 and "PSNR@200 dB" in md and "251.5 tokens" in md


def test_arrcoc_beats_random_and_uniform_at_equal_tokens(report) -> None:
    res = report["results"]["object captions"]
    top, rand, uni = res["ARR-COC (top)"], res["random"], res["uniform downsampling"]
    assert top["pointing"] >= 0.75 > rand["pointing"] + 0.5
    assert top["recall@200"] > rand["recall@200"] + 0.5
    assert top["psnr@200"] > uni["psnr@200"] + 5 and top["psnr@200"] > rand["psnr@200"] + 5
    assert res["ARR-COC (diverse)"]["pointing"] == top["pointing"], "diverse keeps the best cell first"


@pytest.mark.parametrize(
    ("args", "message"),
    [(["--k", "0"], "--k must be between 1 and 1024"), (["--scenes", "0"], "--scenes must be at least 1")],
)
def test_bad_input_is_one_line(args: list[str], message: str) -> None:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    proc = subprocess.run(
        [sys.executable, "-m", "arrcoc", "eval", "selection", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2 and message in proc.stderr and "Traceback" not in proc.stderr
