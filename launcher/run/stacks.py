"""Stacks of a run's processes before the kill: what a hung run was doing.

Every worker (the trainer, and a program once it called ``program.initialize``) answers
``worker.contract.signals.STACKS_SIGNAL`` with every thread's Python stack on its output, written by
``faulthandler`` from the C signal handler (``worker.runtime.interrupts.answer_stack_requests``; its format, ``signals.is_stacks_line``),
so a main thread blocked in C code (a sleep, a blocking read, a collective) answers too.
The launcher asks each process through what its backend already has (a signal to the
worker alone, locally; over the host's SSH connection; ``scancel --signal`` of its Slurm
step), reads the answer off the process's own stream (``state.Tracked`` keeps those
lines out of the console), and writes it beside the attempt's logs as
``process-NNN.stacks.txt``.

A process that cannot answer (stopped by SIGSTOP or a tracer, or one that has not
installed the handler yet) is named as such once the capture's deadline passes; the
capture never waits longer than ``DEADLINE_S``.

Source of the dump's format: CPython's ``Python/traceback.c`` (``faulthandler`` dumps
``Thread 0x... (most recent call first):`` or ``Current thread 0x...`` headers, then
``  File "PATH", line N in NAME`` frames, innermost first, a blank line between threads).
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import time
from typing import Callable

from launcher.words import plural
from worker import contract
from worker.contract import runfiles
from worker.contract import signals

DEADLINE_S = 3.0  # the most a capture waits for every process's answer
# On Ctrl-C, a run looks hung (its stacks are read before the teardown) when some process
# has made no step progress for this long
LOOKS_HUNG_S = 30.0
ANSWER_FILE = "stacks.json"  # beside the attempt's logs: the latest capture (launch stacks)
QUIET_S = 0.3     # a dump is complete once its process has said nothing more for this long

HEADER_RE, FRAME_RE = signals.STACKS_HEADER_RE, signals.STACKS_FRAME_RE

# podlaunch's own worker modules, by their path under the worker package ("trainer/main.py"):
# not "its own code" in a user's stack
_WORKER_ROOT = os.path.dirname(os.path.dirname(contract.__file__))
_WORKER_FILES = frozenset(os.path.relpath(os.path.join(folder, name), _WORKER_ROOT)
                          for folder, _, names in os.walk(_WORKER_ROOT)
                          for name in names if name.endswith(".py"))
_LIBRARY_RE = re.compile(r"/(?:site|dist)-packages/|/lib/python3[.\d]*/|^<")


@dataclasses.dataclass(frozen=True)
class Frame:
    path: str
    line: int
    name: str

    def __str__(self) -> str:
        return f"{self.name} ({os.path.basename(self.path)}:{self.line})"


def threads(lines: list) -> list:
    """The dump's threads, each a list of Frames, innermost first."""
    found: list = []
    for line in lines:
        if HEADER_RE.match(line):
            found.append([])
        elif found and (frame := FRAME_RE.match(line)):
            found[-1].append(Frame(frame["path"], int(frame["line"]), frame["name"]))
    return found


def main_thread(found: list) -> list:
    """The main thread's frames: the one whose outermost frame is a module's top level
    (a program run as a script) or runpy's (the worker, ``python -m worker``), else the
    deepest of those not started by ``threading`` (whose outermost frame is its
    ``_bootstrap``), else the deepest."""
    for frames in found:
        if frames and frames[-1].name in ("<module>", "_run_module_as_main"):
            return frames
    unthreaded = [frames for frames in found if frames and frames[-1].name != "_bootstrap"]
    return max(unthreaded or found, key=len, default=[])


def is_worker(frame: Frame) -> bool:
    """Whether a frame is podlaunch's worker's (``worker/<one of its modules>.py``, in the
    package itself or one of its parts: ``worker/trainer/main.py``)."""
    parts = frame.path.split("/")
    return any(parts[i] == "worker" and "/".join(parts[i + 1:]) in _WORKER_FILES
               for i in range(len(parts) - 1))


def is_own(frame: Frame) -> bool:
    """Whether a frame is the job's own code: not the standard library's, an installed
    package's, or podlaunch's worker's."""
    return not _LIBRARY_RE.search(frame.path) and not is_worker(frame)


def where(frames: list) -> str:
    """Where a thread stands, in words: its innermost frame of the job's own code, else of
    podlaunch's worker, else its innermost frame; then, if deeper, the innermost frame
    (``on_step_end (faulty_task.py:79)``; ``train (train.py:201), in wait (threading.py:320)``)."""
    if not frames:
        return "no Python frame"
    inner = frames[0]
    mine = next((f for f in frames if is_own(f)), None) or next(
        (f for f in frames if is_worker(f)), inner)
    return str(mine) if mine == inner else f"{mine}, in {inner}"


