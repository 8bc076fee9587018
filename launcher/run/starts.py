"""How a launch begins, decided once: a fresh run, a ``--resume`` of one, or taking one back
(``launch attach`` of a detached run whose supervisor was killed). Each kind answers for
itself what the launch asks (as the job kinds do, ``launcher.spec.kinds``): its run
directory, its lock, its first attempt, the files it writes, its record (new or continued
from the sealed journal) and where the restart loop begins; a dry run is any of them stopped
after the plan (nothing is made, locked or written).

Flow (``launcher.commands.launch``)::

    start = choose(args, job, argv)      # Fresh | Resume | TakeBack
    run_dir = start.run_dir(held)
    start.join(session, held)            # before the plan (a take-back: lock, rejoin)
    start.lock(held)                     # unless a dry run: before the plan queues anything
    start.claim(held)                    # after a dry run's exit: index
    begin, watchers = start.open(plan, session, console, handoff, launched_at)
"""

from __future__ import annotations

import datetime
import os

import yaml

from launcher import owned
from launcher import plan as planning
from launcher.backends.base import reattach_of
from launcher.errors import Problem, SpecError
from launcher.run import adopt, notify, restarts
from launcher.rundir import index, jobrecord, journal as journals, launched, ledger, runlock, specdiff
from launcher.rundir.record import Record
from launcher.rundir.watcher import Watchers
from launcher.words import plural
from worker.contract import runfiles


def choose(args, job, argv: list, backend: str) -> "Start":
    """The kind of this launch, from its flags (``--adopt``, ``--resume``, else fresh);
    ``backend``: the backend's name, which a detached run's journal keeps.

    Raises:
      SpecError: ``--resume`` with ``--run-dir`` (a resume is in place).
    """
    if args.adopt:
        return TakeBack(job, args.adopt, argv, backend)
    if args.resume:
        if args.run_dir:
            raise SpecError([Problem("--resume", None, "", "resumes in place; drop --run-dir")])
        start = Resume(job, args.resume, argv, backend)
    else:
        start = Fresh(job, args.run_dir, argv, backend, dry_run=args.dry_run)
    start.inputs = launched.Inputs.given(args.job, args.cluster, args.overrides)
    return start


