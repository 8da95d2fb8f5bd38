"""The engine host: the process part that owns the device, loads the engine once and batches
requests into it. `EngineHost` (interface.py) is what the rest of the serving code sees;
`Runtime` serves in this process, `EngineClient` reaches a worker group's engine process."""
