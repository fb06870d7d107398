"""The processes an elastic run's launcher starts: one torchrun agent per machine (``Agents``)
and the rendezvous store they meet at (``RendezvousStore``), which lives outside every
machine the fault drill may kill.

>>> Agents(Path("/tmp/run"), machines=2, min_machines=1, endpoint="127.0.0.1:1", max_restarts=0).tail
['-m', 'gradsync.training.elastic', '/tmp/run']
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from ...errors import GradsyncError
from ...tools.launch import LOOPBACK, rendezvous_store
from .job import FAST_RENDEZVOUS, workers_per_machine


class Agents:
    """The torchrun agents of one elastic run, one per machine, each in its own session so it
    can be killed whole. On emulated machines (``network``) each agent runs in its machine's
    network namespace under its own host name, with ``network.per_node`` worker processes."""

    def __init__(self, workdir: Path, machines: int, min_machines: int, endpoint: str, max_restarts: int,
                 network=None):
        self.workdir, self.machines, self.network, self.procs, self.logs = workdir, machines, network, {}, []
        self.head = [
            sys.executable, "-m", "torch.distributed.run", "--nnodes", f"{min_machines}:{machines}",
            "--nproc-per-node", str(workers_per_machine(network)), "--rdzv-backend", "c10d",
            "--rdzv-endpoint", endpoint, "--rdzv-id", "gradsync-elastic", "--max-restarts", str(max_restarts),
            "--monitor-interval", "0.2", "--rdzv-conf", "is_host=false,join_timeout=120," + FAST_RENDEZVOUS]
        self.tail = ["-m", "gradsync.training.elastic", str(workdir)]
        self.env = {**os.environ, "OMP_NUM_THREADS": "1",
                    "GLOO_SOCKET_IFNAME": network.interface if network is not None else "lo",
                    "LOGLEVEL": os.environ.get("GRADSYNC_AGENT_LOGLEVEL", "WARNING"),
                    # workers' stores on worker rank 0, re-chosen every round: the agents' shared store
                    # would stay on the first rank-0 agent, which may be the one that dies
                    "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"}

    def start(self, machine: int) -> None:
        """Start (or restart) the agent of ``machine``."""
        log = open(self.workdir / f"agent{len(self.logs)}.log", "w")
        self.logs.append(log)
        prefix, address = [], LOOPBACK
        if self.network is not None:
            address = self.network.addresses[machine]
            prefix = ["ip", "netns", "exec", self.network.namespaces[machine], "unshare", "--uts", "sh", "-c",
                      f'hostname machine{machine} && exec "$0" "$@"']     # exec all the way: the pid is the agent's
        self.procs[machine] = subprocess.Popen([*prefix, *self.head, "--local-addr", address, *self.tail],
                                               env=self.env, stdout=log, stderr=subprocess.STDOUT,
                                               start_new_session=True)

    def alive(self) -> list[int]:
        return [i for i, p in self.procs.items() if p.poll() is None]

    def _workers(self, machine: int) -> dict[int, int]:
        """Local rank -> pid of the worker processes the agent of ``machine`` runs now."""
        found = {}
        for f in (self.workdir / "pids").glob(f"{self.procs[machine].pid}.*"):
            try:
                found[int(f.name.split(".")[1])] = int(f.read_text())
            except ValueError:                   # a file being written
                pass
        return found

    def kill(self, machine: int) -> None:
        """SIGKILL the agent of ``machine`` and its workers (a lost machine)."""
        agent = self.procs[machine]
        for pgid in (agent.pid, *self._workers(machine).values()):
            _kill_group(pgid)
        agent.wait()

    def kill_worker(self, machine: int, local_rank: int) -> None:
        """SIGKILL one worker process of ``machine``; its agent stays and restarts it."""
        pid = self._workers(machine).get(local_rank)
        if pid is None:
            raise GradsyncError(f"machine {machine} runs no worker with local rank {local_rank}")
        _kill_group(pid)

    def close(self, grace: float) -> None:
        deadline = time.monotonic() + grace
        for i in self.alive():
            try:
                self.procs[i].wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                self.kill(i)
        for log in self.logs:
            log.close()

    def tail_of_logs(self, lines: int = 3) -> str:
        for log in self.logs:
            log.flush()
        texts = [Path(log.name).read_text(errors="replace").strip().splitlines() for log in self.logs]
        errors = [t for text in texts for t in text if "Error" in t or "error" in t]
        return " | ".join(errors[-lines:]) or "no error in the agents' logs"


def _kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except ProcessLookupError:
        pass


class RendezvousStore:
    """The rendezvous store of a run: in this process on loopback, or, on emulated machines, a
    ``gradsync store`` process on the switch's own address (reachable from every machine)."""

    def __init__(self, network=None):
        self.proc = None
        if network is None:
            self.store = rendezvous_store(LOOPBACK, 0, 0, 1, timeout=60.0)
            self.endpoint = f"{LOOPBACK}:{self.store.port}"
            return
        self.proc = subprocess.Popen(["ip", "netns", "exec", network.switch, sys.executable, "-m", "gradsync", "store",
                                      "--host", network.switch_address, "--port", "0"],
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        line = self.proc.stdout.readline()
        if "listening on " not in line:
            self.proc.kill()
            raise GradsyncError(f"the rendezvous store did not start: {self.proc.stderr.read().strip()[-500:]}")
        self.endpoint = line.split("listening on ")[1].split()[0]

    def close(self) -> None:
        if self.proc is not None:
            self.proc.terminate()
            self.proc.wait(timeout=10)