class Start:
    """A launch's beginning; subclasses answer each question for their kind.

    Attributes:
      flag: the flag a bad run directory is said under (``--run-dir``, ``--resume``, ``RUN``).
      resume: whether the first attempt restores the latest checkpoint.
    """

    flag = "--run-dir"
    resume = False
    taken: dict | None = None  # a take-back's: the verified journal
    inputs: launched.Inputs | None = None  # what launch resume continues from (launch.json)
    recorded = None  # the job's files to record (``launcher.rundir.jobrecord``), or None

    def __init__(self, job, requested: str | None, argv: list, backend: str):
        self.job, self.requested, self.argv, self.backend = job, requested, list(argv), backend
        self.dir = ""

    def run_dir(self, held: list) -> str:
        """The run directory, checked (and made, for a fresh run); ``held`` gets what is to be
        released on every way out."""
        raise NotImplementedError

    def join(self, session, held: list) -> None:
        """Before the plan: what the session must know of the run (nothing, but for a
        take-back)."""

    def lock(self, held: list) -> None:
        """Unless a dry run, before the plan: the run's lock (one launcher per run directory).
        A backend's plan queues what another launch of the job sees (a Slurm job, its probe
        step), and tells a live launch's from a stale one by this lock
        (``launcher.backends.slurm.launches``): taken after the plan, a sweep's second launch
        found the first's pending job unlocked and refused it as stale."""
        held.append(runlock.acquire(self.dir, self.flag, self.job.secrets))

    def claim(self, held: list) -> None:
        """Once no dry run, after the plan: the user's index of runs (every run command finds
        it from anywhere)."""
        index.add(self.dir)

    def first_attempt(self) -> int:
        return restarts.next_attempt(self.dir)

    def write_files(self, plan: planning.Plan, first_attempt: int) -> list:
        """``spec.yaml``, ``job.json`` (``write_run_files``), ``launch.json``, what the launch
        was given (``launcher.rundir.launched``), and the job's record (``launcher.rundir.
        jobrecord``: a new run's, or a resume's with ``--apply-changes``); the settings changed
        since an earlier attempt (none for a fresh run)."""
        changes = write_run_files(plan, first_attempt if self.resume else 0, self.job)
        if self.inputs is not None:
            launched.write(self.dir, self.inputs)
        if self.recorded is not None:
            jobrecord.write(self.dir, self.recorded)
        return changes

    def said(self, first_attempt: int) -> str:
        return f"run directory {self.dir}"

    def journal_source(self) -> tuple:
        """(argv, cwd, when launched) for a detached run's journal."""
        return self.argv, os.getcwd(), None

    def continue_record(self, record: Record) -> None:
        """What run.json continues from (a take-back: the killed launch's)."""

    def adopted(self, session, plan, console):
        """Where the restart loop goes on from (a take-back's ``journal.Adopted``), or None."""
        return None

    def open(self, plan: planning.Plan, session, console, handoff, launched_at: float) -> tuple:
        """Write the run's files, take back what runs (a take-back), start its record and its
        run-level watchers, and say the run directory.

        Returns:
          (``restarts.Begin``, ``watcher.Watchers``: run.json, the goodput so far, the ledger
          and, detached, the journal; told in that order, so the ledger's goodput is known to
          run.json at the end).

        Raises:
          SpecError: the run directory cannot be written (nothing has started: exit 2).
        """
        job, run_dir = self.job, self.dir
        proof = owned.carry_run_secret(run_dir, self.taken) \
            if handoff.detached else (None, "")
        first = self.first_attempt()
        try:
            changes = self.write_files(plan, first)
        except OSError as exc:  # nothing has started yet: this is bad input
            raise SpecError([Problem(self.flag, None, "", f"cannot write into {run_dir}: "
                                     f"{exc.strerror}; choose another directory")]) from None
        console.log_to(os.path.join(run_dir, "launcher.log"))
        adopted = self.adopted(session, plan, console)
        running = ledger.Running(ledger.read(run_dir))  # launch runs: the goodput so far
        record = Record(run_dir, job.name, job.num_steps, launched_at=launched_at,
                        running=running, devices=planning.devices_text(plan),
                        notify=notify.sender(job.notify, job.name, run_dir, console.say),
                        backend=self.backend)
        journal = self._journal(session, proof, launched_at, record) if handoff.detached else None
        self.continue_record(record)
        record.start(first)
        console.watchers.append(record.progress)  # launch runs: a running run's step and ETA
        handoff.run_dir_is(run_dir, console)
        console.say(self.said(first))
        if changes:
            console.say(f"resuming with {plural(len(changes), 'changed setting')} (the earlier "
                        f"attempts' spec is kept as spec.before-attempt-{first}.yaml): "
                        + "; ".join(changes))
        for line in job.data_lines:  # the epochs; a program reads its own
            console.say(line)
        begin = restarts.Begin(first_attempt=first, resume=self.resume, began_at=launched_at,
                               adopted=adopted)
        return begin, Watchers([running, ledger.Written(run_dir, console.say), journal, record])

    def _journal(self, session, proof: tuple, launched_at: float, record: Record):
        """A detached run's journal, written once before the first attempt."""
        argv, cwd, launched = self.journal_source()
        reattach = session.reattach
        journal = journals.Journal(self.dir, self.backend, argv, cwd, reattach is not None,
                                   session=reattach.handle_entry if reattach else None,
                                   key=proof[0], nonce=proof[1])
        journal.data["launched"] = launched or {"wall": journals.to_wall(launched_at),
                                                "before_s": record.before_s}
        taken = self.taken
        if taken:  # where the killed one left it, until this one's attempt is under way
            journal.data.update({k: taken.get(k) for k in journals.WHERE})
        journal.write()
        return journal


