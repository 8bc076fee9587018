"""A detached run's journal, ``RUN_DIR/supervisor.json``: what a supervisor that takes the run
back (``launch attach`` of a run whose supervisor was killed) needs to go on where it stopped.

A detached supervisor (``launch --detach``) keeps it: the command line it was started with
(to load the same spec), the attempt under way and its stages (wall clock), the restart
budgets used, the ledger entries of this launch's ended attempts and their failures, and for
each process of the attempt its wrapper (pid and start ticks, so that a reused pid is never
taken for it), its worker's process group, the control token of its lines, its output file
(``plan.output_path``: the worker writes there instead of into the supervisor's pipe, so nothing
is lost while nobody reads), how far the supervisor has read it (``offset``: every line
before it is in the process's log) and the log's size then (``logged``: a supervisor that
takes the run back cuts the log there and reads what follows the offset again, so no line is
lost or written twice), and the backend session's own part (``session``, ``Reattach.handle``:
a Slurm job's id and nodes). Between attempts it says the restart's wait instead.
Rewritten whole every ``EVERY_S`` while the run goes on (``alive_at``: the last moment a
supervisor is known to have watched; the gap to the adoption is the ledger's
``unsupervised``), and removed when the run ends by itself. Mode 0600: it holds the tokens
and the command line's ``--set`` values.

It is data, never trusted for what it says: each write is sealed (``launcher.owned.seal``:
an HMAC with the user's own key over its content and the run directory's real path), and
``read`` refuses one whose seal does not verify: written by someone else, or copied with its
run directory. The run's ``nonce`` derives the secret its processes carry
(``owned.run_secret``); a process named here is signalled only once it shows that secret.
Each process's output file is the run's own path (``plan.output_path``), never the
``out`` written here.
"""

from __future__ import annotations

import dataclasses
import json
import os
import time
from typing import Callable

from launcher import logtimes, owned
from launcher.errors import Problem, SpecError
from launcher.rundir import ledger
from launcher.rundir.watcher import RunWatcher
from worker.contract import runfiles

JOURNAL_FILE = "supervisor.json"
EVERY_S = 1.0
VERSION = 1
# where a run is (what a supervisor taking it back copies into its own journal until its own
# attempt is under way; the ended attempts' entries and failures are in ledger.json and
# run.json by then)
WHERE = ("attempt", "restarts", "counted", "budgets", "times", "workers", "waiting", "starting")


def to_wall(mono: float | None, clock: Callable[[], float] = time.monotonic) -> float | None:
    return None if mono is None else time.time() - (clock() - mono)


def to_mono(wall: float | None, clock: Callable[[], float] = time.monotonic) -> float | None:
    return None if wall is None else clock() - (time.time() - wall)


@dataclasses.dataclass
class Adopted:
    """What a supervisor took back (``restarts.run`` goes on from it).

    Attributes:
      attempt: the attempt under way (or, while ``wait_s`` is not None, the one that failed).
      workers: the attempt's processes, watched again; None between attempts.
      times: the attempt's ``ledger.Times`` (this clock), its ``unsupervised`` gap set.
      budgets: ``classes.Budgets``' counts as the journal kept them.
      restarts: restarts made in the killed launch; counted: its last count's words.
      wait_s: the restart's wait still to go (between attempts), else None.
      next_times: between attempts, the ``ledger.Times`` the next attempt begins with (this
        clock): its ``began_at`` is the moment the ended attempts' ledger entries count to
        (``restarts.run`` waits until then), so that no second is in two buckets or in none.
    """

    attempt: int
    workers: list | None
    times: ledger.Times | None
    budgets: dict
    restarts: int
    counted: str
    wait_s: float | None = None
    next_times: ledger.Times | None = None


