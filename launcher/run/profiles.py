"""Profiles of a run's processes: asked of a live run, copied back, told on the console (in
the words of ``launcher.console.traced``, which the summary says them in too).

Each worker traces the steps the spec's ``profile`` section names, or those this launcher
asks, and prints ``worker.contract.profiling.LINE_FORMAT`` when its trace is written (the layout
TensorBoard's profile plugin reads: ``tensorboard/plugins/profile/<session>/process_<id>.xplane.pb``).

``launch profile RUN --steps N`` writes a request (``REQUEST_PREFIX``) into the run directory and signals
this launcher (``launcher.interrupts.PROFILE_REQUEST_SIGNAL``). Between two of supervision's
polls ``Answers.poll`` picks the first step to trace, ``LEAD_S`` ahead of the furthest process
at the step rate its progress lines report, so that every process reads the request before
it gets there, and hands ``worker.contract.profiling.STEPS_FILE`` to every running process through
what its backend already has (``Worker.request_profile``: a file in the run directory on
this machine or a shared filesystem, over the host's SFTP channel for ssh and tpu). Once
every asked process has said its line (or ``ANSWER_WAIT_S`` passed), the console says where
the traces are and which process was slowest over the traced steps, and ``ANSWER_FILE``
beside the attempt's logs holds what ``launch profile`` prints.
"""

from __future__ import annotations

import glob
import json
import math
import os
import time
from typing import Callable

from launcher import interrupts
from launcher.console.traced import by_session, run_dir_of, session_lines
from launcher.words import plural
from launcher.run import stacks
from worker.contract import runfiles
from worker.contract import profiling

REQUEST_PREFIX = "profile-request-"  # launch profile -> the launcher: one file per request
# (<prefix><time ns>-<pid>.json in the run directory, so two at once are two requests)
ANSWER_FILE = "profile.json"           # beside the attempt's logs: the newest session said
LEAD_S = 3.0          # the asked window starts this far ahead of the furthest process
ANSWER_WAIT_S = 120.0  # a session is said with what came once this long passed since it was asked


