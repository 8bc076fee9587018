"""The backend interface: where processes go, and the live session that runs them.

A backend answers one question, *where do the processes go* (``Placement``s
and a coordinator address), and owns the live resources needed to start them
(connections, gcloud answers, allocations) in a ``Session`` with an explicit
lifecycle. Everything else is shared and never names a backend: the plan
(``launcher.plan.make_plan``, a pure function), supervision, restarts, the
console and the summary.

The shape follows JAX's ``jax/_src/clusters/`` (one base class, one small
module per environment) and torch elastic's agent (a few overridable hooks
around one run loop, ``launcher.run.restarts.run``)::

    backend = backends.for_job(job)           # registry, keyed by cluster.backend
    backend.check(job, options)               # local checks; SpecError = exit 2
    session = backend.session(job, run_dir, console, options)
    try:
        plan = session.plan()                 # prepare(): discover, preflight, placements
        workers = session.start(plan)         # one Worker per process, process_id order
        ...                                   # supervise; on a retryable failure:
        session.end_attempt(); plan = session.plan(restart=True); ...
    finally:
        session.close()

Adding a backend is one module with a ``Backend`` subclass (and its cluster
settings dataclass) plus one entry in ``launcher.backends.REGISTRY``; see
docs/backends.md.

Taking a run back (``launch attach`` of a detached run whose supervisor was killed) is not
part of the seam every backend implements: a session whose processes outlive their
supervisor offers it as an object, ``Session.reattach`` (a ``Reattach``; None: it cannot),
with a typed ``Handle`` of what the run holds on the backend beyond its processes, kept in
the run's journal (the shape of SkyPilot's ``ResourceHandle``).
"""

from __future__ import annotations

import abc
import dataclasses
from typing import ClassVar

from launcher import plan as planning
from launcher.console import NullConsole
from launcher.errors import Problem, SpecError


class ClusterSettings:
    """Base of every backend's ``cluster:`` dataclass (frozen, kw_only, built by ``schema``).

    Subclasses provide ``backend`` (a Literal of the backend's name), ``env``,
    ``grace_s``, and the three facts the spec derives its sizes from:
    ``num_processes_total``, ``devices_per_process`` and ``platform``.
    """

    # whether a restart can go on with fewer processes than the spec (``restarts.min_processes``):
    # hosts that can be dropped one by one (ssh), not an allocation placed by a scheduler
    can_shrink: ClassVar[bool] = False

    def problems(self) -> list:
        """Cross-field problems as ``(key under cluster, message)`` pairs; none by default."""
        return []

    @property
    def resolved_devices_per_process(self) -> int:
        """Devices each process sees: ``devices_per_process``, unless a backend derives it
        from the machine (local: a TPU VM's chips shared among the processes)."""
        return self.devices_per_process


@dataclasses.dataclass(frozen=True)
class Options:
    """What the command line asks of a backend.

    Attributes:
      python: this machine's interpreter (local workers run ``python -m worker``).
      kill_stale: stop survivors of an earlier run of this job instead of refusing.
      dry_run: prepare and plan only; change nothing anywhere (stop no process,
        remove no file).
      resume: the run continues an earlier one (``--resume``): its first attempt follows a
        fault too (a spare may take the place of a host that is gone).
      detached: the supervisor is a detached run's (``launch --detach``, ``launch attach``).
        Part of the seam's contract (``Session``): a session with a ``reattach`` starts
        processes that outlive it and keep their output on their hosts; one without ignores
        it, its processes end with their supervisor.
      adopting: the first plan is of processes already running, taken back (``launch
        attach``). Part of the seam's contract (``Session``): only a session with a
        ``reattach`` is given it, and its first ``prepare`` (``restart=False``) then checks
        nothing that those processes themselves would fail (the chips they hold, the
        coordinator port they listen on, this run's own processes as survivors).
    """

    python: str
    kill_stale: bool = False
    dry_run: bool = False
    resume: bool = False
    detached: bool = False
    adopting: bool = False


