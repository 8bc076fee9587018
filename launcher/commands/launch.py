"""``launch JOB.yaml``: the main command, running a job: its flags, the run directory, the
run's files, and the run itself (``run``); ``launcher.cli.main`` calls it for anything that
is not one of the other commands, and alone prints errors and exits.

Exit codes: 0 every process succeeded; 1 the run failed (the summary names
the first failure); 2 bad input (nothing was started); 130 interrupted
(Ctrl-C, SIGTERM or SIGHUP; everything was stopped).

A closed console (``launch job.yaml | head``, a closed terminal) never ends
a run: the console goes quiet and ``launcher.log`` in the run directory keeps
the launcher's messages and the summary.
"""

from __future__ import annotations

import argparse
import datetime
import os
import sys
import time

import yaml

from launcher import backends
from launcher import plan as planning
from launcher import commands, flags, interrupts, owned
from launcher.run import adopt, detach
from launcher.rundir import index, journal as journals, ledger, runlock, specdiff as resumes
from launcher.rundir.record import Record
from launcher.console import nextsteps
from launcher.run import notify, restarts
from launcher import spec as specs
from launcher.backends.base import Options
from launcher.console import Console
from launcher.errors import LaunchError, Problem, SpecError
from launcher.console.status import check_show, parse_show, summary
from launcher.words import plural
from worker.contract import runfiles

EXIT_OK, EXIT_FAILED, EXIT_BAD_INPUT, EXIT_INTERRUPTED = 0, 1, 2, 130


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="launch", usage="launch JOB.yaml [options]\n       launch COMMAND [args]",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Run one JAX data-parallel training job on the cluster its spec names.",
        epilog="commands (`launch COMMAND --help` for each):\n" + commands.listing() + "\n"
               "exit codes: 0 ok, 1 run failed, 2 bad input (nothing started), 130 interrupted "
               "(Ctrl-C, SIGTERM, SIGHUP)")
    parser.add_argument("--version", action=_Version, help="print podlaunch's version and exit")
    parser.add_argument("job", metavar="JOB.yaml", help="the job spec")
    parser.add_argument("--cluster", metavar="FILE",
                        help="cluster YAML that replaces the job's cluster: section")
    parser.add_argument("--set", dest="overrides", metavar="KEY=VALUE", action="append", default=[],
                        help="override a dotted key of the spec, e.g. train.num_steps=50 (repeatable)")
    parser.add_argument("--dry-run", action="store_true",
                        help="print the resolved plan (hosts, ids, env, commands) and start nothing")
    parser.add_argument("--run-dir", metavar="DIR",
                        help="where logs, events and params go (default runs/<job>/<timestamp>)")
    parser.add_argument("--resume", metavar="RUN_DIR",
                        help="continue the run in RUN_DIR from its latest complete checkpoint "
                             "(new logs go to RUN_DIR/logs/attempt-N/)")
    parser.add_argument("--show", metavar="IDS", default="0",
                        help="process_ids whose every line reaches the console: 0 (the default), "
                             "0,3-5, all, or none; from the others only warnings, errors and the last "
                             "lines of one that fails (none: no worker lines at all); library "
                             "start-up chatter is never shown; every line still goes to the logs")
    parser.add_argument("--status-every", metavar="SECONDS", type=float, default=5.0,
                        help="when stdout is not a terminal, print the progress line (step, ETA, "
                             "elapsed, loss, steps/s, slowest process) this often (default 5; 0 = "
                             "never); on a terminal it is redrawn in place")
    parser.add_argument("--kill-stale", action="store_true",
                        help="ssh, tpu, slurm: stop processes of an earlier run of this job still "
                             "alive on the hosts (recorded by pid, never matched by name) instead "
                             "of refusing")
    parser.add_argument("--detach", action="store_true",
                        help="once every process started, leave the run to a supervisor of its "
                             "own (no terminal; its console in RUN_DIR/console.log) and exit 0; "
                             "`launch logs|attach|wait|stop RUN` reach it")
    # launch attach's supervisor that takes back a detached run whose supervisor was killed
    parser.add_argument("--adopt", metavar="RUN_DIR", help=argparse.SUPPRESS)
    parser.add_argument("--rehearse", action="store_true",
                        help="tpu: run the pod's exact topology (hosts x chips per host, slices) as "
                             "local processes with CPU devices, before paying for the pod")
    return parser


