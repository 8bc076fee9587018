"""``launch stop RUN``: the ordered stop Ctrl-C makes, from any terminal.

SIGTERM to the run's supervisor, and only to a process proven to be it
(``names.supervisor``: this user's, holding the run's lock file open for writing); a
detached run whose supervisor was killed is taken back first (``_taken_back``), then stopped
the same way:
it tears down as on Ctrl-C (every worker told; a run that is not hung agrees a step
and saves it; ``--resume`` continues from there). Returns once the supervisor and every
process below it on this machine are gone (the ssh, tpu and slurm backends' remote
processes are gone before their supervisor ends: its teardown waits for them), or names
those still alive at the timeout.
"""

from __future__ import annotations

import argparse
import os
import signal
import time

from launcher import commands, flags, owned
from launcher import proctl
from launcher.console import nextsteps
from launcher.rundir import names, specdiff
from launcher.errors import LaunchError, Problem, SpecError
from launcher.words import plural
from worker import contract

POLL_S = 0.1


def parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="launch stop", description=commands.described("stop"))
    parser.add_argument("run", metavar="RUN", help="a run directory, a name `launch runs` "
                        "lists, or a job's name (its run that is running, else its newest)")
    parser.add_argument("--timeout-s", "--timeout", dest="timeout_s", type=float, default=300.0,
                        metavar="SECONDS",
                        help="how long to wait for every process to be gone (default 300: the "
                             "agreed step's save included; --timeout, its former name, too)")
    parser.add_argument("--root", metavar="DIR", default=None, help=names.ROOT_HELP)
    return parser


def _alive(pid: int, since) -> bool:
    """Whether ``pid`` is still the process first seen (``since``: its start ticks)."""
    return proctl.state(pid) not in (None, "Z") and proctl.start_ticks(pid) == since


def _named(pid: int) -> str:
    """A process still alive, as the user can find it: its process_id where it has one."""
    ident = [item for item in proctl.environ(pid) if item.startswith(contract.PROCESS_ID.encode() + b"=")]
    who = f"process_id {ident[0].split(b'=', 1)[1].decode(errors='replace')}, " if ident else ""
    return f"pid {pid} ({who}{proctl.cmdline(pid, 80)})"


def main(argv: list) -> int:
    """Stop the run; returns 0 once everything is gone.

    Raises:
      SpecError: no such run, or it is not running (exit 2), at once.
      LaunchError: processes still alive at the timeout, named (exit 1).
    """
    args = parser().parse_args(argv)
    flags.check(("--timeout-s", args.timeout_s, flags.seconds, "how long to wait for every process "
                 "to be gone"))
    run_dir = names.resolve(args.run, args.root, names.LIVE)
    value, alive = names.state(run_dir)
    pid = names.supervisor(run_dir) if alive else None
    if pid is None and not alive and value == "running":
        try:
            pid = _taken_back(run_dir)  # a detached run whose supervisor was killed
        except (SpecError, LaunchError) as exc:  # no key, no spec: its processes prove themselves
            why = exc.problems[0].message if isinstance(exc, SpecError) else str(exc)
            return _stop_proven(run_dir, why, args.timeout_s)
    if pid is None:
        why = (f"has ended (state {value})" if value in names.EXIT_CODES else
               "has no live supervisor on this machine (it was killed, or runs elsewhere: stop "
               f"it there; {names.after_supervisor(run_dir, args.run)})" if value == "running"
               else "is not running")
        raise SpecError([Problem("RUN", None, "", f"the run in {run_dir} {why}; nothing to stop")])
    watched = [(p, proctl.start_ticks(p)) for p in [pid] + proctl.descendants(pid)]
    frozen = proctl.is_stopped(pid)  # SIGSTOP, a debugger: it acts on SIGTERM once continued
    os.kill(pid, signal.SIGTERM)
    os.kill(pid, signal.SIGCONT)
    if frozen:
        print(f"launch stop: the run's supervisor (pid {pid}) was stopped (SIGSTOP); continued "
              "so that it stops the run", flush=True)
    print(f"launch stop: stopping the run in {run_dir} (its supervisor, pid {pid}, stops every "
          "process in order; an agreed step is saved)", flush=True)
    deadline = time.monotonic() + args.timeout_s
    try:
        while True:
            left = [p for p, since in watched if _alive(p, since)]
            if not left:
                break
            if time.monotonic() >= deadline:
                raise LaunchError(f"after {args.timeout_s:g} s these processes of the run in "
                                  f"{run_dir} are still alive on this machine: "
                                  + "; ".join(map(_named, left)))
            time.sleep(POLL_S)
    except KeyboardInterrupt:  # the stop goes on without this command
        print(f"launch stop: interrupted while waiting; the run's supervisor is stopping it "
              f"(`launch wait {run_dir}` waits for its end)")
        return 130
    print(f"launch stop: every process is gone (state {names.state(run_dir)[0]}); "
          f"{_continuing(run_dir)}")
    return 0