class Session(abc.ABC):
    """One run's live resources on one backend, from preflight to teardown.

    Lifecycle: ``prepare`` (via ``plan``) once per attempt, ``start`` once per
    attempt, ``end_attempt`` after each attempt that is followed by another,
    ``close`` exactly once at the end (also after errors). ``close`` must be
    safe to call at any point.

    ``reattach``: how a detached run's processes, which outlive a supervisor that is killed,
    are taken back (``launch attach``), a ``Reattach``; None (the default): they cannot be.

    The contract for a detached run and a take-back, whole (``tests/fitness/test_seam.py``
    fails, naming the part, for a backend that misses one):

    - with a ``reattach``: ``start`` reads ``options.detached`` (its processes then outlive
      a killed supervisor and keep their output where ``Reattach.adopt`` reads it), and
      ``prepare`` reads ``options.adopting`` (the first plan is of processes running already:
      check nothing they themselves would fail);
    - without one (None): no process outlives its supervisor, detached or not (a launcher
      killed leaves nothing running: ``launch attach`` then says the run continues from its
      last checkpoint), and neither option is read.
    """

    def __init__(self, job, run_dir: str, console=None, options: Options | None = None):
        self.job = job
        self.run_dir = run_dir
        self.console = console if console is not None else NullConsole()
        self.options = options or Options(python="python3")
        # each host the run stopped using, in order: {host, process_ids, by (its
        # replacement, or None: the run shrank), why, text}; ``restarts`` reports them
        self.host_changes: list = []
        self.reattach: Reattach | None = None

    def failed(self, plan: planning.Plan, failure, result=None) -> None:
        """An attempt of ``plan`` failed with ``failure`` (``launcher.run.classes.Verdict``;
        ``result``: its ``state.Result``) and a restart follows: a backend that can place the
        next attempt elsewhere counts it against the failed process's host (ssh: spares and
        quarantine; Slurm: the node)."""

    @abc.abstractmethod
    def prepare(self, restart: bool = False) -> tuple[tuple, str]:
        """Discover and check where the processes go.

        Args:
          restart: this prepares a restart after a failed attempt (the failed
            attempt's survivors, if any, are ours to stop).

        Returns:
          (placements in process order, coordinator_address ``host:port``).

        Raises:
          SpecError: bad input found only now (nothing was started).
          LaunchError: the cluster cannot run the job now.
        """

    def plan(self, restart: bool = False) -> planning.Plan:
        """``prepare``, then the pure plan of every process."""
        placements, coordinator_address = self.prepare(restart=restart)
        return planning.make_plan(self.job, placements, self.run_dir, coordinator_address)

    def describe(self, plan: planning.Plan) -> str:
        """The ``--dry-run`` text: the plan; backends add what they would submit."""
        return planning.describe(plan)

    @abc.abstractmethod
    def describe_start(self, plan: planning.Plan) -> str:
        """One line for the console: what is about to start, and where."""

    @abc.abstractmethod
    def start(self, plan: planning.Plan) -> list:
        """Start every planned process; return one ``Worker`` each, in process_id order.

        Raises:
          LaunchError: some process could not start; every one already started
            has been stopped.
        """

    def end_attempt(self) -> None:
        """Release what only the ended attempt used (connections, channels)."""

    def succeeded(self) -> None:
        """The run has succeeded, every process ended: clean up what only a resume would
        have needed (called before ``close``)."""

    def close(self) -> None:
        """Release everything; safe to call more than once."""
        self.end_attempt()


class Handle:
    """What a run holds on a backend beyond its processes (a scheduler's job and the nodes it
    placed), typed per backend, in a detached run's journal: the shape of SkyPilot's
    ``ResourceHandle``. A subclass is a frozen dataclass of plain fields."""

    def to_json(self) -> dict:
        """The journal's ``session`` entry."""
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, entry: dict) -> "Handle":
        """The handle a journal's ``session`` entry names, every field checked.

        Raises:
          SpecError: it names nothing usable (the journal is a file: never trusted as is).
        """
        raise NotImplementedError


