"""The Celery worker: `celery -A worker.app worker` (or `arrcoc worker`). Thin adapters over arrcoc."""
