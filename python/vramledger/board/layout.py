"""The board's binary layout (docs/board.md, "Format") and its validation as untrusted input.

A board is one file: a header, then `slot_count` slots of `slot_size` bytes. Little-endian,
fixed-width fields, no pointers, so any process of any Python or C++ build reads the same bytes.

Every field read back is checked (magic, version, sizes, counts, checksums, byte figures that
add up and stay below 1 PiB): the file lives in /dev/shm where any process of the user can write
it, so a bug, a crash halfway or a hostile writer must give a clear error, never a crash or an
absurd budget. Decoding never trusts a length or a count it has not checked first.
"""

from __future__ import annotations

import struct
import zlib
from dataclasses import dataclass, field
from typing import List, Optional

MAGIC = b"VLBOARD1"
VERSION = 1
# magic, version, header_size, slot_size, slot_count, owner uid, reserved, device id, crc32.
HEADER = struct.Struct("<8sIIIIII64sI")
HEADER_SIZE = 128  # HEADER.size rounded up: room to grow without moving the slots
SLOT_SIZE = 256
DEFAULT_SLOTS = 64
MAX_SLOTS = 4096
MAX_BYTES = 1 << 50  # 1 PiB: no device holds more, so a larger figure is corruption
LABEL_BYTES = 32

# seq, pid, flags, start_time, published_ns, device_index, pad, device_total, process_usage,
# live, pending_frees, cached_usable, fragmentation, unmapped_physical, non_torch_tracked,
# remainder (signed: negative means a missing hook), peak_reserved, peak_allocated, num_ooms,
# claim_bytes, claim_ns, label; then crc32 over all of it.
SLOT_BODY = struct.Struct("<QiIQQiIqqqqqqqqqqqqqq32s")
SLOT_CRC = struct.Struct("<I")
assert HEADER.size <= HEADER_SIZE and SLOT_BODY.size + SLOT_CRC.size <= SLOT_SIZE

FLAG_PER_PROCESS = 1  # process_usage is NVML's per-process figure (else a device-wide fallback)
FLAG_ENFORCING = 2    # the process caps itself at its claim (docs/board.md, "Enforcement")
KNOWN_FLAGS = FLAG_PER_PROCESS | FLAG_ENFORCING


class BoardFormatError(ValueError):
    """The board file is not a vramledger board this version can trust."""


@dataclass
class Figures:
    """What one process publishes about one device: additive lines summing to process_usage."""

    device_index: int = 0
    device_total: int = 0
    process_usage: int = 0
    per_process: bool = False
    live: int = 0               # torch live, requested + rounding
    pending_frees: int = 0
    cached_usable: int = 0
    fragmentation: int = 0
    unmapped_physical: int = 0
    non_torch_tracked: int = 0  # the LD_PRELOAD shim's libraries
    remainder: int = 0          # context, modules, driver (and untracked non-torch memory)
    peak_reserved: int = 0
    peak_allocated: int = 0
    num_ooms: int = 0

    @property
    def torch_reserved(self) -> int:
        return (self.live + self.pending_frees + self.cached_usable + self.fragmentation
                + self.unmapped_physical)

    @property
    def non_torch(self) -> int:
        return self.non_torch_tracked + self.remainder

    def problem(self) -> Optional[str]:
        """Why these figures cannot be true, or None (the same check a reader applies)."""
        for name in ("device_total", "process_usage", "live", "pending_frees", "cached_usable",
                     "fragmentation", "unmapped_physical", "non_torch_tracked", "peak_reserved",
                     "peak_allocated", "num_ooms"):
            value = getattr(self, name)
            if not 0 <= value <= MAX_BYTES:
                return f"{name} {value} outside [0, 1 PiB]"
        if not -MAX_BYTES <= self.remainder <= MAX_BYTES:
            return f"remainder {self.remainder} outside [-1 PiB, 1 PiB]"
        if not -1 <= self.device_index < 1 << 16:
            return f"device index {self.device_index} impossible"
        total = self.torch_reserved + self.non_torch_tracked + self.remainder
        if total != self.process_usage:
            return f"lines sum to {total}, not to the process usage {self.process_usage}"
        return None


@dataclass
class Slot:
    """One slot as decoded; `figures` is None for a slot never published."""

    index: int
    seq: int
    pid: int
    flags: int
    start_time: int
    published_ns: int
    figures: Figures
    claim_bytes: int
    claim_ns: int
    label: str

    @property
    def enforcing(self) -> bool:
        return bool(self.flags & FLAG_ENFORCING)


@dataclass
class Header:
    slot_size: int
    slot_count: int
    uid: int
    device_id: str
    problems: List[str] = field(default_factory=list)


def encode_header(slot_count: int, uid: int, device_id: str) -> bytes:
    encoded_id = device_id.encode("ascii")
    if len(encoded_id) > 64:
        raise ValueError(f"device id {device_id!r} longer than 64 bytes")
    body = HEADER.pack(MAGIC, VERSION, HEADER_SIZE, SLOT_SIZE, slot_count, uid, 0, encoded_id, 0)
    crc = zlib.crc32(body[:HEADER.size - 4])
    return (body[:HEADER.size - 4] + struct.pack("<I", crc)).ljust(HEADER_SIZE, b"\0")


def file_size(slot_count: int) -> int:
    return HEADER_SIZE + slot_count * SLOT_SIZE


