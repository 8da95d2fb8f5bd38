"""Hostile inputs for the abuse and fuzz tests, generated (nothing stored): zip bombs, zips that
lie, odd manifests, odd images; and measuring helpers (peak RSS of a process, bytes on disk)."""

from __future__ import annotations

import io
import os
import struct
import threading
import time
import zipfile
import zlib
from pathlib import Path

import numpy as np
from PIL import Image

MIB = 1024 * 1024


def _zeros_deflated(mib: int) -> tuple[bytes, int]:
    """A raw deflate stream of `mib` MiB of zeros built from one flushed block repeated (each block
    is independent after a full flush), and its CRC-32: cheap to build, ~1000x to inflate."""
    c = zlib.compressobj(9, zlib.DEFLATED, -15)
    block = c.compress(bytes(MIB)) + c.flush(zlib.Z_FULL_FLUSH)
    end = zlib.compressobj(9, zlib.DEFLATED, -15).flush()  # an empty final block
    crc, one = 0, bytes(MIB)
    for _ in range(mib):
        crc = zlib.crc32(one, crc)
    return block * mib + end, crc


def raw_zip(entries: list[tuple[str, bytes, int, int]]) -> bytes:
    """A zip from (name, deflated data, crc, uncompressed size) entries, written by hand (no zip64:
    sizes under 4 GiB)."""
    out, central = io.BytesIO(), io.BytesIO()
    for name, data, crc, size in entries:
        fn = name.encode()
        offset = out.tell()
        out.write(
            struct.pack("<4sHHHHHIIIHH", b"PK\x03\x04", 20, 0, 8, 0, 0, crc, len(data), size, len(fn), 0) + fn
        )
        out.write(data)
        central.write(
            struct.pack(
                "<4sHHHHHHIIIHHHHHII",
                b"PK\x01\x02",
                20,
                20,
                0,
                8,
                0,
                0,
                crc,
                len(data),
                size,
                len(fn),
                0,
                0,
                0,
                0,
                0,
                offset,
            )
            + fn
        )
    cd = central.getvalue()
    start = out.tell()
    out.write(cd)
    out.write(struct.pack("<4sHHHHIIH", b"PK\x05\x06", 0, 0, len(entries), len(entries), len(cd), start, 0))
    return out.getvalue()


def bomb_zip(entry_mib: int, name: str = "zeros.jpg") -> bytes:
    """One entry of `entry_mib` MiB of zeros, deflated (~1000x)."""
    data, crc = _zeros_deflated(entry_mib)
    return raw_zip([(name, data, crc, entry_mib * MIB)])


def many_entries_zip(n: int, size_mib: int = 1, prefix: str = "z") -> bytes:
    """n entries of `size_mib` MiB of zeros each (each ~1000x)."""
    data, crc = _zeros_deflated(size_mib)
    return raw_zip([(f"{prefix}{i:05d}.png", data, crc, size_mib * MIB) for i in range(n)])


def duplicate_names_zip(png: bytes) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as zf:
        import warnings

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # zipfile warns about the duplicate: that is the point
            zf.writestr("a.jpg", png)
            zf.writestr("a.jpg", png[::-1])
            zf.writestr("b.png", png)
    return buf.getvalue()


def lying_sizes_zip(data: bytes, name: str = "a.png", declared: int = 16) -> bytes:
    """A stored entry whose headers declare `declared` bytes while `data` follows."""
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_STORED) as zf:
        zf.writestr(name, data)
    raw = bytearray(buf.getvalue())
    size = struct.pack("<I", len(data))
    for sig in (b"PK\x03\x04", b"PK\x01\x02"):  # local header and central directory entry
        at = raw.find(sig)
        off = at + (18 if sig == b"PK\x03\x04" else 20)  # compressed size, then uncompressed size
        assert raw[off : off + 4] == size and raw[off + 4 : off + 8] == size
        raw[off : off + 8] = struct.pack("<II", declared, declared)
    return bytes(raw)


