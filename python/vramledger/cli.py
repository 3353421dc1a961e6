"""The `vramledger` command.

    vramledger run [--conf CONF] [--report[=PATH]] [--report-on-exit[=PATH]]
                   [--track-non-torch | --no-track-non-torch] [--route-non-torch[=LIBRARIES]]
                   -- python app.py [args...]

runs an unmodified program with vramledger installed as torch's CUDA allocator. How: the command
is started with a bootstrap folder first on PYTHONPATH whose sitecustomize.py (run by every
Python interpreter at startup, before user code) waits for `import torch` to finish and then
calls vramledger.install(), before the program can allocate anything. The program's own
sitecustomize, if any, still runs. Child Python processes inherit the variables, so they are
covered too. --report prints vramledger.report() when each process exits (to stderr, or
appended to PATH).

--report-on-exit prints vramledger.process_report() for every device vramledger used when each
process exits (to stderr, or appended to PATH): the process's memory in additive lines that sum
to the driver's per-process figure (docs/classification.md).

--track-non-torch puts the LD_PRELOAD shim libvramledger_preload.so first in LD_PRELOAD, so the
process report has one line per library for memory allocated outside torch (NCCL, cuBLAS, ...;
docs/preload.md). It is on by default when the shim is found (vramledger._library.
preload_library_path: $VRAMLEDGER_PRELOAD_LIBRARY, next to the package, or next to / in the build
tree of $VRAMLEDGER_LIBRARY), off otherwise; --no-track-non-torch turns it off, and
--track-non-torch fails when the shim is not found.

--route-non-torch turns on the shim's routing mode (VRAMLEDGER_PRELOAD_ROUTE; docs/preload.md):
other libraries' cudaMalloc / cuMemAlloc are served by a vramledger cache (libvramledger_route.so
next to the shim). LIBRARIES: 1 (the default set: all but NCCL), all, or a list such as
cublas,user. It needs the shim, so it implies --track-non-torch.

    vramledger where

prints the paths of vramledger's parts: the shared library for CUDAPluggableAllocator, the
LD_PRELOAD shim, the routing mode's library (next to the shim) and the bootstrap folder, one a
line; a part that is missing reads "not found (...)" with the reason, and the exit status is 1.

    vramledger top [--json] [--once] [--interval S] [--dir DIR]

shows the processes on each GPU with their additive lines and claims, from this user's budget
boards (vramledger/top.py, docs/board.md); needs neither torch nor a GPU.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import List, Optional

BOOTSTRAP_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_bootstrap")
PACKAGE_PARENT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run_environment(conf: Optional[str], report: Optional[str], base: dict,
                    process_report: Optional[str] = None,
                    preload: Optional[str] = None, route: Optional[str] = None) -> dict:
    """The environment `vramledger run` starts the command with. preload: the shim to put
    first in LD_PRELOAD (None: LD_PRELOAD untouched); route: VRAMLEDGER_PRELOAD_ROUTE."""
    env = dict(base)
    paths = [BOOTSTRAP_DIR, PACKAGE_PARENT]
    if env.get("PYTHONPATH"):
        paths.append(env["PYTHONPATH"])
    env["PYTHONPATH"] = os.pathsep.join(paths)
    env["VRAMLEDGER_AUTOINSTALL"] = "1"
    if conf is not None:
        env["VRAMLEDGER_CONF"] = conf
    if report is not None:
        env["VRAMLEDGER_REPORT"] = report
    if process_report is not None:
        env["VRAMLEDGER_PROCESS_REPORT"] = process_report
    if preload is not None:
        # glibc splits LD_PRELOAD at spaces and colons; ours goes first, once.
        others = [entry for entry in env.get("LD_PRELOAD", "").replace(":", " ").split()
                  if entry != preload]
        env["LD_PRELOAD"] = " ".join([preload] + others)
    if route is not None:
        env["VRAMLEDGER_PRELOAD_ROUTE"] = route
    return env


# --- The configuration string, checked before the program starts -------------------------------
# A program that never imports torch never installs vramledger, so a bad --conf would go
# unnoticed (issue 16). The C++ parser (allocator/config.cpp) is the reference; this mirrors its
# keys and bounds so that the check needs no native library, and tests/bad_input/test_tools.py
# holds the two to the same verdicts.
_KIB, _MIB, _GIB, _TIB = 1 << 10, 1 << 20, 1 << 30, 1 << 40
_DEVICE_MAX = 4 * _TIB
_CONF_SPACE = " \t\n\r\v\f"
# key: (setting, unit, unit name, zero invalid, accepts 'unlimited', power of two, max bytes)
_CONF_SIZES = {
    "round_bytes": ("round_bytes", 1, "bytes", True, False, True, _GIB),
    "small_size_limit_kb": ("small_size_limit_kb", _KIB, "KiB", False, False, False, _DEVICE_MAX),
    "small_segment_mb": ("small_segment_mb", _MIB, "MiB", True, False, False, _DEVICE_MAX),
    "large_segment_mb": ("large_segment_mb", _MIB, "MiB", True, False, False, _DEVICE_MAX),
    "max_split_mb": ("max_split_mb", _MIB, "MiB", False, False, False, _DEVICE_MAX),
    "page_mb": ("page_mb", _MIB, "MiB", False, False, False, _GIB),
    "span_gb": ("span_gb", _GIB, "GiB", False, False, False, 2 * _DEVICE_MAX),
    "max_free_mapped_mb": ("max_free_mapped_mb", _MIB, "MiB", False, True, False, _DEVICE_MAX),
    "max_free_physical_mb": ("max_free_physical_mb", _MIB, "MiB", False, True, False,
                             _DEVICE_MAX),
    "map_chunk_mb": ("map_chunk_mb", _MIB, "MiB", True, False, False, _DEVICE_MAX),
    "cross_stream_slack_pct": ("cross_stream_slack", 10, "percent", False, False, False,
                               100000),
    "cross_stream_slack_permille": ("cross_stream_slack", 1, "per mille", False, False, False,
                                    100000),
    "cross_stream_cold_allocs": ("cross_stream_cold_allocs", 1, "allocations", False, False,
                                 False, 1 << 40),
    "cross_stream_cold_streams": ("cross_stream_cold_streams", 1, "streams", False, False,
                                  False, 1 << 20),
    "stream_lanes": ("stream_lanes", 1, "lanes", True, False, False, 32),
    "cap_mb": ("cap", _MIB, "MiB", False, False, False, _DEVICE_MAX),
    "cap_gb": ("cap", _GIB, "GiB", False, False, False, _DEVICE_MAX),
    "front_cache_mb": ("front_cache_mb", _MIB, "MiB", False, False, False, _DEVICE_MAX),
}
_CONF_BOOLS = ("paged_heap", "alias_pending_pages", "adopt_pending_frees",
               "place_by_mapped_pages", "sleepable_graph_pools",
               "unmap_in_background")
_CONF_BACKENDS = ("auto", "simulated", "cuda_malloc", "vmm", "malloc_async")


def conf_problem(text: str) -> Optional[str]:
    """Why the allocator would refuse the configuration string `text`, or None."""
    if not text.strip(_CONF_SPACE):
        return None
    settings = set()
    sizes = {}
    for entry in text.split(","):
        entry = entry.strip(_CONF_SPACE)
        if not entry:
            return f"empty entry in '{text}' (a stray comma?)"
        key, colon, value = entry.partition(":")
        key, value = key.strip(_CONF_SPACE), value.strip(_CONF_SPACE)
        if not key:
            return f"entry '{entry}' has no key before ':'"
        if key != "backend" and key not in _CONF_SIZES and key not in _CONF_BOOLS:
            return f"unknown key '{key}'"
        if not value:
            return f"key '{key}' has no value (write {key}:VALUE)"
        setting = _CONF_SIZES[key][0] if key in _CONF_SIZES else key
        if setting in settings:
            return (f"key '{key}' is given twice, or with another spelling of it (cap_mb and "
                    "cap_gb; cross_stream_slack_pct and cross_stream_slack_permille)")
        settings.add(setting)
        invalid = f"key '{key}' has invalid value '{value}'"
        if key == "backend":
            if value not in _CONF_BACKENDS:
                return f"{invalid}: expected auto, simulated, cuda_malloc, vmm or malloc_async"
        elif key in _CONF_BOOLS:
            if value.lower() not in ("true", "false"):
                return f"{invalid}: expected true or false"
        else:
            _, unit, unit_name, zero_invalid, unlimited, power_of_two, max_bytes = _CONF_SIZES[key]
            if unlimited and value == "unlimited":
                continue
            if not value.isascii() or not value.isdigit():
                return f"{invalid}: expected a whole number of {unit_name}"
            units = int(value)
            if units == 0 and zero_invalid:
                return f"{invalid}: 0 is not allowed"
            if power_of_two and units & (units - 1):
                return f"{invalid}: must be a power of two"
            if units * unit > max_bytes:
                return f"{invalid}: at most {max_bytes // unit} {unit_name}"
            sizes[key] = units * unit
    limit = sizes.get("small_size_limit_kb", 0)
    segment = sizes.get("small_segment_mb", 2 * _MIB)
    if limit > segment:
        return (f"small_size_limit_kb {limit // _KIB} KiB exceeds small_segment_mb "
                f"{segment // _MIB} MiB: every small request must fit in a small segment")
    return None


def choose_preload(track: Optional[bool]) -> "tuple[Optional[str], Optional[str]]":
    """(shim path or None, error or None) for --track-non-torch (True), --no-track-non-torch
    (False) or neither (None: on when the shim is found)."""
    if track is False:
        return None, None
    from ._library import preload_library_path

    path = preload_library_path()
    if path is not None and os.path.exists(path):
        return os.path.abspath(path), None
    if track is None:
        if path is not None:  # named by $VRAMLEDGER_PRELOAD_LIBRARY, but not there: say so
            print(f"vramledger run: libvramledger_preload.so {path} not found: non-torch memory "
                  "is not tracked", file=sys.stderr)
        return None, None
    where = path if path is not None else "not found (set VRAMLEDGER_PRELOAD_LIBRARY)"
    return None, f"vramledger run: --track-non-torch: libvramledger_preload.so {where}"


def where() -> int:
    """`vramledger where`: each part's path, or why it is missing; 1 when a part is missing."""
    from ._library import library_path, preload_library_path, route_library_path

    missing = 0
    try:
        plugin = library_path()
        if not os.path.exists(plugin):
            plugin, missing = f"not found ({plugin} does not exist)", missing + 1
    except (ImportError, OSError) as error:  # neither next to the package nor loadable via torch
        plugin, missing = f"not found (libvramledger_torch.so: {error})", missing + 1
    shim = preload_library_path()
    if shim is None:
        shim, missing = ("not found (no libvramledger_preload.so next to the package; "
                         "set VRAMLEDGER_PRELOAD_LIBRARY)"), missing + 1
    elif not os.path.exists(shim):
        shim, missing = f"not found ({shim} does not exist)", missing + 1
    route = route_library_path()
    if route is None:
        route, missing = "not found (no libvramledger_route.so next to the shim)", missing + 1
    print(f"library   {plugin}")
    print(f"preload   {shim}")
    print(f"route     {route}")
    print(f"bootstrap {BOOTSTRAP_DIR}")
    return 1 if missing else 0


