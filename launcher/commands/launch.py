"""``launch JOB.yaml``: the main command, running a job: its flags, the job and its backend,
the run itself (``run``: how it begins is decided once, ``launcher.run.starts``; what follows
it is its run-level watchers, ``launcher.rundir.watcher``) and what is said at its end; ``launcher.cli.main`` calls it for anything that
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
import os
import sys
import time

from launcher import backends
from launcher import commands, flags, interrupts, owned
from launcher import spec as specs
from launcher.backends.base import Options
from launcher.console import Console, nextsteps
from launcher.console.status import check_show, parse_show, summary
from launcher.errors import LaunchError, Problem, SpecError
from launcher.run import adopt, detach, restarts, starts
from launcher.rundir import jobrecord, launched, ledger, ledgerscalars, names, specdiff
from launcher.rundir.watcher import Ending

EXIT_OK, EXIT_FAILED, EXIT_BAD_INPUT, EXIT_INTERRUPTED = 0, 1, 2, 130


def parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="launch", usage="launch JOB.yaml [options]\n       launch resume RUN [--set "
                             "KEY=VALUE ...] [options]\n       launch COMMAND [args]",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Run one JAX data-parallel training job on the cluster its spec names.",
        epilog="commands (`launch COMMAND --help` for each; each also takes --root DIR, the "
               "folder of runs it looks in):\n" + commands.listing() + "\n"
               "exit codes: 0 ok, 1 run failed, 2 bad input (nothing started), 130 interrupted "
               "(Ctrl-C, SIGTERM, SIGHUP)")
    parser.add_argument("--version", action=_Version, help="print podlaunch's version and exit")
    # optional only beside --resume RUN, which reads the run's own (launcher.rundir.launched)
    parser.add_argument("job", metavar="JOB.yaml", nargs="?", help="the job spec")
    _options(parser)
    # launch attach's supervisor that takes back a detached run whose supervisor was killed
    parser.add_argument("--adopt", metavar="RUN_DIR", help=argparse.SUPPRESS)
    return parser


def _options(parser: argparse.ArgumentParser, resume: bool = False) -> None:
    """The options of ``launch JOB.yaml`` and, but for those that name a run directory, of
    ``launch resume RUN`` (``resume``), written once for both."""
    parser.add_argument("--cluster", metavar="FILE",
                        help="cluster YAML that replaces the " + ("run's cluster" if resume else
                                                                  "job's cluster: section"))
    parser.add_argument("--set", dest="overrides", metavar="KEY=VALUE", action="append", default=[],
                        help=("override a dotted key on top of the run's own --set settings, "
                              "e.g. train.num_steps=50000" if resume else
                              "override a dotted key of the spec, e.g. train.num_steps=50")
                        + " (repeatable)")
    parser.add_argument("--dry-run", action="store_true",
                        help="print the resolved plan (hosts, ids, env, commands) and start nothing")
    if not resume:
        parser.add_argument("--run-dir", metavar="DIR",
                            help="where logs, events and params go (default runs/<job>/<timestamp>)")
        parser.add_argument("--resume", metavar="RUN_DIR",
                            help="continue the run in RUN_DIR from its latest complete checkpoint "
                                 "(new logs go to RUN_DIR/logs/attempt-N/); without JOB.yaml, with "
                                 "the job and --set settings the run recorded, as `launch resume "
                                 "RUN`")
    parser.add_argument("--apply-changes", action="store_true",
                        help=("resume" if resume else "with --resume: resume") + " with the spec "
                             "files as they are now; without it a run resumes with the job "
                             "recorded at its start, and says what changed since")
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
    parser.add_argument("--rehearse", action="store_true",
                        help="tpu: run the pod's exact topology (hosts x chips per host, slices) as "
                             "local processes with CPU devices, before paying for the pod")


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
        for lock in reversed(held):  # last taken first: a lock before its directory
            lock.release()
        interrupts.restore(previous)


def _run(argv: list[str] | None, console: Console | None, held: list) -> int:
    launched_at = time.monotonic()  # the ledger's and run.json's duration count from here
    argv, args = _arguments(sys.argv[1:] if argv is None else argv)
    handoff = detach.Handoff()  # this launch is a detached run's supervisor
    if args.detach and not handoff.detached:
        return detach.spawn([a for a in argv if a != "--detach"])
    show = parse_show(args.show)
    console = console or Console(show=show, status_every_s=args.status_every,
                                 others=show != frozenset(), tty=False if handoff.detached else None)
    job, backend, options, recorded = _job(args, show, handoff, console.say)
    start = starts.choose(args, job, argv, backend.name)
    start.recorded = recorded
    run_dir = start.run_dir(held)
    session = backend.session(job, run_dir, console, options)
    try:
        start.join(session, held)
        if not args.dry_run:  # before the plan: what it queues is known as a live launch's
            start.lock(held)
        plan = session.plan()
        if args.dry_run:
            console.block(session.describe(plan))
            return EXIT_OK
        start.claim(held)
        begin, watchers = start.open(plan, session, console, handoff, launched_at)
        try:
            result, attempts = restarts.run(session, plan, console, begin, watchers)
        except BaseException as exc:
            done = list(getattr(exc, "attempts", ()))
            if isinstance(exc, LaunchError) and done:  # a restart that could not be prepared
                console.block(restarts.attempts_table(done))
            watchers.run_ended(Ending("interrupted" if isinstance(exc, KeyboardInterrupt)
                                      else "failed", done, made=restarts.next_attempt(run_dir)))
            raise
        if result.exit_code == 0:
            session.succeeded()
        ending = Ending({0: "succeeded", 130: "interrupted"}.get(result.exit_code, "failed"),
                        attempts, result)
        watchers.run_ended(ending)
    finally:
        session.close()
    _closing(args, job, run_dir, ending, console)
    return 1 if result.exit_code == 0 and result.diverged_loss is not None else result.exit_code


def _arguments(argv: list) -> tuple:
    """(the command line, its parsed flags), checked; ``--adopt RUN_DIR`` (``launch attach``'s
    supervisor) stands for the run's own command line, read from its sealed journal, and
    ``--resume RUN`` without a job for the run's job and settings (``continued``).

    Raises:
      SpecError: a flag's value is bad, or ``--detach`` with ``--dry-run``.
    """
    if argv[:1] == ["--adopt"]:
        argv = adopt.command(argv)
    args = parser().parse_args(argv)
    if args.job is None:
        if not args.resume:
            parser().error("the following arguments are required: JOB.yaml (or --resume RUN)")
        argv = continued(args, names.resolve(args.resume))
        args = parser().parse_args(argv)
    flags.check(("--status-every", args.status_every, flags.seconds_or_never,
                 "how often to print the progress line when stdout is not a terminal"))
    if args.detach and args.dry_run:
        raise SpecError([Problem("--detach", None, "", "a dry run starts nothing to detach; "
                                 "drop one of --detach and --dry-run")])
    return argv, args


def _job(args, show, handoff, say) -> tuple:
    """(the job spec, its backend, the options the backend is given, the job's record to keep
    or None), each checked.

    Raises:
      SpecError: bad input in the spec, ``--show``, ``--rehearse`` or ``--kill-stale``.
    """
    job, recorded = _loaded(args, say)
    check_show(show, job.num_processes)
    backend = backends.for_job(job)
    if args.rehearse:
        rehearsal = backend.rehearsal(job)
        if rehearsal is None:
            raise SpecError([Problem("--rehearse", None, "", "only applies to cluster.backend: "
                                     + ", or ".join(backends.rehearsing()) + f" (this job's is "
                                     f"{backend.name} on {job.cluster.platform}); remove the flag")])
        backend = rehearsal
    if args.kill_stale and not backend.stops_stale:
        raise SpecError([Problem("--kill-stale", None, "", "only applies to backends whose "
                                 "hosts can outlive a launcher "
                                 f"({', '.join(backends.stopping_stale())}); this job's is "
                                 f"{backend.name}; remove the flag")])
    options = Options(python=sys.executable, kill_stale=args.kill_stale, dry_run=args.dry_run,
                      resume=bool(args.resume), detached=handoff.detached,
                      adopting=bool(args.adopt))
    backend.check(job, options)
    return job, backend, options, recorded


def _loaded(args, say) -> tuple:
    """(the job, its record to keep or None): a run taken back (``--adopt``) or resumed runs
    the job recorded at its start (``launcher.rundir.jobrecord``; the files as they are now
    with ``--resume --apply-changes``), a change since said; a new run records its files.

    Raises:
      SpecError: bad input in the spec; a record that is not the user's own or not one;
        ``--apply-changes`` without ``--resume``.
    """
    overrides, run = tuple(args.overrides), args.adopt or args.resume
    if args.apply_changes and not args.resume:
        raise SpecError([Problem("--apply-changes", None, "", "goes with --resume RUN (a new run "
                                 "reads its files as they are); remove it")])
    if run:
        owned.check_dir(owned.real_path(run), "RUN" if args.adopt else "--resume")
    recorded = jobrecord.read(owned.real_path(run)) if run else None
    if recorded is None or args.apply_changes:
        texts: dict = {}
        job = specs.load(args.job, args.cluster, overrides, registry=backends, texts=texts)
        return job, jobrecord.Recorded.of(args.job, args.cluster, texts)
    # a --cluster file other than the recorded one is asked for: read as it is now
    cluster = recorded.cluster_path if args.cluster is None or \
        os.path.abspath(args.cluster) == recorded.cluster_path else args.cluster
    job = specs.load(recorded.job_path, cluster, overrides, registry=backends,
                     texts=dict(recorded.texts))
    now: dict = {}
    try:
        current = specs.load(args.job, args.cluster, overrides, registry=backends, texts=now) \
            if jobrecord.Recorded.of(args.job, args.cluster, _texts(args)) != recorded else job
        changed = jobrecord.changes(job, current)
    except SpecError as exc:
        changed = [f"it cannot be loaded now ({exc.problems[0].message})"]
    if changed:
        files = " and ".join(filter(None, (args.job, args.cluster)))
        then = ("the run resumes with the job recorded at its start; --apply-changes resumes "
                "with the files as they are now" if args.resume else
                "the run goes on with the job recorded at its start")
        say(f"{files} changed since the run started ({'; '.join(changed[:8])}"
            f"{'; ...' if len(changed) > 8 else ''}): {then} "
            f"({os.path.join(owned.real_path(run), jobrecord.FILE)})")
    return job, None


def _texts(args) -> dict:
    """The spec files' texts as they are now, by path ({} for one that cannot be read)."""
    texts = {}
    for path in filter(None, (args.job, args.cluster)):
        try:
            with open(path, encoding="utf-8") as f:
                texts[path] = f.read()
        except (OSError, UnicodeDecodeError):
            pass
    return texts


