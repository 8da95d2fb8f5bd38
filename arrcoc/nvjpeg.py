"""torchvision's nvJPEG decode and encode, safe beside other work on the same GPU.

torchvision allocates a call's output tensors on the caller's current stream and has nvJPEG write
them from streams of its own (the encoder's last copy from the legacy default stream), which wait
for nothing queued on the caller's stream. PyTorch's caching allocator hands a block on as soon as
it is freed on its stream, while kernels queued on that stream may still read it: so the codec can
overwrite memory that another computation is about to read (wrong values, NaNs, or a device-side
assert in code that never touched the codec; pytorch/vision#9606, #9060). With several threads on
one device, each on a stream of its own (a batch job's steps, an engine process's connections), and
more threads than PyTorch's pool has streams, that is a matter of time.

Here each call allocates while a stream of the codec's own is current, one that nothing else ever
runs on (a high-priority stream: everything else draws from the default-priority pool), and the
caller's stream waits for the outputs. Freed, an output's memory goes back to the codecs' stream
at once: so the caller holds each output until its own stream is done with it (the decoder
synchronizes its stream, the overlays copy their bytes to the host) and marks with
`record_stream` one it keeps beyond that. The outputs are not marked on the caller's stream here:
each mark is a call that hands the GIL over, a batch has hundreds of outputs, and a thread that
waits its turn for the GIL after each holds up every item of its batch.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence

import torch


@functools.cache
def _own_stream(index: int) -> torch.cuda.Stream:
    """The codecs' stream on device `index`: allocations only, never a kernel of anyone else's."""
    return torch.cuda.Stream(torch.device("cuda", index), priority=-1)


def _on_own_stream(device: torch.device, call: Callable[[], list[torch.Tensor]]) -> list[torch.Tensor]:
    """`call()`'s output tensors allocated on the codecs' stream, then handed to the caller's,
    which holds each until its stream is done with it (see the module docstring)."""
    index = device.index if device.index is not None else torch.cuda.current_device()
    caller = torch.cuda.current_stream(index)
    own = _own_stream(index)
    torch.cuda.set_stream(own)
    try:
        out = call()
    finally:
        torch.cuda.set_stream(caller)
    caller.wait_stream(own)  # torchvision made the current stream (own) wait for its writes
    return out


def decode(datas: Sequence[torch.Tensor], device: torch.device) -> list[torch.Tensor]:
    """JPEG bytes (uint8 CPU tensors) -> (3, H, W) uint8 RGB tensors on `device`, in one nvJPEG
    call, each held until the caller's stream is done with it. RuntimeError when nvJPEG refuses
    one of them."""
    from torchvision.io import ImageReadMode, decode_jpeg

    return _on_own_stream(
        device, lambda: list(decode_jpeg(list(datas), mode=ImageReadMode.RGB, device=device))
    )


def encode(pictures: Sequence[torch.Tensor], quality: int) -> list[torch.Tensor]:
    """(3, H, W) uint8 tensors on one GPU -> their JPEGs' bytes as uint8 tensors on that GPU, each
    held until the caller's stream is done with it. The pictures must be whole on the current
    stream (torchvision's encoder reads them from a stream that waits for nothing)."""
    from torchvision.io import encode_jpeg

    device = pictures[0].device

    def call() -> list[torch.Tensor]:
        encoded = list(encode_jpeg(list(pictures), quality=quality))
        # torchvision copies each JPEG out on the legacy default stream, which the caller's
        # non-blocking stream does not wait for
        torch.cuda.default_stream(device).synchronize()
        return encoded

    return _on_own_stream(device, call)
