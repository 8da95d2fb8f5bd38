"""arrcoc bench [--variants ...] [--backends ...] [--buckets ...] [--out DIR]: the benchmark.

Writes DIR/<name>.json (the report), .md (table), .html (interactive, inline SVG) and .png; DIR is
bench-out/ unless --out names another (git ignores it: the tracked benchmarks/ holds the reports
the project keeps). Each run gets a name of its own: the date and time of the run, and a counter
when that name is taken.
`arrcoc bench --render report.json [more.json ...]` merges reports and renders them again.
What it runs by default suits the device (arrcoc.bench.device_defaults): a short run on a CPU,
the full set on a GPU; any flag given is used as given. On a terminal it draws a progress bar;
piped or redirected, one plain line per step.
"""

from __future__ import annotations

import glob
import json
from dataclasses import fields
from pathlib import Path

from ..settings import BACKENDS, DTYPES

DEFAULT_OUT = Path("bench-out")  # relative to where it runs; the demo lists the reports found there


def add_parser(sub) -> None:
    p = sub.add_parser(
        "bench", help="benchmark eager vs compiled (+CUDA graphs) vs ONNX Runtime vs AOTInductor"
    )
    p.add_argument(
        "--variants",
        nargs="+",
        default=None,
        help="default: arrcoc-texture arrcoc-clip-b16 (on a CPU: arrcoc-texture)",
    )
    p.add_argument(
        "--backends",
        nargs="+",
        default=None,
        choices=BACKENDS,
        help=f"default: {' '.join(BACKENDS)} (on a CPU: eager onnx; compiled and aot take minutes to build there)",
    )
    p.add_argument(
        "--buckets", nargs="+", type=int, default=None, help="default: settings (1 2 4 ... 64; on a CPU: 1 4)"
    )
    p.add_argument(
        "--iters", type=int, default=None, help="timed iterations per backend and bucket (100; on a CPU 10)"
    )
    p.add_argument("--warmup-iters", type=int, default=None, help="untimed calls first (10; on a CPU 2)")
    p.add_argument("--device", default="auto")
    p.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"))
    p.add_argument(
        "--weights",
        default="default",
        help="'none' for untrained weights; a hub id or directory for CLIP (default for CLIP: random)",
    )
    p.add_argument(
        "--random-weights",
        action="store_true",
        help="random weights of each variant's shapes, nothing downloaded (same speed as the real ones)",
    )
    p.add_argument(
        "--cache-dir", type=Path, default=None, help="default: a fresh temporary dir (cold compile)"
    )
    p.add_argument("--startup", action="store_true", help="also time cold and warm start in subprocesses")
    p.add_argument("--startup-only", action="store_true", help="only the cold/warm start measurements")
    p.add_argument("--out", type=Path, default=DEFAULT_OUT, help=f"output folder ({DEFAULT_OUT}/)")
    p.add_argument(
        "--name", default=None, help="file stem (default: bench-<date>-<time>-<device>, never one taken)"
    )
    p.add_argument(
        "--render", nargs="+", type=Path, default=None, help="merge and re-render these JSON reports"
    )
    p.add_argument(
        "--onnx-options",
        type=json.loads,
        default=None,
        metavar="JSON",
        help='the onnx backend\'s settings, e.g. \'{"provider_options": {"cudnn_conv_algo_search":'
        ' "DEFAULT"}, "disabled_optimizers": ["AttentionFusion"]}\' (tools/ort_options.py)',
    )
    p.set_defaults(func=run)
    suites = p.add_subparsers(
        dest="suite",
        metavar="e2e|selection",
        help="`arrcoc bench e2e`: the system end to end; `arrcoc bench selection`: foveated view and diverse selection",
    )
    e = suites.add_parser(
        "e2e", help="batch jobs and interactive requests end to end, in-process and through Celery"
    )
    # defaults: E2EConfig's (arrcoc.bench.e2e, not imported here: it loads torch)
    e.add_argument("--device")
    e.add_argument("--backend", choices=BACKENDS)
    e.add_argument("--variant", help="any registered variant (arrcoc-texture)")
    e.add_argument(
        "--weights",
        help="default: the variant's bundled weights; for a hub variant (CLIP) random"
        " weights of the real shapes ('random'); or a hub id or directory",
    )
    e.add_argument("--dtype", choices=DTYPES, help="auto: bfloat16 for CLIP on a GPU, else float32 (auto)")
    e.add_argument("--items", type=int, help="800x600 JPEGs in the batch job (8192 on a GPU, 2048 on a CPU)")
    e.add_argument("--large-items", type=int, help="4032x3024 JPEGs in a second job (256)")
    e.add_argument("--png-items", type=int, help="800x600 PNGs in a third job (128)")
    e.add_argument(
        "--requests", type=int, help="interactive requests with one caller (many callers: twice as many)"
    )
    e.add_argument("--clients", type=int)
    e.add_argument("--no-celery", action="store_true", help="in-process only (no redis-server and worker)")
    e.add_argument("--no-peers", action="store_true", help="without the two hand-written peer scripts")
    e.add_argument(
        "--devices",
        type=lambda v: tuple(d.strip() for d in v.split(",") if d.strip()),
        help="e.g. cuda:0,cuda:1: through Celery, a worker group over these beside one over the first",
    )
    e.add_argument("--no-inprocess", action="store_true", help="only the Celery phases")
    e.add_argument("--worker-processes", type=int)
    e.add_argument(
        "--engine-processes",
        type=int,
        help="engine processes in the Celery worker group (2 on a GPU, 1 on a CPU)",
    )
    e.add_argument("--client-processes", type=int)
    e.add_argument("--redis-io-threads", type=int, help="redis-server's I/O threads (1: none)")
    e.add_argument(
        "--overlay",
        choices=("jpeg", "png"),
        help="how the jobs that ask for overlays encode them (jpeg); jpeg_800x600_no_overlays asks for none",
    )
    e.add_argument(
        "--rounds",
        type=int,
        help="rounds of each many-callers phase and batch job; the median is the figure (3)",
    )
    e.add_argument("--out", type=Path, default=DEFAULT_OUT, help=f"output folder ({DEFAULT_OUT}/)")
    e.add_argument(
        "--name",
        default=None,
        help="file stem (default: e2e-<date>-<time>-<device>-<backend>, never one taken)",
    )
    e.set_defaults(func=run_e2e)
    s = suites.add_parser(
        "selection", help="the foveated view and the diverse selection beside a compiled step"
    )
    s.add_argument("--device", default="auto")
    s.add_argument("--batch", type=int, default=64)
    s.add_argument("--iters", type=int, default=50)
    s.add_argument("--out", type=Path, default=None, help="write the report JSON here")
    s.set_defaults(func=run_selection)