def _closing(args, job, run_dir: str, ending: Ending, console: Console) -> None:
    """What the user reads as the launch ends, once its session is closed: the summary, the
    ledger's line and TensorBoard scalars (over ssh, process 0's tensorboard/ is back by
    then), the attempts' table and the next steps."""
    result, attempts, entries = ending.result, ending.attempts, ending.entries
    run = ledger.totals(entries) if entries else None
    # the run's seconds beside this launch's only after an earlier launch (a take-back, a
    # resume, whose entries or attempt came before): a first launch's own ledger counts its
    # launch and preflight (a Slurm job's wait in the queue), which its attempts' elapsed
    # time does not
    earlier = run is not None and (bool(args.adopt) or len(entries) > len(attempts or ()))
    console.block(summary(result, run["wall_s"] if earlier else None))
    run_ledger = ledger.summary_line(run) if run is not None else None
    if run_ledger is not None:
        console.say(f"{run_ledger} (ledger: {os.path.join(run_dir, ledger.LEDGER_FILE)})")
    if entries and job.logging.tensorboard:
        try:
            ledgerscalars.write_scalars(os.path.join(run_dir, "tensorboard"), entries,
                                 sum(a.times is not None for a in attempts))
        except OSError as exc:
            console.say(f"cannot write the ledger's TensorBoard scalars ({exc})")
    if len(attempts) > 1 or attempts[-1].number > 0:
        console.block(restarts.attempts_table(attempts))
    for line in nextsteps.closing(args.job, run_dir, result.exit_code, job.logging.tensorboard,
                                  cluster=args.cluster, overrides=tuple(args.overrides),
                                  default_dir=not (args.run_dir or args.resume), secrets=job.secrets,
                                  failure=attempts[-1].failure, saved_step=specdiff.newest_checkpoint(
                                      run_dir, job.checkpoint.local_dir),
                                  rates=_learning_rates(args, job, attempts[-1].failure)):
        console.say(line)


