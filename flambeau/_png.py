"""A tiny PNG writer and line-plot rasteriser (so the demo needs no plotting library)."""
from __future__ import annotations

import struct
import zlib

import numpy as np


def write_png(path: str, rgb: np.ndarray) -> None:
    h, w, _ = rgb.shape
    raw = b"".join(b"\x00" + rgb[y].astype(np.uint8).tobytes() for y in range(h))

    def chunk(tag, data):
        return struct.pack(">I", len(data)) + tag + data + struct.pack(">I", zlib.crc32(tag + data) & 0xFFFFFFFF)

    png = (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 0))
           + chunk(b"IDAT", zlib.compress(raw, 9)) + chunk(b"IEND", b""))
    with open(path, "wb") as f:
        f.write(png)


def line_plot(series: dict, path: str, width=640, height=360, log=True) -> None:
    """Plot named series (lists of y values) on a white canvas with a light grid."""
    img = np.full((height, width, 3), 255, np.uint8)
    m = 30
    ys = [np.asarray(v, float) for v in series.values() if len(v)]
    allv = np.concatenate(ys)
    allv = np.log10(np.maximum(allv, 1e-6)) if log else allv
    lo, hi = float(allv.min()), float(allv.max())
    hi = hi if hi > lo else lo + 1
    for k in range(5):
        y = m + int((height - 2 * m) * k / 4)
        img[y, m:width - m] = 225
    img[m:height - m, m] = 0
    img[height - m, m:width - m] = 0
    colors = [(31, 119, 180), (255, 127, 14), (44, 160, 44), (214, 39, 40)]
    for (name, v), c in zip(series.items(), colors):
        v = np.asarray(v, float)
        if not len(v):
            continue
        v = np.log10(np.maximum(v, 1e-6)) if log else v
        xs = m + (np.arange(len(v)) / max(len(v) - 1, 1) * (width - 2 * m - 1))
        yv = height - m - (v - lo) / (hi - lo) * (height - 2 * m - 1)
        for i in range(len(v) - 1):
            n = int(max(abs(xs[i + 1] - xs[i]), abs(yv[i + 1] - yv[i]), 1)) + 1
            px = np.linspace(xs[i], xs[i + 1], n).astype(int)
            py = np.linspace(yv[i], yv[i + 1], n).astype(int)
            for dy in (0, 1):
                img[np.clip(py + dy, 0, height - 1), np.clip(px, 0, width - 1)] = c
    write_png(path, img)
