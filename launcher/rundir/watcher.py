"""One contract for what follows a run's life: the run's files kept up to date as it goes.

The restart loop (``launcher.run.restarts.run``) tells every watcher, in the order given::

    attempt_starting(loop, times)           an attempt's processes are about to be started
                                            (not said for processes taken back)
    attempt_started(loop, times, workers)   they run (started, or taken back)
    before_flush() / after_flush(logs)      supervision's poll, around its flush of the logs
    attempt_ended(loop, attempt, wait_s)    an attempt ended; ``wait_s``: the restart's wait,
                                            None when the run is over
    run_ended(ending)                       the launch is over, however it ended (the launch
                                            says it once, an exception included)

``loop`` is the loop's state: ``number`` (the attempt's), ``budgets``, ``restarts``,
``counted`` and ``attempts`` (this launch's ended ``restarts.Attempt``s); ``times`` the
attempt's ``ledger.Times``. The implementations are the run directory's files: run.json
(``record.Record``), the goodput so far (``ledger.Running``), ``ledger.json``
(``ledger.Written``) and a detached run's journal (``journal.Journal``). The next run-level
feature is one more watcher, told the same things, not a branch in the launch: see
docs/development.md. The shape follows torch elastic's agent events and CLU's periodic
actions, one level up.
"""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass
class Ending:
    """How a launch ended, for ``run_ended``; the ledger's watcher fills ``entries`` and
    ``goodput`` for those after it (watchers are told in order).

    Attributes:
      state: succeeded, failed or interrupted (run.json makes a diverged one of a success
        whose final loss is not finite).
      attempts: this launch's ``restarts.Attempt``s, in order (none if none ended).
      result: the last attempt's ``state.Result``, or None (the launch ended by an exception).
      made: attempts made in the run directory, when ``attempts`` cannot say it (an
        exception), else None.
      ended_at: when (``time.monotonic``) this launch's ledger entries count to, or None.
      entries: every ledger entry of the run, every launch's (``ledger.json``).
      goodput: productive seconds / wall seconds over every launch, or None.
    """

    state: str
    attempts: list
    result: object = None
    made: int | None = None
    ended_at: float | None = None
    entries: list = dataclasses.field(default_factory=list)
    goodput: float | None = None


class RunWatcher:
    """A run-level watcher: every method does nothing unless overridden."""

    def attempt_starting(self, loop, times) -> None:
        pass

    def attempt_started(self, loop, times, workers: list) -> None:
        pass

    def before_flush(self) -> None:
        pass

    def after_flush(self, logs: list = ()) -> None:
        pass

    def attempt_ended(self, loop, attempt, wait_s: float | None) -> None:
        pass

    def run_ended(self, ending: Ending) -> None:
        pass


class Watchers(RunWatcher):
    """Several watchers, each told everything in the order given (a list: ``append`` more)."""

    def __init__(self, watchers=()):
        self.watchers = [w for w in watchers if w is not None]

    def append(self, watcher: RunWatcher) -> None:
        self.watchers.append(watcher)

    def attempt_starting(self, loop, times) -> None:
        for w in self.watchers:
            w.attempt_starting(loop, times)

    def attempt_started(self, loop, times, workers: list) -> None:
        for w in self.watchers:
            w.attempt_started(loop, times, workers)

    def before_flush(self) -> None:
        for w in self.watchers:
            w.before_flush()

    def after_flush(self, logs: list = ()) -> None:
        for w in self.watchers:
            w.after_flush(logs)

    def attempt_ended(self, loop, attempt, wait_s: float | None) -> None:
        for w in self.watchers:
            w.attempt_ended(loop, attempt, wait_s)

    def run_ended(self, ending: Ending) -> None:
        for w in self.watchers:
            w.run_ended(ending)
