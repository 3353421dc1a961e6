"""pytest plugin for scripts/torch_upstream_tests.sh (loaded with `-p upstream_plugin`, this
folder on PYTHONPATH), the same in both runs:

1. A per-test time limit when pytest-timeout is missing: $VRAMLEDGER_UPSTREAM_TEST_TIMEOUT_S
   seconds (0 or unset: none). Like pytest-timeout's "signal" method: SIGALRM raises in the
   test's main thread, so the test fails and the run goes on. A test stuck inside one long C call
   is interrupted only when that call returns; the run's own limit covers that case.

2. Fewer compiles: upstream TestMemPool builds its test allocator with load_inline from one of
   two sources (get_dummy_allocator(check_vars=True/False)) under one name, and torch rebuilds
   the extension each time the source differs from the previous call. In name order the tests
   alternate (4 builds a run); the tests of each source are moved next to each other (2 builds).
   Only the order changes, the same in both runs; $VRAMLEDGER_UPSTREAM_KEEP_ORDER=1 keeps
   pytest's own.
"""

import os
import signal

import pytest

# Upstream TestMemPool tests by the source their get_dummy_allocator() call compiles.
_SAME_EXTENSION_GROUPS = (
    ("test_deleted_mempool_not_used_on_oom", "test_mempool_expandable",
     "test_mempool_limited_memory_with_allocator"),  # check_vars=False
    ("test_mempool_empty_cache_inactive", "test_mempool_with_allocator",
     "test_tensor_delete_after_allocator_delete"),  # check_vars=True
)


def pytest_collection_modifyitems(session, config, items):
    if os.environ.get("VRAMLEDGER_UPSTREAM_KEEP_ORDER") == "1":
        return
    rank = {name: i for i, group in enumerate(_SAME_EXTENSION_GROUPS) for name in group}
    moved = [item for item in items
             if getattr(item, "cls", None) is not None and item.cls.__name__ == "TestMemPool"
             and item.name in rank]
    if len(moved) < 2:
        return
    first = items.index(moved[0])
    rest = [item for item in items if item not in moved]
    moved.sort(key=lambda item: rank[item.name])  # stable: name order inside a group
    items[:] = rest[:first] + moved + rest[first:]


class UpstreamTestTimeout(Exception):
    pass


def _limit():
    try:
        return int(os.environ.get("VRAMLEDGER_UPSTREAM_TEST_TIMEOUT_S", "0"))
    except ValueError:
        return 0


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    limit = _limit()
    if limit <= 0 or not hasattr(signal, "SIGALRM"):
        yield
        return

    def on_alarm(signum, frame):
        raise UpstreamTestTimeout(f"test exceeded the {limit}s per-test limit")

    previous = signal.signal(signal.SIGALRM, on_alarm)
    signal.alarm(limit)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)
