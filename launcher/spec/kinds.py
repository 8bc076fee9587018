"""The two kinds of job, each answering for itself what the rest of the launcher asks of it.

A job is the built-in trainer (``Trainer``: task, data, optimizer, train) or the user's own
program (``Program``: the ``program:`` section). Which one is decided once, where the spec
is built (``programspec.job_type`` picks ``TrainerJobSpec`` or ``ProgramJobSpec``, which
take these classes' answers); nothing else asks which kind a job is. A caller asks the
kind for what it needs instead: how many steps, whether it reads data, the command every
process runs and its directory, the environment added, its ``job.json``, what is synced
to hosts, which modules the preflight looks for, which checks apply. A new question is a member of both
classes, each saying its kind's answer.

The classes hold no fields of their own: they read the spec's sections (``self.train``,
``self.program``, ...), so a test's stand-in job with only those fields can take them too.
"""

from __future__ import annotations

import os

from launcher.spec import crosschecks, programspec
from worker.contract import job as jobs
from worker.contract.sections import BUILTIN_TASKS  # the tasks worker.tasks builds in

# The module podlaunch's worker imports first (``python -m worker`` runs it).
WORKER_MAIN = "worker.trainer.main"
# A program's argv[0] that stands for the host's interpreter (the cluster's ``python``).
PYTHON_NAMES = ("python", "python3")


class Trainer:
    """The built-in trainer's answers: every process runs podlaunch's worker over the
    spec's task, data, optimizer and train sections (``TrainerJobSpec``)."""

    user_command = False  # every process runs podlaunch's worker, not the user's command
    program_num_steps = None  # the steps a user's program says it will report: not one
    rendezvous = True  # its workers say their host's facts and take the coordinator's address
    working_directory = None  # the backend's own (the workdir); the task is found on PYTHONPATH
    synced_dirs = ()  # nothing of its own to sync (cluster.sync_dir is the cluster's)

    @property
    def num_steps(self) -> int:
        """The steps the job runs: ``train.num_steps``."""
        return self.train.num_steps

    num_steps_key = "train.num_steps"  # the setting num_steps comes from

    @property
    def learning_rate(self) -> float | None:
        """The optimizer's step size (``optimizer.learning_rate``): what a diverged loss's
        advice lowers."""
        return self.optimizer.learning_rate

    @property
    def data_lines(self) -> tuple[str, ...]:
        """What the launch says of the data before it starts: its epochs (``epoch_text``)."""
        return (self.epoch_text(),)

    @property
    def batch_text(self) -> str:
        """The dry run's words on the batch: ``; global_batch_size 64 = 16 per device``."""
        return (f"; global_batch_size {self.train.global_batch_size} "
                f"= {self.per_device_batch_size} per device")

    @property
    def rows_in_memory(self):
        """The data section whose rows every worker makes and holds in memory
        (``data.source: synthetic``), or None (a file's rows are memory-mapped)."""
        return self.data if self.data.source == "synthetic" else None

    @property
    def uses_compilation_cache(self) -> bool:
        """Whether its workers keep JAX's persistent compilation cache:
        ``train.compilation_cache``."""
        return self.train.compilation_cache

    @property
    def local_copies(self) -> bool:
        """Whether every host keeps local copies of the state (the local tier,
        ``checkpoint.local_every_steps`` not 0)."""
        return bool(self.checkpoint.local_every_steps)

    @property
    def needs_coordinator(self) -> bool:
        """Whether its processes join JAX's coordinator: a trainer of one process joins no
        ``jax.distributed`` (``worker.runtime.joining.single_process``)."""
        return self.num_processes > 1

    @property
    def task_module(self) -> str | None:
        """The module of a user's task (``task.name`` up to ``:``), which the workers import;
        None for a built-in task."""
        if self.task.name in BUILTIN_TASKS:
            return None
        return self.task.name.split(":")[0]

    @property
    def host_commands(self) -> tuple:
        """Commands each host must find on its PATH (none: the worker is the interpreter's)."""
        return ()

    @property
    def worker_modules(self) -> tuple:
        """The modules a worker imports first, which a preflight looks for on each host:
        ``worker.trainer.main`` and a user task's module."""
        return (WORKER_MAIN,) + ((self.task_module,) if self.task_module else ())

    def command(self, python: str, run_dir: str, process_id: int) -> tuple:
        """Every process's argv on a host whose interpreter is ``python``: podlaunch's worker.
        ``-P`` keeps a user's ``worker.py`` or ``launcher.py`` in the working directory from
        standing in for podlaunch's packages (``worker/__main__.py`` searches that directory
        last, for the user's task); the job, run and process id name the process in ``ps``."""
        return (python, "-P", "-m", "worker", "--job", self.name,
                "--run", os.path.basename(os.path.normpath(run_dir)),
                "--process-id", str(process_id))

    def environment(self, coordinator_address: str) -> dict:
        """What the job adds to every process's environment, after the placement's: nothing
        (podlaunch's worker reads the contract's identity)."""
        return {}

    def job_file(self) -> jobs.WorkerJob:
        """What its workers read as ``job.json``: a ``worker.contract.job.WorkerJob``, the spec's
        sections that the worker reads."""
        return jobs.WorkerJob.from_spec(self)

    def profile_start_problem(self, start_step: int) -> str | None:
        """Why ``profile.start_step`` cannot be traced, or None: the trainer traces any step."""
        return None

    def checked(self, raw: dict, ctx):
        """The trainer's own cross-field checks (``crosschecks.check_trainer``): the batch over
        devices, fused steps, the data's settings and files. Problems go to ``ctx``; returns
        the spec with ``data.path`` made absolute and ``data_rows`` counted."""
        return crosschecks.check_trainer(self, raw, ctx)