def decode_header(data: bytes, actual_size: int) -> Header:
    """The header of a board file of `actual_size` bytes; BoardFormatError says what is wrong."""
    if actual_size < HEADER_SIZE:
        raise BoardFormatError(f"file is {actual_size} bytes, shorter than a board header "
                               f"({HEADER_SIZE} bytes)")
    magic, version, header_size, slot_size, slot_count, uid, _, raw_id, crc = \
        HEADER.unpack_from(data, 0)
    if magic != MAGIC:
        raise BoardFormatError(f"wrong magic {magic!r} (expected {MAGIC!r}): not a vramledger "
                               "board, or overwritten")
    if version != VERSION:
        raise BoardFormatError(f"board format version {version}, this vramledger reads "
                               f"version {VERSION} only")
    if header_size != HEADER_SIZE or slot_size != SLOT_SIZE:
        raise BoardFormatError(f"header/slot sizes {header_size}/{slot_size}, expected "
                               f"{HEADER_SIZE}/{SLOT_SIZE}")
    if not 1 <= slot_count <= MAX_SLOTS:
        raise BoardFormatError(f"slot count {slot_count} outside [1, {MAX_SLOTS}]")
    if actual_size != file_size(slot_count):
        raise BoardFormatError(f"file is {actual_size} bytes but its header describes "
                               f"{file_size(slot_count)} ({slot_count} slots)")
    if zlib.crc32(data[:HEADER.size - 4]) != crc:
        raise BoardFormatError("header checksum mismatch (the header was altered)")
    device_id = raw_id.rstrip(b"\0")
    if not device_id or not all(32 < byte < 127 for byte in device_id):
        raise BoardFormatError(f"device id {raw_id!r} is not printable ASCII")
    return Header(slot_size=slot_size, slot_count=slot_count, uid=uid,
                  device_id=device_id.decode("ascii"))


def encode_slot(seq: int, pid: int, flags: int, start_time: int, published_ns: int,
                figures: Figures, claim_bytes: int, claim_ns: int, label: str) -> bytes:
    problem = figures.problem()
    if problem is not None:
        raise ValueError(f"vramledger board: refusing to publish impossible figures: {problem}")
    if not 0 <= claim_bytes <= MAX_BYTES:
        raise ValueError(f"vramledger board: claim {claim_bytes} outside [0, 1 PiB]")
    f = figures
    body = SLOT_BODY.pack(
        seq, pid, flags | (FLAG_PER_PROCESS if f.per_process else 0), start_time, published_ns,
        f.device_index, 0, f.device_total, f.process_usage, f.live, f.pending_frees,
        f.cached_usable, f.fragmentation, f.unmapped_physical, f.non_torch_tracked, f.remainder,
        f.peak_reserved, f.peak_allocated, f.num_ooms, claim_bytes, claim_ns,
        label.encode("utf-8", "replace")[:LABEL_BYTES])
    return (body + SLOT_CRC.pack(zlib.crc32(body))).ljust(SLOT_SIZE, b"\0")


def slot_offset(index: int) -> int:
    return HEADER_SIZE + index * SLOT_SIZE


def decode_slot(index: int, data: bytes) -> Optional[Slot]:
    """The slot at `index` from its SLOT_SIZE bytes; None for a slot never written (all zero);
    BoardFormatError for one whose checksum or figures are wrong (a torn read is retried by the
    caller before it believes that)."""
    if len(data) != SLOT_SIZE:
        raise BoardFormatError(f"slot {index}: {len(data)} bytes, expected {SLOT_SIZE}")
    if not any(data):
        return None
    body = data[:SLOT_BODY.size]
    (crc,) = SLOT_CRC.unpack_from(data, SLOT_BODY.size)
    if zlib.crc32(body) != crc:
        raise BoardFormatError(f"slot {index}: checksum mismatch")
    (seq, pid, flags, start_time, published_ns, device_index, _, device_total, usage, live,
     pending, cached, frag, unmapped, tracked, remainder, peak_reserved, peak_allocated, ooms,
     claim, claim_ns, label) = SLOT_BODY.unpack(body)
    if seq & 1:
        raise BoardFormatError(f"slot {index}: written halfway (odd sequence {seq})")
    if pid <= 0:
        raise BoardFormatError(f"slot {index}: pid {pid} impossible")
    if flags & ~KNOWN_FLAGS:
        raise BoardFormatError(f"slot {index}: unknown flags {flags:#x}")
    figures = Figures(device_index=device_index, device_total=device_total, process_usage=usage,
                      per_process=bool(flags & FLAG_PER_PROCESS), live=live,
                      pending_frees=pending, cached_usable=cached, fragmentation=frag,
                      unmapped_physical=unmapped, non_torch_tracked=tracked,
                      remainder=remainder, peak_reserved=peak_reserved,
                      peak_allocated=peak_allocated, num_ooms=ooms)
    problem = figures.problem()
    if problem is not None:
        raise BoardFormatError(f"slot {index}: {problem}")
    if not 0 <= claim <= MAX_BYTES:
        raise BoardFormatError(f"slot {index}: claim {claim} outside [0, 1 PiB]")
    return Slot(index=index, seq=seq, pid=pid, flags=flags, start_time=start_time,
                published_ns=published_ns, figures=figures, claim_bytes=claim, claim_ns=claim_ns,
                label=label.rstrip(b"\0").decode("utf-8", "replace"))