class Journal(RunWatcher):
    """The supervisor's side, a run watcher (``launcher.rundir.watcher``): kept up to date by
    the restart loop and supervision's polls, removed when the launch ends."""

    def __init__(self, run_dir: str, backend: str, argv: list, cwd: str, adopts: bool = True,
                 clock: Callable[[], float] = time.monotonic,
                 session: Callable[[], dict] | None = None, key: bytes | None = None,
                 nonce: str = ""):
        """``key``: the user's (``owned.key``) that seals each write; ``nonce``: the run's, from
        which its processes' secret is derived (``owned.run_secret``)."""
        self.path, self.run_dir, self.key = os.path.join(run_dir, JOURNAL_FILE), run_dir, key
        self.clock, self.adopts = clock, adopts  # not adopts: written once, to say so
        self.data = {"version": VERSION, "backend": backend, "adopts": adopts,
                     "argv": list(argv), "cwd": cwd, "nonce": nonce,
                     "attempt": None, "restarts": 0, "counted": "", "budgets": {},
                     "entries": [], "failures": [], "times": None, "workers": [],
                     "waiting": None, "alive_at": time.time()}
        self.session = session  # the backend session's own part (``Reattach.handle_entry``)
        self.workers: list = []
        self._marks: list | None = None
        self._sizes: dict = {}  # each log's size (its path's) when the offsets were taken
        self._written_at = -float("inf")

    def state(self, attempt: int, budgets, restarts: int, counted: str, attempts: list) -> None:
        """Where the restart loop is: the attempt, the budgets, this launch's ended attempts."""
        self.data.update(attempt=attempt, restarts=restarts, counted=counted,
                         budgets={"used": {c.value: n for c, n in budgets.used.items()},
                                  "total": budgets.total, "in_a_row": budgets.in_a_row,
                                  "last": None if budgets.last is None else budgets.last.value},
                         entries=ledger.add_attempts([], attempts),
                         failures=[{"attempt": a.number, "class": a.failure.failure_class.value,
                                    "process_id": a.failure.process_id, "why": a.failure.why[:500]}
                                   for a in attempts if a.failure is not None])

    def attempt_starting(self, loop, times) -> None:
        self._state(loop)
        self.starting(times)

    def attempt_started(self, loop, times, workers: list) -> None:
        self._state(loop)
        self.started(times, workers)

    def attempt_ended(self, loop, attempt, wait_s: float | None) -> None:
        if wait_s is not None:
            self._state(loop)
            self.waiting(attempt.times.ended_at, wait_s)

    def run_ended(self, ending) -> None:
        self.close()

    def _state(self, loop) -> None:
        self.state(loop.number, loop.budgets, loop.restarts, loop.counted, loop.attempts)

    def starting(self, times: ledger.Times) -> None:
        """The attempt's processes are being started: a supervisor killed now leaves some that
        the journal does not name (``starting``: the one taking the run back stops them and
        starts the attempt again)."""
        if not self.adopts:
            return
        self.workers, self._marks = [], None
        self.data.update(workers=[], waiting=None, starting=True,
                         times={"began": to_wall(times.began_at, self.clock)})
        self.write()

    def started(self, times: ledger.Times, workers: list) -> None:
        """The attempt's processes run (started or taken back): each one's journal entry."""
        if not self.adopts:
            return
        self.workers = list(workers)
        self.data["starting"] = False
        self.data.update(times={"began": to_wall(times.began_at, self.clock),
                                "started": to_wall(times.started_at, self.clock),
                                "gaps": [[to_wall(a, self.clock), to_wall(b, self.clock)]
                                         for a, b in times.unsupervised]},
                         waiting=None)
        # no reader has run yet: every log holds exactly what precedes its process's offset
        # (a taken-back one was cut there). Without its size, a supervisor killed again within
        # EVERY_S left "logged" unset, and the next take-back read again, into the process's
        # own log, the lines the one before had written (each step line twice).
        self._marks = [w.read_to for w in self.workers]
        self._sizes = {w.plan.log_path: _size(w.plan.log_path) for w in self.workers}
        self.write()

    def waiting(self, since: float, wait_s: float) -> None:
        """The attempt failed and every process has ended: the restart waits ``wait_s`` from
        ``since`` (this clock)."""
        if not self.adopts:
            return
        self.workers, self._marks = [], None
        since_wall = to_wall(since, self.clock)
        self.data.update(workers=[], times=None,
                         waiting={"since": since_wall, "until": since_wall + wait_s})
        self.write()

    def before_flush(self) -> None:
        """Supervision's poll, before it flushes the logs: how far each process was read (every
        line before is in its log's buffer, and on disk once flushed)."""
        if self.adopts and self.clock() - self._written_at >= EVERY_S:
            self._marks = [w.read_to for w in self.workers]

    def after_flush(self, logs: list = ()) -> None:
        """Once the logs were flushed: the journal, with each process's log size (``logs``:
        the ``LogFile``s; every line before the offset is within it)."""
        if self.adopts and self._marks is not None and self.clock() - self._written_at >= EVERY_S:
            self._sizes = {log.path: log.flushed_size() for log in logs}
            self.write()

    def write(self) -> None:
        if self._marks is not None:
            self.data["workers"] = [dict(w.journal_entry(), offset=mark,
                                         logged=self._sizes.get(w.plan.log_path))
                                    for w, mark in zip(self.workers, self._marks)]
        if self.session is not None:
            self.data["session"] = self.session()
        self.data["alive_at"] = time.time()
        self._written_at = self.clock()
        data = self.data if self.key is None else owned.seal(self.run_dir, self.data, self.key)
        try:
            runfiles.write_whole(self.path, json.dumps(data) + "\n")
        except OSError:
            pass  # the next write may pass; a run is never stopped for its journal

    def close(self) -> None:
        """The run ended by itself (or was stopped): nothing to take back."""
        try:
            os.unlink(self.path)
        except OSError:
            pass


