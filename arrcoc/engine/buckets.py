"""Batch buckets: every batch size maps to the bucket it is padded to (or is split across)."""

from __future__ import annotations

from ..errors import EngineError


class BucketTable:
    """buckets (1, 2, 4, 8) -> a lookup for every size 1..max, and a splitter for larger ones."""

    def __init__(self, buckets: tuple[int, ...] | list[int]):
        buckets = tuple(sorted({int(b) for b in buckets}))
        if not buckets or buckets[0] < 1:
            raise EngineError(f"Buckets must be positive batch sizes, got {buckets}.")
        self.buckets = buckets
        self.largest = buckets[-1]
        # size -> bucket, precomputed for every size up to the largest (vLLM-style table)
        self._table = [0] * (self.largest + 1)
        i = 0
        for size in range(1, self.largest + 1):
            while buckets[i] < size:
                i += 1
            self._table[size] = buckets[i]

    def bucket_for(self, batch: int) -> int:
        if batch < 1:
            raise EngineError(f"Batch size must be at least 1, got {batch}.")
        return self._table[batch] if batch <= self.largest else self.largest

    def split(self, batch: int) -> list[tuple[int, int, int]]:
        """[(start, stop, bucket)]: full chunks of the largest bucket, then one padded chunk."""
        out = []
        lo = 0
        while batch - lo > self.largest:
            out.append((lo, lo + self.largest, self.largest))
            lo += self.largest
        out.append((lo, batch, self.bucket_for(batch - lo)))
        return out

    def __repr__(self) -> str:
        return f"BucketTable{self.buckets}"
