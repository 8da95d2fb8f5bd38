"""Where does the aot backend crash? Each risky step of loading and capturing AOTInductor
packages, in its own process, so a segfault in one does not hide the others.

    python scripts/aot_debug.py --cache-dir D [--device cuda] [--budget 200] [--steps ...]

D is what `arrcoc compile --backend aot --cache-dir D` filled (packages in D/aot). One line per
step: OK / FAILED(rc, signal) / TIMEOUT / SKIP, its wall time, the phases it timed (load, first
and second run, capture, replay) and the max |aot - eager| of its outputs; a failed step adds the
last lines of its stderr (faulthandler's Python stack on a crash; a step about to time out dumps
its stack too). Children run with AOTI_RUNTIME_CHECK_INPUTS=1, so an input of the wrong shape,
dtype or stride is an error, not a crash. With gdb installed, the first step that died of a
signal is run again under gdb for a native backtrace.

Steps (most informative first; --budget cuts the tail):
  info            versions, packages (files inside, sizes), key check (would warmup rebuild?)
  tiny_plain      a toy model, built (the backend's settings) and loaded on its own:
                  does AOTInductor work on this machine at all?
  tiny_o0         the toy model with its host wrapper built at -O0 (what the backend did before)
  load_b1_direct  b1 through the backend's loader (arrcoc.engine.aot.load_runner: the C++
                  loader without aoti_load_package's CPU-ISA probe), run 3x, compare
  graph_b1_direct a CUDA graph over that runner
  build_plain_b1  b1 built without "opt_level" settings, into <cache-dir>/plain
  load_plain_b1   that package through load_runner, run, CUDA graph
  load_b1_st      aoti_load_package(b1, run_single_threaded=True), run 3x, compare with eager
  load_dyn_st     b2-64 package, run_single_threaded=True, at batch 8 and 64
  graph_b1        CUDA graph over the b1 runner: warm-up on a side stream, capture, replay
  graph_dyn8      the same over b2-64 at batch 8
  backend_nograph AotBackend(cuda_graphs=False, build=False).warmup(), then runs
  backend_graph   AotBackend(cuda_graphs=True, build=False).warmup(), then runs (the real path)
  load_b1_mt      b1 with run_single_threaded=False (the default)
  load_dyn_mt     b2-64 with run_single_threaded=False
  load_both_st    both packages in one process (as warmup loads them), no graphs
  graph_pool      graphs at 64, 8 (b2-64) and 1 (b1) in one shared pool, largest first
  load_b1_pkg     b1 through torch._inductor.package.load_package (what aoti_load_package calls)
  graph_b1_mt     capture over a run_single_threaded=False runner (expected to fail: AOTI's
                  thread-safe run queries a CUDA event, which a capturing stream forbids)
"""

from __future__ import annotations

import argparse
import faulthandler
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import zipfile
from pathlib import Path

STEPS = ("info", "tiny_plain", "tiny_o0", "load_b1_direct", "graph_b1_direct", "build_plain_b1", "load_plain_b1",
         "load_b1_st", "load_dyn_st", "graph_b1", "graph_dyn8", "backend_nograph", "backend_graph",
         "load_b1_mt", "load_dyn_mt", "load_both_st", "graph_pool", "load_b1_pkg", "graph_b1_mt")  # fmt: skip
T0 = time.perf_counter()


def say(msg: str) -> None:
    """Progress on stderr, flushed: the last line before a crash names the phase that crashed."""
    print(f"[{time.perf_counter() - T0:6.2f}s] {msg}", file=sys.stderr, flush=True)


