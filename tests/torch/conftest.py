"""PyTorch integration tests (issue 4).

Layout:
  test_bootstrap.py      pure Python: the `vramledger run` hook and CLI; runs anywhere.
  test_installed.py      in this process, with vramledger installed before any CUDA allocation:
                         torch's memory APIs, CUDA graphs, streams, cudnn, tags, OOM.
  test_processes.py      each case in a fresh interpreter: refusal after a native allocation,
                         the pluggable path, MemPool, and bitwise-identical training vs native.

Without torch, without a GPU, or without the built vramledger package (tests/torch/run_on_gpu.sh
builds and stages it), the GPU tests skip with the reason.
"""

import os
import subprocess
import sys
import textwrap

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))


def _gpu_skip_reason():
    try:
        import torch
    except Exception as error:  # ImportError, or OSError from a missing CUDA library
        return f"torch not importable: {error}"
    if not torch.cuda.is_available():
        return "no CUDA device"
    try:
        import vramledger  # noqa: F401
        from vramledger import _C  # noqa: F401
    except Exception as error:
        return f"vramledger package not built/staged ({error}); see tests/torch/run_on_gpu.sh"
    return None


GPU_SKIP_REASON = _gpu_skip_reason()
needs_gpu = pytest.mark.skipif(GPU_SKIP_REASON is not None, reason=GPU_SKIP_REASON or "")


def run_python(code, env_extra=None, timeout=300, args=(), prefix=()):
    """Runs `code` in a fresh interpreter (optionally under a wrapper such as `vramledger run`);
    returns the CompletedProcess with text output."""
    env = dict(os.environ)
    env.update(env_extra or {})
    command = list(prefix) + [sys.executable, "-c", textwrap.dedent(code), *args]
    return subprocess.run(command, env=env, capture_output=True, text=True, timeout=timeout)


def torch_format_size(size):
    """c10::CachingAllocator::format_size, which torch's OOM message uses."""
    if size <= 1024:
        return f"{size} bytes"
    if size <= 1048576:
        return f"{size / 1024:.2f} KiB"
    if size <= 1073741824:
        return f"{size / 1048576:.2f} MiB"
    return f"{size / 1073741824:.2f} GiB"