class Program:
    """The user's own program's answers: every process runs ``program.argv`` from
    ``program.dir``, and trains, reads data and saves checkpoints itself
    (``ProgramJobSpec``)."""

    user_command = True  # every process runs program.argv
    data_lines = ()  # a program reads its own data
    batch_text = ""  # and makes its own batches
    rows_in_memory = None  # its memory is its own business
    rendezvous = False  # a program says no facts; a backend that needs them probes the hosts
    learning_rate = None  # a program's optimizer is its own

    @property
    def working_directory(self) -> str:
        """The directory every process runs from: ``program.dir`` (absolute once checked)."""
        return self.program.dir

    @property
    def synced_dirs(self) -> tuple:
        """What the job syncs to each ssh/tpu host's workdir, as ``(key, directory, rules)``:
        ``program.dir`` with ``program.include``/``exclude``."""
        return (("program.dir", self.program.dir, self.program.sync_rules),)

    @property
    def num_steps(self) -> int | None:
        """The steps the program says it will report: ``program.num_steps`` (None: it did
        not say)."""
        return self.program.num_steps

    num_steps_key = "program.num_steps"  # the setting num_steps comes from

    @property
    def program_num_steps(self) -> int | None:
        """The steps the program says it will report (``program.num_steps``), or None."""
        return self.num_steps
    uses_compilation_cache = False  # a program runs its own JAX
    local_copies = False  # a program keeps its own checkpoints
    needs_coordinator = True  # a program calls jax.distributed.initialize itself
    task_module = None  # no task: what it imports is the program's business
    worker_modules = ()  # nothing of podlaunch's by name (it imports podlaunch.program)

    @property
    def host_commands(self) -> tuple:
        """``program.argv[0]`` when each host finds it on its PATH (a bare name other than
        ``python``/``python3``, which are the cluster's interpreter): the ssh preflight looks
        it up there, after the setup and the environment, as the workers will."""
        command = self.program.argv[0]
        return () if command in ("python", "python3") or "/" in command else (command,)

    def command(self, python: str, run_dir: str, process_id: int) -> tuple:
        """Every process's argv on a host whose interpreter is ``python``: ``program.argv``,
        a leading ``python``/``python3`` being the host's interpreter (the cluster's
        ``python``), as for the built-in worker."""
        argv = tuple(self.program.argv)
        if argv[0] in PYTHON_NAMES:
            argv = (python,) + argv[1:]
        return argv

    def environment(self, coordinator_address: str) -> dict:
        """What the job adds to every process's environment, after the placement's:
        ``JAX_COORDINATOR_ADDRESS`` (``jax.distributed.initialize()`` with no arguments reads
        it, and ``worker.program`` passes it), then ``program.env``."""
        return {"JAX_COORDINATOR_ADDRESS": coordinator_address, **self.program.env}

    def job_file(self) -> jobs.ProgramJob:
        """What its processes' ``worker.program`` helper reads as ``job.json``: a
        ``worker.contract.job.ProgramJob`` (``program.num_steps`` and the sections every job has)."""
        return jobs.ProgramJob.from_spec(self)

    def profile_start_problem(self, start_step: int) -> str | None:
        """Why ``profile.start_step`` cannot be traced, or None: a program's trace starts at
        one of its ``worker.program.report`` calls, so not at step 1."""
        if start_step == 1:
            return ("a program's trace starts at one of its worker.program.report calls, so "
                    "the first step it can trace is 2; set 2 or later")
        return None

    def checked(self, raw: dict, ctx):
        """The program's own cross-field checks (``programspec.check_program``): its
        directory, nothing of the trainer's that it would ignore, no module that hides
        podlaunch's. Problems go to ``ctx``; returns the spec with ``program.dir`` absolute."""
        return programspec.check_program(self, raw, ctx)