def _parse(argv: List[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="vramledger", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="run a program with vramledger installed")
    run.add_argument("--conf", default=None,
                     help="allocator configuration, e.g. 'backend:vmm,cap_gb:40' "
                          "(default: $VRAMLEDGER_CONF)")
    run.add_argument("--report", nargs="?", const="stderr", default=None, metavar="PATH",
                     help="print vramledger's report at exit (to stderr, or append to PATH)")
    run.add_argument("--report-on-exit", nargs="?", const="stderr", default=None,
                     metavar="PATH", dest="process_report",
                     help="print vramledger.process_report() for every device used at exit "
                          "(to stderr, or append to PATH)")
    run.add_argument("--track-non-torch", action=argparse.BooleanOptionalAction, default=None,
                     help="LD_PRELOAD the shim that counts non-torch CUDA memory by library "
                          "(default: on when libvramledger_preload.so is found)")
    run.add_argument("--route-non-torch", nargs="?", const="1", default=None, metavar="LIBRARIES",
                     help="serve other libraries' cudaMalloc/cuMemAlloc from vramledger's cache "
                          "(the shim's routing mode; LIBRARIES: 1 = all but NCCL (default), all, "
                          "or e.g. cublas,user)")
    run.add_argument("argv", nargs=argparse.REMAINDER, help="-- COMMAND [ARGS...]")
    sub.add_parser("where", help="print the paths of the plugin, the LD_PRELOAD shim, the routing "
                                 "library and the bootstrap folder")
    top = sub.add_parser("top", help="the processes on each GPU by category, from the budget "
                                     "boards (docs/board.md)")
    top.add_argument("--json", action="store_true", help="print one JSON document and exit")
    top.add_argument("--once", action="store_true", help="print the table once and exit")
    top.add_argument("--interval", type=float, default=1.0, help="seconds between refreshes")
    top.add_argument("--dir", default=None, help="board folder (default: $VRAMLEDGER_BOARD_DIR "
                                                 "or /dev/shm)")
    return parser.parse_args(argv)


def main(argv: Optional[List[str]] = None) -> int:
    args = _parse(sys.argv[1:] if argv is None else argv)
    if args.command == "where":
        return where()
    if args.command == "top":
        from .top import main as top_main

        return top_main(args.json, args.once, args.interval, args.dir)
    command = list(args.argv)
    if command and command[0] == "--":
        command = command[1:]
    if not command:
        print("vramledger run: no command given (vramledger run -- python app.py)", file=sys.stderr)
        return 2
    conf = args.conf if args.conf is not None else os.environ.get("VRAMLEDGER_CONF")
    problem = conf_problem(conf) if conf is not None else None
    if problem is not None:
        source = "--conf" if args.conf is not None else "$VRAMLEDGER_CONF"
        print(f"vramledger run: {source}: allocator config: {problem} (nothing was started)",
              file=sys.stderr)
        return 2
    track = args.track_non_torch
    if args.route_non_torch is not None:
        if track is False:
            print("vramledger run: --route-non-torch needs the shim: drop --no-track-non-torch",
                  file=sys.stderr)
            return 2
        track = True
    preload, error = choose_preload(track)
    if error is not None:
        print(error.replace("--track-non-torch", "--route-non-torch")
              if args.route_non_torch is not None and args.track_non_torch is None else error,
              file=sys.stderr)
        return 2
    env = run_environment(args.conf, args.report, os.environ, args.process_report, preload,
                          args.route_non_torch)
    try:
        os.execvpe(command[0], command, env)
    except OSError as error:
        print(f"vramledger run: cannot start {command[0]}: {error}", file=sys.stderr)
        return 127
    return 0  # not reached


if __name__ == "__main__":
    sys.exit(main())