class Fresh(Start):
    """A new run: its directory made (``runs/<job>/<timestamp>`` or ``--run-dir``, new or
    empty), removed again if nothing was written into it."""

    def __init__(self, job, requested: str | None, argv: list, backend: str,
                 dry_run: bool = False):
        super().__init__(job, requested, argv, backend)
        self.dry_run = dry_run

    def run_dir(self, held: list) -> str:
        made = not os.path.exists(self.requested) if self.requested is not None else True
        self.dir = run_dir_for(self.job, self.requested, create=not self.dry_run)
        if made and not self.dry_run:  # a --run-dir is made by the lock, before the plan
            held.append(_RemovedIfEmpty(self.dir))  # a start that fails before any file: no trace
        _check_creatable(self.dir, self.flag)
        return self.dir

    def lock(self, held: list) -> None:
        """As every start's, its file removed again with a start that wrote nothing else (one
        refused in the plan leaves the directory as it found it: not "not empty" to a rerun)."""
        held.append(_NewRunLock(runlock.acquire(self.dir, self.flag, self.job.secrets), self.dir))


class Resume(Start):
    """``--resume RUN_DIR``: the run goes on in place from its latest complete checkpoint;
    refused beside live processes of the run (``owned.refuse_live_processes``) and when it
    changes what the run trains (``specdiff``)."""

    flag = "--resume"
    resume = True

    def run_dir(self, held: list) -> str:
        self.dir = specdiff.resume_dir(self.job, self.requested)
        if runlock.held(self.dir) is not True:  # held: the lock names its launcher
            owned.refuse_live_processes(self.dir, self.requested)
        _check_creatable(self.dir, self.flag)
        return self.dir

    def said(self, first_attempt: int) -> str:
        return f"run directory {self.dir} (resuming; attempt {first_attempt})"


class TakeBack(Start):
    """``launch --adopt RUN_DIR`` (started by ``launch attach``): a detached run whose
    supervisor was killed, taken back from its sealed journal (``launcher.run.adopt``); its
    lock is taken before anything is asked of its backend, and it writes no file of its own."""

    flag = "RUN"

    def __init__(self, job, requested: str, argv: list, backend: str):
        super().__init__(job, requested, argv, backend)
        self.taken = {}

    def run_dir(self, held: list) -> str:
        self.dir = specdiff.resume_dir(self.job, self.requested, "RUN")
        return self.dir

    def join(self, session, held: list) -> None:
        held.append(runlock.acquire(self.dir, "RUN", self.job.secrets))
        self.taken = adopt.check(self.dir)  # SpecError: nothing to take back
        reattach = reattach_of(session)  # SpecError where the backend cannot
        reattach.rejoin(reattach.read_handle(self.taken.get("session")))

    def lock(self, held: list) -> None:
        """Held since ``join``."""

    def claim(self, held: list) -> None:
        """The run is indexed since its first launch."""

    def first_attempt(self) -> int:
        return self.taken["attempt"]

    def write_files(self, plan: planning.Plan, first_attempt: int) -> list:
        return []

    def journal_source(self) -> tuple:
        return self.taken["argv"], self.taken["cwd"], self.taken.get("launched")

    def continue_record(self, record: Record) -> None:
        adopt.continue_record(record, self.taken)

    def adopted(self, session, plan, console):
        return adopt.take_back(session, plan, self.taken, console, self.dir)


def run_dir_for(job, requested: str | None, create: bool = False) -> str:
    """The run directory: ``requested`` (checked new or empty), or ``runs/<job>/<timestamp>``.

    With ``create`` the default one is made exclusively (``os.mkdir``): two launches of
    one job in the same millisecond (a sweep) each get their own, the later one with a
    ``-2``, ``-3``, ... suffix. A dry run names it and makes nothing.

    Raises:
      SpecError: ``requested`` is empty, a file, not empty, holds a run or is another
        user's; the default cannot be made.
    """
    if requested is None:
        stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S-%f")[:-3]
        base = owned.real_path(os.path.join("runs", job.name, stamp))
        if not create:
            return base
        _check_creatable(base, "--run-dir")
        os.makedirs(os.path.dirname(base), exist_ok=True)
        for n in range(1, 1000):
            path = base if n == 1 else f"{base}-{n}"
            try:
                os.mkdir(path, 0o700)
                return path
            except FileExistsError:
                continue
        raise SpecError([Problem("--run-dir", None, "", f"{base}: a thousand runs started in "
                                 "this millisecond; name a directory with --run-dir")])
    if not requested.strip():
        raise SpecError([Problem("--run-dir", None, "", "is empty; name a new directory, "
                                 "or leave the flag out for runs/<job>/<timestamp>")])
    run_dir = owned.real_path(requested)
    if os.path.isdir(os.path.join(run_dir, "logs")):
        raise SpecError([Problem("--run-dir", None, "", f"{run_dir} already holds a run; "
                                 "choose a new directory so nothing is overwritten "
                                 "(or continue it with --resume)")])
    if os.path.exists(run_dir) and not os.path.isdir(run_dir):
        raise SpecError([Problem("--run-dir", None, "", f"{run_dir} is a file; name a directory")])
    if os.path.isdir(run_dir) and os.listdir(run_dir):
        raise SpecError([Problem("--run-dir", None, "", f"{run_dir} is not empty; a run's files "
                                 "would mix with what is there: name a new or empty directory")])
    if create:  # an empty one of the user's own is made private as a new one is
        owned.make_private(run_dir)
    elif os.path.lexists(run_dir) and (os.path.islink(run_dir)
                                       or os.lstat(run_dir).st_uid != os.geteuid()):
        owned.check_dir(run_dir, "--run-dir")  # another user's: refused, in the dry run too
    return run_dir