# -- the child: one step --------------------------------------------------------------------------
class Ctx:
    def __init__(self, args: argparse.Namespace):
        import torch

        from arrcoc.registry import create_model

        self.args, self.torch = args, torch
        self.device = torch.device(args.device)
        torch.manual_seed(0)
        self.model = create_model(args.variant, None if args.weights == "none" else args.weights, self.device)
        self.root = Path(args.cache_dir) / "aot"
        self.timings: dict[str, float] = {}
        self.diffs: dict[str, float] = {}
        self._eager = None

    def package(self, spec: str) -> Path:
        """The package for batch spec '1' or '2-64' (the newest, if several machines' are there)."""
        found = sorted(self.root.glob(f"{self.args.variant}-b{spec}-*.pt2"), key=lambda p: p.stat().st_mtime)
        found = [p for p in found if ".tmp" not in p.name]
        if not found:
            raise SystemExit(
                f"no package b{spec} in {self.root} (have {sorted(p.name for p in self.root.glob('*.pt2'))})"
            )
        return found[-1]

    def timed(self, name: str, fn, *a, **k):
        say(f"{name} ...")
        t = time.perf_counter()
        out = fn(*a, **k)
        if self.device.type == "cuda":
            self.torch.cuda.synchronize(self.device)
        self.timings[name] = round(time.perf_counter() - t, 4)
        say(f"{name} done in {self.timings[name]:.3f} s")
        return out

    def load(self, spec: str, single: bool, api: str = "aoti_load_package"):
        torch = self.torch
        path = self.package(spec)
        kw = {"run_single_threaded": single}
        if self.device.type == "cuda":
            kw["device_index"] = self.device.index or 0
        if api == "direct":
            from arrcoc.engine.aot import load_runner

            return self.timed(f"load b{spec} (load_runner, single={single})", load_runner, path, self.device, single)
        if api == "load_package":
            from torch._inductor.package import load_package

            return self.timed(f"load b{spec} ({api}, single={single})", load_package, str(path), **kw)
        return self.timed(
            f"load b{spec} (single={single})", torch._inductor.aoti_load_package, str(path), **kw
        )

    def inputs(self, batch: int, seed: int = 0):
        from arrcoc.engine.base import example_inputs

        return example_inputs(self.model, batch, self.device, seed=seed)

    def eager(self, *x):
        from arrcoc.engine.base import ForwardFn

        if self._eager is None:
            self._eager = ForwardFn(self.model, self.device.type, self.torch.float32).eval()
        with self.torch.inference_mode():
            return self._eager(*x)

    def compare(self, name: str, out, ref) -> None:
        """Max |aot - eager| over the float outputs (which one, too); integer outputs (the cell
        order: ties may rank differently) as a count of differing elements."""
        from arrcoc.model import ModelOutput

        names = (
            ModelOutput._fields if len(out) == len(ModelOutput._fields) else [str(i) for i in range(len(out))]
        )
        worst, where, int_diff = 0.0, "", 0
        for n, o, r in zip(names, out, ref, strict=True):
            if o.shape != r.shape:
                raise AssertionError(f"{name}: {n} shape {tuple(o.shape)} != eager {tuple(r.shape)}")
            if not o.is_floating_point():
                int_diff += int((o != r).sum().item())
            elif o.numel() and (d := (o.double() - r.double()).abs().max().item()) >= worst:
                worst, where = d, n
        self.diffs[name] = worst
        say(f"{name}: max |aot - eager| = {worst:.3g} ({where}); integer elements differing: {int_diff}")

    def run_runner(self, runner, batch: int, tag: str, times: int = 3) -> None:
        x = self.inputs(batch, seed=7)
        with self.torch.inference_mode():
            for i in range(times):
                out = self.timed(f"{tag} run{i + 1} b{batch}", runner, *x)
        self.compare(f"{tag} b{batch}", out, self.eager(*x))

    def graph(self, runner, batch: int, tag: str, pool=None):
        """Plain torch.cuda.graph over runner(*static): warm on a side stream, capture, replay,
        then new inputs copied into the static ones, replay, compare (what CudaGraphRunner does)."""
        torch = self.torch
        static = self.inputs(batch, seed=1000)
        with torch.inference_mode():
            side = torch.cuda.Stream(self.device)
            side.wait_stream(torch.cuda.current_stream(self.device))
            with torch.cuda.stream(side):
                for i in range(2):
                    self.timed(f"{tag} side-stream warm-up {i + 1} b{batch}", runner, *static)
            torch.cuda.current_stream(self.device).wait_stream(side)
            torch.cuda.synchronize(self.device)
            g = torch.cuda.CUDAGraph()

            def capture():
                with torch.cuda.graph(g, pool=pool):
                    return runner(*static)

            out = self.timed(f"{tag} capture b{batch}", capture)
            self.timed(f"{tag} replay1 b{batch}", g.replay)
            self.compare(f"{tag} graph b{batch} (static inputs)", out, self.eager(*static))
            fresh = self.inputs(batch, seed=11)
            for dst, src in zip(static, fresh, strict=True):
                dst.copy_(src)
            self.timed(f"{tag} replay2 b{batch}", g.replay)
            self.compare(f"{tag} graph b{batch} (new inputs)", out, self.eager(*fresh))
        return g, static, out

    def backend(self, graphs: bool) -> None:
        from arrcoc.engine import create_backend

        be = create_backend("aot", self.model, self.device, tuple(self.args.buckets), cache_dir=Path(self.args.cache_dir),
                            cuda_graphs=graphs, build=False)  # fmt: skip
        self.timed(f"AotBackend(cuda_graphs={graphs}).warmup", be.warmup)
        say(f"backend stats {json.dumps(be.stats, default=str)}")
        for b in sorted({1, 3, 8, max(self.args.buckets), max(self.args.buckets) + 5}):
            x = self.inputs(b, seed=21)
            with self.torch.inference_mode():
                out = self.timed(f"backend run b{b}", be.run, *x)
            self.compare(f"backend b{b}", tuple(out), self.eager(*x))
        be.close()


