"""Traces of chosen steps with ``jax.profiler``, laid out for TensorBoard's profile plugin.

Which steps: the spec's ``profile`` section (``worker.contract.sections.Profile``), or a request the
launcher writes into the run directory while the run goes on (``STEPS_FILE``, from
``launch profile RUN``: ``{"session": ..., "start_step": N, "num_steps": M}``), looked for
at most once every ``POLL_S`` seconds. A process that is already past the requested first
step when it reads the request traces its next ``num_steps`` steps instead, so every process
traces as many steps as asked; the line it prints says which.

Each process traces into a private directory, then moves its ``.xplane.pb`` to
``<run dir>/tensorboard/plugins/profile/<session>/process_<process_id>.xplane.pb``: the
layout the profile plugin (xprof, ``tensorboard-plugin-profile``) reads, one session per
window of steps (``steps_20-25``) and one "host" per process (its host selector names the
processes). ``jax.profiler.start_trace`` itself would name the file by the host name, and
processes on one host would overwrite each other.

With ``profile.processes: slowest`` every process traces, then they compare their step
times over the coordination service's key-value store (the same client ``worker.recovery.notice``
uses) and only the slowest keeps its trace.

Cost: with nothing to trace, one clock read per device call (a ``stat`` of ``STEPS_FILE``
once every ``POLL_S``); while tracing, the traced steps run under the profiler and the last
one waits for its devices, so that the trace holds their device work.

What the launcher reads of it (the request file, the line, the layout) is
``worker.contract.profiling``. Standard library at import; jax is imported when a trace
starts.
"""

from __future__ import annotations

import glob
import json
import math
import os
import shutil
import time
from contextlib import nullcontext

from worker.contract import runfiles
from worker.contract.profiling import (LINE_FORMAT, NOT_KEPT, PLUGIN_DIR, SESSION_RE, STEPS_FILE,
                                       session_name, trace_path)

POLL_S = 1.0
SLOWEST_TIMEOUT_S = 10.0  # the most a process waits for its peers' step times (slowest)
KEY_PREFIX = "podlaunch/profile/"

_NOTHING = nullcontext()


def _whole(value) -> bool:
    """A step number: a JSON integer from 1 to 2**31-1 (not a bool, a float, infinity)."""
    return type(value) is int and 1 <= value <= 2**31 - 1


def _mtime(path: str) -> float | None:
    try:
        return os.stat(path).st_mtime_ns
    except OSError:
        return None