class _RemovedIfEmpty:
    """A directory the launch made, removed at exit if nothing was written into it."""

    def __init__(self, path: str):
        self.path = path

    def release(self) -> None:
        try:
            os.rmdir(self.path)
        except OSError:  # not empty (the run's files), or gone
            pass


class _NewRunLock:
    """A fresh run's lock; released after its file is removed if the run directory holds
    nothing else (released before the directory's ``_RemovedIfEmpty``: ``held`` goes last
    first)."""

    def __init__(self, lock: runlock.RunLock, run_dir: str):
        self.lock, self.run_dir = lock, run_dir

    def release(self) -> None:
        try:
            if os.listdir(self.run_dir) == [runlock.LOCK_FILE]:
                os.unlink(self.lock.path)  # still held: no other launcher took it meanwhile
        except OSError:
            pass
        self.lock.release()


def _check_creatable(path: str, flag: str) -> None:
    """Bad input unless ``path`` exists as a directory or could be made (nothing is made here)."""
    parent = path
    while not os.path.exists(parent):
        parent = os.path.dirname(parent)
    if not os.path.isdir(parent) or not os.access(parent, os.W_OK | os.X_OK):
        what = "is a file" if not os.path.isdir(parent) else "is not writable"
        raise SpecError([Problem(flag, None, "", f"cannot create {path}: {parent} {what}; "
                                 "choose another directory")])


def write_run_files(plan: planning.Plan, first_attempt: int = 0, job=None) -> list:
    """``spec.yaml`` (the resolved spec, secrets masked: it may be shared) and ``job.json``
    (what the workers read, secrets included: mode 0600, readable by the owner only).

    On a resume (``first_attempt`` > 0) the spec the earlier attempts ran is kept as
    ``spec.before-attempt-N.yaml`` when the new one differs, so the run's record says what
    each attempt ran.

    Returns:
      The settings that changed since the earlier attempts (``key: old -> new``).

    Raises:
      OSError: a file could not be written.
    """
    job = job or plan.job  # the user's spec: hosts a spare or a shrink changed are not its
    os.makedirs(os.path.join(plan.run_dir, "logs"), exist_ok=True)
    spec_file = os.path.join(plan.run_dir, "spec.yaml")
    masked = job.to_masked_dict()
    changes = [f"{key}: {before!r} -> {now!r}" for key, before, now
               in specdiff.changes(plan.run_dir, masked)] if first_attempt else []
    if changes:
        os.replace(spec_file, os.path.join(plan.run_dir, f"spec.before-attempt-{first_attempt}.yaml"))
    # PyYAML's libyaml emitter where it was built with it: the same text, a seventh of the
    # CPU (0.5 ms per host of a launch's own cost with the pure-Python one)
    runfiles.write_whole(spec_file, f"# resolved from {os.path.abspath(job.source)}; secrets masked\n"
                         + yaml.dump(masked, sort_keys=False,
                                     Dumper=getattr(yaml, "CSafeDumper", yaml.SafeDumper)),
                         mode=0o644)
    # the worker's keys only (its contract, no defaults); secrets in clear: mode 0600
    job.job_file().to_json(plan.job_path)
    return changes
