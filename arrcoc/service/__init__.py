"""Running work: one Executor interface, an in-process and a Celery implementation."""
