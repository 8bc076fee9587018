"""A real Slurm cluster on this machine, for podlaunch's tests: munged, slurmctld, N slurmd.

``SlurmTestEnv`` writes a ``slurm.conf`` under a short temporary directory
(slurmstepd puts Unix sockets in the spool directory, and their paths are
limited to 107 bytes), starts one ``munged`` (as the munge user, on its own
socket under ``/run/munge``, so a system munged is left alone), one
``slurmctld`` and one ``slurmd -N nK`` per node, all on loopback ports found
free, and waits until ``sinfo`` shows every node idle. Every "node" is this
machine: they share the filesystem and the process table, as a real cluster
shares its filesystem.

Every node has ``gpus`` GPUs (4 by default; 0: none), declared as generic resources
(``GresTypes=gpu``, ``Gres=gpu:4``, a ``gres.conf`` over stand-in device files:
``_write_gres_conf``), so a job or step that asks for GPUs gets them named as on a GPU node;
a job that asks for none is placed as before.

Partitions, each of every node: ``debug`` (the default), ``cancel`` and
``urgent`` (higher PriorityTier), with partition preemption so a job in
``urgent`` preempts one in ``debug`` (``PreemptMode`` REQUEUE, or CANCEL,
chosen at start) or in ``cancel`` (always CANCEL: the job ends PREEMPTED and
must be submitted again) after ``GraceTime`` seconds of SIGTERM (the end of
a grace time is checked every 30 s, as time limits are). One cluster thus
serves the tests of both preemption modes. Clients find the cluster through
``env.env()`` (``SLURM_CONF``). No pytest in here; wrap it in a fixture::

    with SlurmTestEnv(num_nodes=3) as env:
        subprocess.run(["sinfo"], env=env.env())

Needs root (slurmd starts tasks as the submitting user) and Debian's
``slurm-wlm`` and ``munge`` packages (``.ci/run`` installs them).
"""

from __future__ import annotations

import ctypes
import os
import pwd
import shutil
import signal
import socket
import stat
import subprocess
import tempfile
import time
from pathlib import Path

from harness import ports
from harness.sshenv import proc_table

MUNGE_DIR = Path("/run/munge")
SBIN = "/usr/sbin"
NVIDIA_MAJOR = 195  # the NVIDIA driver's character devices (unregistered here: opening one fails)


def available() -> str | None:
    """Why Slurm cannot run here, or None when it can."""
    if os.geteuid() != 0:
        return "needs root (slurmd)"
    for tool in ("slurmctld", "slurmd", "munged"):
        if not os.path.exists(os.path.join(SBIN, tool)):
            return f"{SBIN}/{tool} is missing (apt-get install slurm-wlm munge)"
    return None


def _free_ports(count: int, start: int) -> list[int]:
    """``count`` consecutive TCP ports free on every address, from ``start``."""
    port = start
    while port < 60000:
        candidate = list(range(port, port + count))
        if all(_free(p) for p in candidate):
            return candidate
        port += count
    raise RuntimeError("no free ports for the test Slurm cluster")


def _free(port: int) -> bool:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("", port))
        except OSError:
            return False
    return True


def _die_with_parent() -> None:
    ctypes.CDLL(None).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG: a dead test stops the daemons