def _info(c: Ctx) -> dict:
    torch = c.torch
    from arrcoc.engine.aot import AotBackend, read_key

    doc: dict = {"torch": torch.__version__, "cuda": torch.version.cuda, "device": str(c.device)}
    try:
        import triton

        doc["triton"] = triton.__version__
    except ImportError:
        pass
    if c.device.type == "cuda":
        doc["gpu"] = torch.cuda.get_device_name(c.device)
        doc["capability"] = torch.cuda.get_device_capability(c.device)
    doc["env"] = {k: v for k, v in os.environ.items() if k.startswith(("CUDA_", "TORCH", "AOT", "PYTORCH"))}
    for p in sorted(c.root.glob("*.pt2")):
        with zipfile.ZipFile(p) as z:
            kinds: dict[str, list] = {}
            for i in z.infolist():
                ext = Path(i.filename).suffix or "(none)"
                n, size = kinds.get(ext, [0, 0])
                kinds[ext] = [n + 1, size + i.file_size]
        doc[p.name] = {"mb": round(p.stat().st_size / 2**20, 2), "files_by_ext": kinds, "key": read_key(p)}
    be = AotBackend(c.model, c.device, tuple(c.args.buckets), cache_dir=Path(c.args.cache_dir), build=False)
    doc["stale"] = {f"{lo}-{hi}": why for (lo, hi), (_, _, why) in be.stale().items()}
    doc["programs"] = [f"{lo}-{hi}" for lo, hi in be.programs()]
    for k, v in doc.items():
        say(f"info {k}: {json.dumps(v, default=str)}")
    return doc