class Answers:
    """What ``launch stacks`` and ``launch profile`` ask of the live attempt, answered between
    two polls of supervision, and each profile session said once all its traces are in.

    Profile requests (``REQUEST_PREFIX*.json`` in the run directory, one per ``launch
    profile``) are taken one at a time, oldest first, once every running process has logged
    a step of this attempt (so the first step is chosen from where they stand, a resumed
    attempt's included, at the rate they step, and each has its profiler looking for
    requests), and the next only after the previous session was said. A request left when
    the attempt ends waits for the next attempt.

    Args:
      tracked: the attempt's ``state.Tracked``, in process_id order.
      console: where it is said.
      clock: seconds, monotonic.
    """

    def __init__(self, tracked: list, console, clock: Callable[[], float]):
        self.tracked, self.console, self.clock = tracked, console, clock
        self.run_dir = run_dir_of(tracked[0].plan.log_path) if tracked else "."
        self.said: set = set()
        self.asked: dict = {}  # session -> (when, process_ids asked, its request's "at")
        self.failures: list = []  # what could not be asked, said on the next poll (any thread appends)
        self.requested = bool(pending(self.run_dir))  # one left by the attempt before, say
        self.ignored: set = set()  # request paths taken or refused (a directory cannot be removed)

    def poll(self, wait: Callable[[float], None]) -> None:
        """Answer what was asked since the last poll (``wait``: supervise's output wait)."""
        if interrupts.stacks_requested.is_set():  # launch stacks RUN asked
            interrupts.stacks_requested.clear()
            stacks.read_before(self.tracked, wait, self.console, self.clock, "asked by launch stacks")
        if interrupts.profile_requested.is_set():  # launch profile RUN wrote a request
            interrupts.profile_requested.clear()
            self.requested = True
        in_flight = [s for s in self.asked if s not in self.said]
        if self.requested and not in_flight and any(t.running for t in self.tracked) and all(
                t.stats.progress is not None for t in self.tracked if t.running):
            requests = [r for r in pending(self.run_dir) if r not in self.ignored]
            self.requested = len(requests) > 1
            if requests:
                self.ask(requests[0])
        while self.failures:
            self.console.say(self.failures.pop(0))
        self._say_complete()

    def finish(self) -> None:
        """The attempt is over: say each asked session with whatever traces came."""
        self._say_complete(ending=True)

    def ask(self, path: str) -> None:
        """Take the request in ``path`` and hand its window to every running process."""
        try:
            request = json.loads(runfiles.read_regular(path, 4096))
            num_steps, asked_at = request["num_steps"], request.get("at")
            if type(num_steps) is not int or not 1 <= num_steps <= 10000:
                raise ValueError(f"num_steps {num_steps!r:.40}: expected 1 to 10000")
        except Exception as exc:  # noqa: BLE001  a file (written by hand, say) never ends a run
            self.console.say(f"profile: the request {path} could not be read ({type(exc).__name__}: "
                             f"{exc}); ignored"[:500])
            self.ignored.add(path)  # said once, even where it cannot be removed (a directory)
            _remove(path)
            return
        _remove(path)
        self.ignored.add(path)
        running = [t for t in self.tracked if t.running]
        start = self.first_step(running, num_steps)
        total = max((t.stats.progress.num_steps for t in running if t.stats.progress), default=None)
        last = start + num_steps - 1 if total is None else min(start + num_steps - 1, total)
        if last < start:  # every process is at the run's last step
            text = [f"profile: the run is at its last step ({total}): no step is left to trace"]
            self.console.say(text[0])
            self._answer("", {}, text, asked_at, len(running))
            return
        session = profiling.session_name(start, last)
        if session in self.asked:
            session += f".{len(self.asked)}"
        text = json.dumps({"session": session, "start_step": start, "num_steps": last - start + 1})
        asked = []
        for t in running:
            def failed(why: str, label: str = t.plan.label) -> None:
                self.failures.append(f"profile: could not ask {label}: {why}")
            try:
                t.worker.request_profile(text, failed)
                asked.append(t.plan.process_id)
            except Exception as exc:  # noqa: BLE001  one process's transport must not stop the rest
                failed(str(exc))
        self.asked[session] = (self.clock(), asked, asked_at)
        self.console.say(f"profile {session}: asked {plural(len(asked), 'process')} to trace "
                         f"steps {start}-{last} (launch profile)")

    @staticmethod
    def first_step(running: list, num_steps: int = 1) -> int:
        """``LEAD_S`` ahead of the furthest process at the fastest process's step rate (its mean
        over the steps it reported, compilation excluded; at least 1 step), but early enough for
        ``num_steps`` steps before the run's last, where that leaves any."""
        furthest = max((t.last_step or 0 for t in running), default=0)
        progress = [t.stats.progress for t in running if t.stats.progress is not None]
        means = [t.stats.mean_step_time_s for t in running if t.stats.mean_step_time_s]
        rate = max([1.0 / m for m in means] or [p.steps_per_s for p in progress] or [0.0])
        start = furthest + max(1, math.ceil(rate * LEAD_S) if math.isfinite(rate) else 1)
        total = max((p.num_steps for p in progress), default=None)
        return start if total is None else max(furthest + 1, min(start, total - num_steps + 1))

    def _say_complete(self, ending: bool = False) -> None:
        if all(s in self.said for s in self.asked) and not any(t.stats.profiles for t in self.tracked):
            return  # nothing asked or traced yet: the common case, at every poll
        sessions: dict = {session: {} for session in self.asked}
        sessions.update(by_session(self.tracked))
        ids = {t.plan.process_id: t for t in self.tracked}
        for session, traces in sessions.items():
            if session in self.said:
                continue
            asked_at, asked, request_at = self.asked.get(session, (None, None, None))
            if asked is None:  # the spec's window: every process that is still running
                asked = [p for p, t in ids.items() if t.running or p in traces]
            waiting = [p for p in asked if p not in traces and ids[p].running]
            late = asked_at is not None and self.clock() - asked_at >= ANSWER_WAIT_S
            if waiting and not late and not ending:
                continue
            self.said.add(session)
            labels = {p: t.plan.label for p, t in ids.items()}
            missing = [p for p in asked if p not in traces]
            text = session_lines(session, traces, labels, self.run_dir) if traces else []
            if missing:
                text.append(f"profile {session}: no trace from {plural(len(missing), 'process')} "
                            f"asked ({', '.join(labels[p] for p in missing[:8])}"
                            f"{', ...' if len(missing) > 8 else ''}): "
                            + ("the attempt ended first" if ending else "ended or still not there"
                               if not late else f"none within {ANSWER_WAIT_S:g} s"))
            for line in text:
                self.console.say(line)
            self._answer(session, traces, text, request_at, len(asked))

    def _answer(self, session: str, traces: dict, text: list, request_at, asked: int) -> None:
        folder = os.path.dirname(self.tracked[0].plan.log_path)
        files = {str(p): os.path.join(self.run_dir, t.path) for p, t in traces.items() if t.path}
        try:
            runfiles.write_whole(os.path.join(folder, ANSWER_FILE), json.dumps(
                {"at": time.time(), "asked_at": request_at, "session": session, "lines": text,
                 "files": files, "asked": asked, "traced": len(traces)}, indent=1))
        except OSError:
            pass


def pending(run_dir: str) -> list:
    """The profile requests waiting in the run directory, oldest first."""
    return sorted(glob.glob(os.path.join(run_dir, REQUEST_PREFIX + "*.json")))


def _remove(path: str) -> None:
    try:
        os.remove(path)
    except OSError:
        pass