class SlurmTestEnv:
    """One slurmctld and ``num_nodes`` slurmd daemons named n1..nN, all on this machine."""

    def __init__(self, num_nodes: int = 3, cpus: int = 4, preempt_mode: str = "REQUEUE",
                 grace_s: int = 2, gpus: int = 4):
        self.num_nodes = num_nodes
        self.cpus = cpus
        self.gpus = gpus
        self.preempt_mode = preempt_mode
        self.grace_s = grace_s
        self.base = Path(tempfile.mkdtemp(prefix="slm", dir="/tmp"))
        self.tag = self.base.name
        self.conf = self.base / "slurm.conf"
        self.nodes = [f"n{i + 1}" for i in range(num_nodes)]
        self.host = socket.gethostname().split(".")[0]
        self.munge_socket = MUNGE_DIR / f"{self.tag}.socket"
        self._procs: dict[str, subprocess.Popen] = {}

    # -- configuration -----------------------------------------------------
    def env(self, **extra) -> dict:
        """This process's environment, pointed at this cluster, with no outer Slurm job."""
        env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "SBATCH_", "SALLOC_"))}
        env["SLURM_CONF"] = str(self.conf)
        env.update(extra)
        return env

    def _write_conf(self) -> None:
        # each checkout its own range (3000-15799, 400 ports, shared by its workers), and
        # start() holds ports.claiming() until the daemons listen: two clusters starting at
        # once never pick the same free port
        ctld_port, = _free_ports(1, ports.first_port(3000, 400, 0))
        node_ports = _free_ports(self.num_nodes, ctld_port + 100)
        b = self.base
        lines = [
            "ClusterName=podtest",
            f"SlurmctldHost={self.host}(127.0.0.1)",
            f"SlurmctldPort={ctld_port}",
            "SlurmUser=root", "SlurmdUser=root",
            "AuthType=auth/munge", "CredType=cred/munge",
            # cred_expire: a requeued job may start again only after it (default 120 s)
            f"AuthInfo=socket={self.munge_socket},cred_expire=10",
            f"StateSaveLocation={b}/state",
            f"SlurmdSpoolDir={b}/spool/%n",
            f"SlurmctldPidFile={b}/slurmctld.pid",
            f"SlurmdPidFile={b}/slurmd-%n.pid",
            f"SlurmctldLogFile={b}/slurmctld.log",
            f"SlurmdLogFile={b}/slurmd-%n.log",
            "SlurmctldDebug=info", "SlurmdDebug=info",
            "ProctrackType=proctrack/linuxproc", "TaskPlugin=task/none",
            "SelectType=select/cons_tres", "SelectTypeParameters=CR_CPU",
            "SchedulerType=sched/backfill", "MpiDefault=none",
            "SwitchType=switch/none", "LaunchParameters=test_exec",
            "AccountingStorageType=accounting_storage/none",
            "JobAcctGatherType=jobacct_gather/none", "JobCompType=jobcomp/none",
            "SlurmdParameters=config_overrides",
            "ReturnToService=2", "SlurmctldTimeout=30", "SlurmdTimeout=30",
            "KillWait=10", "InactiveLimit=0", "MinJobAge=300", "WaitTime=0",
            "MessageTimeout=10", "TCPTimeout=5",
            "PreemptType=preempt/partition_prio", f"PreemptMode={self.preempt_mode}",
            "SchedulerParameters=defer_batch=0",
        ] + (["GresTypes=gpu"] if self.gpus else [])
        gres = f" Gres=gpu:{self.gpus}" if self.gpus else ""
        for node, port in zip(self.nodes, node_ports):
            lines.append(f"NodeName={node} NodeHostname={self.host} NodeAddr=127.0.0.1 "
                         f"Port={port} CPUs={self.cpus} RealMemory=2000{gres} State=UNKNOWN")
        nodes = ",".join(self.nodes)
        lines.append(f"PartitionName=debug Nodes={nodes} Default=YES MaxTime=INFINITE State=UP "
                     f"PriorityTier=1 GraceTime={self.grace_s}")
        # the same nodes again, for jobs that a preemption cancels instead of requeueing
        lines.append(f"PartitionName=cancel Nodes={nodes} MaxTime=INFINITE State=UP "
                     f"PriorityTier=1 GraceTime={self.grace_s} PreemptMode=CANCEL")
        lines.append(f"PartitionName=urgent Nodes={nodes} MaxTime=INFINITE State=UP PriorityTier=10 "
                     "PreemptMode=OFF")
        self.conf.write_text("\n".join(lines) + "\n")
        if self.gpus:
            self._write_gres_conf()
        (b / "state").mkdir()
        for node in self.nodes:
            (b / "spool" / node).mkdir(parents=True)

    def _write_gres_conf(self) -> None:
        """Every node's ``gpus`` GPUs as generic resources, over stand-in device files.

        The stand-ins are character devices of the NVIDIA driver's major number (195), minors
        0..gpus-1, under the cluster's directory: nothing can open them here (no driver
        registers 195), but slurmd takes them for GPUs as on a GPU node and names them in each
        step's ``CUDA_VISIBLE_DEVICES``, ``SLURM_STEP_GPUS`` and ``scontrol -d show job``'s
        ``GRES=gpu:N(IDX:...)``. Regular files it refuses (``is not a valid character or block
        device``: it then counts the GPUs but names none, so no step gets a
        ``CUDA_VISIBLE_DEVICES``). Every node lists the same files, as every GPU node has its
        own /dev/nvidia0...; ``task/none`` constrains no device, so Slurm numbers the GPUs of a
        step by their index on the node (0..gpus-1), not from 0 per step."""
        dev = self.base / "dev"
        dev.mkdir()
        for i in range(self.gpus):
            os.mknod(dev / f"nvidia{i}", stat.S_IFCHR | 0o600, os.makedev(NVIDIA_MAJOR, i))
        files = f"{dev}/nvidia[0-{self.gpus - 1}]" if self.gpus > 1 else f"{dev}/nvidia0"
        (self.base / "gres.conf").write_text(
            f"NodeName={','.join(self.nodes)} Name=gpu File={files}\n")

    # -- lifecycle ---------------------------------------------------------
    def start(self, timeout_s: float = 30.0) -> "SlurmTestEnv":
        why = available()
        if why:
            raise RuntimeError(f"SlurmTestEnv: {why}")
        try:
            with ports.claiming():
                self._write_conf()
                self._start_munge()
                self._spawn("slurmctld",
                            [f"{SBIN}/slurmctld", "-D", "-c", "-i", "-f", str(self.conf)])
                for node in self.nodes:
                    self._spawn(node, [f"{SBIN}/slurmd", "-D", "-N", node, "-f", str(self.conf)])
                self.wait_idle(timeout_s)
        except BaseException:
            self.stop()
            raise
        return self

    def _start_munge(self) -> None:
        munge = pwd.getpwnam("munge")
        MUNGE_DIR.mkdir(mode=0o755, exist_ok=True)
        os.chown(MUNGE_DIR, munge.pw_uid, munge.pw_gid)
        os.chmod(MUNGE_DIR, 0o755)
        stem = MUNGE_DIR / self.tag
        self._spawn("munged", ["runuser", "-u", "munge", "--", f"{SBIN}/munged", "-F",
                               f"--socket={self.munge_socket}", f"--pid-file={stem}.pid",
                               f"--seed-file={stem}.seed", f"--log-file={stem}.log"])
        deadline = time.monotonic() + 10
        while not self.munge_socket.exists():
            if self._procs["munged"].poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"munged did not start: {self.log_tail('munged')}")
            time.sleep(0.05)

    def _spawn(self, name: str, argv: list) -> None:
        log = open(self.base / f"{name}.out", "ab")
        with log:
            self._procs[name] = subprocess.Popen(
                argv, stdin=subprocess.DEVNULL, stdout=log, stderr=log, env=self.env(),
                start_new_session=True, preexec_fn=_die_with_parent)

    def log_tail(self, name: str, lines: int = 20) -> str:
        out = []
        for path in (self.base / f"{name}.out", self.base / f"{name}.log",
                     self.base / f"slurmd-{name}.log", MUNGE_DIR / f"{self.tag}.log"):
            if path.exists() and (name == "munged") == (path.parent == MUNGE_DIR or
                                                        path.name == "munged.out"):
                out.append(f"--- {path}\n" + "\n".join(path.read_text(errors="replace")
                                                       .splitlines()[-lines:]))
        return "\n".join(out) or "<no log>"

    def sinfo_states(self) -> dict:
        """node -> state, as ``sinfo`` reports it."""
        out = self.run("sinfo", "-h", "-N", "-p", "debug", "-o", "%N %T", check=False)
        return dict(line.split() for line in out.splitlines() if len(line.split()) == 2)

    def wait_idle(self, timeout_s: float = 30.0) -> None:
        """Wait until every node is idle (no job left on it)."""
        deadline = time.monotonic() + timeout_s
        states: dict = {}
        while True:
            for name, proc in self._procs.items():
                if proc.poll() is not None:
                    raise RuntimeError(f"{name} exited rc={proc.returncode}:\n{self.log_tail(name)}")
            states = self.sinfo_states()
            if len(states) == self.num_nodes and all(s == "idle" for s in states.values()):
                return
            if time.monotonic() > deadline:
                raise RuntimeError(f"nodes not idle after {timeout_s}s: {states}\n"
                                   f"{self.log_tail('slurmctld')}")
            time.sleep(0.2)

    def run(self, *argv: str, check: bool = True, timeout_s: float = 30) -> str:
        """Run a Slurm client command against this cluster; returns stdout."""
        result = subprocess.run(list(argv), env=self.env(), capture_output=True, text=True,
                                timeout=timeout_s, stdin=subprocess.DEVNULL)
        if check and result.returncode != 0:
            raise RuntimeError(f"{' '.join(argv)}: rc {result.returncode}: {result.stderr}")
        return result.stdout

    def jobs(self) -> list[str]:
        """``jobid state name`` of every job slurmctld still lists as pending or running."""
        out = self.run("squeue", "-h", "-o", "%i %T %j", check=False)
        return [line for line in out.splitlines() if line.strip()]

    def wait_queue_empty(self, timeout_s: float = 15.0) -> list[str]:
        deadline = time.monotonic() + timeout_s
        while True:
            jobs = self.jobs()
            if not jobs or time.monotonic() > deadline:
                return jobs
            time.sleep(0.1)

    def daemon_pids(self) -> set[int]:
        return {p.pid for p in self._procs.values() if p.poll() is None}

    def step_processes(self) -> list[int]:
        """Live processes below the slurmd daemons: slurmstepd and every task."""
        table = proc_table()
        roots = {p.pid for name, p in self._procs.items() if name in self.nodes}
        found, todo = [], list(roots)
        while todo:
            parent = todo.pop()
            for pid, (ppid, _comm, state) in table.items():
                if ppid == parent:
                    todo.append(pid)
                    if state != "Z":
                        found.append(pid)
        return found

    def stop(self) -> None:
        """Cancel every job, stop every daemon, remove the directories."""
        if "slurmctld" in self._procs and self._procs["slurmctld"].poll() is None:
            subprocess.run(["scancel", "--full", "-u", "root"], env=self.env(), capture_output=True,
                           timeout=30, stdin=subprocess.DEVNULL)
        for name in list(self._procs)[::-1]:
            proc = self._procs.pop(name)
            if proc.poll() is None:
                try:
                    os.killpg(proc.pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass
                try:
                    proc.wait(10)
                except subprocess.TimeoutExpired:
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait()
        # slurmstepd daemons double-fork to init: anything still pointing at our conf goes too
        for pid in pids_using(str(self.conf)):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        for path in MUNGE_DIR.glob(f"{self.tag}*"):
            path.unlink(missing_ok=True)
        shutil.rmtree(self.base, ignore_errors=True)

    def __enter__(self) -> "SlurmTestEnv":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def pids_using(conf: str) -> list[int]:
    """Live processes whose environment has ``SLURM_CONF=conf`` (tasks, sruns, stepds)."""
    needle = f"SLURM_CONF={conf}".encode()
    found = []
    for d in filter(str.isdigit, os.listdir("/proc")):
        try:
            environ = Path(f"/proc/{d}/environ").read_bytes().split(b"\0")
            state = Path(f"/proc/{d}/stat").read_bytes().rsplit(b")", 1)[1].split()[0]
        except OSError:
            continue
        if needle in environ and state != b"Z" and int(d) != os.getpid():
            found.append(int(d))
    return found