def _tiny(c: Ctx, o0: bool) -> None:
    """Export, build and load a toy model (a linear layer, a buffer, a reduction) on c.device."""
    import torch

    from arrcoc.engine.aot import _configs, load_runner

    class Toy(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(64, 32)
            self.register_buffer("shift", torch.linspace(0, 1, 32))

        def forward(self, x):
            y = torch.relu(self.lin(x)) + self.shift
            return y, y.amax(dim=-1)

    toy = Toy().to(c.device).eval()
    x = torch.randn(4, 64, device=c.device)
    path = Path(c.args.cache_dir) / f"toy-{'o0' if o0 else 'plain'}-{c.device.type}.pt2"
    configs = _configs({"variant": "toy"}, c.device)  # the backend's settings (compiler included)
    if o0:
        configs["aot_inductor.compile_wrapper_opt_level"] = "O0"
    with torch.no_grad():
        program = c.timed("toy export", torch.export.export, toy, (x,), strict=False)
        c.timed("toy build", torch._inductor.aoti_compile_and_package, program, package_path=str(path),
                inductor_configs=configs)  # fmt: skip
    r = c.timed("toy load (load_runner)", load_runner, path, c.device, True)
    with torch.inference_mode():
        out = c.timed("toy run", r, x)
        ref = toy(x)
    c.diffs["toy"] = max(float((o - e).abs().max()) for o, e in zip(out, ref, strict=True))
    say(f"toy: max |aot - eager| = {c.diffs['toy']:.3g}")


def _dyn_spec(c: Ctx) -> str:
    big = [b for b in c.args.buckets if b > 1]
    return f"{big[0]}-{big[-1]}"


def child(args: argparse.Namespace) -> None:
    if args.timeout > 5:  # dump the Python stack just before the parent kills a hung step
        faulthandler.dump_traceback_later(args.timeout - 3, exit=False)
    c = Ctx(args)
    cuda = c.device.type == "cuda"
    step, dyn = args.child, _dyn_spec(c)
    big = max(args.buckets)
    extra: dict = {}
    if step.startswith("graph") and not cuda:
        print("RESULT " + json.dumps({"skip": "CUDA graphs need --device cuda"}), flush=True)
        return
    if step == "build":
        from arrcoc.engine.aot import AotBackend

        be = AotBackend(
            c.model, c.device, tuple(args.buckets), cache_dir=Path(args.cache_dir), cuda_graphs=False
        )
        times = c.timed("build (prepare: export + AOTInductor, no load)", be.prepare)
        extra = {"built": {f"{lo}-{hi}": round(t, 1) for (lo, hi), t in times.items()}}
        say(f"built {extra['built'] or 'nothing (every package present and current)'}")
    elif step == "info":
        extra = _info(c)
    elif step in ("tiny_plain", "tiny_o0"):
        _tiny(c, o0=step == "tiny_o0")
    elif step in ("load_b1_direct", "graph_b1_direct"):
        r = c.load("1", True, "direct")
        c.run_runner(r, 1, step) if step == "load_b1_direct" else c.graph(r, 1, step)
    elif step == "build_plain_b1":
        import arrcoc.engine.aot as aot

        plain = aot._configs
        aot._configs = lambda key, device: {k: v for k, v in plain(key, device).items() if "opt_level" not in k}
        c.root = Path(args.cache_dir) / "plain" / "aot"
        be = aot.AotBackend(c.model, c.device, (1,), cache_dir=Path(args.cache_dir) / "plain", cuda_graphs=False)
        extra = {"built": {f"{lo}-{hi}": round(t, 1) for (lo, hi), t in c.timed("build plain b1", be.prepare).items()}}
        say(f"built {extra['built']}")
    elif step == "load_plain_b1":
        c.root = Path(args.cache_dir) / "plain" / "aot"
        r = c.load("1", True, "direct")
        c.run_runner(r, 1, step)
        c.graph(r, 1, step)
    elif step in ("load_b1_st", "load_b1_mt", "load_b1_pkg"):
        api = "load_package" if step == "load_b1_pkg" else "aoti_load_package"
        c.run_runner(c.load("1", step != "load_b1_mt", api), 1, step)
    elif step in ("load_dyn_st", "load_dyn_mt"):
        r = c.load(dyn, step == "load_dyn_st")
        for b in sorted({min(8, big), big}):
            c.run_runner(r, b, step)
    elif step == "load_both_st":
        r1, rd = c.load("1", True), c.load(dyn, True)
        c.run_runner(r1, 1, "b1")
        for b in sorted({min(8, big), big}, reverse=True):
            c.run_runner(rd, b, "dyn")
        c.run_runner(r1, 1, "b1 again")
    elif step in ("graph_b1", "graph_b1_mt"):
        c.graph(c.load("1", step == "graph_b1"), 1, step)
    elif step == "graph_dyn8":
        c.graph(c.load(dyn, True), min(8, big), step)
    elif step == "graph_pool":
        import torch

        pool = torch.cuda.graph_pool_handle()
        rd, r1 = c.load(dyn, True), c.load("1", True)
        keep = [c.graph(rd, b, "pool", pool) for b in sorted({big, min(8, big)}, reverse=True)]
        keep.append(c.graph(r1, 1, "pool", pool))
        for g, _, _ in keep:  # every graph still replays after the others were captured
            g.replay()
        torch.cuda.synchronize()
    elif step in ("backend_nograph", "backend_graph"):
        c.backend(step == "backend_graph")
    else:
        raise SystemExit(f"unknown step {step}")
    tol = max(c.diffs.values(), default=0.0)
    doc = {"timings": c.timings, "max_diff": tol, "diffs": c.diffs, **({"info": extra} if extra else {})}
    print("RESULT " + json.dumps(doc, default=str), flush=True)


# -- the parent: every step in its own process ----------------------------------------------------
def _signal_name(rc: int) -> str:
    if rc >= 0:
        return ""
    try:
        return signal.Signals(-rc).name
    except ValueError:
        return f"signal {-rc}"


def _child_cmd(args: argparse.Namespace, step: str, timeout: float) -> list[str]:
    return [sys.executable, "-X", "faulthandler", str(Path(__file__).resolve()), "--child", step,
            "--cache-dir", str(args.cache_dir), "--variant", args.variant, "--weights", args.weights,
            "--device", args.device, "--timeout", str(int(timeout)), "--buckets", *map(str, args.buckets)]  # fmt: skip


NATIVE_TRACE = Path("/tmp/segv_backtrace.so")


def native_backtraces() -> bool:
    """Build scripts/segv_backtrace.c (a backtrace on a fatal signal) for the children; False
    when there is no C compiler."""
    src = Path(__file__).with_name("segv_backtrace.c")
    cc = shutil.which("gcc") or shutil.which("cc")
    if cc is None:
        return False
    return subprocess.call([cc, "-shared", "-fPIC", "-O1", "-o", str(NATIVE_TRACE), str(src)]) == 0


def _env() -> dict[str, str]:
    env = dict(os.environ)
    if NATIVE_TRACE.is_file():
        env["LD_PRELOAD"] = str(NATIVE_TRACE) + (os.pathsep + env["LD_PRELOAD"] if env.get("LD_PRELOAD") else "")
    env.setdefault("AOTI_RUNTIME_CHECK_INPUTS", "1")  # a wrong input is an error, not a crash
    env.setdefault("TORCH_SHOW_CPP_STACKTRACES", "1")
    root = str(Path(__file__).resolve().parent.parent)
    env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    return env


def run_group(cmd: list[str], timeout: float) -> tuple[int | None, str, str]:
    """(rc or None on timeout, stdout, stderr) of cmd in its own process group: on a timeout the
    whole group is killed (a build's spawned compilers too), not only the child."""
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_env(),
                         start_new_session=True)  # fmt: skip
    try:
        out, err = p.communicate(timeout=timeout)
        return p.returncode, out, err
    except subprocess.TimeoutExpired:
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        out, err = p.communicate()
        return None, out or "", err or ""


