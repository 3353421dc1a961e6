"""The `vramledger` command.

    vramledger run [--conf CONF] [--report[=PATH]] -- python app.py [args...]

runs an unmodified program with vramledger installed as torch's CUDA allocator. How: the command
is started with a bootstrap folder first on PYTHONPATH whose sitecustomize.py (run by every
Python interpreter at startup, before user code) waits for `import torch` to finish and then
calls vramledger.install(), before the program can allocate anything. The program's own
sitecustomize, if any, still runs. Child Python processes inherit the variables, so they are
covered too. --report prints vramledger.report() when each process exits (to stderr, or
appended to PATH).

    vramledger where

prints the paths a non-Python integration needs (the shared library for
CUDAPluggableAllocator / LD_PRELOAD, and the bootstrap folder).
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import List, Optional

BOOTSTRAP_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_bootstrap")
PACKAGE_PARENT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run_environment(conf: Optional[str], report: Optional[str], base: dict) -> dict:
    """The environment `vramledger run` starts the command with."""
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
    return env


def _parse(argv: List[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="vramledger", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="run a program with vramledger installed")
    run.add_argument("--conf", default=None,
                     help="allocator configuration, e.g. 'backend:vmm,cap_gb:40' "
                          "(default: $VRAMLEDGER_CONF)")
    run.add_argument("--report", nargs="?", const="stderr", default=None, metavar="PATH",
                     help="print vramledger's report at exit (to stderr, or append to PATH)")
    run.add_argument("argv", nargs=argparse.REMAINDER, help="-- COMMAND [ARGS...]")
    sub.add_parser("where", help="print the library and bootstrap paths")
    return parser.parse_args(argv)


def main(argv: Optional[List[str]] = None) -> int:
    args = _parse(sys.argv[1:] if argv is None else argv)
    if args.command == "where":
        from ._library import library_path

        print(f"library   {library_path()}")
        print(f"bootstrap {BOOTSTRAP_DIR}")
        return 0
    command = list(args.argv)
    if command and command[0] == "--":
        command = command[1:]
    if not command:
        print("vramledger run: no command given (vramledger run -- python app.py)", file=sys.stderr)
        return 2
    env = run_environment(args.conf, args.report, os.environ)
    try:
        os.execvpe(command[0], command, env)
    except OSError as error:
        print(f"vramledger run: cannot start {command[0]}: {error}", file=sys.stderr)
        return 127
    return 0  # not reached


if __name__ == "__main__":
    sys.exit(main())