def _size(path: str) -> int:
    """The file's size in bytes; 0 when it is not there yet."""
    try:
        return os.lstat(path).st_size
    except OSError:
        return 0


def read(run_dir: str) -> dict:
    """The journal of ``run_dir``.

    Raises:
      SpecError: there is none (the run was not detached, or ended), it cannot be read, or
        its seal does not verify (``owned.unseal``: nothing it says is acted on).
    """
    path = os.path.join(run_dir, JOURNAL_FILE)
    try:
        data = json.loads(runfiles.read_regular(path))
    except FileNotFoundError:
        data = None
    except (OSError, ValueError, RecursionError) as exc:
        why = exc.strerror if isinstance(exc, OSError) and exc.strerror else exc
        raise SpecError([Problem("RUN", None, "", f"cannot read {path} ({why}): the run's "
                                 "processes cannot be taken back")]) from None
    if data is not None:
        why = owned.unseal(run_dir, data)
        if why is not None:
            raise SpecError([Problem("RUN", None, "", (
                f"the run's journal ({path}) is not trusted: {why}; nothing was taken back "
                "or signalled. A run's processes are taken back only from the directory they "
                "run in, by the user who started them"))])
    if not isinstance(data, dict) or data.get("version") != VERSION \
            or not isinstance(data.get("argv"), list) or not all(
                isinstance(a, str) for a in data["argv"]) or not isinstance(data.get("cwd"), str):
        raise SpecError([Problem("RUN", None, "", (
            f"the run in {run_dir} has no supervisor's journal ({path}): only a run started with "
            f"--detach can be taken back; `launch resume {run_dir}` continues it from its "
            "newest checkpoint once its processes are gone"))])
    if data.get("adopts") is False:
        raise SpecError([Problem("RUN", None, "", (
            f"the run in {run_dir} was started where its backend ({data.get('backend')}) could "
            "not take a run's processes back (its journal says so): they ended with the "
            "supervisor that was killed (such a backend lets none outlive it: "
            "launcher.backends.base.Session); continue the run from its newest checkpoint "
            f"(`launch resume {run_dir}`)"))])
    return data


def gap_s(data: dict, now: float | None = None) -> float:
    """Seconds since a supervisor last watched the run (its journal's ``alive_at``) to ``now``
    (wall clock; default: now)."""
    alive_at = data.get("alive_at")
    now = time.time() if now is None else now
    return max(0.0, now - alive_at) if isinstance(alive_at, (int, float)) else 0.0


def replay(tracked, clock: Callable[[], float] = time.monotonic) -> None:
    """Rebuild what an adopted process's lines said before the adoption (its progress, join,
    first step, saves: the ledger's and the summary's) from its launcher-side log, each line
    at the time it was written there; its watchdog clock then starts from now, so the
    unsupervised gap is not counted against it."""
    try:
        text = open(tracked.plan.log_path, encoding="utf-8", errors="replace",
                    opener=runfiles.opener).read()
    except OSError:
        return
    now_mono, now_wall = clock(), time.time()
    for line in text.splitlines():
        when = logtimes.time_of(line)
        line = line[logtimes.STAMP_CHARS:] if when is not None else line
        at = now_mono - (now_wall - when.timestamp()) if when is not None else now_mono
        if tracked.detail(line):
            continue
        tracked.observe(line, at)
    if tracked.progress_at is not None:
        tracked.progress_at = now_mono
