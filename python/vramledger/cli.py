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

prints the paths a non-Python integration needs (the shared library for
CUDAPluggableAllocator, the LD_PRELOAD shim, and the bootstrap folder).
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
    sub.add_parser("where", help="print the library and bootstrap paths")
    return parser.parse_args(argv)


def main(argv: Optional[List[str]] = None) -> int:
    args = _parse(sys.argv[1:] if argv is None else argv)
    if args.command == "where":
        from ._library import library_path

        from ._library import preload_library_path

        print(f"library   {library_path()}")
        print(f"preload   {preload_library_path() or 'not found'}")
        print(f"bootstrap {BOOTSTRAP_DIR}")
        return 0
    command = list(args.argv)
    if command and command[0] == "--":
        command = command[1:]
    if not command:
        print("vramledger run: no command given (vramledger run -- python app.py)", file=sys.stderr)
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
