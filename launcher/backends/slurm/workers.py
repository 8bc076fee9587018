"""One worker process = one Slurm job step: ``srun --ntasks=1 --nodelist=NODE``, a local child.

Why a step per process (docs/slurm.md): each process then has its own output
stream (no demultiplexing of ``srun --label``), its own exit code or signal
(srun's "task 0: Killed" line; "Node failure on n2", after which srun exits 0), and can be signalled alone; fail-fast across
steps is ``launcher.run.supervise``'s, as on every backend. Steps are named
``<prefix>p<id>`` so a later launch (``--kill-stale``) and this one's teardown
find them in ``squeue -s``.

``terminate`` asks Slurm to SIGTERM the step's task (``scancel --signal=TERM``;
srun itself turns a SIGTERM into SIGKILL of the step), ``kill`` SIGKILLs the
task the same way and then srun. srun gets SIGTERM when the launcher dies
(PR_SET_PDEATHSIG), on which it kills its step: a launcher killed with SIGKILL
leaves no task behind.

srun's own messages (how the task ended, a node failure) are read from srun's
stderr only, and the task's stderr is joined to its stdout on the node
(``TASK_SHELL``): a task that prints ``srun: error: n1: task 0: Killed`` prints
a line like any other, and cannot make the launcher think it died.
"""

from __future__ import annotations

import ctypes
import queue
import re
import signal
import subprocess
import threading
import time
from typing import Callable, Iterator

from launcher import proctl
from launcher.backends.slurm.commands import Slurm, scrubbed
from launcher.console import lines
from launcher.errors import LaunchError
from launcher.plan import ProcessPlan
from launcher.ends import Exit, exit_of, Exited, Killed, Lost
from worker import contract
from worker.contract import causes, profiling, signals, wire

# srun's own report of how its task ended: "srun: error: n2: task 0: Killed"
TASK_END = re.compile(r"^srun: error: (?P<node>\S+): task \d+: (?P<what>.+)$")
NODE_FAILURE = re.compile(r"^srun: error: Node failure on (?P<node>\S+)$")  # srun then exits 0
EXITED = re.compile(r"^Exited with exit code (\d+)$")
# slurmstepd's word that the step (or its job) reached its time limit, relayed by srun:
# "slurmstepd: error: *** STEP 26.1 ON n2 CANCELLED AT 2026-12-01T10:00:00 DUE TO TIME LIMIT ***"
TIME_LIMIT = re.compile(r"\*\*\* (?:STEP|JOB) \S+ ON \S+ CANCELLED AT \S+ DUE TO TIME LIMIT \*\*\*")
EOF_WAIT_S = 1.0
# Runs the task on its node with its stderr joined to its stdout, so srun's own stderr
# carries srun's messages alone, and owner-only files (what it writes may hold secrets).
TASK_SHELL = ("sh", "-c", 'umask 077; exec "$@" 2>&1', "podlaunch-task")
SIGNALS = {signal.strsignal(s): int(s) for s in signal.Signals if signal.strsignal(s)}


def _term_with_parent() -> None:
    try:  # PR_SET_PDEATHSIG = 1: srun gets SIGTERM when the launcher dies, and kills its step
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM, 0, 0, 0)
    except (OSError, AttributeError):
        pass


def srun_argv(job_id: str, node: str, step_name: str, cluster, argv: tuple,
              workdir: str | None = None) -> list:
    """The srun command of one process: one task on ``node``, in job ``job_id``.

    A gpu job's step asks for every GPU the job has on the node (``--gres=gpu:N``,
    ``gpus_per_node``), so its ``CUDA_VISIBLE_DEVICES`` (Slurm's) lists the same GPUs for
    every process there, and each process uses its own ``local_device_ids`` of them. Without
    it a step inherits the allocation's per-task request: inside ``salloc --gpus-per-task=1``
    every one-task step got the same single GPU, renumbered 0 for JAX, and the planned
    ``local_device_ids`` 1 did not exist (Slurm 22.05, tests/backends/slurm/test_slurm_gpu.py).
    Steps share those GPUs (``--overlap``); Slurm gives each the first N of the job's there."""
    cmd = ["srun", f"--jobid={job_id}", "--nodes=1", "--ntasks=1", f"--nodelist={node}",
           f"--job-name={step_name}", "--overlap", "--kill-on-bad-exit=1", "--wait=0",
           "--export=ALL", "--quiet"]
    if cluster.cpus_per_process:
        cmd.append(f"--cpus-per-task={cluster.cpus_per_process}")
    if cluster.gpus_per_node:
        cmd.append(f"--gres=gpu:{cluster.gpus_per_node}")
    if workdir:
        cmd.append(f"--chdir={workdir}")
    return cmd + ["--", *TASK_SHELL] + list(argv)


