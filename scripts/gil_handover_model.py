"""A model of the in-process interactive path with no engine, to see what bounds it: the project's
DynamicBatcher (two stages, batches of 16) fed by 32 caller threads, where each stage does a
fixed amount of Python under the GIL, split into CHUNKS pieces with the GIL released between them
(as each torch call releases and retakes it), then waits without the GIL (as for the device).
The total GIL work per batch stays the same whatever CHUNKS is; only the number of hand-overs
changes. Its figures in BENCHMARKS.md (fourth session) drove the batcher's two threads of then; since
`1288376` the batcher runs both stages on one thread, and this model drives that (the modelled
engine stage runs whole when launched: nothing of it overlaps the next decode).

    python scripts/gil_handover_model.py [--chunks 1 10 30 60] [--stage-gil-us 1200] [--device-ms 1.3]
        [--caller-us 50] [--switch-interval-ms 5] [--repeats 2]
    python scripts/gil_handover_model.py --ops   # which torch calls of the stages hand the GIL over
    python scripts/gil_handover_model.py --orders [--decode-py-us 800] [--nvjpeg-ms 1.5] [--launch-py-us 400]
        [--device-ms 0.6] [--results-py-us 300]

`--orders` models today's one-thread batcher (`1288376`) in the order it runs a cycle (start batch k,
gather k+1, hand k out, decode k+1: the callers' next requests come in during nvJPEG) against the
other order (start k, gather k+1, decode k+1, hand k out: the device runs during the decode), with
a modelled decode (Python, then nvJPEG without the GIL) and a modelled engine (Python to launch,
the device's time counted from the launch, Python to build results).

`--ops` calls each in a loop beside a thread that wants the GIL all the time: a call that releases
the GIL (and must take it back) runs a few thousand times a second, one that does not, millions.
"""

from __future__ import annotations

import argparse
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from arrcoc.service.host.batching import DynamicBatcher  # noqa: E402


def _spin(seconds: float) -> None:
    until = time.perf_counter() + seconds
    while time.perf_counter() < until:
        pass


def measure(chunks: int, stage_gil_s: float, device_s: float, caller_s: float, clients: int = 32,
            per_client: int = 300) -> tuple[float, float]:  # fmt: skip
    """req/s and p50 ms of `clients` callers through a two-stage batcher of modelled stages."""
    piece = stage_gil_s / chunks

    def stage(items: list) -> list:
        for _ in range(chunks):
            _spin(piece)
            time.sleep(0)  # the GIL released and taken back, as around a torch call
        time.sleep(device_s)  # waiting on the device, GIL released
        return list(items)

    batcher = DynamicBatcher(stage, 16, 0.005, "model", False, stage)
    return _drive(batcher, caller_s, clients, per_client)


