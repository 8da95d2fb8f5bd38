"""The result of one image + query: one typed, JSON-serialisable object."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

SCORER_NAMES = ("information", "perspectival", "participatory")  # the order of `balance` and the maps
TENSION_NAMES = ("compress_particularize", "exploit_explore", "focus_diversify")

JSON_KEYS = (
    "variant",
    "weights_version",
    "backend",
    "grid",
    "relevance",
    "information",
    "perspectival",
    "participatory",
    "balance",
    "tensions",
    "selected",
    "budgets",
)  # fmt: skip  -- the stable contract of `arrcoc infer --json`; add keys, never rename


BOX_FIELDS = ("x0", "y0", "x1", "y1", "tokens")  # a row of `selected_boxes`; x1, y1 exclusive

# A match score below this is a weak match: "nothing much like this here". Every variant's
# `match_score` is on this one scale, in [0, 1] (see each model's `match_score` method and
# docs/model.md, "Match score"): texture, the best cell's cosine with the query (clamped at 0);
# CLIP, the best patch's probability of the query against neutral prompts, where 0.5 is where
# the query stops beating "nothing in particular" at its best location.
WEAK_MATCH = 0.5


def _rounded(a: np.ndarray) -> np.ndarray:
    return np.round(np.asarray(a, dtype=np.float64), 6)


def _grid(a: np.ndarray) -> list[list[float]]:
    return _rounded(a).tolist()


def cell_boxes(cells: np.ndarray, grid: int, size: tuple[int, int] | np.ndarray) -> np.ndarray:
    """(K,) row-major cell indices of a G x G grid -> (K, 4) int64 boxes (x0, y0, x1, y1) in the
    pixels of a photo of `size` (width, height), x1/y1 exclusive: cell (r, c) covers columns
    [c*W/G, (c+1)*W/G) and rows [r*H/G, (r+1)*H/G): the whole pixels in it (pixel x is in column
    floor(x*G/W), as in arrcoc.foveate), so the boxes tile the photo. Many photos at once: cells
    (n, K) and sizes (n, 2) -> (n, K, 4)."""
    cells = np.asarray(cells, dtype=np.int64)
    size = np.asarray(size, dtype=np.int64)
    w, h = size[..., 0, None], size[..., 1, None]  # one photo: (1,); n photos: (n, 1), against cells (n, K)
    r, c = cells // grid, cells % grid
    edge = lambda i, n: -((-i * n) // grid)  # noqa: E731  -- ceil(i*n/G), exact in integers
    boxes = np.stack((edge(c, w), edge(r, h), edge(c + 1, w), edge(r + 1, h)), axis=-1)
    return boxes.reshape(-1, 4) if cells.ndim < 2 else boxes


@dataclass(frozen=True)
class RelevanceResult:
    variant: str
    weights_version: str
    backend: str
    query: str
    relevance: np.ndarray  # (G, G) in [0, 1]
    information: np.ndarray  # (G, G)
    perspectival: np.ndarray  # (G, G)
    participatory: np.ndarray  # (G, G)
    balance: np.ndarray  # (3,) information, perspectival, participatory; sums to 1
    tensions: np.ndarray  # (3,) TENSION_NAMES order
    selected: np.ndarray  # (K,) row-major cell indices in selection order (most relevant first for "top")
    budgets: np.ndarray  # (K,) tokens per selected cell, in [64, 400]
    budget_map: np.ndarray  # (G, G) tokens per cell, 0 where not selected
    texture: np.ndarray  # (13, G, G)
    image_size: tuple[int, int]  # original (width, height)
    token_budget: int
    benchmark_only: bool = False
    bucket: int | None = None
    timings_ms: dict[str, float] = field(default_factory=dict)
    # absolute query-image match in [0, 1] (ModelOutput.match), not normalised per image;
    # None only for a result made before the score existed (e.g. an old queued job's payload)
    match_score: float | None = None

    @property
    def weak_match(self) -> bool:
        """The query matched weakly or not at all (match_score < WEAK_MATCH)."""
        return self.match_score is not None and self.match_score < WEAK_MATCH

    @property
    def grid(self) -> int:
        return int(self.relevance.shape[0])

    @property
    def k(self) -> int:
        return int(self.selected.shape[0])

    @property
    def selected_boxes(self) -> np.ndarray:
        """(K, 5) int64: each selected cell's box in the original photo's pixels (x0, y0, x1, y1,
        exclusive ends) and its tokens, most relevant first: the compact form a program hands a VLM."""
        return np.concatenate(
            (
                cell_boxes(self.selected, self.grid, self.image_size),
                np.asarray(self.budgets, dtype=np.int64).reshape(-1, 1),
            ),
            axis=1,
        )

    def to_json(self, *, numpy_arrays: bool = False) -> dict[str, Any]:
        """The result as a JSON document (`arrcoc infer --json`). numpy_arrays: the maps and index
        lists stay (rounded) numpy arrays, for `orjson.dumps(..., option=OPT_SERIALIZE_NUMPY)`,
        which writes the same JSON many times faster than lists through json.dumps (a batch job writes
        one document per item)."""
        grid = _rounded if numpy_arrays else _grid
        ints = (
            (lambda a: np.ascontiguousarray(a, dtype=np.int64))
            if numpy_arrays
            else (lambda a: np.asarray(a, dtype=np.int64).tolist())
        )
        out: dict[str, Any] = {
            "variant": self.variant,
            "weights_version": self.weights_version,
            "backend": self.backend,
            "grid": self.grid,
            "relevance": grid(self.relevance),
            "information": grid(self.information),
            "perspectival": grid(self.perspectival),
            "participatory": grid(self.participatory),
            "balance": [round(float(x), 6) for x in self.balance],
            "tensions": {n: round(float(x), 6) for n, x in zip(TENSION_NAMES, self.tensions, strict=True)},
            "selected": ints(self.selected),
            "budgets": ints(self.budgets),
            # extras
            "query": self.query,
            "match_score": None if self.match_score is None else round(float(self.match_score), 6),
            "weak_match": self.weak_match,
            "k": self.k,
            "token_budget": self.token_budget,
            "tokens_used": int(self.budgets.sum()),
            "balance_names": list(SCORER_NAMES),
            "budget_map": ints(self.budget_map),
            "image_size": list(self.image_size),
            "benchmark_only": self.benchmark_only,
            "bucket": self.bucket,
            "timings_ms": {k: round(v, 3) for k, v in self.timings_ms.items()},
            # [x0, y0, x1, y1, tokens] per selected cell, in the original photo's pixels
            "selected_boxes": ints(self.selected_boxes),
            "selected_boxes_format": list(BOX_FIELDS),
        }
        return out
