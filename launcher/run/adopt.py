"""``launch attach RUN`` of a detached run whose supervisor was killed: a new supervisor takes
the run back, where the killed one left it.

``attach`` starts it (``spawn``: ``launch --adopt RUN_DIR``; the supervisor reads the command
line the run was started with from the run's journal, ``launcher.rundir.journal``, once its seal
proves the user's own launcher wrote it for this very directory: ``command``) as
``--detach`` starts a supervisor: its own session, its messages on this terminal until it holds the run,
then its console in ``RUN_DIR/console.log``. The new supervisor takes the run's lock first
(``launcher.rundir.runlock``: a second one is refused, naming the first), checks that the run's
state is still ``running`` (a state written as final is never overwritten), then
(``take_back``) takes back the attempt's processes through its backend
(``Session.reattach``: each proven before anything is signalled), or goes on with the restart's
wait the killed one was in; ``restarts.run`` then goes on as if nothing happened: fail-fast,
the watchdog, restarts, the ledger (``unwatched_s``: the time nobody watched; the steps
trained meanwhile count as any others, and only a stretch in which nothing ran is the
``unsupervised`` bucket).
"""

from __future__ import annotations

import os
import time

from launcher import owned
from launcher import plan as planning
from launcher.backends.base import reattach_of
from launcher.rundir import names
from launcher.errors import Problem, SpecError
from launcher.rundir import journal as journals
from launcher.rundir import ledger
from launcher.words import plural


def check(run_dir: str) -> dict:
    """The run's journal, once its lock is held.

    Raises:
      SpecError: the run has ended (its final state stays as written), or has no usable journal.
    """
    value, _ = names.state(run_dir)
    if value != "running":
        raise SpecError([Problem("RUN", None, "", f"the run in {run_dir} has ended (state "
                                 f"{value or 'none'}); nothing to take back")])
    data = journals.read(run_dir)
    if not isinstance(data.get("attempt"), int):
        raise SpecError([Problem("RUN", None, "", f"the run in {run_dir} was killed before its "
                                 f"first attempt started; `launch resume {run_dir}` starts it")])
    return data


def take_back(session, plan: planning.Plan, data: dict, console, run_dir: str,
              clock=time.monotonic) -> journals.Adopted:
    """Where the killed supervisor left the run, taken back: its attempt's processes
    (``Session.reattach``'s ``adopt``), or the restart's wait it was in. The ledger entries of its ended
    attempts are written into ``ledger.json`` (the restart's wait and the gap with them).

    Raises:
      SpecError: the backend cannot take processes back, or the journal does not name them.
    """
    # one reading of each clock: the gap, the wait's split and the moments handed on are all
    # differences of this same moment (the ledger's buckets add up to run.json's duration)
    now, now_wall = clock(), time.time()
    gap = journals.gap_s(data, now_wall)
    attempt, waiting = data["attempt"], data.get("waiting")
    entries = [e for e in data.get("entries") or () if isinstance(e, dict)]
    common = dict(budgets=data.get("budgets") or {}, restarts=int(data.get("restarts") or 0),
                  counted=str(data.get("counted") or ""))
    if data.get("starting") or isinstance(waiting, dict):
        # nothing of its own runs: whatever was being started (a kill while starting leaves
        # processes the journal does not name) is stopped before anything starts again
        stopped = reattach_of(session).stop_strays()
        if stopped:
            console.say(f"stopped {plural(len(stopped), 'process')} of the run that no journal "
                        f"named (pid {', '.join(map(str, stopped))}): its supervisor was killed "
                        "while starting them")
    if data.get("starting"):
        # the attempt starting again counts from the killed one's start of it (the ended
        # attempts' entries count to there), the gap among it
        began = journals.to_mono((data.get("times") or {}).get("began"), clock)
        began = min(now - gap, began) if isinstance(began, float) else now - gap
        adopted = journals.Adopted(attempt - 1, None, None, wait_s=0.0, next_times=ledger.Times(
            began, unsupervised=[(now - gap, now)]), **common)
        console.say(f"taking the run back after {gap:.1f} s without a supervisor: it was killed "
                    f"while starting attempt {attempt}, which starts again")
    elif isinstance(waiting, dict):
        # the failed attempt's entry counts the wait to the moment the next attempt begins:
        # the wait's end, or now if that is past (never before what it already counts)
        since = float(waiting.get("since") or now_wall)
        until = float(waiting.get("until") or since)
        counted = waiting.get("counted")  # a supervisor that took it back counted it to there
        counted = float(counted) if isinstance(counted, (int, float)) else \
            (since if entries else until)
        end = max(until, now_wall, counted)
        if entries:  # the failed attempt's, counted to its end (``since``) by the killed one
            _count_wait(entries[-1], since, counted, end, now_wall - gap, now_wall)
        else:  # in ledger.json already (taken back before, and killed in the same wait)
            written = ledger.read(run_dir)
            if written:
                _count_wait(written[-1], since, counted, end, now_wall - gap, now_wall)
                ledger.write(run_dir, written)
        waiting["counted"] = end  # this launch's journal copies it (``WHERE``)
        # the next attempt begins where the entry's count ends: restarts.run waits to then
        resume_at = now + (end - now_wall)
        adopted = journals.Adopted(attempt, None, None, wait_s=resume_at - now,
                                   next_times=ledger.Times(resume_at), **common)
        console.say(f"taking the run back after {gap:.1f} s without a supervisor: attempt "
                    f"{attempt} had failed, and its restart waits {resume_at - now:.1f} s more")
    else:
        resume = bool(common["restarts"]) or attempt > 0
        workers = reattach_of(session).adopt(planning.for_attempt(plan, attempt, resume=resume),
                                data.get("workers") or [])
        times = data.get("times") or {}
        began = journals.to_mono(times.get("began"), clock) or now
        started = journals.to_mono(times.get("started"), clock) or now
        gaps = [(journals.to_mono(a, clock), journals.to_mono(b, clock))
                for a, b in times.get("gaps") or () if isinstance(a, float) and isinstance(b, float)]
        adopted = journals.Adopted(attempt, workers, ledger.Times(
            began, started_at=started, unsupervised=gaps + [(now - gap, now)]), **common)
        console.say(f"taking the run back after {gap:.1f} s without a supervisor: attempt "
                    f"{attempt}'s {plural(len(workers), 'process')}, each proven before anything "
                    "is signalled" + ("" if console.show == frozenset() else
                                      "; what they printed meanwhile follows"))
    if entries:
        ledger.write(run_dir, ledger.read(run_dir) + entries)
    return adopted


