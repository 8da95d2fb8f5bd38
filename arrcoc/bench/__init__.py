"""Benchmark harness: eager vs compiled (+ CUDA graphs) vs ONNX Runtime, per variant and bucket.

    from arrcoc.bench import BenchConfig, run_benchmark
    report = run_benchmark(BenchConfig(variants=("arrcoc-texture",), buckets=(1, 8)), progress=print)

The report is a JSON-safe dict (schema SCHEMA); arrcoc.bench.report renders it as markdown,
HTML (inline SVG) and PNG plots.
"""

from .harness import CPU_DEFAULTS, SCHEMA, BenchConfig, device_defaults, run_benchmark

__all__ = ["CPU_DEFAULTS", "SCHEMA", "BenchConfig", "device_defaults", "run_benchmark"]
