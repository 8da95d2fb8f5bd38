"""The compiled backend's shared dynamic-batch program on a CPU, through the serving path.

On a CPU the convolution's backend is chosen by batch size (oneDNN from 16), so a program traced
at batch 16 only holds from 16 up: a declared range 2..16 was a ConstraintViolationError at
warmup, and `arrcoc bench --backends eager compiled --buckets 1 8 64` exited 1. Compiles twice
(buckets 2 and 16), so it is slow.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from arrcoc.bench.parity import TOL
from arrcoc.request import Controls
from arrcoc.settings import default_settings
from tests.helpers import png_bytes


@pytest.mark.slow
def test_the_runtime_serves_every_bucket_with_the_compiled_backend_on_a_cpu(tmp_path):
    from arrcoc.engine.compiled import compile_count
    from arrcoc.service.host.runtime import Runtime

    engine = {"device": "cpu", "buckets": (2, 16)}
    common = dict(
        batching={"max_size": 16},
        service={"cache_dir": tmp_path / "cache", "data_dir": tmp_path / "data", "broker_url": None},
    )
    compiled = Runtime(
        default_settings(engine=engine | {"backend": "compiled", "backends": ("compiled",)}, **common)
    )
    eager = Runtime(default_settings(engine=engine | {"backend": "eager", "backends": ("eager",)}, **common))
    try:
        assert compiled.buckets == (2, 16)
        engine = compiled.pipeline.backend  # warms up: compiles whatever programs the buckets need
        assert engine.name == "compiled" and engine.dynamic_batch
        compiles = compile_count()
        queries = ["the red one", "the text", "the top left"]
        for n in (3, 2, 16):  # pads to 16; bucket 2; bucket 16 full
            images = [png_bytes(i, 64) for i in range(n)]
            qs = [queries[i % 3] for i in range(n)]
            got = compiled.process(images, qs, Controls(), "none")
            want = eager.process(images, qs, Controls(), "none")
            assert got.errors == [None] * n
            assert set(np.asarray(got.outputs.bucket).tolist()) == {2 if n == 2 else 16}
            diff = float(np.abs(got.outputs.relevance - want.outputs.relevance).max())
            assert diff <= TOL[torch.float32], (n, diff)
            assert (
                float(np.abs(got.outputs.match_score - want.outputs.match_score).max()) <= TOL[torch.float32]
            )
        assert compiled.infer(png_bytes(99, 64), "the red one", Controls(), 120).backend == "compiled"
        assert compile_count() == compiles and engine.recompiles == 0, "serving never compiles"
    finally:
        compiled.close()
        eager.close()
