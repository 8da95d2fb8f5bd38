"""Where a host's CPU goes while a load runs: every process's CPU over a window, by role (the
benchmark's client processes, Celery processes, engine processes, redis-server, the driver), and
each role's busiest threads, read from /proc at the window's two ends (no sampling, no pausing).

    python tools/host_cpu.py --after LOGFILE "interactive through Celery: 32" --busy "engine processes" --wait 1 --window 3

waits until LOGFILE holds the line and (--busy) the engine processes work, then `--wait` s, then
measures `--window` s.
A thread near 100% of one core is the candidate bound of its process; a process whose threads
sum to ~100% is bound by its GIL.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from collections import defaultdict
from pathlib import Path

TICK = os.sysconf("SC_CLK_TCK")
ROLES = (
    ("engine processes", "engine_process"),
    ("Celery processes", "arrcoc worker"),
    ("redis-server", "redis-server"),
    ("client processes", "multiprocessing"),
    ("bench driver", "bench e2e"),
)


def _role(cmd: str) -> str:
    return next((role for role, mark in ROLES if mark in cmd), "other")


def _ticks(stat: Path) -> tuple[str, int] | None:
    try:
        text = stat.read_text()
    except OSError:
        return None
    name = text[text.index("(") + 1 : text.rindex(")")]
    fields = text[text.rindex(")") + 2 :].split()
    return name, int(fields[11]) + int(fields[12])  # utime + stime


def snapshot() -> dict[tuple[int, int], tuple[str, str, int]]:
    """(pid, tid) -> (role, thread name, CPU ticks) for every thread on the host."""
    out = {}
    for p in Path("/proc").iterdir():
        if not p.name.isdigit():
            continue
        try:
            cmd = (p / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        role = _role(cmd)
        for t in (p / "task").glob("*"):
            got = _ticks(t / "stat")
            if got is not None:
                out[(int(p.name), int(t.name))] = (role, got[0], got[1])
    return out


def _role_cores(role: str, window: float) -> float:
    a = snapshot()
    time.sleep(window)
    b = snapshot()
    return sum((t - a[k][2]) / TICK / window for k, (r, _, t) in b.items() if r == role and k in a)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--after", nargs=2, metavar=("LOG", "LINE"), help="start once LOG holds LINE")
    ap.add_argument(
        "--busy", metavar="ROLE", help="then wait until ROLE uses over half a core (the load has begun)"
    )
    ap.add_argument("--wait", type=float, default=3.0)
    ap.add_argument("--window", type=float, default=3.0)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    if args.after:
        log, line = Path(args.after[0]), args.after[1]
        deadline = time.monotonic() + 900
        while time.monotonic() < deadline and not (log.exists() and line in log.read_text(errors="replace")):
            time.sleep(0.2)
    if args.busy:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and _role_cores(args.busy, 0.5) < 0.5:
            pass
    time.sleep(args.wait)
    a, t0 = snapshot(), time.monotonic()
    time.sleep(args.window)
    b, dt = snapshot(), time.monotonic() - t0
    roles: dict[str, float] = defaultdict(float)
    procs: dict[tuple[str, int], float] = defaultdict(float)
    threads = []
    for key, (role, name, ticks) in b.items():
        used = (ticks - a.get(key, (role, name, ticks))[2]) / TICK / dt  # cores
        roles[role] += used
        procs[(role, key[0])] += used
        threads.append((used, role, key[0], name))
    total = sum(roles.values())
    print(f"host CPU over {dt:.1f} s: {total:.2f} of {os.cpu_count()} cores")
    for role, cores in sorted(roles.items(), key=lambda x: -x[1]):
        n = sum(1 for r, _ in procs if r == role)
        busiest = max((c for (r, _), c in procs.items() if r == role), default=0.0)
        print(f"  {role:18s} {cores:6.2f} cores in {n:3d} processes (busiest process {busiest:.2f})")
    print("busiest threads (cores):")
    for used, role, pid, name in sorted(threads, reverse=True)[:24]:
        print(f"  {used:5.2f}  {role:18s} pid {pid:<7d} {name}")
    if args.json:
        args.json.write_text(
            json.dumps(
                {
                    "window_s": dt,
                    "cores": os.cpu_count(),
                    "roles": roles,
                    "processes": [{"role": r, "pid": p, "cores": c} for (r, p), c in procs.items()],
                    "threads": [
                        {"role": r, "pid": p, "name": n, "cores": u}
                        for u, r, p, n in sorted(threads, reverse=True)[:60]
                    ],
                },
                indent=1,
            )
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