def _learning_rates(args, job, failure) -> tuple | None:
    """(the run's learning rate, the job file's own before ``--set``, or None), after a failure
    that names the learning rate (a diverged loss), for the next run's advice; else None."""
    if job.learning_rate is None or failure is None or "learning_rate" not in failure.why:
        return None
    try:
        own = specs.load(args.job, args.cluster, tuple(
            kv for kv in args.overrides if not kv.startswith(nextsteps.LR_KEY)), registry=backends)
        return job.learning_rate, own.learning_rate
    except (SpecError, OSError):  # the file changed since: the run's own rate alone
        return job.learning_rate, None
    console.close()


def main(argv: list[str]) -> int:
    """``launch JOB.yaml [options]``, as every command is run (``launcher.commands``): run the
    job; returns the exit code."""
    return run(argv)


def resume_parser() -> argparse.ArgumentParser:
    """``launch resume``'s parser: ``RUN`` in place of the job, the launch's other options
    but those that name a run directory."""
    resume = argparse.ArgumentParser(prog="launch resume", description=commands.described("resume"))
    resume.add_argument("run", metavar="RUN", help="a run directory, a name `launch runs` lists, "
                        "or a job's name (its newest run)")
    _options(resume, resume=True)
    resume.add_argument("--root", metavar="DIR", default=None, help=names.ROOT_HELP)
    return resume