def _drive(batcher: DynamicBatcher, caller_s: float, clients: int, per_client: int) -> tuple[float, float]:
    """req/s and p50 ms of `clients` caller threads, each `caller_s` of Python then a request."""
    lat: list[float] = []

    def caller() -> None:
        for _ in range(per_client):
            t0 = time.perf_counter()
            _spin(caller_s)  # the caller's own Python (checks, the request)
            batcher.submit(None, time.monotonic() + 60).result()
            lat.append(time.perf_counter() - t0)

    threads = [threading.Thread(target=caller) for _ in range(clients)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    batcher.close()
    lat.sort()
    return clients * per_client / wall, lat[len(lat) // 2] * 1e3


class _DecodeFirst(DynamicBatcher):
    """The other order: start batch k, gather batch k+1, decode it, then hand batch k out."""

    def _pipelined_loop(self) -> None:
        ahead = None
        closing = False
        while ahead is not None or not closing:
            running = self._launch(*ahead) if ahead is not None else None
            live, closing = self._next_batch(running is not None, closing)
            ahead = self._prepared(live)
            if running is not None:
                self._finish(*running)
        self._fail_queued()


def measure_order(batcher_cls: type, args: argparse.Namespace, clients: int = 32, per_client: int = 300
                  ) -> tuple[float, float]:  # fmt: skip
    """req/s and p50 ms of `clients` callers through the one-thread batcher with modelled stages."""

    def decode(items: list) -> list:
        for _ in range(4):  # its Python, in a few pieces between torch calls
            _spin(args.decode_py_us / 4e6)
            time.sleep(0)
        time.sleep(args.nvjpeg_ms / 1e3)  # nvJPEG: no GIL
        return list(items)

    def launch(items: list):
        started = time.perf_counter()
        _spin(args.launch_py_us / 1e6)

        def wait() -> list:
            left = args.device_ms / 1e3 - (time.perf_counter() - started)
            if left > 0:
                time.sleep(left)  # the device still busy: wait without the GIL
            _spin(args.results_py_us / 1e6)
            return list(items)

        return wait

    batcher = batcher_cls(lambda items: launch(items)(), 16, 0.005, "model", False, decode, launch)
    return _drive(batcher, args.caller_us / 1e6, clients, per_client)


def ops() -> None:
    import torch

    x = torch.randn(16, 32, 32)
    calls = {"contiguous() (already)": x.contiguous, "detach()": x.detach, "x[:8]": lambda: x[:8],
             "to('cpu') (already)": lambda: x.to("cpu"), "numpy()": x.numpy, "clone()": x.clone,
             "stack": lambda: torch.stack([x, x]), "time.sleep(0)": lambda: time.sleep(0)}  # fmt: skip
    for label, call in calls.items():
        stop = threading.Event()

        def other(stop: threading.Event = stop) -> None:
            while not stop.is_set():
                pass

        t = threading.Thread(target=other)
        t.start()
        n, end = 0, time.perf_counter() + 0.5
        while time.perf_counter() < end:
            call()
            n += 1
        stop.set()
        t.join()
        print(f"  {label:24s} {n / 0.5:10.0f} calls/s beside a thread that wants the GIL")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--chunks", type=int, nargs="+", default=[1, 10, 30, 60])
    p.add_argument("--stage-gil-us", type=float, default=1200.0)
    p.add_argument("--device-ms", type=float, default=None, help="1.3, or 0.6 with --orders")
    p.add_argument("--caller-us", type=float, default=50.0)
    p.add_argument("--switch-interval-ms", type=float, default=sys.getswitchinterval() * 1e3)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--ops", action="store_true", help="which torch calls release the GIL (see above)")
    p.add_argument("--orders", action="store_true", help="the one-thread batcher's two orders (see above)")
    p.add_argument("--decode-py-us", type=float, default=800.0)
    p.add_argument("--nvjpeg-ms", type=float, default=1.5)
    p.add_argument("--launch-py-us", type=float, default=400.0)
    p.add_argument("--results-py-us", type=float, default=300.0)
    args = p.parse_args()
    if args.ops:
        ops()
        return 0
    if args.orders:
        sys.setswitchinterval(args.switch_interval_ms / 1e3)
        args.device_ms = device_ms = 0.6 if args.device_ms is None else args.device_ms
        print(f"decode {args.decode_py_us:.0f} us of Python + nvJPEG {args.nvjpeg_ms} ms; engine "
              f"{args.launch_py_us:.0f} us to launch, {device_ms} ms on the device, {args.results_py_us:.0f} us "
              f"of results; callers {args.caller_us:.0f} us each; batches of 16, 32 callers")  # fmt: skip
        for _ in range(args.repeats):
            for label, cls in (("hand out, then decode (as it runs)", DynamicBatcher),
                               ("decode, then hand out", _DecodeFirst)):  # fmt: skip
                rps, p50 = measure_order(cls, args)
                print(f"  {label:36s} {rps:6.0f} req/s, p50 {p50:5.1f} ms", flush=True)
        return 0
    sys.setswitchinterval(args.switch_interval_ms / 1e3)
    args.device_ms = 1.3 if args.device_ms is None else args.device_ms
    gil_ms = 2 * args.stage_gil_us / 1e3 + 16 * args.caller_us / 1e3
    print(f"each stage {args.stage_gil_us:.0f} us of Python + {args.device_ms} ms on the device; callers "
          f"{args.caller_us:.0f} us each; switch interval {args.switch_interval_ms} ms; GIL work "
          f"{gil_ms:.2f} ms a batch of 16 (at most {16 / gil_ms * 1e3:.0f} req/s)")  # fmt: skip
    for _ in range(args.repeats):
        for chunks in args.chunks:
            rps, p50 = measure(chunks, args.stage_gil_us / 1e6, args.device_ms / 1e3, args.caller_us / 1e6)
            print(f"  {chunks:3d} GIL hand-overs a stage: {rps:6.0f} req/s, p50 {p50:5.1f} ms", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
