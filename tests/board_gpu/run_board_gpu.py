#!/usr/bin/env python3
"""The budget board on a real GPU (issue 18, docs/board.md): several engine instances on one
GPU, started together, each profiling with utilization = 1/N and deciding its KV cache with the
board; then one killed mid-profile.

    PYTHONPATH=<staged vramledger package> python tests/board_gpu/run_board_gpu.py \\
        --out DIR [--budget SECONDS] [--only together2,together4,kill3]

Scenarios (instance_worker.py is one instance; this script drives them over pipes):
  together2  2 instances, 20 GiB weights + 4 GiB activations each, utilization 1/2; instance 0
             then enforces its claim and must get an OOM naming instance 1
  together4  4 instances, 10 GiB + 2 GiB each, utilization 1/4
  kill3      3 instances claim 1/3 up front, 10 GiB + 2 GiB each; while all three are inside
             the profile, one is SIGKILLed; the two others, deciding for utilization 1/2, must
             be cut by the board while it lives and not after (its share recovered);
             they decide for 0.98 x 1/2, since 2 x 1/2 of NVML's total is more than
             processes can allocate
  cluster2   vramledger.cluster_report() over gloo with 2 and 4 rank processes sharing the GPU
  cluster4   (rank r holds r + 1 GiB, the last one peaks 2 GiB higher): every rank's usage
             equals NVML's per-process figure read right after, lines add up, the highest peak
             is the last rank's, HTML has a row per rank and its timeline, Prometheus every rank

Checked per scenario: every instance's KV budget >= 0 and allocated without OOM; the claims sum
to at most what the device can allocate (cudaMemGetInfo's total) and NVML's per-process figures
to at most its total; each instance's books (process report) sum to its usage, basis NVML
per-process, equal to NVML's figure read independently here (ctypes); the board lists exactly
the live instances; `vramledger top --json` reads it. Printed for the record: each budget next
to vLLM's formula in the same run, total x util - (torch peak + (device used - torch reserved)).

Writes DIR/results.json, DIR/summary.md (the table for bench/results/board/) and
DIR/summary_line.txt. Exit 1 on any failed check; without a GPU prints "skipped: no GPU" and
exits 0. About 90 s on an H200.
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import shutil
import signal
import subprocess
import sys
import threading
import time
from typing import Any, Dict, List, Optional

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "classification_gpu"))
import _common  # noqa: E402

GIB = 1 << 30
MIB = 1 << 20
SCENARIOS = {
    "together2": dict(count=2, weights=20, activation=4, upfront=False, kill=None, enforce=0),
    "together4": dict(count=4, weights=10, activation=2, upfront=False, kill=None, enforce=None),
    "kill3": dict(count=3, weights=10, activation=2, upfront=True, kill=2, enforce=None),
    "cluster2": dict(cluster=2),
    "cluster4": dict(cluster=4),
}


class Instance:
    """A worker process with a reader thread: expect(TAG) returns its payload or raises."""

    def __init__(self, command: List[str], env: Dict[str, str], log_path: str) -> None:
        self.log = open(log_path, "w", encoding="utf-8")
        self.process = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                        stderr=self.log, text=True, env=env, bufsize=1)
        self.lines: "queue.Queue[Optional[str]]" = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.process.stdout:
            self.log.write(line)
            self.log.flush()
            self.lines.put(line)
        self.lines.put(None)

    def expect(self, tag: str, timeout_s: float) -> Dict[str, Any]:
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                line = self.lines.get(timeout=max(0.05, deadline - time.monotonic()))
            except queue.Empty:
                raise RuntimeError(f"pid {self.process.pid}: no {tag} within {timeout_s:.0f} s")
            if line is None:
                raise RuntimeError(f"pid {self.process.pid}: exited ({self.process.wait()}) "
                                   f"before {tag}; see its log")
            if line.startswith(tag + " "):
                return json.loads(line[len(tag) + 1:])

    def send(self, command: str) -> None:
        try:
            self.process.stdin.write(command + "\n")
            self.process.stdin.flush()
        except (BrokenPipeError, OSError):
            pass

    def end(self) -> None:
        self.send("EXIT")
        try:
            self.process.wait(20)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self.log.close()


def run_scenario(name: str, spec: Dict[str, Any], folder: str, env: Dict[str, str],
                 nvml: "_common.Nvml", timeout_s: float) -> Dict[str, Any]:
    count = spec["count"]
    failures: List[str] = []
    out: Dict[str, Any] = {"scenario": name, "count": count, "weights_gib": spec["weights"],
                           "activation_gib": spec["activation"], "failures": failures}
    instances: List[Instance] = []
    started = time.monotonic()
    left = lambda: max(5.0, timeout_s - (time.monotonic() - started))  # noqa: E731
    try:
        for who in range(count):
            command = [sys.executable, os.path.join(HERE, "instance_worker.py"), "--who",
                       str(who), "--count", str(count), "--weights-gib", str(spec["weights"]),
                       "--activation-gib", str(spec["activation"])]
            if spec["upfront"]:
                command.append("--upfront")
            if spec["kill"] is not None:
                command.append("--pause-in-profile")
                if who != spec["kill"]:
                    # A little under 1/(N-1): NVML's total, which utilization multiplies,
                    # exceeds what processes can allocate by the driver's share (~615 MiB).
                    command += ["--utilization-after", str(0.98 / (count - 1))]
            if spec["enforce"] == who:
                command.append("--enforce")
            instances.append(Instance(command, env, os.path.join(folder, f"{name}-{who}.log")))
        ready = [instance.expect("READY", left()) for instance in instances]
        out["capacity"] = ready[0]["capacity"]
        key = ready[0]["key"]
        for instance in instances:  # all at once: they load and profile together
            instance.send("GO")
        victim = None
        if spec["kill"] is not None:
            for instance in instances:
                instance.expect("IN_PROFILE", left())
            survivors = [i for who, i in enumerate(instances) if who != spec["kill"]]
            for survivor in survivors:  # the victim stays inside its profile until killed
                survivor.send("CONTINUE")
            out["cut_while_alive"] = [s.expect("DECIDED_WHILE_ALIVE", left())["cut"]
                                      for s in survivors]
            victim = instances[spec["kill"]]
            os.kill(victim.process.pid, signal.SIGKILL)
            victim.process.wait(10)
            out["victim_pid"] = victim.process.pid
            # The driver frees a dead process's memory: wait until NVML stops listing it.
            deadline = time.monotonic() + 15
            while nvml.process_used(victim.process.pid) is not None:
                if time.monotonic() > deadline:
                    failures.append("NVML still lists the killed instance after 15 s")
                    break
                time.sleep(0.05)
            out["victim_reaped_s"] = round(15 - (deadline - time.monotonic()), 2)
            for survivor in survivors:
                survivor.send("CONTINUE")
        live = [i for i in instances if i is not victim]
        for instance in live:
            instance.expect("KV_HELD", left())
        # Every live instance now holds its KV cache: the whole device, measured here.
        out["nvml_per_process"] = {str(i.process.pid): nvml.process_used(i.process.pid)
                                   for i in live}
        out["nvml_device_used"], out["nvml_device_total"] = nvml.device_used_total()
        from vramledger.board import Board

        view = Board.open(key, create=False, writable=False).read()
        out["board_pids"] = sorted(slot.pid for slot in view.slots)
        out["board_claims"] = {str(slot.pid): slot.claim_bytes for slot in view.slots}
        out["board_dead_slots"] = view.dead_slots
        top = subprocess.run([sys.executable, "-m", "vramledger", "top", "--json"], env=env,
                             capture_output=True, text=True, timeout=60)
        out["top_exit"] = top.returncode
        out["top_processes"] = len(json.loads(top.stdout)["boards"][0]["processes"]) \
            if top.returncode == 0 else None
        with open(os.path.join(folder, f"{name}-top.json"), "w", encoding="utf-8") as handle:
            handle.write(top.stdout + top.stderr)
        for instance in live:
            instance.send("CHECKED")
        out["instances"] = [instance.expect("RESULT", left()) for instance in live]
    except Exception as error:  # a worker died or hung: the scenario fails, the others run
        failures.append(f"{type(error).__name__}: {error}")
    finally:
        for instance in instances:
            instance.end()
        # The next scenario starts on an empty GPU: wait for the driver to reap these.
        deadline = time.monotonic() + 15
        while any(nvml.process_used(i.process.pid) is not None for i in instances) \
                and time.monotonic() < deadline:
            time.sleep(0.05)
    if not failures:
        judge(out, spec, failures)
    out["seconds"] = round(time.monotonic() - started, 1)
    return out


def run_cluster(name: str, world: int, folder: str, env: Dict[str, str], timeout_s: float
                ) -> Dict[str, Any]:
    """cluster_report over gloo with `world` rank processes sharing GPU 0 (cluster_rank.py)."""
    failures: List[str] = []
    out: Dict[str, Any] = {"scenario": name, "count": world, "failures": failures}
    started = time.monotonic()
    store = os.path.join(folder, f"{name}.store")
    if os.path.exists(store):
        os.unlink(store)
    logs = [open(os.path.join(folder, f"{name}-{rank}.log"), "w", encoding="utf-8")
            for rank in range(world)]
    ranks = [subprocess.Popen([sys.executable, os.path.join(HERE, "cluster_rank.py"), str(rank),
                               str(world), store, folder], stdout=subprocess.PIPE, stderr=log,
                              text=True, env=env, stdin=subprocess.DEVNULL)
             for rank, log in zip(range(world), logs)]
    results: Dict[int, Dict[str, Any]] = {}
    for rank, process in enumerate(ranks):
        try:
            stdout, _ = process.communicate(timeout=max(5.0, timeout_s - (time.monotonic()
                                                                          - started)))
        except subprocess.TimeoutExpired:
            for other in ranks:
                other.kill()
            failures.append(f"rank {rank} timed out")
            break
        logs[rank].write(stdout)
        for line in stdout.splitlines():
            if line.startswith("RESULT "):
                results[rank] = json.loads(line[len("RESULT "):])
        if process.returncode != 0 or rank not in results:
            failures.append(f"rank {rank}: exit {process.returncode}, see {name}-{rank}.log")
    for log in logs:
        log.close()
    out["seconds"] = round(time.monotonic() - started, 1)
    if failures:
        return out

    def expect(condition: bool, text: str) -> None:
        if not condition:
            failures.append(text)

    with open(os.path.join(folder, f"cluster{world}.json"), encoding="utf-8") as handle:
        document = json.load(handle)
    with open(os.path.join(folder, f"cluster{world}.html"), encoding="utf-8") as handle:
        page = handle.read()
    expect(document["world_size"] == world and document["backend"] == "gloo",
           f"world {document['world_size']} over {document['backend']}")
    expect([r["rank"] for r in document["ranks"]] == list(range(world)), "ranks out of order")
    out["ranks"] = []
    for entry in document["ranks"]:
        rank = entry["rank"]
        expect(entry["error"] is None, f"rank {rank}: {entry['error']}")
        expect(entry["pid"] == results[rank]["pid"], f"rank {rank}: pid differs")
        devices = {d["device"]: d for d in entry["devices"]}
        if 0 not in devices:
            failures.append(f"rank {rank}: no device 0 in its document")
            continue
        device = devices[0]
        out["ranks"].append({"rank": rank, "usage": device["process_usage_bytes"],
                             "nvml": results[rank]["nvml"],
                             "peak_reserved": device["peak_reserved_bytes"],
                             "samples": len(device["timeline"])})
        expect(device["basis"] == "nvml_per_process", f"rank {rank}: basis {device['basis']}")
        expect(device["process_usage_bytes"] == results[rank]["nvml"],
               f"rank {rank}: usage {device['process_usage_bytes']} != NVML "
               f"{results[rank]['nvml']}")
        expect(sum(device["lines"].values()) == device["process_usage_bytes"],
               f"rank {rank}: lines do not add up")
        expect(device["torch_allocated_bytes"] >= (rank + 1) * GIB,
               f"rank {rank}: {device['torch_allocated_bytes']} allocated, held "
               f"{(rank + 1) * GIB}")
        expect(results[rank]["prometheus_ranks"] == world,
               f"rank {rank}: Prometheus text has {results[rank]['prometheus_ranks']} ranks")
    expect((document["highest_peak"] or {}).get("rank") == world - 1,
           f"highest peak on rank {(document['highest_peak'] or {}).get('rank')}, not "
           f"{world - 1}")
    expect(page.count("<tr data-rank=") == world, "HTML: not one row per rank")
    expect(f"Timeline of rank {world - 1}, device 0" in page and page.count("<polyline") == 3,
           "HTML: no timeline of the highest-peak rank")
    return out


def judge(out: Dict[str, Any], spec: Dict[str, Any], failures: List[str]) -> None:
    def expect(condition: bool, text: str) -> None:
        if not condition:
            failures.append(text)

    results = out["instances"]
    live_pids = sorted(r["pid"] for r in results)
    expect(out["board_pids"] == live_pids,
           f"board lists {out['board_pids']}, live instances are {live_pids}")
    expect(out["top_exit"] == 0 and out["top_processes"] == len(results),
           f"vramledger top --json: exit {out['top_exit']}, {out['top_processes']} processes")
    claims = sum(r["result"]["claimed_bytes"] for r in results)
    expect(claims <= out["capacity"],
           f"claims sum to {claims}, more than the device can allocate ({out['capacity']})")
    usage = sum(v or 0 for v in out["nvml_per_process"].values())
    expect(usage <= out["nvml_device_total"], f"NVML per-process usage {usage} > device total")
    for r in results:
        who = f"instance {r['who']} (pid {r['pid']})"
        kv = r["result"]["kv_cache_budget_bytes"]
        expect(kv >= 0, f"{who}: negative KV budget {kv}")
        expect(r["kv_oom"] is None, f"{who}: its KV cache did not fit: {r['kv_oom']}")
        books = r["books"]
        expect(books["basis"] == "nvml_per_process", f"{who}: books on basis {books['basis']}")
        expect(books["sum"] == books["usage"], f"{who}: lines sum {books['sum']} != usage "
                                               f"{books['usage']}")
        expect(books["non_negative"], f"{who}: a negative line in its books")
        expect(books["usage"] == books["nvml_independent"],
               f"{who}: books {books['usage']} != NVML per-process {books['nvml_independent']}")
        if "cut_while_alive" in r:
            expect(r["cut_while_alive"] > 0, f"{who}: not cut while the victim lived")
            expect(r["result"]["board_cut_bytes"] == 0,
                   f"{who}: still cut by {r['result']['board_cut_bytes']} after the victim died")
        if "enforcement" in r:
            enforcement = r["enforcement"]
            others = [str(o["pid"]) for o in results if o["pid"] != r["pid"]]
            expect(enforcement["refused"], f"{who}: enforcement let it allocate past its claim")
            expect("vramledger budget board" in enforcement["message"]
                   and all(f"pid {pid}" in enforcement["message"] for pid in others),
                   f"{who}: the OOM message does not name the other instances: "
                   f"{enforcement['message'][-400:]}")
    if spec["kill"] is not None:
        expect(out["board_dead_slots"] >= 1, "the killed instance's slot is not seen as dead")


def table(outs: List[Dict[str, Any]]) -> str:
    rows = ["| scenario | instance | weights + act (GiB) | own peak (GiB) | board cut (GiB) | "
            "our KV budget (GiB) | vLLM's KV (GiB) | vLLM non-torch (GiB) | our non-torch "
            "increase (GiB) | claim (GiB) | books = NVML |",
            "|---|---|---|---|---|---|---|---|---|---|---|"]
    for out in outs:
        for r in out.get("instances", []):
            res = r["result"]
            own = res["budget_bytes"] - res["kv_cache_budget_bytes"] - res["board_cut_bytes"]
            rows.append(
                f"| {out['scenario']} | {r['who']} | {out['weights_gib']} + "
                f"{out['activation_gib']} | {own / GIB:.3f} | {res['board_cut_bytes'] / GIB:.3f}"
                f" | {res['kv_cache_budget_bytes'] / GIB:.3f} | {r['vllm']['kv'] / GIB:.3f} | "
                f"{r['vllm']['non_torch'] / GIB:.3f} | "
                f"{res['non_torch_increase_bytes'] / GIB:.3f} | "
                f"{res['claimed_bytes'] / GIB:.3f} | "
                f"{r['books']['usage'] == r['books']['nvml_independent']} |")
    cluster = [out for out in outs if "ranks" in out]
    if cluster:
        rows += ["", "| scenario | rank | process usage (B) | NVML per-process (B) | "
                 "peak reserved (GiB) | timeline samples |", "|---|---|---|---|---|---|"]
        for out in cluster:
            for r in out["ranks"]:
                rows.append(f"| {out['scenario']} | {r['rank']} | {r['usage']} | {r['nvml']} | "
                            f"{r['peak_reserved'] / GIB:.3f} | {r['samples']} |")
    return "\n".join(rows)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default=os.path.join(os.getcwd(), "board_gpu_logs"))
    parser.add_argument("--budget", type=float, default=120.0)
    parser.add_argument("--only", default=",".join(SCENARIOS))
    args = parser.parse_args()
    os.makedirs(args.out, exist_ok=True)
    reason = _common.gpu_skip_reason()
    if reason is not None:
        print(f"skipped: no GPU ({reason})")
        with open(os.path.join(args.out, "summary_line.txt"), "w", encoding="utf-8") as handle:
            handle.write(f"skipped: no GPU ({reason})\n")
        return 0
    board_dir = f"/dev/shm/vramledger-board-check-{os.getpid()}"
    os.makedirs(board_dir, mode=0o700)
    env = _common.worker_env(drop_preload=True)
    env.update({"VRAMLEDGER_BOARD_DIR": board_dir, "VRAMLEDGER_BOARD_INTERVAL_S": "0.2"})
    os.environ["VRAMLEDGER_BOARD_DIR"] = board_dir
    nvml = _common.Nvml(_common.cuda_pci_bus_id(0))
    started = time.monotonic()
    outs = []
    try:
        for name in [n for n in args.only.split(",") if n]:
            left = args.budget - (time.monotonic() - started)
            if left < 20:
                outs.append({"scenario": name, "failures": [f"not run: {left:.0f} s of the "
                                                            "budget left"]})
                continue
            print(f"=== {name} ({left:.0f} s left)", flush=True)
            spec = SCENARIOS[name]
            if "cluster" in spec:
                outs.append(run_cluster(name, spec["cluster"], args.out, env, left - 5))
            else:
                outs.append(run_scenario(name, spec, args.out, env, nvml, left - 5))
    finally:
        shutil.rmtree(board_dir, ignore_errors=True)
    text = table(outs)
    failed = [f"{out['scenario']}: {failure}" for out in outs for failure in out["failures"]]
    print(text)
    for out in outs:
        extra = ""
        if "cut_while_alive" in out:
            extra = (f"; survivors cut by {[round(c / GIB, 3) for c in out['cut_while_alive']]}"
                     f" GiB while the victim lived, victim reaped in {out['victim_reaped_s']} s")
        print(f"{out['scenario']}: {'FAIL' if out['failures'] else 'pass'} "
              f"({out.get('seconds', 0)} s){extra}")
    for failure in failed:
        print(f"  FAIL: {failure}")
    with open(os.path.join(args.out, "results.json"), "w", encoding="utf-8") as handle:
        json.dump(outs, handle, indent=1)
    with open(os.path.join(args.out, "summary.md"), "w", encoding="utf-8") as handle:
        handle.write(f"# Budget board on the GPU ({time.strftime('%Y-%m-%d')})\n\n"
                     "`tests/board_gpu/run_board_gpu.py`; sizes in GiB; vLLM's KV is its "
                     "formula total x util - (torch peak + (device used - torch reserved)) at "
                     "the end of the same profile.\n\n" + text + "\n\n"
                     + "\n".join(f"- FAIL: {failure}" for failure in failed) + "\n")
    passed = sum(1 for out in outs if not out["failures"])
    line = f"{passed} of {len(outs)} scenarios passed"
    if failed:
        line += f"; first failure: {failed[0][:200]}"
    with open(os.path.join(args.out, "summary_line.txt"), "w", encoding="utf-8") as handle:
        handle.write(line + "\n")
    print(line)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
