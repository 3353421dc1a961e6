"""The same functions as the _C extension, over libvramledger_torch.so through ctypes.

Used when the extension was not built (Meson found no Python headers for the interpreter): the
library exports everything the package needs as plain C functions (vramledger_c_api.h).
"""

from __future__ import annotations

import ctypes

from ._library import library_path  # noqa: F401  (part of the same interface as _C)

_lib = ctypes.CDLL(library_path(), mode=ctypes.RTLD_GLOBAL)
_lib.vramledger_install.argtypes = [ctypes.c_char_p]
_lib.vramledger_install.restype = ctypes.c_int
_lib.vramledger_is_installed.restype = ctypes.c_int
_lib.vramledger_last_error.restype = ctypes.c_char_p
_lib.vramledger_stats_json.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_size_t]
_lib.vramledger_stats_json.restype = ctypes.c_size_t
_lib.vramledger_report.argtypes = [ctypes.c_char_p, ctypes.c_size_t]
_lib.vramledger_report.restype = ctypes.c_size_t
_lib.vramledger_process_report.argtypes = [ctypes.c_int, ctypes.c_char_p]
_lib.vramledger_process_report.restype = ctypes.c_char_p
_lib.vramledger_empty_cache.restype = ctypes.c_int
_lib.vramledger_reset_peak_stats.argtypes = [ctypes.c_int]
_lib.vramledger_reset_accumulated_stats.argtypes = [ctypes.c_int]
_lib.vramledger_tag_push.argtypes = [ctypes.c_char_p]
_lib.vramledger_tag_push.restype = ctypes.c_int
# Absent from a plugin built before the budget board (issue 18): set_oom_note says so.
if hasattr(_lib, "vramledger_set_oom_note"):
    _lib.vramledger_set_oom_note.argtypes = [ctypes.c_int, ctypes.c_char_p]
    _lib.vramledger_set_oom_note.restype = ctypes.c_int


def _raise_last_error() -> None:
    raise RuntimeError(_lib.vramledger_last_error().decode("utf-8", "replace"))


def _string(fill) -> str:
    length = fill(None, 0)
    buffer = ctypes.create_string_buffer(length + 1)
    fill(buffer, length + 1)
    return buffer.raw[:length].decode("utf-8", "replace")


def install(conf: str = "") -> None:
    if _lib.vramledger_install(conf.encode()) != 0:
        _raise_last_error()


def is_installed() -> bool:
    return bool(_lib.vramledger_is_installed())


def stats_json(device: int) -> str:
    return _string(lambda buffer, size: _lib.vramledger_stats_json(device, buffer, size))


def report() -> str:
    return _string(_lib.vramledger_report)


def process_report(device: int, format: str = "text") -> str:
    # c_char_p copies the thread-owned result into a bytes object at once.
    result = _lib.vramledger_process_report(device, format.encode())
    if result is None:
        _raise_last_error()
    return result.decode("utf-8", "replace")


def empty_cache() -> None:
    if _lib.vramledger_empty_cache() != 0:
        _raise_last_error()


def reset_peak_stats(device: int) -> None:
    _lib.vramledger_reset_peak_stats(device)


def reset_accumulated_stats(device: int) -> None:
    _lib.vramledger_reset_accumulated_stats(device)


def tag_push(name: str) -> None:
    if _lib.vramledger_tag_push(name.encode()) != 0:
        _raise_last_error()


def tag_pop() -> None:
    _lib.vramledger_tag_pop()



def set_oom_note(device: int, text: str) -> None:
    """The sentence vramledger's OutOfMemoryError carries on `device` (docs/board.md)."""
    if not hasattr(_lib, "vramledger_set_oom_note"):
        raise RuntimeError("vramledger_set_oom_note missing: the plugin predates the budget "
                           "board; reinstall vramledger")
    if _lib.vramledger_set_oom_note(device, text.encode("utf-8", "replace")) != 0:
        _raise_last_error()