def _taken_back(run_dir: str) -> int | None:
    """A detached run whose supervisor was killed, taken back to be stopped in order: a new
    supervisor (``adopt.spawn``, as ``launch attach`` starts it: every process proven before
    anything is signalled) that the stop then reaches as any live one; its pid, or None where
    the run kept no journal (it was not detached: its processes ended with their launcher).

    Raises:
      SpecError: the journal is not trusted, or the run cannot be taken back (nothing signalled).
      LaunchError: the supervisor that would take it back failed to (its own error said why).
    """
    from launcher.run import adopt
    from launcher.rundir import journal

    if not os.path.lexists(os.path.join(run_dir, journal.JOURNAL_FILE)):
        return None
    journal.read(run_dir)  # SpecError: not trusted, or not a run that can be taken back
    print(f"launch stop: the run's supervisor is gone; taking the run back to stop it in order "
          f"({run_dir})", flush=True)
    code = adopt.spawn(run_dir, quiet=True)  # what it does, not a replay of the run's lines
    pid = names.supervisor(run_dir)
    if code != 0 or pid is None:
        raise LaunchError(f"the run in {run_dir} could not be taken back to be stopped (exit "
                          f"{code}, said above); nothing was signalled by this command")
    return pid


def _stop_proven(run_dir: str, why: str, timeout_s: float) -> int:
    """Stop, without a supervisor, the processes of a run that cannot be taken back (its
    journal not trusted: the user's key is gone; its spec gone): those that show the run's
    secret (``owned.proven``: its digest in the run directory; no key, no spec needed). Each
    worker gets TERM, as a preemption notice (they agree a step and save it where they can),
    then, at ``timeout_s``, every one still alive KILL; what names the run without proving it
    is said and never signalled. 0 once every proven process is gone.

    Raises:
      SpecError: none proves itself (nothing signalled; the unproven named).
      LaunchError: some are still alive after the KILL, named.
    """
    proven, unproven = owned.proven(run_dir)
    unsaid = (f"; not signalled, as they do not show the run's secret: "
              + "; ".join(map(_named, unproven))) if unproven else ""
    if not proven:
        raise SpecError([Problem("RUN", None, "", (
            f"the run in {run_dir} cannot be taken back ({why}) and no process of this user "
            f"proves itself the run's (by the run's secret){unsaid}; nothing was signalled"))])
    watched = [(p, proctl.start_ticks(p)) for p in proven]
    parent = {p: (proctl.stat_fields(p) or (b"", 0, 0))[1] for p in proven}
    wrappers = {p for p in proven if parent[p] not in parent}
    # the wrappers' workers (each a process group of its own): TERM is their notice
    workers = [p for p in proven if parent[p] in wrappers]
    print(f"launch stop: the run cannot be taken back ({why}); stopping the "
          f"{plural(len(proven), 'process')} that prove themselves the run's by its secret (pid "
          f"{', '.join(map(str, proven))}): TERM to each worker as a preemption notice, KILL "
          f"at {timeout_s:g} s{unsaid}", flush=True)

    def alive() -> list:
        return [p for p, since in watched if _alive(p, since)]

    def send(signals) -> None:
        if signal.SIGKILL in signals:
            for p in alive():
                proctl.signal_pid(p, signals)
        else:
            for p in workers or alive():
                proctl.signal_group(p, signals)

    proctl.stop(send, alive, timeout_s)
    left = alive()
    if left:
        raise LaunchError(f"these processes of the run in {run_dir} are still alive after KILL: "
                          + "; ".join(map(_named, left)))
    print(f"launch stop: every process that proved itself the run's is gone; {_continuing(run_dir)}")
    return 0


def _continuing(run_dir: str) -> str:
    """How to continue the stopped run: a sentence, then the command on a line of its own."""
    local_dir = specdiff.spec_of(run_dir).get("checkpoint.local_dir")
    said, command = nextsteps.continue_lines(run_dir, specdiff.newest_checkpoint(
        run_dir, local_dir if isinstance(local_dir, str) else "local-checkpoints"))
    return f"{said}\n{command}"