class SrunWorker:
    """A worker process started by a local ``srun`` as its own job step."""

    def __init__(self, plan: ProcessPlan, job_id: str, step_name: str, argv: list,
                 slurm: Slurm, base_env: dict | None = None,
                 judge: Callable[..., Exit] | None = None, rendezvous: bool = False):
        self.plan = plan
        self.job_id = job_id
        self.step_name = step_name
        self.slurm = slurm
        self._step: str | None = None
        self._ended: Exit | None = None  # from srun's "task 0: ..." line
        self._eof = False
        self._exited_at: float | None = None
        # the session's reading of a failure against the job's state, and the node srun
        # reported failed (None: none)
        self.judge = judge
        self.failed_node: str | None = None
        self.argv = argv
        self._early: list = []  # lines read before the facts line (contract.RENDEZVOUS)
        self._srun: queue.Queue = queue.Queue()  # srun's own stderr lines, as they come
        env = scrubbed(base_env, plan.env, drop=plan.unset)
        if rendezvous:
            env[contract.RENDEZVOUS] = "stdin"
        try:
            self._proc = subprocess.Popen(
                argv, env=env, stdin=subprocess.PIPE if rendezvous else subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE, start_new_session=True, preexec_fn=_term_with_parent,
                text=True, encoding="utf-8", errors="replace", bufsize=1)
        except OSError as exc:
            raise LaunchError(f"cannot start srun for process_id {plan.process_id}: "
                              f"{causes.exhausted(exc) or exc.strerror}") from None
        self._srun_reader = threading.Thread(target=self._read_srun, daemon=True,
                                             name=f"srun-{plan.process_id}")
        self._srun_reader.start()

    def _read_srun(self) -> None:
        """srun's stderr: its reports of how the task ended, kept for ``poll``, and shown."""
        for line in self._proc.stderr:
            line = line.rstrip("\n")
            self._said_by_srun(line)
            self._srun.put(line)
        self._proc.stderr.close()

    time_limit: str | None = None  # slurmstepd's line that the step reached its time limit

    def _said_by_srun(self, line: str) -> None:
        """One line of srun's own stderr: how its task ended, a node failure, or the step's
        time limit, kept."""
        if "DUE TO TIME LIMIT" in line and TIME_LIMIT.search(line):
            self.time_limit = TIME_LIMIT.search(line).group(0)
        match = TASK_END.match(line)
        failure = NODE_FAILURE.match(line)
        if failure:
            self._ended = Lost(f"srun reports a node failure on {failure.group('node')}")
            self.failed_node = failure.group('node')
        if match:
            what = match.group("what").strip()
            code = EXITED.match(what)
            if code:
                self._ended = Exited(int(code.group(1)))
            elif what.split(" (")[0] in SIGNALS:
                self._ended = Killed(SIGNALS[what.split(" (")[0]])

    def _srun_lines(self) -> list:
        out = []
        try:
            while True:
                out.append(self._srun.get_nowait())
        except queue.Empty:
            return out

    def facts(self) -> dict | None:
        """The worker's first line (``wire.Facts``) as a dict; None if its output ends first.

        Lines before it (srun's own errors) are kept for ``lines``.
        """
        for line in self._proc.stdout:
            parsed = wire.parse(line.rstrip("\n"))
            if isinstance(parsed, wire.Facts) and parsed.facts is not None:
                return parsed.facts
            self._early.append(line)
        return None

    def early_lines(self) -> list:
        """What the step printed before its facts line, and srun's messages so far."""
        self._early += [line + "\n" for line in self._srun_lines()]
        return [line.rstrip("\n") for line in self._early]

    def send(self, address: str) -> None:
        """The coordinator's ``host:port``, on the worker's stdin (then closed)."""
        try:
            self._proc.stdin.write(address + "\n")
            self._proc.stdin.close()
        except (OSError, ValueError):  # the step already ended: supervise reads how
            pass

    def lines(self) -> Iterator[str]:
        for line in self._early:
            yield line.rstrip("\n")
        within = False  # inside a long line (after a Piece): srun's lines wait for its end
        for line in lines.stream_lines(self._proc.stdout):  # a long line in pieces
            if not within:
                yield from self._srun_lines()
            yield line
            within = isinstance(line, lines.Piece)
        self._proc.stdout.close()
        self._srun_reader.join(EOF_WAIT_S * 5)  # srun's last lines say how the task ended
        yield from self._srun_lines()
        self._eof = True

    def poll(self) -> Exit | None:
        code = self._proc.poll()
        if code is None:
            return None
        if not self._eof:  # srun's last lines say how the task ended (even with exit 0): read them
            self._exited_at = self._exited_at or time.monotonic()
            if time.monotonic() - self._exited_at < EOF_WAIT_S:
                return None
        return self._verdict(code)

    def _verdict(self, code: int) -> Exit:
        """How the task ended, from srun's exit ``code`` and its own lines, read against the job."""
        if code == 0 and self._ended is None and self.time_limit is None:
            return Exited(0)
        # no "task 0:" line: srun failed itself (no step, the job is gone) or died of a signal;
        # a step Slurm said it cancelled at its time limit is that, whatever its task's end
        # and in whichever order srun's lines came (an exit 0 read first was a program error)
        ended = self._ended or exit_of(code)
        if self.judge is None:
            return ended
        return self.judge(ended, self.failed_node, time_limit=self.time_limit is not None)

    def step(self) -> str | None:
        """This process's step id ``J.S``, once Slurm lists it."""
        if self._step is None:
            for step, name in self.slurm.steps_named(self.job_id, self.step_name):
                if name == self.step_name:
                    self._step = step
        return self._step

    def terminate(self) -> None:
        step = self.step()
        if step is not None:
            self.slurm.cancel(step, signal="TERM")
        else:  # not registered yet: srun kills what it started
            proctl.signal_pid(self._proc.pid, (signal.SIGTERM,))

    def kill(self) -> None:
        step = self.step()
        if step is not None:
            self.slurm.cancel(step, signal="KILL")
        proctl.signal_pid(self._proc.pid, (signal.SIGTERM,))  # srun: kill the step, then exit

    def dump_stacks(self) -> None:
        step = self.step()
        if step is not None:  # Slurm signals the step's task: the worker (and what it started)
            self.slurm.cancel(step, signal=signals.STACKS_SIGNAL.name[3:])

    def request_profile(self, text: str, failed=None) -> None:
        profiling.write_request(self.plan.run_dir, text)  # the run directory is shared with the nodes

    def stopped(self) -> bool:
        return False  # the task's state lives on its node; the watchdog's SIGKILL covers it
