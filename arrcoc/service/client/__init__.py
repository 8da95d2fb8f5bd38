"""The client side: the `Executor` interface the demo and the CLI call, its in-process and Celery
implementations, and the queue contract the Celery executor shares with worker/."""
