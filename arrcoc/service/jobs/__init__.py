"""The job model: job types, the job store, batch archives, and the batch and benchmark job steps.

Torch-free: the submitting side creates jobs here and the worker runs their steps here, through an
`EngineHost` it is given (arrcoc.service.host).
"""