@dataclasses.dataclass
class Capture:
    """What one capture found, per process: the stacks file written, or why none.

    Attributes:
      files: process_id -> the ``process-NNN.stacks.txt`` written.
      standing: process_id -> where its main thread stands (``where``).
      unread: process_id -> why its stacks could not be read.
    """

    files: dict = dataclasses.field(default_factory=dict)
    standing: dict = dataclasses.field(default_factory=dict)
    unread: dict = dataclasses.field(default_factory=dict)

    def lines(self, labels: dict, focus: int | None = None, each_up_to: int = 8) -> list:
        """The summary's lines: where each process stands (up to ``each_up_to`` processes;
        beyond, the stalled one and those that stand elsewhere than the most), what could
        not be read, where the files are."""
        out = []
        mark = {focus: " (stalled)"} if focus is not None else {}
        if len(self.standing) <= each_up_to:
            for process_id, text in sorted(self.standing.items()):
                out.append(f"stacks: {labels[process_id]}{mark.get(process_id, '')} stands in {text}")
        else:
            places: dict = {}
            for process_id, text in sorted(self.standing.items()):
                places.setdefault(text, []).append(process_id)
            rest = max(places, key=lambda text: len(places[text]))
            if focus in self.standing and focus not in places[rest]:
                out.append(f"stacks: {labels[focus]} (stalled) stands in {self.standing[focus]}")
            for text, ids in places.items():
                if text != rest:
                    out.append(f"stacks: {plural(len(ids), 'process')} "
                               f"({', '.join(labels[i] for i in ids[:8])}{', ...' if len(ids) > 8 else ''}) "
                               f"{'stands' if len(ids) == 1 else 'stand'} elsewhere than the rest: in {text}")
            out.append(f"stacks: the rest ({plural(len(places[rest]), 'process')}) stand in {rest}")
        for process_id, why in sorted(self.unread.items()):
            out.append(f"stacks: {labels[process_id]} could not be read: {why}")
        if self.files:
            folder = os.path.dirname(next(iter(self.files.values())))
            out.append(f"stacks: every thread of {plural(len(self.files), 'process')} in "
                       f"{folder}/process-NNN.stacks.txt")
        return out


def capture(tracked: list, wait: Callable[[float], None], clock: Callable[[], float],
            deadline_s: float = DEADLINE_S) -> Capture:
    """Ask every running process for its stacks and write what each answers.

    Args:
      tracked: the run's ``state.Tracked``, in process_id order.
      wait: lets time pass while lines arrive (supervise's output wait), seconds.
      clock: seconds, monotonic.
      deadline_s: the most this waits for the answers.

    Returns:
      A Capture. Every ``process-NNN.stacks.txt`` goes beside that process's log.
    """
    result = Capture()
    asked = []
    for t in tracked:
        if not t.running:
            continue
        if t.worker.stopped():
            result.unread[t.plan.process_id] = ("it is stopped (SIGSTOP or a tracer), so it "
                                                "cannot answer")
            continue
        t.stacks.begin()
        try:
            t.worker.dump_stacks()
        except Exception as exc:  # noqa: BLE001  one process's transport must not stop the rest
            t.stacks.end()
            result.unread[t.plan.process_id] = f"the request failed: {exc}"
            continue
        asked.append(t)
    began = clock()
    while asked:
        pending = [t for t in asked if not t.stacks.complete(clock(), QUIET_S, t.eof_at is not None)]
        if not pending or clock() - began >= deadline_s:
            break
        wait(0.05)
    for t in asked:
        t.stacks.end()
        process_id = t.plan.process_id
        lines = list(t.stacks.lines)
        found = threads(lines)
        if not found:
            result.unread[process_id] = (f"no answer within {deadline_s:g} s (busy in code that "
                                         "holds off signals, or it has not started its job yet)")
            continue
        path = os.path.splitext(t.plan.log_path)[0] + ".stacks.txt"
        try:
            runfiles.write_whole(path, f"# {t.plan.label}: {plural(len(found), 'thread')}, "
                                 "innermost frame first (faulthandler)\n" + "\n".join(lines) + "\n")
            result.files[process_id] = path
        except OSError as exc:
            result.unread[process_id] = f"read, but {path} could not be written ({exc.strerror})"
        result.standing[process_id] = where(main_thread(found))
    return result


def looks_hung(tracked: list, started: float, clock: Callable[[], float]) -> str | None:
    """Why the run looks hung (a running process without step progress for
    ``LOOKS_HUNG_S``), or None."""
    now = clock()
    for t in tracked:
        since = started if t.progress_at is None else t.progress_at
        if t.running and now - since >= LOOKS_HUNG_S:
            return (f"{t.plan.label}: no step progress for {now - since:.0f} s; reading every "
                    f"process's stacks first, at most {DEADLINE_S:g} s")
    return None


def read_before(tracked: list, wait: Callable[[float], None], console, clock: Callable[[], float],
                why: str, focus: int | None = None) -> list:
    """``capture`` of every running process (``wait``: supervise's output wait); says what
    it found on ``console``, writes ``ANSWER_FILE`` beside the logs (what ``launch stacks``
    waits for); returns the summary's lines (``focus``: the stalled process_id)."""
    began = clock()
    got = capture(tracked, wait, clock)
    text = got.lines({t.plan.process_id: t.plan.label for t in tracked}, focus)
    asked = len(got.files) + len(got.unread)
    console.say(f"stacks ({why}): read {len(got.files)} of {plural(asked, 'process')} in "
                f"{clock() - began:.1f} s")
    for line in text:
        console.say(line)
    folder = os.path.dirname(tracked[0].plan.log_path) if tracked else None
    if folder is not None:
        try:
            runfiles.write_whole(os.path.join(folder, ANSWER_FILE), json.dumps(
                {"at": time.time(), "why": why, "lines": text,
                 "files": {str(k): v for k, v in got.files.items()},
                 "unread": {str(k): v for k, v in got.unread.items()}}, indent=1))
        except OSError:
            pass
    return text