def run_selection(args) -> int:
    from ..bench.selection import bench_selection, markdown

    report = bench_selection(args.device, args.batch, args.iters)
    if args.out is not None:
        args.out.write_text(json.dumps(report, indent=1))
    print(markdown(report))
    return 0


def run_e2e(args) -> int:
    from ..bench.e2e import E2EConfig, markdown, run_e2e, write

    given = {
        f.name: getattr(args, f.name) for f in fields(E2EConfig) if getattr(args, f.name, None) is not None
    }
    cfg = E2EConfig(
        **given
        | {"celery": not args.no_celery, "peers": not args.no_peers, "inprocess": not args.no_inprocess}
    )
    report = run_e2e(cfg, progress=lambda m: print(m, flush=True))
    named = "" if cfg.variant == "arrcoc-texture" else f"-{cfg.variant}"
    stem = (
        args.out / args.name
        if args.name
        else new_stem(args.out, "e2e", report["env"], f"-{cfg.backend}{named}")
    )
    for path in write(report, stem):
        print(path)
    print(markdown(report))
    return 0


def new_stem(folder: Path, kind: str, env: dict, tail: str = "") -> Path:
    """folder/<kind>-<date>-<HHMMSS>-<device><tail>, with -2, -3, ... when a file of that name is
    there already: a run never overwrites another's report."""
    dev = (env.get("gpu") or "cpu").replace("NVIDIA ", "").split()[0].lower()
    date = str(env.get("date") or "")  # ISO 8601, UTC, to the second (arrcoc.bench.env)
    when = "-".join(filter(None, (date[:10], date[11:19].replace(":", ""))))
    base = f"{kind}-{when}-{dev}{tail}"
    stem, n = folder / base, 1
    while folder.is_dir() and any(folder.glob(f"{glob.escape(stem.name)}.*")):
        n += 1
        stem = folder / f"{base}-{n}"
    return stem


def _stem(report: dict, args) -> Path:
    return args.out / args.name if args.name else new_stem(args.out, "bench", report["env"])


def merge(reports: list[dict]) -> dict:
    """Results and startup rows of several runs in one report (env and config of the first)."""
    out = dict(reports[0])
    for key in ("results", "startup", "warmup", "errors"):
        out[key] = [row for r in reports for row in r.get(key, [])]
    out["recompiles_after_warmup"] = sum(r.get("recompiles_after_warmup", 0) for r in reports)
    out["merged_from"] = [r["env"].get("date") for r in reports]
    return out


