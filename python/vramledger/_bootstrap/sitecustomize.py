"""vramledger's startup hook, put first on PYTHONPATH by `vramledger run`.

Python imports `sitecustomize` at startup, before the program's code. This one (1) runs the
sitecustomize it shadows, if there is one, and (2) arranges for vramledger.install() to run the
moment `import torch` completes — before the program can allocate CUDA memory, and without
importing torch in programs that never use it.

A failed install raises from `import torch` (the program asked to run under vramledger; running
it silently without would mislead). VRAMLEDGER_REPORT=stderr|PATH prints the report at exit;
VRAMLEDGER_PROCESS_REPORT=stderr|PATH prints vramledger.process_report() of every device
vramledger used at exit.
"""

import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))


def _run_shadowed_sitecustomize():
    path = [p for p in sys.path if os.path.abspath(p or os.curdir) != _HERE]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", path)
    if spec is not None and spec.loader is not None:
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)


def _write(variable, text):
    destination = os.environ.get(variable, "")
    if destination in ("", "stderr", "-"):
        sys.stderr.write(text)
    else:
        with open(destination, "a", encoding="utf-8") as handle:
            handle.write(f"--- pid {os.getpid()}: {' '.join(sys.argv)}\n{text}")


def _write_report():
    import vramledger

    _write("VRAMLEDGER_REPORT", vramledger.report())


def _write_process_report():
    import vramledger

    devices = vramledger.used_devices()
    if not devices:
        text = "vramledger: no CUDA memory allocated through vramledger: no process report\n"
    else:
        text = "".join(vramledger.process_report(device) for device in devices)
    _write("VRAMLEDGER_PROCESS_REPORT", text)


def _backend_the_program_chose():
    """The allocator backend the program itself asked torch for, if any: torch reads
    PYTORCH_ALLOC_CONF (2.9+) or PYTORCH_CUDA_ALLOC_CONF when `import torch` runs, so a program
    that sets `backend:cudaMallocAsync` there before importing torch has chosen torch's
    cudaMallocAsync allocator. `backend:native` is torch's default, which vramledger replaces."""
    for variable in ("PYTORCH_ALLOC_CONF", "PYTORCH_CUDA_ALLOC_CONF"):
        for item in os.environ.get(variable, "").split(","):
            key, _, value = item.partition(":")
            if key.strip() == "backend" and value.strip() not in ("", "native"):
                return variable, value.strip()
    return None


def _install_vramledger():
    import vramledger

    chosen = _backend_the_program_chose()
    if chosen is not None and os.environ.get("VRAMLEDGER_OVERRIDE_BACKEND") != "1":
        # An explicit choice of another allocator in the program's own environment wins over
        # the launcher's default; say so, once, rather than silently replacing it.
        sys.stderr.write(
            f"vramledger: {chosen[0]} selects backend:{chosen[1]}; leaving torch's allocator in "
            "place for this process (VRAMLEDGER_OVERRIDE_BACKEND=1 installs vramledger anyway)\n"
        )
        return
    vramledger.install(os.environ.get("VRAMLEDGER_CONF", ""))
    import atexit

    if os.environ.get("VRAMLEDGER_REPORT"):
        atexit.register(_write_report)
    if os.environ.get("VRAMLEDGER_PROCESS_REPORT"):
        atexit.register(_write_process_report)


class _InstallAfterTorchImport(importlib.abc.MetaPathFinder):
    """Finds `torch` through the other finders and wraps its loader, once."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname != "torch":
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec("torch")
        if spec is None or spec.loader is None:
            return spec
        loader = spec.loader
        exec_torch = loader.exec_module

        def exec_module(module):
            exec_torch(module)
            _install_vramledger()

        loader.exec_module = exec_module
        return spec


_run_shadowed_sitecustomize()
if os.environ.get("VRAMLEDGER_AUTOINSTALL") == "1":
    if "torch" in sys.modules:
        _install_vramledger()
    else:
        sys.meta_path.insert(0, _InstallAfterTorchImport())
