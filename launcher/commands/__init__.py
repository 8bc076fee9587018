"""The commands beside ``launch JOB.yaml``, written once: ``COMMANDS``.

One module per command, named for it (``launch logs``: ``logs.py``; ``launch JOB.yaml``
itself: ``launch.py``), each with ``main(argv) -> int``. Each entry names the module whose
``main`` runs the command (or ``<name>_main``, where one module serves two: ``logs`` and
``attach``) and the line ``launch --help`` shows for it; ``launcher.cli.main`` dispatches on
this table alone (torchx's ``cli/main.py`` keeps its subcommands so). A module is imported
only when its command runs: ``launch --help`` imports none of them. A new command is a
module here and a row in ``COMMANDS``.
"""

from __future__ import annotations

import importlib
import os

# name -> (module under launcher.commands, its arguments, what --help says of it); the
# arguments are the parser's (launcher.commands.usage_doc.listed: --root DIR left out), kept
# here for launch --help, which imports no command module, and checked against it
# (tests/fitness/test_usage_doc.py)
COMMANDS = {
    "resume": ("launch", "RUN [--cluster FILE] [--set KEY=VALUE] [--dry-run] [--apply-changes] "
               "[--show IDS] [--status-every SECONDS] [--kill-stale] [--detach] [--rehearse]",
               "continue a stopped or failed run from its newest checkpoint, from any "
               "directory, with the job and --set settings it recorded (new --set on top)"),
    "runs": ("runs", "[JOB] [-n N] [--state STATE]", "past and running runs, newest first (a running one's step, "
                              "loss, ETA, goodput so far and whether its supervisor is alive)"),
    "logs": ("logs", "[RUN] [-f] [-n N] [--process N] [-t]", "a run's console log (or one process's), "
                                                    "with -f followed from its last lines "
                                                    "(-n N) to the run's end, "
                                                    "with -t each line's time"),
    "attach": ("logs", "RUN", "the live console view of a running run again (Ctrl-C "
                              "leaves the run running); a detached run whose "
                              "supervisor was killed is taken back first (any backend)"),
    "wait": ("wait", "RUN [--timeout-s SECONDS]", "wait for a run to end: its exit code, 124 "
                                          "at the timeout"),
    "stop": ("stop", "RUN [--timeout-s SECONDS]", "stop a running run as Ctrl-C does (an agreed step saved) and "
                            "return once every process is gone"),
    "tensorboard": ("tensorboard", "[JOB | RUN_DIR] [--host HOST] [--port PORT] "
                    "[--startup-timeout-s SECONDS]", "serve the TensorBoard of every run "
                                   "of a job (default: the newest run's), or of one run"),
    "why": ("why", "[RUN] [--attempt N]", "why each failed attempt of a run failed: the "
                                         "launcher's verdict and the last lines of the "
                                         "process that failed first"),
    "stacks": ("stacks", "RUN [--timeout-s SECONDS]", "every process's stacks of a live run"),
    "profile": ("profile", "RUN [--steps N] [--timeout-s SECONDS]", "trace N steps of every process of a live run"),
}


def described(name: str) -> str:
    """What ``launch NAME --help`` says the command does: the table's words as a sentence,
    plain text (a module's docstring is reStructuredText, ``launch stacks`` shown raw)."""
    text = COMMANDS[name][2]
    return f"launch {name} {COMMANDS[name][1]}: {text[0].upper()}{text[1:]}."


def listing() -> str:
    """The commands as ``launch --help`` lists them, one a line."""
    return "\n".join(f"  launch {name} {args}\n      {text}" for name, (_, args, text) in COMMANDS.items())


def run(name: str, argv: list) -> int:
    """Run command ``name`` with ``argv`` (what follows its name); returns its exit code."""
    module = importlib.import_module(f"launcher.commands.{COMMANDS[name][0]}")
    main = getattr(module, f"{name}_main", None) or module.main
    return main(argv)


def parser_of(name: str):
    """Command ``name``'s ``argparse.ArgumentParser``, where its usage is written once: its
    module's ``<name>_parser`` (where one module serves two) or ``parser``; ``launch`` is the
    job's own (``launch.py``). ``launcher.commands.usage_doc`` reads the usage from it."""
    module = importlib.import_module(
        f"launcher.commands.{COMMANDS[name][0] if name in COMMANDS else name}")
    return (getattr(module, f"{name}_parser", None) or module.parser)()


def mistyped(word: str) -> str | None:
    """The command ``word`` was probably meant as, or None when it is a job (a path that
    exists, one with a directory or a YAML suffix) or resembles no command."""
    if (word.startswith("-") or os.path.exists(word) or os.sep in word
            or word.endswith((".yaml", ".yml"))):
        return None
    import difflib  # only for a word that is neither a command nor a job

    close = difflib.get_close_matches(word, COMMANDS, n=1, cutoff=0.6)
    return close[0] if close else None
