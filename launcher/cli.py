"""``launch``: the command line's entry point. Only ``main`` prints errors and exits.

``launch COMMAND ...`` runs one of ``launcher.commands.COMMANDS``; anything else is a job
(``launch JOB.yaml``, ``launcher.commands.launch``), unless it looks like a mistyped
command. Exit codes: ``launcher.commands.launch``'s (2 for bad input, here).
"""

from __future__ import annotations

import os
import signal
import sys

from launcher import commands, owned, proctl
from launcher.commands import launch
from launcher.commands.launch import EXIT_BAD_INPUT, EXIT_FAILED, EXIT_INTERRUPTED
from launcher.console import lines
from launcher.errors import LaunchError, Problem, SpecError
from launcher.words import plural


def main(argv: list[str] | None = None) -> int:
    _sane_process()
    try:
        code = _run(argv)
        sys.stdout.flush()  # what is still buffered: a reader that left shows here
    except BrokenPipeError:  # `launch logs RUN | head`: the reader has what it wanted
        if not _stdout_broken():
            raise
        code = _stdout_closed()
    except SystemExit as exc:  # argparse's --help and --version, which print, then exit
        try:
            sys.stdout.flush()
        except BrokenPipeError:
            code = _stdout_closed()
        else:
            raise exc from None
    sys.exit(code)


def _run(argv: list[str] | None) -> int:
    """The command's exit code; bad input, a failed launch and Ctrl-C are said here."""
    # nothing podlaunch makes is writable by group or others, whatever umask it was given
    # (logs/, TensorBoard's event files, the podlaunch folder: 0777 and 0666 under umask 000)
    os.umask(os.umask(0o077) | 0o022)
    try:
        argv = sys.argv[1:] if argv is None else argv
        if not argv and owned.ARGV_VAR in os.environ:  # a detached supervisor (detach.spawn)
            argv = _supervisor_argv()
        if not argv:  # bare `launch`: what it takes, and every command, one line each
            _say_error(launch.parser().format_usage().rstrip() + "\n\n" + _bare_text())
            return EXIT_BAD_INPUT
        if argv[:1] and argv[0] in commands.COMMANDS:
            code = commands.run(argv[0], argv[1:])
        elif argv[:1] and commands.mistyped(argv[0]):
            raise SpecError([Problem("COMMAND", None, "", (
                f"{argv[0]!r} is neither a command nor a job file; did you mean "
                f"`launch {commands.mistyped(argv[0])}`? (commands: {', '.join(commands.COMMANDS)})"))])
        else:
            code = launch.main(argv)
    except SpecError as exc:
        for problem in exc.problems:
            _say_error(f"error: {problem}")
        _say_error(f"launch: {plural(len(exc.problems), 'problem')} in the input; nothing was started.")
        code = EXIT_BAD_INPUT
    except LaunchError as exc:
        _say_error(f"launch: {exc}")
        code = EXIT_FAILED
    except KeyboardInterrupt as exc:
        _say_error(f"launch: interrupted ({str(exc) or 'SIGINT'}); nothing is left running")
        code = EXIT_INTERRUPTED
    return code


def _bare_text() -> str:
    """What a bare ``launch`` says under its usage: a job to run, then the commands by name
    with their first words (``launch --help`` has every option and each command's arguments)."""
    width = max(map(len, commands.COMMANDS))
    lines = ["run a job: launch JOB.yaml (with --dry-run: its plan, nothing started)", "commands:"]
    lines += [f"  {name:<{width}}  {about.split(' (')[0].split(', from any')[0].split(': ')[0]}"
              for name, (_, _, about) in commands.COMMANDS.items()]
    lines.append("launch --help: every option; launch COMMAND --help: a command's own")
    return "\n".join(lines)


def _supervisor_argv() -> list:
    """A detached supervisor's arguments: ``detach.spawn`` hands them over in the environment
    (``owned.ARGV_VAR``, taken out at once: no worker inherits it), never in the command line,
    where ``ps`` would show every ``--set`` value to every user. ``sys.argv`` gets them (the
    run's lock records them, masked)."""
    import json

    try:
        argv = json.loads(os.environ.pop(owned.ARGV_VAR))
    except ValueError:
        argv = None
    if not isinstance(argv, list) or not all(isinstance(a, str) for a in argv):
        raise SpecError([Problem(owned.ARGV_VAR, None, "", "is not a JSON list of arguments")])
    sys.argv[1:] = argv
    return argv


def _sane_process() -> None:
    """What the process that started this one may have left, undone before anything starts: a
    closed stdin, stdout or stderr (``launch job.yaml >&-``) is /dev/null (otherwise the first
    file or pipe opened takes its number: the detached supervisor's pipe became its stdout,
    and a message written to a closed stdout failed a run that succeeded); the signals the
    launcher and its processes need are unblocked and not ignored (``proctl.sane_signals``),
    but for an ignored SIGHUP (``nohup launch``, kept: the run outlives the terminal); the
    open-files limit is its hard limit (``proctl.open_files_to_the_hard_limit``)."""
    for fd, name, mode in ((0, "stdin", "r"), (1, "stdout", "w"), (2, "stderr", "w")):
        try:
            os.fstat(fd)
        except OSError:
            devnull = os.open(os.devnull, os.O_RDWR)
            if devnull != fd:
                os.dup2(devnull, fd)
                os.close(devnull)
        if getattr(sys, name) is None:  # Python found it closed at its start
            setattr(sys, name, open(fd, mode, encoding="utf-8", errors="replace", closefd=False,
                                    buffering=1 if mode == "w" else -1))
    proctl.sane_signals(keep_ignored=(signal.SIGHUP,))
    proctl.open_files_to_the_hard_limit()


def _stdout_broken() -> bool:
    """Whether stdout is a pipe whose reader has gone (poll reports an error on its write end):
    a BrokenPipeError from elsewhere (a host's channel) is not the reader's doing."""
    import select

    try:
        poller = select.poll()
        poller.register(sys.stdout.fileno(), select.POLLOUT)
        return any(events & select.POLLERR for _, events in poller.poll(0))
    except (OSError, ValueError):
        return False


def _stdout_closed() -> int:
    """The command's reader closed the pipe (``| head``): nothing more is written, no
    traceback; exit 141 as a shell's command killed by SIGPIPE would (128 + 13). Python's own
    flush of stdout at exit would fail again, so stdout is pointed at /dev/null first."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError):
        pass
    return 128 + signal.SIGPIPE


def _say_error(text: str) -> None:
    """Print to stderr; a closed stderr (the terminal went away) is not an error of its own."""
    try:
        print(lines.printable(text, keep_newlines=True), file=sys.stderr, flush=True)
    except (OSError, ValueError):
        pass


if __name__ == "__main__":
    main()
