#!/usr/bin/env python3
"""Renders an HTML report of a real corpus trace in headless Chromium and checks the screenshot.

usage: render_html_report.py VRAMLEDGER_REPORT TRACE CHROMIUM

Exits 77 (skipped) when CHROMIUM is empty. Keeps the files in $VRAMLEDGER_SCREENSHOT_DIR when set
(to look at the picture), else in a temporary folder.
"""
import os
import struct
import subprocess
import sys
import tempfile
import zlib

# Colours the report draws with (accounting/reports/timeline_svg.cpp).
REQUESTED = (0x4E, 0x79, 0xA7)
CACHED_USABLE = (0x59, 0xA1, 0x4F)


def decode_png(path):
    """Width, height and rows of RGB tuples of an 8-bit, non-interlaced RGB or RGBA PNG."""
    with open(path, "rb") as f:
        data = f.read()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    pos, idat, header = 8, b"", None
    while pos < len(data):
        length, kind = struct.unpack(">I4s", data[pos:pos + 8])
        body = data[pos + 8:pos + 8 + length]
        if kind == b"IHDR":
            header = struct.unpack(">IIBBBBB", body)
        elif kind == b"IDAT":
            idat += body
        pos += 12 + length
    width, height, depth, colour, _, _, interlace = header
    assert depth == 8 and colour in (2, 6) and interlace == 0, header
    channels = 3 if colour == 2 else 4
    raw = zlib.decompress(idat)
    stride = width * channels
    rows, previous, offset = [], bytearray(stride), 0
    for _ in range(height):
        kind, line = raw[offset], bytearray(raw[offset + 1:offset + 1 + stride])
        offset += 1 + stride
        for i in range(stride):  # undo the row filter (PNG spec, section 9)
            left = line[i - channels] if i >= channels else 0
            up = previous[i]
            up_left = previous[i - channels] if i >= channels else 0
            if kind == 1:
                line[i] = (line[i] + left) & 255
            elif kind == 2:
                line[i] = (line[i] + up) & 255
            elif kind == 3:
                line[i] = (line[i] + (left + up) // 2) & 255
            elif kind == 4:
                p = left + up - up_left
                pa, pb, pc = abs(p - left), abs(p - up), abs(p - up_left)
                predictor = left if pa <= pb and pa <= pc else (up if pb <= pc else up_left)
                line[i] = (line[i] + predictor) & 255
        rows.append([tuple(line[i:i + 3]) for i in range(0, stride, channels)])
        previous = line
    return width, height, rows


def near(pixel, colour, tolerance=40):
    return all(abs(a - b) <= tolerance for a, b in zip(pixel, colour))


def main():
    report, trace, chromium = sys.argv[1:4]
    if not chromium:
        print("no chromium found: skipped")
        return 77
    folder = os.environ.get("VRAMLEDGER_SCREENSHOT_DIR") or tempfile.mkdtemp(prefix="vrl-html-")
    os.makedirs(folder, exist_ok=True)
    html = os.path.join(folder, "report.html")
    png = os.path.join(folder, "report.png")
    subprocess.run([report, trace, "--html", html, "--samples", "400"], check=True)
    if os.path.exists(png):
        os.remove(png)
    subprocess.run([chromium, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                    "--window-size=1050,900", "--screenshot=" + png, "file://" + html],
                   check=True, timeout=120, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    size = os.path.getsize(png)
    width, height, rows = decode_png(png)
    pixels = [p for row in rows for p in row]
    white = sum(1 for p in pixels if p == (255, 255, 255))
    requested = sum(1 for p in pixels if near(p, REQUESTED))
    cached = sum(1 for p in pixels if near(p, CACHED_USABLE))
    print(f"{png}: {size} bytes, {width}x{height}, {len(pixels) - white} non-white pixels, "
          f"{requested} of the 'requested' colour, {cached} of 'cached, usable'")
    failures = []
    if size < 20_000:
        failures.append("screenshot suspiciously small")
    if len(pixels) - white < 0.05 * len(pixels):
        failures.append("almost everything is white")
    # The stacked chart is 960x360 units; real gpt2_train data fills a good part with 'requested'.
    if requested < 20_000:
        failures.append("too little of the 'requested' area is drawn")
    for failure in failures:
        print("FAIL:", failure)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
