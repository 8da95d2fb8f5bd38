"""Numbers that describe a selection of cells: what the demo's views and batch summaries report.

All functions take plain numpy: a (G, G) relevance map and/or K selected cell indices (row-major,
as in RelevanceResult.selected). Distances are in cells.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np

REGIONS = 4  # coverage and entropy count selected cells in a REGIONS x REGIONS split of the grid


@dataclass(frozen=True)
class SelectionMetrics:
    k: int
    coverage: float  # share of the REGIONS^2 regions holding at least one selected cell
    spatial_entropy: float  # entropy of selected cells over the regions / log(REGIONS^2), in [0, 1]
    mean_nn_distance: float  # mean distance from a selected cell to its nearest selected neighbour
    clusters: int  # 8-connected groups of selected cells
    relevance_captured: float  # share of the total relevance that lies on selected cells

    def as_dict(self) -> dict[str, float | int]:
        return asdict(self)


def cell_mask(selected: np.ndarray, grid: int) -> np.ndarray:
    """(G, G) bool, True on selected cells."""
    mask = np.zeros(grid * grid, dtype=bool)
    mask[np.asarray(selected, dtype=np.int64)] = True
    return mask.reshape(grid, grid)


def coordinates(selected: np.ndarray, grid: int) -> np.ndarray:
    """(K, 2) float (row, col) of each selected cell."""
    idx = np.asarray(selected, dtype=np.int64)
    return np.stack([idx // grid, idx % grid], axis=1).astype(np.float64)


def region_counts(selected: np.ndarray, grid: int, regions: int = REGIONS) -> np.ndarray:
    """(regions, regions) number of selected cells in each block of the grid."""
    rc = coordinates(selected, grid).astype(np.int64) * regions // grid
    counts = np.zeros((regions, regions), dtype=np.int64)
    np.add.at(counts, (rc[:, 0], rc[:, 1]), 1)
    return counts


def coverage(selected: np.ndarray, grid: int, regions: int = REGIONS) -> float:
    return float((region_counts(selected, grid, regions) > 0).mean())


def spatial_entropy(selected: np.ndarray, grid: int, regions: int = REGIONS) -> float:
    """0: every selected cell in one region; 1: spread evenly over all regions."""
    p = region_counts(selected, grid, regions).ravel().astype(np.float64)
    if p.sum() == 0:
        return 0.0
    p = p[p > 0] / p.sum()
    return float(-(p * np.log(p)).sum() / np.log(regions * regions))


def mean_nn_distance(selected: np.ndarray, grid: int) -> float:
    xy = coordinates(selected, grid)
    if len(xy) < 2:
        return 0.0
    d = np.sqrt(((xy[:, None, :] - xy[None, :, :]) ** 2).sum(-1))  # (K, K)
    np.fill_diagonal(d, np.inf)
    return float(d.min(axis=1).mean())


def cluster_count(mask: np.ndarray) -> int:
    """Number of 8-connected components of True cells (union-find over the small grid)."""
    g_rows, g_cols = mask.shape
    parent = np.arange(mask.size)

    def find(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    cells = np.flatnonzero(mask.ravel())
    for i in cells:
        r, c = divmod(int(i), g_cols)
        for dr, dc in ((0, 1), (1, -1), (1, 0), (1, 1)):
            rr, cc = r + dr, c + dc
            if 0 <= rr < g_rows and 0 <= cc < g_cols and mask[rr, cc]:
                a, b = find(int(i)), find(rr * g_cols + cc)
                if a != b:
                    parent[a] = b
    return len({find(int(i)) for i in cells})


def relevance_captured(relevance: np.ndarray, selected: np.ndarray) -> float:
    total = float(np.asarray(relevance, dtype=np.float64).sum())
    if total <= 0:
        return 0.0
    return float(
        np.asarray(relevance, dtype=np.float64).ravel()[np.asarray(selected, dtype=np.int64)].sum() / total
    )


def selection_metrics(relevance: np.ndarray, selected: np.ndarray) -> SelectionMetrics:
    grid = int(relevance.shape[0])
    return SelectionMetrics(
        k=int(len(selected)),
        coverage=coverage(selected, grid),
        spatial_entropy=spatial_entropy(selected, grid),
        mean_nn_distance=mean_nn_distance(selected, grid),
        clusters=cluster_count(cell_mask(selected, grid)),
        relevance_captured=relevance_captured(relevance, selected),
    )


def uniform_selection(grid: int, k: int) -> np.ndarray:
    """K cells spread as an even lattice over the grid: the query-blind baseline with the same K."""
    assert 1 <= k <= grid * grid
    rows = max(1, int(round(np.sqrt(k))))
    cols = int(np.ceil(k / rows))
    while rows * cols < k:  # rounding can leave the lattice short by a row
        rows += 1
    r = np.floor((np.arange(rows) + 0.5) * grid / rows).astype(np.int64)
    c = np.floor((np.arange(cols) + 0.5) * grid / cols).astype(np.int64)
    cells = (r[:, None] * grid + c[None, :]).ravel()  # distinct: rows, cols <= grid
    # drop the surplus evenly rather than the last row, so the lattice stays balanced
    keep = np.round(np.linspace(0, len(cells) - 1, k)).astype(np.int64)
    return cells[keep]


@dataclass(frozen=True)
class QueryImpact:
    overlap: int  # cells selected both with and without the participatory scorer
    overlap_share: float  # overlap / K
    jaccard: float
    centroid_shift: float  # distance (cells) between the relevance-weighted centroids
    mean_abs_change: float  # mean |relevance with - relevance without| over all cells
    gained: np.ndarray  # cells selected only with the query
    lost: np.ndarray  # cells selected only without it


def weighted_centroid(relevance: np.ndarray) -> np.ndarray:
    w = np.clip(np.asarray(relevance, dtype=np.float64), 0, None)
    g = w.shape[0]
    rows, cols = np.mgrid[0:g, 0:g]
    total = w.sum() or 1.0
    return np.array([(rows * w).sum() / total, (cols * w).sum() / total])


def query_impact(
    relevance_with: np.ndarray,
    selected_with: np.ndarray,
    relevance_without: np.ndarray,
    selected_without: np.ndarray,
) -> QueryImpact:
    a, b = set(map(int, selected_with)), set(map(int, selected_without))
    both = len(a & b)
    return QueryImpact(
        overlap=both,
        overlap_share=both / max(len(a), 1),
        jaccard=both / max(len(a | b), 1),
        centroid_shift=float(
            np.linalg.norm(weighted_centroid(relevance_with) - weighted_centroid(relevance_without))
        ),
        mean_abs_change=float(np.abs(np.asarray(relevance_with) - np.asarray(relevance_without)).mean()),
        gained=np.array(sorted(a - b), dtype=np.int64),
        lost=np.array(sorted(b - a), dtype=np.int64),
    )


def channel_attribution(texture: np.ndarray, relevance: np.ndarray) -> np.ndarray:
    """(C,) Pearson correlation of each texture channel (C, G, G) with relevance; 0 for a flat channel."""
    x = np.asarray(texture, dtype=np.float64).reshape(texture.shape[0], -1)
    y = np.asarray(relevance, dtype=np.float64).ravel()
    x = x - x.mean(axis=1, keepdims=True)
    y = y - y.mean()
    denom = np.sqrt((x * x).sum(axis=1) * (y * y).sum())
    with np.errstate(invalid="ignore", divide="ignore"):
        r = (x @ y) / denom
    return np.where(denom > 1e-12, r, 0.0)
