"""Lock step for sibling processes: each step starts when every sibling has reached it.

compare_allocators.py --together runs a workload's allocators at the same time, one process
each, on one GPU. The host's speed drifts by 20-30% over seconds on the H200 machine (the same
native process measured 91-123 ms median steps in one call), which no number of back-to-back
runs averages away; started together, step i of every allocator runs at the same moment, so the
drift hits all of them alike and the paired per-step ratio sees the allocator alone. The price
is that they share the GPU, which the A/A control (native-again, also in the group) measures.

The barrier is a folder of empty files, `<step>.<party>`, one per party per step, polled; a
party that ends early writes `gone.<party>` so nobody waits for it. A wait that outlasts
`timeout_s` breaks the barrier for the rest of the run (recorded, never a hang).
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any, Dict, List, Optional


class StepBarrier:
    def __init__(self, folder: Path, me: str, parties: List[str], timeout_s: float = 120.0,
                 poll_s: float = 0.0002) -> None:
        if me not in parties:
            raise ValueError(f"step barrier: {me!r} is not one of the parties {parties}")
        self.folder = Path(folder)
        self.folder.mkdir(parents=True, exist_ok=True)
        self.me = me
        self.others = [p for p in parties if p != me]
        self.timeout_s = timeout_s
        self.poll_s = poll_s
        self.waited_s = 0.0
        self.broken_at: Optional[int] = None

    def _touch(self, name: str) -> None:
        (self.folder / name).touch()

    def _arrived(self, party: str, step: int) -> bool:
        return (os.path.exists(self.folder / f"{step}.{party}")
                or os.path.exists(self.folder / f"gone.{party}"))

    def wait(self, step: int) -> None:
        """Returns once every other party has reached `step` (or left)."""
        self._touch(f"{step}.{self.me}")
        if self.broken_at is not None:
            return
        started = time.perf_counter()
        waiting = list(self.others)
        while waiting:
            waiting = [p for p in waiting if not self._arrived(p, step)]
            if not waiting:
                break
            if time.perf_counter() - started > self.timeout_s:
                self.broken_at = step
                break
            time.sleep(self.poll_s)
        self.waited_s += time.perf_counter() - started

    def leave(self) -> None:
        """This party takes no further steps: the others stop waiting for it."""
        try:
            self._touch(f"gone.{self.me}")
        except OSError:
            pass

    def record(self) -> Dict[str, Any]:
        return {"parties": [self.me] + self.others, "waited_s": round(self.waited_s, 3),
                "broken_at_step": self.broken_at}