def run(args) -> int:
    if not args.render:
        _quiet_libraries()  # before torch and the exporters are imported: some warn on import
    from ..bench.report import markdown_table, write_all

    if args.render:
        report = merge([json.loads(p.read_text()) for p in args.render])
    else:
        report = _measure(args)
    paths = write_all(report, _stem(report, args))
    print(markdown_table(report))
    for row in report.get("errors", []):
        print(f"error: {row}")
    print("wrote " + ", ".join(str(p) for p in paths))
    return 0 if not report.get("errors") else 1


def _resolve(args, device) -> None:
    """Fill the flags not given with the defaults for this device (in place) and say what was chosen."""
    from ..bench import device_defaults
    from ..settings import get_settings

    base = device_defaults(device.type)
    chosen = []
    for flag, value in (
        ("variants", base.variants),
        ("backends", base.backends),
        ("iters", base.iters),
        ("warmup_iters", base.warmup_iters),
        ("buckets", base.buckets),
    ):
        if getattr(args, flag) is None:
            if flag == "buckets" and device.type != "cpu":
                value = get_settings().engine.buckets
            setattr(args, flag, list(value) if isinstance(value, tuple) else value)
            chosen.append(
                f"--{flag.replace('_', '-')} {' '.join(map(str, getattr(args, flag)))}"
                if isinstance(value, tuple)
                else f"--{flag.replace('_', '-')} {value}"
            )
    if chosen:
        print(
            f"arrcoc bench on {device.type}: defaults for this device: {' '.join(chosen)} (name a flag to change it)",
            flush=True,
        )


class _Progress:
    """A tqdm bar on a terminal; elsewhere (a pipe, a file, CI) one plain line per step."""

    def __init__(self, desc: str = ""):
        import sys
        import time

        self.interactive = sys.stdout.isatty() and sys.stderr.isatty()
        self.desc, self.last, self.t0, self.clock = desc, None, time.perf_counter(), time.perf_counter
        self.bar = None
        if self.interactive:
            from tqdm import tqdm

            self.bar = tqdm(
                total=1.0, unit="", desc=desc or None, bar_format="{l_bar}{bar}| {elapsed} {postfix}"
            )

    def __call__(self, frac: float, msg: str) -> None:
        if self.bar is not None:
            self.bar.n = round(frac, 4)
            self.bar.set_postfix_str(msg)
            self.bar.refresh()
        elif msg != self.last and msg != "timing":  # "timing": one timed iteration, not a step
            self.last = msg
            print(f"[{frac:4.0%} {self.clock() - self.t0:6.1f} s] {msg}", flush=True)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def _quiet_libraries() -> None:
    """Warnings the user cannot act on (deprecations inside torch, onnxscript, torchvision) stay
    out of the benchmark's output; errors still show."""
    import logging
    import warnings

    for category in (FutureWarning, DeprecationWarning):
        warnings.filterwarnings("ignore", category=category)
    warnings.filterwarnings("ignore", module=r"torchvision(\.|$)")
    warnings.filterwarnings("ignore", message=r".*torchvision.*")
    warnings.filterwarnings(
        "ignore", category=UserWarning, module=r"(torch\.onnx|onnxscript)"
    )  # exporter chatter
    for name in ("torch.onnx", "onnxscript", "torch._dynamo", "torch._inductor"):
        logging.getLogger(name).setLevel(logging.ERROR)


def _measure(args) -> dict:
    from ..bench import BenchConfig, run_benchmark
    from ..bench.env import collect_env
    from ..bench.startup import measure_startup
    from ..engine import resolve_device

    device = resolve_device(args.device)
    _resolve(args, device)
    buckets = tuple(args.buckets)
    weights = None if args.weights == "none" or args.random_weights else args.weights
    if args.startup_only:
        report = {
            "schema": "arrcoc-bench/1",
            "env": collect_env(device),
            "results": [],
            "startup": [],
            "errors": [],
            "recompiles_after_warmup": 0,
        }
        jobs = [(v, b) for v in args.variants for b in args.backends if b != "eager"]
        progress = _Progress("startup")
        for i, (v, b) in enumerate(jobs):
            progress(i / max(1, len(jobs)), f"startup {v} {b}")
            try:
                report["startup"].append(measure_startup(v, b, buckets, str(device), weights))
            except Exception as e:
                report["errors"].append(
                    {"variant": v, "backend": b, "stage": "startup", "error": str(e)[-2000:]}
                )
        progress(1.0, "startup done")
        progress.close()
        return report
    config = BenchConfig(
        variants=tuple(args.variants),
        backends=tuple(args.backends),
        buckets=buckets,
        iters=args.iters,
        warmup_iters=args.warmup_iters,
        device=args.device,
        dtype=args.dtype,
        weights=weights,
        cache_dir=args.cache_dir,
        startup=args.startup,
        backend_options={"onnx": args.onnx_options} if args.onnx_options else {},
    )
    progress = _Progress()
    try:
        return run_benchmark(config, progress)
    finally:
        progress.close()
