"""The budget board (docs/board.md) on the CPU: several forked processes over a simulated GPU
(sim_device.py) publishing, claiming and profiling with vramledger.profiling; dead owners,
hostile board files, permissions, and `vramledger top --json`. Runs under pytest or as
`python3 test_board.py` (unittest)."""

from __future__ import annotations

import json
import multiprocessing
import os
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import time
import unittest
import zlib

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
PYTHON_DIR = os.path.join(HERE, "..", "..", "python")

from sim_device import GIB, H200_TOTAL, MIB, SimDevice, SimProcess  # noqa: E402
from instances import kill, run_instance  # noqa: E402
from vramledger.board import (Board, BoardError, Figures, claim_share, layout,  # noqa: E402
                              room_on_board)
from vramledger.board.enforcement import oom_note  # noqa: E402
from vramledger.profiling import MemoryProfile  # noqa: E402

FORK = multiprocessing.get_context("fork")


class BoardTest(unittest.TestCase):
    def setUp(self) -> None:
        self.dir = tempfile.mkdtemp(prefix="vramledger-board-test-")
        os.environ["VRAMLEDGER_BOARD_DIR"] = self.dir
        self.key = f"sim-{os.getpid()}-{self._testMethodName[-20:]}"
        self.children = []

    def tearDown(self) -> None:
        for child in self.children:
            if child.is_alive():
                kill(child)
        for board in list(Board._registry.values()):
            board.close()
        shutil.rmtree(self.dir, ignore_errors=True)

    def start(self, target, *args, **kwargs):
        child = FORK.Process(target=target, args=args, kwargs=kwargs, daemon=True)
        child.start()
        self.children.append(child)
        return child

    def results(self, queue, count, timeout=60):
        out = []
        deadline = time.monotonic() + timeout
        while len(out) < count:
            out.append(queue.get(timeout=max(0.1, deadline - time.monotonic())))
        for result in out:
            self.assertNotIn("error", result, result.get("error"))
        return sorted(out, key=lambda r: r["who"])

    # --- the file ------------------------------------------------------------------------

    def test_created_0600_named_by_uid_and_device(self):
        board = Board.open(self.key)
        info = os.stat(board.path)
        self.assertEqual(info.st_mode & 0o777, 0o600)
        self.assertEqual(os.path.basename(board.path),
                         f"vramledger-board-{os.geteuid()}-{self.key}")
        self.assertEqual(info.st_size, layout.file_size(layout.DEFAULT_SLOTS))
        # A umask that would open it up does not.
        old = os.umask(0)
        try:
            other = Board.open(self.key + "-b")
        finally:
            os.umask(old)
        self.assertEqual(os.stat(other.path).st_mode & 0o777, 0o600)

    def test_publish_and_claim_seen_by_another_process(self):
        figures = Figures(device_total=H200_TOTAL, process_usage=10 * GIB, per_process=True,
                          live=6 * GIB, cached_usable=1 * GIB, fragmentation=123,
                          non_torch_tracked=2 * GIB, remainder=1 * GIB - 123,
                          peak_reserved=8 * GIB, peak_allocated=7 * GIB, num_ooms=1)
        ready, done = FORK.Event(), FORK.Event()

        def owner():
            board = Board.open(self.key)
            board.acquire("owner")
            board.publish(figures)
            board.set_claim(40 * GIB)
            ready.set()
            done.wait(30)

        child = self.start(owner)
        self.assertTrue(ready.wait(30))
        view = Board.open(self.key, writable=False).read()
        self.assertEqual(len(view.slots), 1)
        slot = view.slots[0]
        self.assertEqual(slot.pid, child.pid)
        self.assertEqual(slot.label, "owner")
        self.assertEqual(slot.figures, figures)
        self.assertEqual(slot.claim_bytes, 40 * GIB)
        room = room_on_board(view, H200_TOTAL)
        self.assertEqual(room.others_bytes, 40 * GIB)  # max(holds 10, claims 40)
        self.assertEqual(room.room_bytes, H200_TOTAL - 40 * GIB)
        done.set()

    def test_impossible_figures_are_refused_when_published(self):
        board = Board.open(self.key)
        with self.assertRaises(ValueError):
            board.publish(Figures(process_usage=10, live=5, remainder=4))  # sums to 9
        with self.assertRaises(ValueError):
            board.publish(Figures(process_usage=-1, remainder=-1))

    # --- budgets -------------------------------------------------------------------------

    def _start_together(self, count, utilization, weights, activation, use_board=True):
        device = SimDevice(count)
        start, queue = FORK.Event(), FORK.Queue()
        for who in range(count):
            self.start(run_instance, who, device, self.key, utilization, weights, activation,
                       start, queue, use_board=use_board)
        time.sleep(0.2)
        start.set()
        return device, self.results(queue, count)

    def _check_fit(self, device, results):
        for result in results:
            self.assertIsNone(result["oom"], result)
            self.assertGreaterEqual(result["kv"], 0, result)
        self.assertLessEqual(sum(r["claimed"] for r in results), device.total)
        self.assertLessEqual(device.used(), device.total)
        view = Board.open(self.key, writable=False).read()
        self.assertEqual(len(view.slots), len(results))
        self.assertEqual(view.problems, [])

    def test_two_instances_started_together_fit(self):
        device, results = self._start_together(2, 0.5, 30 * GIB, 6 * GIB)
        self._check_fit(device, results)
        # utilization 1/2 of the device each: the board cuts nothing, every byte is used.
        for result in results:
            self.assertEqual(result["cut"], 0)
            self.assertEqual(result["claimed"], H200_TOTAL // 2)

    def test_four_instances_started_together_fit(self):
        device, results = self._start_together(4, 0.25, 14 * GIB, 3 * GIB)
        self._check_fit(device, results)
        for result in results:
            self.assertEqual(result["claimed"], H200_TOTAL // 4)

    def test_greedy_instances_are_cut_by_the_board(self):
        # Both ask for 60% of the device: without the board both take it and the second KV
        # cache does not fit; with it, the later decision gets what the first left.
        device, results = self._start_together(2, 0.6, 20 * GIB, 4 * GIB, use_board=False)
        self.assertTrue(any(result["oom"] for result in results), results)
        for child in self.children:
            kill(child)
        self.children = []
        for board in list(Board._registry.values()):
            board.close()
        os.unlink(os.path.join(self.dir, f"vramledger-board-{os.geteuid()}-{self.key}"))
        device, results = self._start_together(2, 0.6, 20 * GIB, 4 * GIB)
        self._check_fit(device, results)
        self.assertEqual(sorted(result["cut"] > 0 for result in results), [False, True])
        self.assertEqual(sum(result["claimed"] for result in results), H200_TOTAL)

    def test_killed_instance_share_is_recovered(self):
        count = 3
        device = SimDevice(count)
        start, queue = FORK.Event(), FORK.Queue()
        in_profile = [FORK.Event() for _ in range(count)]
        go_on, hold, never = FORK.Event(), FORK.Event(), FORK.Event()
        children = []
        for who in range(count):
            children.append(self.start(
                run_instance, who, device, self.key, 1 / 3, 20 * GIB, 4 * GIB, start, queue,
                upfront=True, in_profile=in_profile[who], go_on=go_on if who < 2 else never,
                utilization_after=0.5 if who < 2 else None, hold=hold))
        time.sleep(0.2)
        start.set()
        for event in in_profile:
            self.assertTrue(event.wait(30))
        view = Board.open(self.key, writable=False).read()
        self.assertEqual(len(view.slots), 3)
        victim_slot = next(s.index for s in view.slots if s.pid == children[2].pid)
        self.assertEqual(sum(s.claim_bytes for s in view.slots), 3 * (H200_TOTAL // 3))
        # The survivors ask for half the device while the victim still holds its third: cut.
        go_on.set()
        time.sleep(0.5)
        kill(children[2])  # SIGKILL, mid-profile
        device.reap(2)
        self.assertEqual(children[2].exitcode, -signal.SIGKILL)
        view = Board.open(self.key, writable=False).read()
        self.assertEqual(sorted(s.pid for s in view.slots),
                         sorted(c.pid for c in children[:2]))
        self.assertEqual(view.dead_slots, 1)
        hold.set()
        results = self.results(queue, 2)
        for result in results:
            self.assertGreater(result["cut_while_alive"], 0, result)
            self.assertEqual(result["cut"], 0, result)  # its share came back
            self.assertIsNone(result["oom"])
            self.assertGreaterEqual(result["kv"], 0)
        self.assertLessEqual(sum(r["claimed"] for r in results), H200_TOTAL)
        # The dead slot is taken again by the next process.
        reclaimed = FORK.Queue()

        def newcomer():
            board = Board.open(self.key)
            reclaimed.put(board.acquire("newcomer"))

        self.start(newcomer)
        self.assertEqual(reclaimed.get(timeout=30), victim_slot)

    def test_decision_lock_of_a_killed_process_is_released(self):
        board = Board.open(self.key)
        board.acquire("parent")
        holding = FORK.Event()

        def holder():
            mine = Board.open(self.key)
            mine.acquire("holder")
            with mine.decision():
                mine.set_claim(50 * GIB)
                holding.set()
                time.sleep(600)

        child = self.start(holder)
        self.assertTrue(holding.wait(30))
        with self.assertRaises(TimeoutError):
            with board.decision(timeout_s=0.2):
                pass
        kill(child)
        started = time.monotonic()
        with board.decision(timeout_s=2) as view:
            self.assertEqual([s.pid for s in view.others()], [])  # its claim went with it
        self.assertLess(time.monotonic() - started, 1.0)

    def test_torn_reads_are_never_believed(self):
        stop = FORK.Event()

        def writer():
            board = Board.open(self.key)
            board.acquire("writer")
            n = 0
            while not stop.is_set():
                n += 1
                live = (n * 4099) % (64 * GIB)
                board.publish(Figures(device_total=H200_TOTAL, process_usage=live + n,
                                      per_process=True, live=live, remainder=n))

        self.start(writer)
        reader = Board.open(self.key, writable=False)
        seen = set()
        deadline = time.monotonic() + 1.5
        while time.monotonic() < deadline:
            view = reader.read()
            self.assertEqual(view.problems, [])
            for slot in view.slots:
                self.assertIsNone(slot.figures.problem())
                seen.add(slot.seq)
        stop.set()
        self.assertGreater(len(seen), 10)

    def test_profile_result_takes_the_room_left(self):
        # Pure arithmetic: one neighbour claims 100 GiB; we ask for 90% of the device.
        device = SimDevice(2)
        neighbour_ready, done = FORK.Event(), FORK.Event()

        def neighbour():
            board = Board.open(self.key)
            board.acquire("neighbour")
            board.publish(SimProcess(device, 1).figures())
            board.set_claim(100 * GIB)
            neighbour_ready.set()
            done.wait(30)

        self.start(neighbour)
        self.assertTrue(neighbour_ready.wait(30))
        process = SimProcess(device, 0)
        board = Board.open(self.key)
        board.acquire("us")
        profile = MemoryProfile(stats_fn=process.stats, reset_peaks_fn=process.reset_peaks,
                                process_memory=lambda: device.sample(0))
        profile.begin()
        process.alloc(10 * GIB)
        profile.end_load()
        with profile.profiling():
            process.alloc(GIB)
            process.free(GIB)
        result = profile.result(utilization=0.9, board=board)
        own = result.budget_bytes - result.kv_cache_budget_bytes - result.board_cut_bytes
        self.assertEqual(result.board_others_bytes, 100 * GIB)
        self.assertEqual(result.kv_cache_budget_bytes, H200_TOTAL - 100 * GIB - own)
        self.assertEqual(result.claimed_bytes, H200_TOTAL - 100 * GIB)
        self.assertEqual(board.claim_bytes, result.claimed_bytes)
        self.assertEqual(result.accounted_bytes(), result.budget_bytes)
        self.assertTrue(any("budget board" in line for line in result.log_lines()))
        note = oom_note(board.read(), H200_TOTAL, board.claim_bytes, 5 * GIB)
        self.assertIn("neighbour", note)
        self.assertIn("claims 100.00 GiB", note)
        done.set()

    def test_outsiders_and_the_driver_share_are_left_out_of_the_room(self):
        # NVML's total and used include 615 MiB the driver keeps; a process without vramledger
        # holds 30 GiB. Neither is on the board; both are subtracted, the driver's share once.
        share = 615 * MIB
        device = SimDevice(3, driver_share=share)
        device.allocate(2, 30 * GIB)  # the outsider
        process = SimProcess(device, 0)
        board = Board.open(self.key)
        board.acquire("us")
        profile = MemoryProfile(stats_fn=process.stats, reset_peaks_fn=process.reset_peaks,
                                process_memory=lambda: device.sample(0))
        profile.begin()
        process.alloc(10 * GIB)
        profile.end_load()
        with profile.profiling():
            process.alloc(GIB)
            process.free(GIB)
        result = profile.result(utilization=1.0, board=board)
        self.assertEqual(result.device_total_bytes, H200_TOTAL + share)
        self.assertEqual(result.board["capacity_bytes"], H200_TOTAL)
        self.assertEqual(result.board["outside_bytes"], 30 * GIB)
        self.assertEqual(result.board_room_bytes, H200_TOTAL - 30 * GIB)
        self.assertEqual(result.claimed_bytes, H200_TOTAL - 30 * GIB)
        process.alloc(result.kv_cache_budget_bytes)  # fits; the activation's 1 GiB is spare
        self.assertLessEqual(device.used(), H200_TOTAL)
        self.assertGreater(device.used(), H200_TOTAL - GIB - 20 * MIB)

    def test_claim_share_never_negative(self):
        board = Board.open(self.key)
        board.acquire("a")
        self.assertEqual(claim_share(board, H200_TOTAL, utilization=0.75),
                         (H200_TOTAL * 3) // 4)
        ready, done, got = FORK.Event(), FORK.Event(), FORK.Queue()

        def second():
            mine = Board.open(self.key)
            mine.acquire("b")
            got.put(claim_share(mine, H200_TOTAL, utilization=0.75))
            done.wait(30)

        self.start(second)
        self.assertEqual(got.get(timeout=30), H200_TOTAL - (H200_TOTAL * 3) // 4)
        done.set()

    def test_figures_from_a_process_report_add_up(self):
        from vramledger.board.publisher import figures_from_report

        # Two devices: the report leaves the libraries out of the lines (its remainder holds
        # them) while tracked_total still counts them; the figures follow the lines.
        torch_lines = {"requested": 5 * GIB - 7, "rounding": 7, "pending_frees": 0,
                       "cached_usable": GIB, "fragmentation": 3, "unmapped_physical": 0,
                       "reserved": 6 * GIB + 3}
        lines = [{"kind": "torch", "name": f"torch {k}", "bytes": v}
                 for k, v in torch_lines.items() if k != "reserved"]
        lines.append({"kind": "remainder", "name": "context, modules, driver", "bytes": GIB})
        report = {"device": 1, "device_total_bytes": H200_TOTAL, "basis": "nvml_per_process",
                  "process_usage_bytes": 7 * GIB + 3, "torch": torch_lines, "lines": lines,
                  "non_torch": {"tracked_total": 300 << 20, "by_library": {"nccl": 300 << 20}},
                  "remainder": {"bytes": GIB}}
        stats = SimProcess(SimDevice(1), 0).stats()
        figures = figures_from_report(report, stats)
        self.assertIsNone(figures.problem())
        self.assertEqual((figures.live, figures.non_torch_tracked, figures.remainder),
                         (5 * GIB, 0, GIB))
        Board.open(self.key).publish(figures)

    def test_publisher_writes_on_change_and_heartbeat_only(self):
        from vramledger.board.publisher import Publisher

        board = Board.open(self.key)
        state = {"live": GIB}

        def figures(_device):
            return Figures(device_total=H200_TOTAL, process_usage=state["live"] + GIB,
                           per_process=True, live=state["live"], remainder=GIB)

        def open_board(_device):
            board.acquire("published")
            return board

        publisher = Publisher(interval_s=0.01, threshold_bytes=2 << 20, heartbeat_s=60,
                              figures_fn=figures, devices_fn=lambda: [0], board_fn=open_board)
        def ticks_later(count):  # polled: this machine's cores may be busy
            target = len(publisher.timelines.get(0, ())) + count
            deadline = time.monotonic() + 10
            while len(publisher.timelines.get(0, ())) < target and time.monotonic() < deadline:
                time.sleep(0.005)

        publisher.start()
        ticks_later(10)
        self.assertEqual(publisher.publishes, 1)  # unchanged figures are not written again
        state["live"] += 1 << 20                   # below the threshold
        ticks_later(5)
        self.assertEqual(publisher.publishes, 1)
        state["live"] += 4 << 20
        ticks_later(3)
        self.assertEqual(publisher.publishes, 2)
        self.assertGreaterEqual(len(publisher.timelines[0]), 18)  # sampled every tick
        view = Board.open(self.key, writable=False).read()
        self.assertEqual(view.slots[0].figures.live, GIB + (5 << 20))
        self.assertEqual(view.slots[0].label, "published")
        state["live"] = -1                         # impossible: refused, the thread stops
        publisher.join(5)
        self.assertFalse(publisher.is_alive())
        self.assertIn("impossible figures", publisher.error)

    # --- untrusted files -----------------------------------------------------------------

    def _write_board(self, data: bytes, mode: int = 0o600) -> str:
        path = os.path.join(self.dir, f"vramledger-board-{os.geteuid()}-{self.key}")
        with open(path, "wb") as handle:
            handle.write(data)
        os.chmod(path, mode)
        return path

    def _header(self, **changes) -> bytes:
        fields = dict(magic=layout.MAGIC, version=layout.VERSION, header_size=layout.HEADER_SIZE,
                      slot_size=layout.SLOT_SIZE, slot_count=4, uid=os.geteuid(),
                      device=self.key.encode())
        fields.update(changes)
        body = layout.HEADER.pack(fields["magic"], fields["version"], fields["header_size"],
                                  fields["slot_size"], fields["slot_count"], fields["uid"], 0,
                                  fields["device"], 0)
        crc = zlib.crc32(body[:-4])
        return (body[:-4] + struct.pack("<I", crc)).ljust(layout.HEADER_SIZE, b"\0")

    def assertRefused(self, data: bytes, words: str, mode: int = 0o600):
        self._write_board(data, mode)
        with self.assertRaises(BoardError) as caught:
            Board.open(self.key, writable=False, create=False)
        self.assertIn(words, str(caught.exception))
        self.assertIn(self.key, str(caught.exception))  # names the file

    def test_hostile_boards_give_clear_errors(self):
        size = layout.file_size(4)
        self.assertRefused(b"", "shorter than a board header")
        self.assertRefused(os.urandom(size), "wrong magic")
        self.assertRefused(b"\0" * size, "wrong magic")
        self.assertRefused(self._header(version=7).ljust(size, b"\0"), "version 7")
        self.assertRefused(self._header(slot_count=1 << 31).ljust(size, b"\0"), "slot count")
        self.assertRefused(self._header(slot_count=4000).ljust(size, b"\0"), "describes")
        self.assertRefused(self._header(slot_size=1 << 30).ljust(size, b"\0"), "sizes")
        self.assertRefused(self._header(uid=os.geteuid() + 1).ljust(size, b"\0"), "uid")
        self.assertRefused(self._header(device=b"\xff\x01").ljust(size, b"\0"), "printable")
        self.assertRefused(self._header(device=b"other-gpu").ljust(size, b"\0"), "names device")
        altered = bytearray(self._header().ljust(size, b"\0"))
        altered[60] ^= 1
        self.assertRefused(bytes(altered), "checksum")
        self.assertRefused(self._header().ljust(size, b"\0"), "mode 0644", mode=0o644)
        self.assertRefused(self._header().ljust(size + 1, b"\0"), "describes")
        self.assertRefused(b"\0" * (layout.file_size(layout.MAX_SLOTS) + 1), "larger than any")
        # A link planted at the board's name is not followed.
        target = os.path.join(self.dir, "elsewhere")
        with open(target, "wb") as handle:
            handle.write(self._header().ljust(size, b"\0"))
        path = os.path.join(self.dir, f"vramledger-board-{os.geteuid()}-{self.key}")
        os.unlink(path)
        os.symlink(target, path)
        with self.assertRaises(BoardError) as caught:
            Board.open(self.key, writable=False, create=False)
        self.assertIn("symbolic link", str(caught.exception))
        # A writer refuses the same files: the program runs on, without a board.
        with self.assertRaises(BoardError):
            Board.open(self.key)

    def test_corrupted_slot_of_a_live_process_is_left_out_with_a_problem(self):
        ready, done = FORK.Event(), FORK.Event()

        def owner():
            board = Board.open(self.key)
            board.acquire("victim-of-corruption")
            board.publish(Figures(process_usage=GIB, per_process=True, live=GIB))
            ready.set()
            done.wait(30)

        self.start(owner)
        self.assertTrue(ready.wait(30))
        path = os.path.join(self.dir, f"vramledger-board-{os.geteuid()}-{self.key}")
        with open(path, "r+b") as handle:  # a stray write over the slot's figures
            handle.seek(layout.slot_offset(0) + 40)
            handle.write(b"\xff" * 16)
        view = Board.open(self.key, writable=False).read()
        self.assertEqual(view.slots, [])
        self.assertEqual(len(view.problems), 1)
        self.assertIn("slot 0: checksum mismatch", view.problems[0])
        # Figures that checksum but cannot be true (lines not adding up) are refused as well.
        figures = Figures(process_usage=GIB, per_process=True, live=GIB)
        data = bytearray(layout.encode_slot(2, os.getpid(), 0, 0, 0, figures, 0, 0, "x"))
        struct.pack_into("<q", data, 48, 2 * GIB)  # process_usage
        struct.pack_into("<I", data, layout.SLOT_BODY.size,
                         zlib.crc32(bytes(data[:layout.SLOT_BODY.size])))
        with self.assertRaises(layout.BoardFormatError) as caught:
            layout.decode_slot(0, bytes(data))
        self.assertIn("lines sum to", str(caught.exception))
        done.set()

    # --- vramledger top --------------------------------------------------------------------

    def _top(self, *args):
        env = dict(os.environ, PYTHONPATH=PYTHON_DIR, VRAMLEDGER_BOARD_DIR=self.dir)
        return subprocess.run([sys.executable, "-m", "vramledger", "top", *args],
                               capture_output=True, text=True, env=env, timeout=60)

    def test_top_json_once(self):
        ready, done = FORK.Event(), FORK.Event()

        def owner():
            board = Board.open(self.key)
            board.acquire("engine-0")
            board.publish(Figures(device_total=H200_TOTAL, process_usage=3 * GIB,
                                  per_process=True, live=2 * GIB, cached_usable=GIB // 2,
                                  remainder=GIB // 2, peak_reserved=3 * GIB))
            board.set_claim(60 * GIB)
            ready.set()
            done.wait(30)

        child = self.start(owner)
        self.assertTrue(ready.wait(30))
        completed = self._top("--json")
        self.assertEqual(completed.returncode, 0, completed.stderr)
        document = json.loads(completed.stdout)
        self.assertEqual(document["schema"], "vramledger.top")
        (board,) = document["boards"]
        self.assertIsNone(board["error"])
        (process,) = board["processes"]
        self.assertEqual(process["pid"], child.pid)
        self.assertEqual(process["label"], "engine-0")
        self.assertEqual(sum(process["lines"].values()), process["process_usage_bytes"])
        self.assertEqual(process["claim_bytes"], 60 * GIB)
        self.assertEqual(board["unclaimed_bytes"], H200_TOTAL - 60 * GIB)
        completed = self._top("--once")
        self.assertEqual(completed.returncode, 0, completed.stderr)
        self.assertIn("engine-0", completed.stdout)
        done.set()
        kill(child)
        # A hostile board next to it: reported with its reason, exit 1, no traceback.
        with open(os.path.join(self.dir, f"vramledger-board-{os.geteuid()}-bad"), "wb") as f:
            f.write(os.urandom(4096))
        os.chmod(os.path.join(self.dir, f"vramledger-board-{os.geteuid()}-bad"), 0o600)
        completed = self._top("--json")
        self.assertEqual(completed.returncode, 1)
        self.assertNotIn("Traceback", completed.stderr)
        errors = {b["device_key"]: b["error"] for b in json.loads(completed.stdout)["boards"]}
        self.assertIn("wrong magic", errors["bad"])
        self.assertIsNone(errors[self.key])


if __name__ == "__main__":
    unittest.main(verbosity=2)