def resume_main(argv: list[str]) -> int:
    """``launch resume RUN [--set KEY=VALUE ...] [options]``: continue a run with the job and
    ``--set`` settings it recorded (``launcher.rundir.launched``), new ``--set``s on top, from
    any directory; returns the exit code."""
    args = resume_parser().parse_args(argv)
    return run(continued(args, names.resolve(args.run, args.root)))


def continued(args, run_dir: str) -> list:
    """The full command line that continues the run in ``run_dir``: the job, cluster and
    ``--set``s it recorded (``args.cluster`` in place of its cluster, ``args.overrides`` after
    its own), the options of ``args`` that differ from their defaults, ``--resume RUN_DIR``;
    said on the console first (secrets masked).

    Raises:
      SpecError: the run recorded nothing to continue from (``launched.read``).
    """
    from worker.contract import redact

    recorded = launched.read(run_dir)
    inputs = launched.Inputs(recorded.job, os.path.abspath(args.cluster) if args.cluster
                             else recorded.cluster, recorded.overrides + tuple(args.overrides))
    defaults, options = parser(), []
    for flag in ("show", "status_every"):
        if getattr(args, flag) != defaults.get_default(flag):
            options += [f"--{flag.replace('_', '-')}", str(getattr(args, flag))]
    options += [f"--{flag.replace('_', '-')}" for flag in ("kill_stale", "detach", "dry_run", "rehearse",
                                                           "apply_changes")
                if getattr(args, flag)]
    argv = [*inputs.argv(), *options, "--resume", run_dir]
    secrets = specdiff.spec_of(run_dir).get("secrets")  # the spec's own secret names
    shown = redact.masked_argv(["launch", *inputs.argv()], tuple(
        n for n in secrets if isinstance(n, str)) if isinstance(secrets, list) else ())[1:]
    print(f"podlaunch: continuing {run_dir} with the job and settings it recorded: "
          + " ".join(shown), flush=True)
    return argv