class Reattach(abc.ABC):
    """Taking a detached run back after its supervisor was killed (``launch attach``): the
    part of a session whose processes outlive their supervisor (``Session.reattach``).

    The supervisor that takes the run back (``launcher.run.starts.TakeBack``,
    ``launcher.run.adopt``) calls, with the run's lock held: ``rejoin`` with the journal's
    handle before the session's first ``plan``; then ``adopt`` with the processes the journal
    names, or ``stop_strays`` where the killed one was starting an attempt or waiting to.
    Nothing is signalled before what the journal names is proven the run's own.

    Attributes:
      handle_type: the backend's ``Handle`` class; None: it keeps none (the processes'
        records, proven one by one, are all it needs).
    """

    handle_type: ClassVar[type | None] = None

    def handle(self) -> Handle | None:
        """What the journal keeps of the session beyond its processes (rewritten with it)."""
        return None

    def rejoin(self, handle: Handle | None) -> None:
        """Take back the run whose killed session kept ``handle``, before the first ``plan``;
        nothing is changed until what it names is proven the run's own."""

    @abc.abstractmethod
    def adopt(self, plan: planning.Plan, records: list) -> list:
        """Take back the running processes of ``plan`` (its attempt) that a killed supervisor
        started, from their journal ``records`` (``launcher.rundir.journal``); one ``Worker``
        each, in process_id order, as ``Session.start`` returns them.

        Raises:
          SpecError: a record is not usable; nothing was signalled.
        """

    def stop_strays(self) -> list:
        """Stop every process of this run still running that no journal names (a supervisor
        killed while starting them), before one that took the run back starts any; returns
        their pids (or step ids)."""
        return []

    def handle_entry(self) -> dict:
        """``handle`` as the journal's ``session`` entry ({} for none)."""
        handle = self.handle()
        return handle.to_json() if handle is not None else {}

    def read_handle(self, entry) -> Handle | None:
        """The journal's ``session`` entry as this backend's ``Handle`` (None: it keeps none).

        Raises:
          SpecError: the entry names nothing usable.
        """
        if self.handle_type is None:
            return None
        return self.handle_type.from_json(entry if isinstance(entry, dict) else {})


def reattach_of(session: Session) -> Reattach:
    """``session.reattach``, or the sentence why this backend cannot take a run back.

    Raises:
      SpecError: the session has no ``Reattach``; nothing was signalled.
    """
    if session.reattach is None:
        # the seam's contract: a session without a Reattach lets no process outlive its
        # supervisor, so nothing of the run is left to stop
        raise SpecError([Problem("RUN", None, "", (
            f"the {session.job.cluster.backend} backend cannot take a run's processes back: "
            "they ended with the supervisor that was killed; continue the run from its last "
            "checkpoint (`launch resume RUN`)"))])
    return session.reattach


class Backend(abc.ABC):
    """One kind of cluster. Subclasses set the class attributes and ``session``.

    Attributes:
      name: the ``cluster.backend`` value that selects it.
      cluster_type: the frozen settings dataclass of ``cluster:`` (schema checked).
      docs: the pages (from the repository's root) that document every field of
        ``cluster_type``; ``tests/spec/test_spec.py`` holds each field to them.
      stops_stale: whether ``--kill-stale`` applies (hosts that outlive a launcher); its help
        and its refusal list the registry's backends that set it.
      rehearses: where ``rehearsal`` gives a backend, what ``--rehearse`` applies to, as the
        refusal of ``--rehearse`` lists it (``"tpu"``); "" for none.
    """

    name: ClassVar[str]
    cluster_type: ClassVar[type]
    docs: ClassVar[tuple] = ()
    stops_stale: ClassVar[bool] = False
    rehearses: ClassVar[str] = ""

    def check(self, job, options: Options) -> None:
        """Checks of this machine that only this backend needs (before any run file).

        Raises:
          SpecError: e.g. a user task not importable here (local backends).
        """

    def rehearsal(self, job) -> "Backend | None":
        """The backend that rehearses this job on this machine (``--rehearse``), or None where
        it has none (the launch refuses the flag, naming the registry's ``rehearses``)."""
        return None

    @abc.abstractmethod
    def session(self, job, run_dir: str, console=None, options: Options | None = None) -> Session:
        """A new session for one run of ``job`` (nothing is contacted yet)."""
