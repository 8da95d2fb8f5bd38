"""arrcoc.nvjpeg: torchvision's GPU codecs allocate their outputs on a stream of their own and hand
them to the caller's. CI has no GPU: torch.cuda's stream calls are fakes that record what happens
to which stream, and torchvision's codecs fakes that note the stream current while they allocate
(the only mocks here; on a GPU the bench e2e runs this path). CI has no torchvision either: a
stand-in module holds the two codecs."""

from __future__ import annotations

import sys
import types
from dataclasses import dataclass, field

import pytest
import torch

from arrcoc import nvjpeg


@dataclass
class FakeStream:
    name: str
    log: list = field(repr=False)

    def wait_stream(self, other: FakeStream) -> None:
        self.log.append(("wait", self.name, other.name))

    def synchronize(self) -> None:
        self.log.append(("synchronize", self.name))


@dataclass
class FakeOutput:
    """An output tensor as the codec returns it: it says on which streams it was marked used."""

    allocated_on: str
    log: list = field(repr=False)
    device: torch.device = torch.device("cuda", 0)

    def record_stream(self, stream: FakeStream) -> None:
        self.log.append(("record", self.allocated_on, stream.name))


@pytest.fixture
def gpu(monkeypatch):
    log: list = []
    state = {"current": FakeStream("caller", log)}
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda index=None: state["current"])
    monkeypatch.setattr(torch.cuda, "set_stream", lambda s: state.__setitem__("current", s))
    monkeypatch.setattr(
        torch.cuda, "Stream", lambda device=None, priority=0: FakeStream(f"own{priority}", log)
    )
    monkeypatch.setattr(torch.cuda, "default_stream", lambda device=None: FakeStream("legacy", log))

    def codec(n):
        log.append(("codec", state["current"].name))
        return [FakeOutput(state["current"].name, log) for _ in range(n)]

    io = types.ModuleType("torchvision.io")
    io.ImageReadMode = types.SimpleNamespace(RGB="RGB")
    io.decode_jpeg = lambda datas, mode, device: codec(len(datas))
    io.encode_jpeg = lambda pictures, quality: codec(len(pictures))
    monkeypatch.setitem(sys.modules, "torchvision", types.ModuleType("torchvision"))
    monkeypatch.setitem(sys.modules, "torchvision.io", io)
    nvjpeg._own_stream.cache_clear()
    yield log, state
    nvjpeg._own_stream.cache_clear()


def test_a_decodes_outputs_come_from_the_codecs_own_stream_and_go_to_the_callers(gpu):
    log, state = gpu
    out = nvjpeg.decode([torch.zeros(4, dtype=torch.uint8)] * 3, torch.device("cuda", 0))
    assert len(out) == 3
    assert log == [
        ("codec", "own-1"),  # allocated on a high-priority stream nothing else runs on
        ("wait", "caller", "own-1"),  # the caller holds them until its stream is done with them
    ]
    assert state["current"].name == "caller"


def test_an_encodes_copies_are_waited_for_and_its_outputs_handed_to_the_caller(gpu):
    log, state = gpu
    out = nvjpeg.encode([FakeOutput("caller", [])] * 2, 90)
    assert len(out) == 2
    assert log == [
        ("codec", "own-1"),
        ("synchronize", "legacy"),  # torchvision's last copy runs on the legacy default stream
        ("wait", "caller", "own-1"),
    ]
    assert state["current"].name == "caller"


def test_the_callers_stream_comes_back_when_the_codec_refuses(gpu, monkeypatch):
    log, state = gpu

    def refuse(datas, mode, device):
        raise RuntimeError("nvJPEG: bad stream")

    monkeypatch.setattr(sys.modules["torchvision.io"], "decode_jpeg", refuse)
    with pytest.raises(RuntimeError, match="bad stream"):
        nvjpeg.decode([torch.zeros(4, dtype=torch.uint8)], torch.device("cuda", 0))
    assert state["current"].name == "caller"


@dataclass
class FakeTensor:
    """An nvJPEG output, or a tensor of its own: where its memory starts, and where it was marked used."""

    ptr: int
    log: list = field(repr=False)

    def data_ptr(self) -> int:
        return self.ptr

    def record_stream(self, stream: FakeStream) -> None:
        self.log.append(("record", self.ptr, stream.name))


def test_the_decoder_lets_go_of_nvjpegs_outputs_once_its_stream_is_done_and_marks_only_those_it_keeps(gpu):
    """`Decoder._let_go`: the stream the decode ran on is synchronized (its resize read the
    outputs), and an output kept whole as an overlay's view (a small photo) is marked used on
    that stream, since the overlays read it later; a view of its own memory is not."""
    from arrcoc.images import ImageLimits
    from arrcoc.preprocess import Decoder, Pixels

    log, _ = gpu
    raw = [FakeTensor(1, log), FakeTensor(2, log)]
    resized = FakeTensor(9, log)  # a view the resize made: the caller's stream's own memory
    pixels = [Pixels(None, (8, 8), raw[0]), Pixels(None, (900, 900), resized), Pixels(None, (8, 8), None)]
    Decoder(torch.device("cuda", 0), 64, ImageLimits())._let_go(raw, pixels)
    assert log == [("synchronize", "caller"), ("record", 1, "caller")]


def _nvjpeg_on_this_machine() -> bool:
    from arrcoc.preprocess import gpu_decoder_available

    return gpu_decoder_available()


@pytest.mark.skipif(not _nvjpeg_on_this_machine(), reason="needs a GPU and torchvision with nvJPEG")
def test_on_a_gpu_a_decode_never_writes_into_memory_the_callers_stream_still_reads():
    """pytorch/vision#9606's pattern, on a real GPU: tensors of a decode's output size are filled,
    read by reductions queued behind a long kernel on the caller's stream, and freed before those
    run; then a decode. torchvision alone may be handed those blocks and overwrite them before the
    reductions read them; through arrcoc.nvjpeg every reduction reads what was written."""
    from pathlib import Path

    device = torch.device("cuda")
    photo = (Path(__file__).resolve().parent.parent / "arrcoc" / "examples" / "coffee.jpg").read_bytes()
    jpeg = torch.frombuffer(bytearray(photo), dtype=torch.uint8)
    shape = (3, 400, 600)  # the photo decoded
    wrong = 0
    for _ in range(20):
        held = [torch.full(shape, 7, dtype=torch.uint8, device=device) for _ in range(8)]
        torch.cuda.synchronize()
        torch.cuda._sleep(20_000_000)  # the caller's stream busy for a while
        sums = [t.sum(dtype=torch.int64) for t in held]  # queued behind it
        del held  # freed while the reductions that read them are still queued
        nvjpeg.decode([jpeg] * 8, device)
        torch.cuda.synchronize()
        wrong += sum(int(s) != 7 * 3 * 400 * 600 for s in sums)
    assert wrong == 0