def run_step(args: argparse.Namespace, step: str, timeout: float) -> dict:
    t = time.perf_counter()
    rc, out, err = run_group(_child_cmd(args, step, timeout), timeout)
    wall = time.perf_counter() - t
    result = next((json.loads(x[7:]) for x in reversed(out.splitlines()) if x.startswith("RESULT ")), None)
    if rc is None:
        status = "TIMEOUT"
    elif rc == 0 and result is not None:
        status = "SKIP" if "skip" in result else "OK"
    else:
        status = f"FAILED(rc={rc}{', ' + _signal_name(rc) if rc < 0 else ''})"
    return {"step": step, "status": status, "rc": rc, "wall_s": round(wall, 2), "result": result,
            "stderr_tail": err.splitlines()[-args.tail:], "stdout_tail": out.splitlines()[-5:],
            "notes": [x for x in err.splitlines() if "] info " in x or "] built " in x]}  # fmt: skip


def report(r: dict, tail: int) -> None:
    res = r["result"] or {}
    line = f"STEP {r['step']:16s} {r['status']:24s} {r['wall_s']:7.1f} s"
    if "max_diff" in res:
        line += f"  max|aot-eager| {res['max_diff']:.3g}"
    if res.get("timings"):
        line += "  " + ", ".join(f"{k} {v:.3f}" for k, v in res["timings"].items())
    if res.get("skip"):
        line += f"  ({res['skip']})"
    print(line, flush=True)
    if r["status"] not in ("OK", "SKIP"):
        for x in r["stderr_tail"][-tail:]:
            print(f"    | {x}", flush=True)
    elif r["step"] in ("info", "build"):  # what they found, in the log
        for x in r["notes"]:
            print(f"    {x[:400]}", flush=True)