class Profiler:
    """One process's traces: the spec's window and whatever the launcher asks, each in turn.

    Args:
      run_dir: the process's run directory.
      process_id, num_processes: JAX's.
      spec: the job's ``profile`` section.
      client: the coordination service's client (``jax._src.distributed.global_state.client``),
        or None in a single process: only ``processes: slowest`` uses it.
      out: prints a line (the launcher reads ``LINE_RE``).
      num_steps: the run's last step, if known: a trace still running there ends with it.
    """

    def __init__(self, run_dir: str, process_id: int, num_processes: int, spec, client=None,
                 out=print, num_steps: int | None = None):
        self.run_dir, self.process_id, self.num_processes = run_dir, process_id, num_processes
        self.spec, self.client, self.out, self.num_steps = spec, client, out, num_steps
        self.windows: list = []  # (first, last, session) to trace, in step order
        if spec.start_step is not None:
            last = spec.start_step + spec.num_steps - 1
            self.windows.append((spec.start_step, last, session_name(spec.start_step, last)))
        # every session taken: the launcher writes a request once per process, so processes
        # that share a run directory (one host's, a shared workdir) may read one twice
        self.sessions = {session for _, _, session in self.windows}
        self.tracing: tuple | None = None  # (first step traced, session, began, private dir, last)
        self.next_poll = time.monotonic() + POLL_S
        # a request already there was for an earlier attempt (a restart resumes before its steps)
        self.request_mtime: float | None = _mtime(os.path.join(run_dir, STEPS_FILE))
        self.broken = False  # the profiler would not start or stop: said once, no more tried
        self.first_call = True

    # ---- the loop's two calls --------------------------------------------------------
    def before(self, first: int, last: int) -> None:
        """Called before the device call that runs steps ``first`` to ``last``: starts a trace
        when that call reaches the next window."""
        if self.tracing is not None or self.broken:
            return
        now = time.monotonic()
        if now >= self.next_poll:
            self.next_poll = now + POLL_S
            self._poll(first)
        if self.first_call:  # a resumed attempt: the windows it resumed past were traced before
            self.first_call = False
            self.windows = [w for w in self.windows if w[1] >= first]
        if self.windows and last >= self.windows[0][0]:
            window_first, window_last, session = self.windows.pop(0)
            # late for it (another trace was running, or this attempt resumed inside it): its
            # steps from here, as many as asked
            self._start(first, session, max(window_last, first + window_last - window_first))

    def next_step(self, step: int) -> float:
        """After the call that ended at ``step``: the first step whose call needs ``before``
        or ``after`` (the next call while tracing, else the next window's first step; inf
        when no window is left). A live request is read by a time-bound poll in ``before``."""
        if self.tracing is not None:
            return step + 1
        return self.windows[0][0] if self.windows and not self.broken else math.inf

    def after(self, last: int, wait, *args) -> None:
        """Called after the device call that ran up to step ``last`` was dispatched;
        ``wait(*args)`` blocks until its work is done (no closure made per step). Ends the
        trace at the window's last step."""
        if self.tracing is not None and (last >= self.tracing[4] or last == self.num_steps):
            wait(*args)
            self._stop(last)

    def annotate(self, step: int):
        """A context for the call that ends at ``step``: ``jax.profiler.StepTraceAnnotation``
        while tracing (the plugin's step boundaries), else one that does nothing."""
        if self.tracing is None:
            return _NOTHING
        import jax

        return jax.profiler.StepTraceAnnotation("train", step_num=step)

    def close(self) -> None:
        """Stop a trace still running (the loop ended inside the window): said, nothing kept."""
        if self.tracing is not None:
            import jax

            first, session, _, private, _ = self.tracing
            self.tracing = None
            try:
                jax.profiler.stop_trace()
            except Exception:  # noqa: BLE001  ending anyway
                pass
            shutil.rmtree(private, ignore_errors=True)
            self.out(f"profile: the trace of {session} from step {first} was cut short by the "
                     "end of this process; not kept")

    # ---- the parts ---------------------------------------------------------------------
    def _poll(self, step: int) -> None:
        path = os.path.join(self.run_dir, STEPS_FILE)
        mtime = _mtime(path)
        if mtime is None or mtime == self.request_mtime:
            return
        self.request_mtime = mtime
        try:
            asked = json.loads(runfiles.read_regular(path, 4096))
            start, count, session = asked["start_step"], asked["num_steps"], asked["session"]
            if not (_whole(start) and _whole(count) and count >= 1 and isinstance(session, str)
                    and SESSION_RE.fullmatch(session)):
                raise ValueError(f"expected whole start_step >= 1 and num_steps >= 1 and a "
                                 f"session name, got {asked!r:.200}")
        except Exception as exc:  # noqa: BLE001  a request never ends a run (a file written by hand)
            self.out(f"profile: ignored an unreadable request {path}: {type(exc).__name__}: {exc}"[:500])
            return
        if session in self.sessions:
            return
        self.sessions.add(session)
        start = max(start, step)  # already past it: the next steps, as many
        self.windows = sorted(self.windows + [(start, start + count - 1, session)])

    def _start(self, first: int, session: str, last: int) -> None:
        import jax

        private = os.path.join(self.run_dir, PLUGIN_DIR, f".tracing-{session}-process_{self.process_id}")
        shutil.rmtree(private, ignore_errors=True)
        options = jax.profiler.ProfileOptions()
        options.python_tracer_level = 1 if self.spec.python_tracer else 0
        try:
            jax.profiler.start_trace(private, profiler_options=options)
        except Exception as exc:  # noqa: BLE001  a profile never ends a run (another trace running)
            self.broken, self.windows = True, []
            self.out(f"profile: could not start a trace of step {first}: {type(exc).__name__}: "
                     f"{exc}; no more traces in this process")
            return
        self.tracing = (first, session, time.monotonic(), private, last)

    def _stop(self, last: int) -> None:
        import jax

        first, session, began, private, _ = self.tracing
        self.tracing = None
        seconds = time.monotonic() - began
        try:
            try:
                jax.profiler.stop_trace()
            except Exception:
                self.broken = True  # the profiler's state is JAX's: another start would fail
                raise
            written = glob.glob(os.path.join(private, "plugins", "profile", "*", "*.xplane.pb"))
            if not written:
                raise OSError(f"jax.profiler wrote no .xplane.pb under {private}")
            target = trace_path(self.run_dir, session, self.process_id)
            os.makedirs(os.path.dirname(target), exist_ok=True)
            os.replace(written[0], target)
        except Exception as exc:  # noqa: BLE001  a profile never ends a run
            self.out(f"profile: the trace of steps {first}-{last} was lost: {type(exc).__name__}: {exc}")
            return
        finally:
            shutil.rmtree(private, ignore_errors=True)
        per_step_s = seconds / (last - first + 1)
        kept = os.path.relpath(target, self.run_dir)
        if self.spec.processes == "slowest" and self.num_processes > 1:
            try:
                slower = self._slower(session, per_step_s)
            except Exception:  # noqa: BLE001  the store refused (a session asked twice): keep it
                slower = None
            if slower is not None:
                os.remove(target)
                kept = f"{NOT_KEPT} (profile.processes: slowest; {slower})"
        self.out(LINE_FORMAT.format(first=first, last=last, session=session, seconds=seconds,
                                    ms_per_step=per_step_s * 1e3, kept=kept))

    def _slower(self, session: str, per_step_s: float) -> str | None:
        """Who was slower than this process over the session's steps, in words; None when
        this process was the slowest (ties: the lowest process_id), or a peer did not answer
        within ``SLOWEST_TIMEOUT_S`` (then every such process keeps its trace)."""
        if self.client is None:
            return None
        key = f"{KEY_PREFIX}{session}/"
        self.client.key_value_set(f"{key}{self.process_id}", repr(per_step_s))
        deadline = time.monotonic() + SLOWEST_TIMEOUT_S
        times = {}
        for peer in range(self.num_processes):
            if peer == self.process_id:
                continue
            left_ms = max(1, int((deadline - time.monotonic()) * 1e3))
            try:
                times[peer] = float(self.client.blocking_key_value_get(f"{key}{peer}", left_ms))
            except Exception:  # noqa: BLE001  a peer gone or slow to answer: keep ours
                return None
        times[self.process_id] = per_step_s
        slowest = max(sorted(times), key=lambda p: times[p])
        if slowest == self.process_id:
            return None
        return f"process {slowest} was slower, {times[slowest] * 1e3:.2f} ms per step"