def png_bytes(size: int = 48, seed: int = 0, mode: str = "RGB") -> bytes:
    rng = np.random.default_rng(seed)
    arr = (rng.random((size, size, 3)) * 255).astype(np.uint8)
    img = Image.fromarray(arr).convert(mode)
    buf = io.BytesIO()
    img.save(buf, "PNG")
    return buf.getvalue()


def png_header(width: int, height: int) -> bytes:
    """A PNG whose header declares width x height, with a tiny (broken) body: a pixel bomb's header."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return (
            struct.pack(">I", len(data))
            + kind
            + data
            + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)
        )

    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", ihdr)
        + chunk(b"IDAT", zlib.compress(b"\0" * 64))
        + chunk(b"IEND", b"")
    )


def png16(side: int) -> bytes:
    """A 16-bit greyscale PNG of side x side that compresses to almost nothing (a gradient band)."""
    arr = np.zeros((side, side), dtype=np.uint16)
    arr[: side // 8] = 40000
    buf = io.BytesIO()
    Image.fromarray(arr).save(buf, "PNG", compress_level=9)
    return buf.getvalue()


def du(path: Path) -> int:
    """Bytes on disk under path (0 when it does not exist), a file under two names counted once."""
    if not path.exists():
        return 0
    return sum(
        {
            (st.st_dev, st.st_ino): st.st_size for st in (f.stat() for f in path.rglob("*") if f.is_file())
        }.values()
    )


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


class PeakRSS:
    """Samples this process's RSS every 10 ms while the block runs: `growth` is the peak over the start."""

    def __enter__(self) -> PeakRSS:
        self.start = self.peak = rss_bytes()
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)
        self._t.start()
        return self

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, rss_bytes())
            time.sleep(0.01)

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._t.join()
        self.peak = max(self.peak, rss_bytes())

    @property
    def growth(self) -> int:
        return self.peak - self.start


def many_names_zip(n: int) -> bytes:
    """A real zip of n empty stored entries (zip64 end records past 65,535): a central directory
    that costs a parser ~600 bytes an entry, in a file of ~90 bytes an entry."""
    local, central = bytearray(), bytearray()
    crc0 = zlib.crc32(b"")
    for i in range(n):
        fn = b"%07d" % i
        offset = len(local)
        local += struct.pack("<4sHHHHHIIIHH", b"PK\x03\x04", 20, 0, 0, 0, 0, crc0, 0, 0, len(fn), 0) + fn
        central += (
            struct.pack(
                "<4sHHHHHHIIIHHHHHII",
                b"PK\x01\x02",
                45,
                20,
                0,
                0,
                0,
                0,
                crc0,
                0,
                0,
                len(fn),
                0,
                0,
                0,
                0,
                0,
                offset,
            )
            + fn
        )
    start = len(local)
    end64 = len(local) + len(central)
    out = bytes(local) + bytes(central)
    out += struct.pack("<4sQHHIIQQQQ", b"PK\x06\x06", 44, 45, 45, 0, 0, n, n, len(central), start)
    out += struct.pack("<4sIQI", b"PK\x06\x07", 0, end64, 1)
    out += struct.pack("<4sHHHHIIH", b"PK\x05\x06", 0, 0, 0xFFFF, 0xFFFF, 0xFFFFFFFF, 0xFFFFFFFF, 0)
    return out


def compressible_zip(n: int, size: int, name: str = "big{:03d}.png") -> bytes:
    """n entries of `size` bytes each that deflate ~100x (under the ratio limit): little to upload,
    a lot to write."""
    rng = np.random.default_rng(0)
    data = np.zeros(size, np.uint8)
    data[::160] = rng.integers(0, 256, len(data[::160]), dtype=np.uint8)
    raw = data.tobytes()
    c = zlib.compressobj(6, zlib.DEFLATED, -15)
    packed = c.compress(raw) + c.flush()
    crc = zlib.crc32(raw)
    return raw_zip([(name.format(i), packed, crc, size) for i in range(n)])