def gdb_backtrace(args: argparse.Namespace, step: str, timeout: float) -> list[str]:
    gdb = shutil.which("gdb")
    if gdb is None:
        return ["(no gdb on this machine: no native backtrace)"]
    cmd = [gdb, "-q", "-batch", "-ex", "set pagination off", "-ex", "handle SIGPIPE nostop noprint",
           "-ex", "run", "-ex", "bt 40", "-ex", "info threads", "--args", *_child_cmd(args, step, timeout)]  # fmt: skip
    _, out, err = run_group(cmd, timeout)
    text = out + err
    lines = [x for x in text.splitlines() if x.startswith(("#", "Thread", "Program received", "  Id", "*"))]
    return lines[:60] or text.splitlines()[-30:]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument(
        "--cache-dir", required=True, type=Path, help="the dir given to `arrcoc compile --backend aot`"
    )
    p.add_argument("--variant", default="arrcoc-texture")
    p.add_argument("--weights", default="default", help="as given to arrcoc compile ('none': untrained)")
    p.add_argument("--device", default="cuda")
    p.add_argument("--buckets", type=int, nargs="+", default=[1, 2, 4, 8, 16, 32, 64])
    p.add_argument("--steps", nargs="*", default=list(STEPS), choices=STEPS, metavar="STEP")
    p.add_argument("--build", type=float, default=0.0, metavar="SECONDS",
                   help="first build missing or stale packages (AotBackend.prepare, no load), time-boxed")  # fmt: skip
    p.add_argument("--timeout", type=float, default=60.0, help="seconds per step")
    p.add_argument("--budget", type=float, default=400.0, help="seconds for all steps (the tail is skipped)")
    p.add_argument("--tail", type=int, default=45, help="stderr lines shown for a step that failed")
    p.add_argument("--json", type=Path, default=None, help="write every step's result here")
    p.add_argument(
        "--gdb",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="rerun the first step that died of a signal under gdb (if installed)",
    )
    p.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        child(args)
        return 0
    results, gdb_done = [], not args.gdb
    if args.gdb and shutil.which("gdb") is None:
        print(f"native backtraces: {'LD_PRELOAD ' + str(NATIVE_TRACE) if native_backtraces() else 'none (no gcc)'}")
    if args.build > 0:
        r = run_step(args, "build", args.build)
        report(r, args.tail)
        results.append(r)
    if args.steps and not (args.cache_dir / "aot").is_dir():
        print(f"no packages: {args.cache_dir / 'aot'} does not exist (build them: --build 300)")
        return 2
    deadline = time.perf_counter() + args.budget
    for step in args.steps:
        left = deadline - time.perf_counter()
        if left < 10:
            print(f"STEP {step:16s} NOT RUN (budget of {args.budget:.0f} s spent)", flush=True)
            continue
        r = run_step(args, step, min(args.timeout, left))
        report(r, args.tail)
        if not gdb_done and r["rc"] is not None and r["rc"] < 0 and deadline - time.perf_counter() > 30:
            gdb_done = True
            r["gdb"] = gdb_backtrace(args, step, min(args.timeout, deadline - time.perf_counter() - 5))
            for x in r["gdb"]:
                print(f"    gdb| {x}", flush=True)
        results.append(r)
    if args.json:
        args.json.write_text(json.dumps(results, indent=1, default=str))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
