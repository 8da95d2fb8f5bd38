"""The serving path's tuning constants, in one place: sizes, delays, intervals and caps chosen for
speed or robustness rather than set by a format or protocol. Each says why it is what it is; what a
deployment may change is a setting instead (arrcoc.settings, docs/settings.md)."""

from __future__ import annotations

# --- Engine host (arrcoc.service.host) ---

# With prepare_batch: with the device idle a batch gathers at most this long (rather than waiting
# out the whole delay while the device has nothing to do); with a batch on the device, the next
# one gathers until no caller has arrived for this long.
IDLE_GATHER_S = 0.0005
# On a CPU a batch costs more per image than one image does (the engine's threads already take
# every core; BENCHMARKS.md's CPU bucket table), so there requests run one at a time
# unless ARRCOC_BATCHING__MAX_SIZE says otherwise.
CPU_MAX_BATCH = 1
# a benchmark's progress (and with it a cancel) crosses the engine process's socket this often
BENCH_PROGRESS_EVERY_S = 0.25
# how long an engine process that failed a call is passed over by the Celery processes' routing
ENGINE_DOWN_S = 2.0
# the window ARRCOC_ENGINE__RESTARTS counts an engine process's exits in: past that many in this
# long, the group stops rather than restart an engine that cannot stay up
ENGINE_RESTART_WINDOW_S = 600.0
# Decodes over this many pixels run at most LARGE_DECODES at a time per process, so concurrent large
# uploads cannot together exhaust memory (each costs up to 3 bytes a pixel while it decodes).
LARGE_DECODE_PIXELS = 12_000_000
LARGE_DECODES = 2

# --- Workers (worker/) ---

# A Celery process's threads unless ARRCOC_ENGINE__WORKER_THREADS says otherwise. Each task holds
# one while it runs (an interactive request waiting on the engine, a chunk running its steps), and
# with a prefetch of one per thread it is also how many messages the process reserves: enough for
# its interactive requests to fill a batch together with other processes', not so many that one
# process holds chunks that others could run.
WORKER_THREADS = 20

# How long a worker that cannot read a job's data holds its chunk before giving it back: a worker
# that sees the data may take it meanwhile, and the chunk does not spin between the two.
GIVE_BACK_WAIT_S = 2.0
# A model that failed to load is tried again by the first request after this long; the requests
# in between get the reason at once (a load with the hub out of reach takes minutes to fail).
LOAD_RETRY_S = 300.0

# --- Jobs (arrcoc.service.jobs) ---

# How often the first chunk's worker, writing results.zip while the job's other chunks run, looks
# for their parts when it has caught up: the last chunk's rows wait at most this long to be appended.
FOLLOW_POLL_S = 0.05
# Chunks following their job's other chunks at once in one worker process: each holds one of the
# process's task threads, which must stay free to take the chunks they wait for.
FOLLOWERS = 2
# How long closing an in-process executor waits for the job it is running to stop (it fails at its
# next step): long enough for a CPU step to end, short enough for a shutdown.
JOB_STOP_WAIT_S = 10.0
TOMBSTONE_S = 30 * 24 * 3600  # how long "expired" is remembered after a job's TTL
LOST_AFTER_BEATS = 3  # a chunk whose worker missed this many heartbeats is lost
ORPHAN_AGE_S = 24 * 3600  # a job folder without job.json (its creation died) is removed after this
UNREACHABLE_AGE_S = 600  # a job folder younger than this may still be being created
# a benchmark job's progress notes and cancel checks: at most this often (a Redis call each)
BENCH_STATUS_EVERY_S = 0.5
# Inputs are unpacked PACK_ITEMS to a file (inputs/<first index>.pack, items at offsets): creating
# a file per item would be most of what unpacking costs (docs/service.md#batch-jobs).
PACK_ITEMS = 64
# what one central-directory entry may take on average (46 fixed bytes, its name, extra field and
# comment): the directory's size is bounded by the entry limit times this
CENTRAL_BYTES_PER_ENTRY = 512
# What a header read may take of a compressed entry to learn an image's size: a JPEG's frame header
# follows its metadata (EXIF, ICC: each segment at most 64 KiB).
HEADER_READ_BYTES = 256 * 1024
# The disk a job reserves before writing (arrcoc.service.jobs.budget), estimated on the safe side:
# an item's row (its maps as JSON numbers); a picture encoded at most this many bytes a pixel (a
# PNG of one-pixel rows holds 3 and a filter byte a pixel; a JPEG at quality 90 of noise about 1),
# plus its headers and tables.
ROW_BYTES = 64 * 1024
PICTURE_BYTES_PER_PIXEL = 4
PICTURE_HEADER_BYTES = 4 * 1024
# Values ParquetWriter encodes at a time (pyarrow's write_batch_size, 1,024 by default): a map
# column's row group holds a step's rows of 1,024 floats each; in larger batches the list
# columns' levels are encoded in fewer, longer calls, and a row group is written sooner.
PARQUET_WRITE_BATCH = 1 << 16
# Bytes a copy into results.zip moves at once (results.parquet, summary.csv): ZipFile.write moves
# 8 KiB at a time, a Python call and a CRC call each.
COPY_PIECE = 1 << 20

# --- Clients (arrcoc.service.client, arrcoc.cli) ---

ZEROGPU_INFER_S = 30  # GPU time asked for one interactive request (the platform's default is 60)
# GPU time asked for the start: building the aot packages of a 12-layer ViT, one at a time
ZEROGPU_BUILD_S = 900
# `submit batch/bench` without --timeout: how long a job may wait for a worker before the CLI says so
PENDING_TIMEOUT_S = 300.0

# --- Demo (demo/) ---

MAX_BODY = 1 << 20  # a call's JSON (files travel by /upload): a larger body is refused unread (413)
UPLOAD_SLACK = 1 << 20  # a multipart body's boundaries and headers beside its files
# While half the data budget is spoken for, uploads go this long after they came: a call uses its
# upload within seconds; a page keeps its photo for the next few runs.
TIGHT_UPLOAD_AGE_S = 300
