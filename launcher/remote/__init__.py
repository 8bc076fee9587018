"""The programs the launcher runs on SSH and TPU hosts, and how they are shipped.

Each program is a plain module here (``preflight``, ``wrapper``, ``killpg``,
``holders``, ``reach``, ``follow``) with a ``main(args)`` and the line
``if __name__ == "__main__": main(json.loads(sys.argv[1]))``: tests import
and run them on this machine like any module, and the launcher ships their
source to a host as ``python -c SOURCE JSON`` (``python_call``); the wrapper, which lives
as long as a run, goes as a file the worker's start script writes on the host (``script_call``), or runs as
the installed module on this machine (``module_call``), so ``ps`` shows a short command
line. Nothing has to be installed on the hosts beyond a Python 3.8+ interpreter.

Rules for these modules, because they run on hosts under an interpreter the
launcher does not control: standard library only; no ``from __future__``
import and no annotations that need a newer Python at run time; the only
import from ``launcher`` is the line ``from launcher import proctl``, which
``source`` replaces with proctl's own text (loaded as a module named
``proctl``), so the hosts run the same stop sequence, ``/proc`` readers and
port check as the launcher, whatever podlaunch version they have installed.
Each program prints its answer as one marked line (``MARK`` + JSON), so a
login banner or ``setup`` chatter cannot be mistaken for it.
"""

import functools
import hashlib
import json
import os

_HERE = os.path.dirname(os.path.abspath(__file__))
_PROCTL = os.path.join(os.path.dirname(_HERE), "proctl.py")
IMPORT_PROCTL = "from launcher import proctl"
PROGRAMS = ("preflight", "wrapper", "killpg", "holders", "reach", "follow")


def _read(path):
    with open(path, "r", encoding="utf-8") as f:
        return f.read()


@functools.lru_cache(maxsize=None)
def source(name):
    """The text of program ``name`` as shipped: its module, proctl inlined where it imports it.

    Raises:
      ValueError: ``name`` is not one of ``PROGRAMS``, or the module imports
        something else from ``launcher`` (it could not run on a host).
    """
    if name not in PROGRAMS:
        raise ValueError("no remote program %r (known: %s)" % (name, ", ".join(PROGRAMS)))
    lines = _read(os.path.join(_HERE, name + ".py")).splitlines()
    out = []
    for line in lines:
        if line.strip() == IMPORT_PROCTL:
            # proctl becomes a module object of its own (its names do not mix
            # with the program's); its filename keeps tracebacks readable.
            out.append("import types as _types; proctl = _types.ModuleType('proctl'); "
                       "exec(compile(%r, 'launcher/proctl.py', 'exec'), proctl.__dict__)"
                       % _read(_PROCTL))
        elif line.startswith(("from launcher", "import launcher")):
            raise ValueError("launcher/remote/%s.py: %r cannot run on a host; only %r is shipped"
                             % (name, line.strip(), IMPORT_PROCTL))
        else:
            out.append(line)
    return "\n".join(out) + "\n"


def python_call(python, name, args):
    """argv running program ``name`` under ``python`` with ``args`` as its one JSON argument.

    The source is the command line: fine for the short-lived checks (preflight, killpg,
    holders, reach), not for a program that lives as long as a run (the wrapper), whose
    command line ``ps``, ``top`` and ``pgrep -a`` show: see ``module_call`` and
    ``script_call``.
    """
    return [python, "-c", source(name), json.dumps(args)]


def module_call(python, name, args):
    """argv running program ``name`` as podlaunch's installed module, for this machine, where
    ``python`` has podlaunch (a local worker's wrapper): a short command line in ``ps``.
    ``-P``: a ``launcher.py`` in the working directory never stands in for podlaunch's."""
    if name not in PROGRAMS:
        raise ValueError("no remote program %r (known: %s)" % (name, ", ".join(PROGRAMS)))
    return [python, "-P", "-m", "launcher.remote." + name, json.dumps(args)]


def script_call(python, directory, name):
    """argv running program ``name`` from a file of its source on a host, and that file.

    Returns:
      ``(argv, (path, text))``: the command line names the file (``directory``/NAME-DIGEST.py:
      launchers of other versions never share one), not its 25,000 characters; the caller
      writes ``text`` to ``path`` on the host first, and hands the program its JSON argument
      in the environment (the wrapper's ``ARGS_VAR``), where ``ps`` does not show it.
    """
    text = source(name)
    digest = hashlib.sha256(text.encode("utf-8")).hexdigest()[:12]
    path = os.path.join(directory, "%s-%s.py" % (name, digest))
    return [python, path], (path, text)


def parse_marked(output, mark):
    """The JSON after the first line of ``output`` that starts with ``mark``, or None."""
    for line in output.splitlines():
        if line.startswith(mark):
            return json.loads(line[len(mark):])
    return None
