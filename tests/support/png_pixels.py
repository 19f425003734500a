"""Just enough PNG decoding to check a screenshot is not blank: 8-bit RGB/RGBA, not interlaced (what Chromium
writes). Pure Python, no imaging library."""

from __future__ import annotations

import struct
import zlib
from collections import Counter

__all__ = ("pixels", "colour_spread")


def pixels(png: bytes) -> tuple[int, int, list[bytes]]:
    """(width, height, rows of raw pixel bytes)."""
    assert png[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    offset, idat, header = 8, b"", None
    while offset < len(png):
        (length,) = struct.unpack(">I", png[offset : offset + 4])
        kind = png[offset + 4 : offset + 8]
        data = png[offset + 8 : offset + 8 + length]
        if kind == b"IHDR":
            header = struct.unpack(">IIBBBBB", data)
        elif kind == b"IDAT":
            idat += data
        offset += 12 + length
    assert header is not None
    width, height, depth, colour, _, _, interlace = header
    assert depth == 8 and colour in (2, 6) and interlace == 0, header
    channels = 3 if colour == 2 else 4
    raw = zlib.decompress(idat)
    stride = width * channels
    rows: list[bytes] = []
    previous = bytearray(stride)
    for y in range(height):
        kind = raw[y * (stride + 1)]
        line = bytearray(raw[y * (stride + 1) + 1 : (y + 1) * (stride + 1)])
        for x in range(stride):
            left = line[x - channels] if x >= channels else 0
            up = previous[x]
            corner = previous[x - channels] if x >= channels else 0
            if kind == 1:
                line[x] = (line[x] + left) & 0xFF
            elif kind == 2:
                line[x] = (line[x] + up) & 0xFF
            elif kind == 3:
                line[x] = (line[x] + (left + up) // 2) & 0xFF
            elif kind == 4:
                p = left + up - corner
                pa, pb, pc = abs(p - left), abs(p - up), abs(p - corner)
                line[x] = (line[x] + (left if pa <= pb and pa <= pc else up if pb <= pc else corner)) & 0xFF
        rows.append(bytes(line))
        previous = line
    return width, height, rows


def colour_spread(png: bytes) -> tuple[int, float]:
    """(distinct colours, share of the most common colour) over every pixel."""
    width, height, rows = pixels(png)
    channels = len(rows[0]) // width
    counts: Counter[bytes] = Counter()
    for row in rows:
        counts.update(row[i : i + 3] for i in range(0, len(row), channels))
    return len(counts), counts.most_common(1)[0][1] / (width * height)