class _Version(argparse.Action):
    """``--version``: the installed podlaunch's version (looked up only when asked)."""

    def __init__(self, option_strings, dest=argparse.SUPPRESS, default=argparse.SUPPRESS, help=None):
        super().__init__(option_strings, dest=dest, default=default, nargs=0, help=help)

    def __call__(self, parser, namespace, values, option_string=None):
        print(f"launch (podlaunch) {version()}")
        parser.exit()


def version() -> str:
    """podlaunch's version as installed (pip's metadata), or "unknown" outside an install."""
    from importlib import metadata  # only for --version: it costs milliseconds at start-up

    try:
        return metadata.version("podlaunch")
    except metadata.PackageNotFoundError:
        return "unknown (not installed; pip install -e .)"


def _run_dir(job: specs.JobSpec, requested: str | None, create: bool = False) -> str:
    """The run directory: ``requested`` (checked new or empty), or ``runs/<job>/<timestamp>``.

    With ``create`` the default one is made exclusively (``os.mkdir``): two launches of
    one job in the same millisecond (a sweep) each get their own, the later one with a
    ``-2``, ``-3``, ... suffix. A dry run names it and makes nothing.
    """
    if requested is None:
        stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S-%f")[:-3]
        base = os.path.abspath(os.path.join("runs", job.name, stamp))
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
    run_dir = os.path.abspath(requested)
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


def _check_creatable(path: str, flag: str) -> None:
    """Bad input unless ``path`` exists as a directory or could be made (nothing is made here)."""
    parent = path
    while not os.path.exists(parent):
        parent = os.path.dirname(parent)
    if not os.path.isdir(parent) or not os.access(parent, os.W_OK | os.X_OK):
        what = "is a file" if not os.path.isdir(parent) else "is not writable"
        raise SpecError([Problem(flag, None, "", f"cannot create {path}: {parent} {what}; "
                                 "choose another directory")])


def _spec_changes(run_dir: str, masked: dict) -> list:
    """``key: old -> new`` for every setting in which ``masked`` (the spec about to run, secrets
    masked) differs from the run's ``spec.yaml`` (what its earlier attempts ran)."""
    return [f"{key}: {before!r} -> {now!r}" for key, before, now in resumes.changes(run_dir, masked)]


def _write_run_files(plan: planning.Plan, first_attempt: int = 0, job=None) -> list:
    """``spec.yaml`` (the resolved spec, secrets masked: it may be shared) and ``job.json``
    (what the workers read, secrets included: mode 0600, readable by the owner only).

    On a resume (``first_attempt`` > 0) the spec the earlier attempts ran is kept as
    ``spec.before-attempt-N.yaml`` when the new one differs, so the run's record says what
    each attempt ran.

    Returns:
      The settings that changed since the earlier attempts (``key: old -> new``).
    """
    job = job or plan.job  # the user's spec: hosts a spare or a shrink changed are not its
    os.makedirs(os.path.join(plan.run_dir, "logs"), exist_ok=True)
    spec_file = os.path.join(plan.run_dir, "spec.yaml")
    changes = _spec_changes(plan.run_dir, job.to_masked_dict()) if first_attempt else []
    if changes:
        os.replace(spec_file, os.path.join(plan.run_dir, f"spec.before-attempt-{first_attempt}.yaml"))
    # PyYAML's libyaml emitter where it was built with it: the same text, a seventh of the
    # CPU (0.5 ms per host of a launch's own cost with the pure-Python one)
    runfiles.write_whole(spec_file, f"# resolved from {os.path.abspath(job.source)}; secrets masked\n"
                         + yaml.dump(job.to_masked_dict(), sort_keys=False,
                                     Dumper=getattr(yaml, "CSafeDumper", yaml.SafeDumper)),
                         mode=0o644)
    # the worker's keys only (its contract, no defaults); secrets in clear: mode 0600
    job.job_file().to_json(plan.job_path)
    return changes


def run(argv: list[str] | None = None, console: Console | None = None) -> int:
    """Parse flags, validate, plan, launch and supervise; return the exit code.

    SIGTERM and SIGHUP act like Ctrl-C throughout (``supervise`` and the restart
    loop handle them while processes run; before that, the session is closed).

    Raises:
      SpecError: bad input (``main`` turns it into exit code 2).
      LaunchError: the run could not be started (exit code 1).
      KeyboardInterrupt: interrupted before any process started (exit code 130).
    """
    previous = interrupts.install(interrupts.raise_keyboard_interrupt)
    held: list = []  # the run directory's lock, once taken (runlock): dropped on every way out
    try:
        with interrupts.stacks_requests():  # launch stacks RUN (launcher.commands.stacks)
            return _run(argv, console, held)
    finally:
        for lock in held:
            lock.release()
        interrupts.restore(previous)