def _count_wait(entry: dict, since: float, counted: float, end: float, gap_from: float,
                gap_to: float) -> None:
    """Count a failed attempt's restart wait (wall clock: from ``since``) in its ledger
    ``entry`` to ``end`` instead of ``counted``: the stretch nobody watched (``gap_from`` to
    ``gap_to``) is ``unsupervised`` (taken out of ``restart_wait`` where it was counted there
    already, as the wait's rest by a supervisor killed in it), the rest ``restart_wait``."""
    buckets = entry["buckets_s"]
    unwatched = max(0.0, min(gap_to, end) - max(gap_from, since))
    buckets["unsupervised"] = round(buckets.get("unsupervised", 0.0) + unwatched, 3)
    entry["unwatched_s"] = round(ledger.seconds(entry.get("unwatched_s")) + unwatched, 3)
    buckets["restart_wait"] = round(max(0.0, buckets.get("restart_wait", 0.0)
                                        + end - counted - unwatched), 3)
    entry["wall_s"] = round(sum(buckets.values()), 3)


def continue_record(record, data: dict) -> None:
    """The killed launch's failures and duration, in this launch's run.json (``launcher.rundir.record.Record``)."""
    for failure in data.get("failures") or ():
        if isinstance(failure, dict) and isinstance(failure.get("class"), str):
            name = failure["class"]
            record.data["failures"][name] = record.data["failures"].get(name, 0) + 1
            record.data["last_failure"] = failure
    launched = data.get("launched") or {}
    if isinstance(launched.get("wall"), (int, float)):
        # the run's duration counts from the killed launch's own start, on this clock: the
        # moment its first attempt's ledger entry begins at (the gap and this launch's start-up
        # are then counted once, in the ledger's buckets as in the duration)
        record.before_s = float(launched.get("before_s") or 0.0)
        record._launched = journals.to_mono(float(launched["wall"]), record.clock)


QUIET = ("--show", "none")  # a take-back to stop the run: no replay of what workers printed


def spawn(run_dir: str, handed: list | None = None, quiet: bool = False) -> int:
    """Start the supervisor that takes the run back: ``launch --adopt RUN_DIR``, what the user
    asked, nothing read from a file (``detach.spawn``; it reads the run's sealed journal itself,
    ``command``); 0 once it holds the run, else its exit code. ``handed``: ``detach.spawn``'s.
    ``quiet`` (``launch stop``): it shows no worker line (``QUIET``), only what it does, and
    the workers' warnings and errors; their lines are in the logs as ever."""
    from launcher.run import detach

    return detach.spawn(["--adopt", run_dir, *(QUIET if quiet else ())], quiet=True,
                        handed=handed)


def command(argv: list) -> list:
    """``--adopt RUN_DIR [--show none]`` (``spawn``'s supervisor) as the command line the run
    was started with, from its journal once that proves itself (``journal.read``: the user's own
    directory, the seal of the user's own launcher for this very directory); the process moves
    to the directory the run was launched from, which the same sealed journal names.

    Raises:
      SpecError: ``argv`` is not ``--adopt RUN_DIR``, or the journal is missing, not the
        user's or not sealed for this directory; nothing was started.
    """
    if len(argv) != 2 and tuple(argv[2:]) != QUIET:
        raise SpecError([Problem("--adopt", None, "", "takes one run directory and nothing "
                                 "else (`launch attach RUN` starts it)")])
    run_dir = os.path.abspath(argv[1])
    owned.check_dir(run_dir)
    data = journals.read(run_dir)
    try:
        os.chdir(data["cwd"])
    except OSError as exc:
        raise SpecError([Problem("RUN", None, "", f"the run was launched from {data['cwd']}, "
                                 f"which cannot be entered now ({exc.strerror}); the run cannot "
                                 "be taken back from there")]) from None
    return [*data["argv"], *argv[2:], "--adopt", run_dir]
