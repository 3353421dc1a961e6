"""Finding, creating and opening a board's file in POSIX shared memory (/dev/shm).

Linux's shm_open(name) is open("/dev/shm/name", O_NOFOLLOW | O_CLOEXEC): the same file, so the
C++ side or any tool can open what Python creates. The name holds the user's uid and the GPU's
UUID (or index), so each user has one board per GPU and users never share one.

Creation is atomic: the first process writes a complete header into a private temporary file
and link()s it to the board's name, so no reader ever sees a half-made board, and of two
processes creating at once one links and the other opens the winner's file. Opening checks the
file before trusting a byte of it: a regular file, not a link, owned by this user, mode 0600
(nobody else can write it), a size the header can describe.
"""

from __future__ import annotations

import mmap
import os
import re
import stat
from typing import Optional, Tuple

from . import layout

DEFAULT_DIRECTORY = "/dev/shm"
PREFIX = "vramledger-board"
_DEVICE_KEY = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")


class BoardError(RuntimeError):
    """A board that cannot be used; the message names the file and what to do."""


def board_directory() -> str:
    """$VRAMLEDGER_BOARD_DIR (tests, or machines without /dev/shm), else /dev/shm."""
    return os.environ.get("VRAMLEDGER_BOARD_DIR") or DEFAULT_DIRECTORY


def board_path(device_key: str, directory: Optional[str] = None, uid: Optional[int] = None) -> str:
    if not _DEVICE_KEY.match(device_key):
        raise ValueError(f"vramledger board: device key {device_key!r} must be 1-64 characters "
                         "of letters, digits, '.', '_' or '-' (a GPU UUID such as "
                         "GPU-8f6c..., or idx0)")
    uid = os.geteuid() if uid is None else uid
    return os.path.join(directory or board_directory(), f"{PREFIX}-{uid}-{device_key}")


def _check_opened(fd: int, path: str) -> int:
    """The file's size once it has passed the ownership and permission checks."""
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode):
        raise BoardError(f"vramledger board {path}: not a regular file")
    if info.st_uid != os.geteuid():
        raise BoardError(f"vramledger board {path}: owned by uid {info.st_uid}, not by this user "
                         f"({os.geteuid()}); refusing to trust it")
    if info.st_mode & 0o077:
        raise BoardError(f"vramledger board {path}: mode {info.st_mode & 0o777:04o} lets other "
                         "users read or write it (expected 0600); refusing to trust it. Remove "
                         "it when no vramledger process runs")
    if info.st_size > layout.file_size(layout.MAX_SLOTS):
        raise BoardError(f"vramledger board {path}: {info.st_size} bytes, larger than any board "
                         f"({layout.file_size(layout.MAX_SLOTS)})")
    return info.st_size


def _open_existing(path: str, writable: bool) -> Optional[int]:
    flags = (os.O_RDWR if writable else os.O_RDONLY) | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        return os.open(path, flags)
    except FileNotFoundError:
        return None
    except OSError as error:
        raise BoardError(f"vramledger board {path}: cannot open ({error.strerror}); a symbolic "
                         "link or someone else's file there is refused") from error


def _create(path: str, device_key: str, slot_count: int) -> None:
    """Links a fully written board at `path`; a no-op when another process won the race."""
    directory = os.path.dirname(path)
    temporary = os.path.join(directory, f".{os.path.basename(path)}.{os.urandom(8).hex()}.tmp")
    try:
        fd = os.open(temporary, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                     0o600)
    except OSError as error:
        raise BoardError(f"vramledger board {path}: cannot create it in {directory} "
                         f"({error.strerror}); set VRAMLEDGER_BOARD_DIR to a folder of "
                         "this user's, or VRAMLEDGER_BOARD=0") from error
    try:
        os.fchmod(fd, 0o600)  # whatever the umask
        os.ftruncate(fd, layout.file_size(slot_count))
        os.pwrite(fd, layout.encode_header(slot_count, os.geteuid(), device_key), 0)
        try:
            os.link(temporary, path)
        except FileExistsError:
            pass
    finally:
        os.close(fd)
        os.unlink(temporary)


def open_board_file(device_key: str, directory: Optional[str] = None, create: bool = True,
                    writable: bool = True,
                    slot_count: int = layout.DEFAULT_SLOTS) -> Tuple[int, mmap.mmap, str]:
    """(fd, mapping of the whole file, path); BoardError when it does not exist (create=False)
    or cannot be trusted; layout.BoardFormatError (wrapped in BoardError) when its header is
    wrong. The mapping is shared: the owner's writes are visible to every process at once."""
    path = board_path(device_key, directory)
    fd = _open_existing(path, writable)
    if fd is None:
        if not create:
            raise BoardError(f"vramledger board {path}: does not exist (no vramledger process "
                             "has published on this GPU)")
        if not 1 <= slot_count <= layout.MAX_SLOTS:
            raise ValueError(f"slot count {slot_count} outside [1, {layout.MAX_SLOTS}]")
        _create(path, device_key, slot_count)
        fd = _open_existing(path, writable)
        if fd is None:
            raise BoardError(f"vramledger board {path}: vanished right after being created")
    try:
        size = _check_opened(fd, path)
        if size < layout.HEADER_SIZE:
            raise layout.BoardFormatError(f"file is {size} bytes, shorter than a board header "
                                          f"({layout.HEADER_SIZE} bytes)")
        mapping = mmap.mmap(fd, size, mmap.MAP_SHARED,
                            mmap.PROT_READ | (mmap.PROT_WRITE if writable else 0))
        try:
            header = layout.decode_header(bytes(mapping[:layout.HEADER_SIZE]), size)
            if header.uid != os.geteuid():
                raise layout.BoardFormatError(f"header names uid {header.uid}, not this user")
            if header.device_id != device_key:
                raise layout.BoardFormatError(f"header names device {header.device_id!r}, the "
                                              f"file name {device_key!r}")
        except Exception:
            mapping.close()
            raise
    except layout.BoardFormatError as error:
        os.close(fd)
        raise BoardError(f"vramledger board {path}: {error}. Remove the file when no vramledger "
                         "process runs on this GPU; vramledger creates a fresh one") from error
    except BaseException:
        os.close(fd)
        raise
    return fd, mapping, path


def list_boards(directory: Optional[str] = None) -> list:
    """(device key, path) of this user's boards, sorted."""
    directory = directory or board_directory()
    prefix = f"{PREFIX}-{os.geteuid()}-"
    try:
        names = os.listdir(directory)
    except OSError:
        return []
    return sorted((name[len(prefix):], os.path.join(directory, name)) for name in names
                  if name.startswith(prefix) and _DEVICE_KEY.match(name[len(prefix):]))