def _run(argv: list[str] | None, console: Console | None, held: list) -> int:
    launched_at = time.monotonic()  # the ledger's and run.json's duration count from here
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--adopt"]:  # launch attach's supervisor: the run's own sealed command line
        argv = adopt.command(argv)
    args = _parser().parse_args(argv)
    flags.check(("--status-every", args.status_every, flags.seconds_or_never,
                 "how often to print the progress line when stdout is not a terminal"))
    handoff = detach.Handoff()  # this launch is a detached run's supervisor
    if args.detach and args.dry_run:
        raise SpecError([Problem("--detach", None, "", "a dry run starts nothing to detach; "
                                 "drop one of --detach and --dry-run")])
    if args.detach and not handoff.detached:
        return detach.spawn([a for a in argv if a != "--detach"])
    show = parse_show(args.show)
    console = console or Console(show=show, status_every_s=args.status_every,
                                 others=show != frozenset(), tty=False if handoff.detached else None)
    job = specs.load(args.job, args.cluster, tuple(args.overrides), registry=backends)
    check_show(show, job.num_processes)
    backend = backends.for_job(job)
    if args.rehearse:
        backend = backend.rehearsal(job)  # SpecError unless the backend has one
    if args.kill_stale and not backend.stops_stale:
        raise SpecError([Problem("--kill-stale", None, "", "only applies to backends whose "
                                 f"hosts can outlive a launcher (ssh, tpu, slurm); this job's is "
                                 f"{backend.name}; remove the flag")])
    options = Options(python=sys.executable, kill_stale=args.kill_stale, dry_run=args.dry_run,
                      resume=bool(args.resume), detached=handoff.detached,
                      adopting=bool(args.adopt))
    backend.check(job, options)
    if args.adopt:  # the run's own (its spec unchanged in what it trains)
        run_dir = resumes.resume_dir(job, args.adopt, "RUN")
    else:
        if args.resume and args.run_dir:
            raise SpecError([Problem("--resume", None, "", "resumes in place; drop --run-dir")])
        run_dir = (resumes.resume_dir(job, args.resume) if args.resume
                   else _run_dir(job, args.run_dir, create=not args.dry_run))
        if args.resume and runlock.held(run_dir) is not True:  # held: the lock names its launcher
            owned.refuse_live_processes(run_dir, args.resume)
        if not args.resume and args.run_dir is None and not args.dry_run:
            held.append(_RemovedIfEmpty(run_dir))  # a start that fails before any file: no trace
        _check_creatable(run_dir, "--resume" if args.resume else "--run-dir")
    session = backend.session(job, run_dir, console, options)
    try:
        taken = None
        if args.adopt:  # the run's lock first: nothing is asked of its backend by a second one
            held.append(runlock.acquire(run_dir, "RUN", job.secrets))
            taken = adopt.check(run_dir)  # SpecError: nothing to take back
            session.rejoin(taken.get("session") or {})
        plan = session.plan()
        if args.dry_run:
            console.block(session.describe(plan))
            return EXIT_OK
        if not args.adopt:
            held.append(runlock.acquire(run_dir, "--resume" if args.resume else "--run-dir",
                                        job.secrets))
            index.add(run_dir)  # launch runs and every run command find it from anywhere
        proof = owned.carry_run_secret(run_dir, taken) if handoff.detached else (None, "")
        first_attempt = taken["attempt"] if taken else restarts.next_attempt(run_dir)
        try:
            changes = [] if taken else _write_run_files(plan, first_attempt if args.resume else 0, job)
        except OSError as exc:  # nothing has started yet: this is bad input
            raise SpecError([Problem("--resume" if args.resume else "--run-dir", None, "",
                                     f"cannot write into {run_dir}: {exc.strerror}; "
                                     "choose another directory")]) from None
        console.log_to(os.path.join(run_dir, "launcher.log"))
        adopted = adopt.take_back(session, plan, taken, console, run_dir) if taken else None
        running = ledger.Running(ledger.read(run_dir))  # launch runs: the goodput so far
        record = Record(run_dir, job.name, job.num_steps, launched_at=launched_at,
                             running=running, devices=planning.devices_text(plan),
                             notify=notify.sender(job.notify, job.name, run_dir, console.say))
        journal = None  # a detached run's: what a supervisor needs to take it back
        if handoff.detached:
            journal = journals.Journal(run_dir, backend.name, taken["argv"] if taken else argv,
                                       taken["cwd"] if taken else os.getcwd(), session.adopts,
                                       session=session.journaled, key=proof[0], nonce=proof[1])
            journal.data["launched"] = (taken or {}).get("launched") or {
                "wall": journals.to_wall(launched_at), "before_s": record._before_s}
            if taken:  # where the killed one left it, until this one's attempt is under way
                journal.data.update({k: taken.get(k) for k in journals.WHERE})
            journal.write()
        if taken:
            adopt.continue_record(record, taken)
        record.start(first_attempt)
        console.watchers.append(record.progress)  # launch runs: a running run's step and ETA
        handoff.run_dir_is(run_dir, console)
        console.say(f"run directory {run_dir}"
                    + (f" (resuming; attempt {first_attempt})" if args.resume else ""))
        if changes:
            console.say(f"resuming with {plural(len(changes), 'changed setting')} (the earlier "
                        f"attempts' spec is kept as spec.before-attempt-{first_attempt}.yaml): "
                        + "; ".join(changes))
        if job.reads_data:  # a program reads its own
            console.say(job.epoch_text())
        try:
            result, attempts = restarts.run(session, plan, console, first_attempt=first_attempt,
                                            resume=bool(args.resume), began_at=launched_at,
                                            running=running, journal=journal, adopted=adopted)
        except BaseException as exc:
            if journal is not None:
                journal.close()
            done = getattr(exc, "attempts", ())
            if isinstance(exc, LaunchError) and done:  # a restart that could not be prepared
                console.block(restarts.attempts_table(done))
            record.end("interrupted" if isinstance(exc, KeyboardInterrupt) else "failed",
                       attempts=done, made=restarts.next_attempt(run_dir),
                       goodput=_write_ledger(run_dir, done, console)[1],
                       ended_at=_ledger_end(done))
            raise
        entries, goodput = _write_ledger(run_dir, attempts, console)
        if journal is not None:
            journal.close()
        if result.exit_code == 0:
            session.succeeded()
        record.end({0: "succeeded", 130: "interrupted"}.get(result.exit_code, "failed"),
                   result, attempts, goodput=goodput, ended_at=_ledger_end(attempts))
    finally:
        session.close()
    console.block(summary(result))
    run_ledger = ledger.summary_line(ledger.totals(entries)) if entries else None
    if run_ledger is not None:
        console.say(f"{run_ledger} (ledger: {os.path.join(run_dir, ledger.LEDGER_FILE)})")
    if entries and job.logging.tensorboard:
        try:  # after session.close: over ssh, process 0's tensorboard/ has been brought back
            ledger.write_scalars(os.path.join(run_dir, "tensorboard"), entries,
                                 sum(a.times is not None for a in attempts))
        except OSError as exc:
            console.say(f"cannot write the ledger's TensorBoard scalars ({exc})")
    if len(attempts) > 1 or attempts[-1].number > 0:
        console.block(restarts.attempts_table(attempts))
    for line in nextsteps.closing(args.job, run_dir, result.exit_code, job.logging.tensorboard,
                                  cluster=args.cluster, overrides=tuple(args.overrides),
                                  default_dir=not (args.run_dir or args.resume), secrets=job.secrets,
                                  failure=attempts[-1].failure, saved_step=resumes.newest_checkpoint(
                                      run_dir, job.checkpoint.local_dir)):
        console.say(line)
    console.close()
    return 1 if result.exit_code == 0 and result.diverged_loss is not None else result.exit_code


def _ledger_end(attempts) -> float | None:
    """The moment (``time.monotonic``) this launch's ledger entries count to: its last
    attempt's end and wait (run.json's duration ends there too), or None for no attempt."""
    timed = [a.times for a in attempts or () if getattr(a, "times", None) is not None
             and a.times.ended_at is not None]
    return timed[-1].ended_at + max(0.0, timed[-1].waited_s) if timed else None


def _write_ledger(run_dir: str, attempts, console: Console) -> tuple:
    """Add this launch's attempts to ``<run_dir>/ledger.json``; returns (every entry, the
    run's goodput or None). A ledger that cannot be written is said, and the run goes on."""
    entries = ledger.add_attempts(ledger.read(run_dir), attempts or ())
    if not entries:
        return entries, None
    try:
        return entries, ledger.write(run_dir, entries)["goodput"]
    except OSError as exc:
        console.say(f"cannot write {os.path.join(run_dir, ledger.LEDGER_FILE)} "
                    f"({exc.strerror})")
        return entries, ledger.totals(entries)["goodput"]


def main(argv: list[str]) -> int:
    """``launch JOB.yaml [options]``, as every command is run (``launcher.commands``): run the
    job; returns the exit code."""
    return run(argv)
