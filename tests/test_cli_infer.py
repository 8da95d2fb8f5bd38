"""`arrcoc infer` end to end on a real photo, in a subprocess, as a user runs it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from arrcoc.result import JSON_KEYS

ROOT = Path(__file__).resolve().parent.parent
REQUIRED = ("variant", "weights_version", "backend", "grid", "relevance", "information", "perspectival",
            "participatory", "balance", "tensions", "selected", "budgets")  # fmt: skip -- the issue's list


def arrcoc(*args: str, timeout: int = 240) -> subprocess.CompletedProcess:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false", "OMP_NUM_THREADS": "2"}
    return subprocess.run([sys.executable, "-m", "arrcoc", *args], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=timeout)  # fmt: skip


@pytest.fixture(scope="module")
def infer_run(tmp_path_factory) -> tuple[dict, Path, subprocess.CompletedProcess]:
    out = tmp_path_factory.mktemp("infer")
    proc = arrcoc("infer", "arrcoc/examples/coffee.jpg", "--query", "the cup", "--json", str(out / "r.json"),
                  "--png", str(out / "r.png"))  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    return json.loads((out / "r.json").read_text()), out / "r.png", proc


def test_json_has_the_contract_keys(infer_run) -> None:
    doc, _, proc = infer_run
    assert set(REQUIRED) <= set(doc) and tuple(JSON_KEYS) == REQUIRED
    assert doc["variant"] == "arrcoc-texture" and doc["backend"] == "eager"
    assert doc["weights_version"].startswith("20"), "the bundled trained weights are used by default"
    assert "coffee.jpg" in proc.stdout and "top cells" in proc.stdout


def test_json_values_are_in_range(infer_run) -> None:
    doc, _, _ = infer_run
    g = doc["grid"]
    assert g == 32
    for key in ("relevance", "information", "perspectival", "participatory"):
        m = np.asarray(doc[key], dtype=np.float64)
        assert m.shape == (g, g) and m.min() >= 0 and m.max() <= 1, key
    assert len(doc["balance"]) == 3 and abs(sum(doc["balance"]) - 1) < 1e-4 and min(doc["balance"]) >= 0
    assert set(doc["tensions"]) == {"compress_particularize", "exploit_explore", "focus_diversify"}
    assert all(0 < v < 1 for v in doc["tensions"].values())
    selected, budgets = doc["selected"], doc["budgets"]
    assert len(selected) == len(budgets) == 200 and len(set(selected)) == 200
    assert all(isinstance(i, int) and 0 <= i < g * g for i in selected)
    rel = np.asarray(doc["relevance"]).reshape(-1)[selected]
    assert np.all(np.diff(rel) <= 1e-6), "selected cells are sorted by relevance, highest first"
    assert all(isinstance(b, int) and 64 <= b <= 400 for b in budgets) and sum(budgets) <= doc["token_budget"]


def test_png_is_the_heatmap_at_the_original_size(infer_run) -> None:
    _, png, _ = infer_run
    with Image.open(png) as im:
        assert im.format == "PNG" and im.size == (600, 400) and im.mode == "RGB"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("infer", "EMPTY", "--query", "the cup"), "empty"),
        (("infer", "arrcoc/examples/coffee.jpg", "--query", "   "), "query is empty"),
        (("infer", "arrcoc/examples/coffee.jpg", "--query", "cup", "--variant", "arrcoc-nope"), "Unknown model variant"),
    ],
)
def test_cli_errors_are_clear(args, message: str, tmp_path: Path) -> None:
    empty = tmp_path / "empty.jpg"
    empty.write_bytes(b"")
    proc = arrcoc(*(str(empty) if a == "EMPTY" else a for a in args))
    assert proc.returncode == 2, proc.stderr
    assert "arrcoc: error: " in proc.stderr and message in proc.stderr
    assert "Traceback" not in proc.stderr
