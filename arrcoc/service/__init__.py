"""The serving floor, by role (docs/architecture.md has the picture):

- jobs/    the job model: types, the job store, archives, batch and benchmark job steps (torch-free)
- host/    the engine host: the runtime, the dynamic batcher, the engine process
- client/  the Executor interface, the in-process and Celery executors, the queue contract
- codec    the wire format of results and errors, shared by all three
"""
