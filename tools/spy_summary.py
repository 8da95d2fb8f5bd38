"""Where the GIL's time went in an interactive run or a batch job: a `py-spy record --gil --format raw`
file of tools/interactive_probe.py or of a worker group's engine or Celery process, by thread role
(callers, the batcher's thread, the engine process's connection threads, a batch job's step
threads and follower, Celery's consumer and task threads; "other": none of these) and by function
(inclusive), as shares of those samples.

    python tools/spy_summary.py spy-interactive.txt [--top 40]
"""

from __future__ import annotations

import argparse
import re
from collections import Counter
from pathlib import Path

# a role per thread, known by a frame on its stack (arrcoc.bench.load's callers, the batcher's threads)
ROLES = (
    ("client", "_drive"),
    ("engine", "_engine_loop"),
    ("batcher", "DynamicBatcher._loop"),  # the gather stage's one loop (arrcoc.service.host.batching)
    ("connection", "EngineServer._serve"),
    # a batch job: the chunk that writes results.zip while the job's other chunks run, a pipeline
    # step (read, the engine host's call, rows, part), the thread handing steps out
    ("follower", "follow (arrcoc/service/jobs/finishing.py"),
    ("step", "_run_step (arrcoc/service/jobs/batch.py"),
    ("celery task", "fast_trace_task"),
    ("celery consumer", "asynloop"),
    ("heartbeat", "Heartbeat._run"),
    ("job", "_run_group"),
    ("bench poll", "batch_job"),
)
LINE = re.compile(r" \((.*?):\d+\)")  # a frame's line number: functions are counted whole


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("raw", type=Path)
    p.add_argument("--top", type=int, default=40)
    args = p.parse_args()
    roles: Counter[str] = Counter()
    inclusive: Counter[tuple[str, str]] = Counter()
    own: Counter[tuple[str, str]] = Counter()  # the innermost Python frame: where the thread is
    for line in args.raw.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        frames = [LINE.sub(r" (\1)", f) for f in stack.split(";")]
        role = next((r for r, mark in ROLES if any(mark in f for f in frames)), "other")
        roles[role] += int(count)
        own[role, frames[-1]] += int(count)
        for name in dict.fromkeys(frames):
            inclusive[role, name] += int(count)
    total = sum(roles.values())
    print(
        f"samples in the load's threads: {total} (at the recording's rate; with --gil, those holding the GIL)"
    )
    for role, n in roles.most_common():
        print(f"{n / total:6.1%}  {role}")
    print("\nby function, inclusive: share of all samples, share of its thread role's")
    for (role, name), n in inclusive.most_common(args.top):
        if "threading" not in name and "_bootstrap" not in name:
            print(f"{n / total:6.1%} {n / roles[role]:6.1%}  {role} {name[:120]}")
    print("\nby innermost frame (where the thread was): share of all samples, share of its thread role's")
    for (role, name), n in own.most_common(args.top // 2):
        print(f"{n / total:6.1%} {n / roles[role]:6.1%}  {role} {name[:120]}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
