"""A preemption notice on any process becomes one step every process stops after.

A GCE or TPU VM gets SIGTERM about 30 s before it stops, Slurm SIGTERMs a job's tasks
before its GraceTime ends, and the launcher SIGTERMs every worker when it is itself told
to stop. A checkpoint saved then is only of use when every process stopped at the same
step: the state is replicated, but a process that stops alone leaves the others blocked
in the next step's all-reduce, and a resume needs one step for all.

The agreement, after JAX's own preemption sync (``jax.experimental.multihost_utils.
reached_preemption_sync_point``: every process reports its current step, the safe step is
their maximum), over the coordination service's key-value store and barrier that
``jax.distributed.initialize`` started (``jax._src.distributed.global_state.client``, as
``multihost_utils`` and orbax use it). JAX's own notifier cannot be used as is: it is a C
SIGTERM handler, replaced by the worker's (``worker.runtime.interrupts``), which the launcher's
stop and the finally blocks that write process 0's records need.

1. The process that got the SIGTERM sets ``NOTICE_KEY`` (its process_id).
2. Every process's watcher thread, blocked on that key, wakes, and under the lock the
   training loop takes before each dispatch, marks the loop held and reads the last step
   the loop dispatched: the loop dispatches nothing after that until the step is agreed.
   The thread (not the loop, which may wait on the devices) sets ``REPORT_DIR/<process_id>``
   to that step and waits at ``BARRIER`` for every process.
3. The agreed step is the maximum of the reports. A process behind dispatches up to it
   (its peers have dispatched it: the collectives match) and stops after it; process 0
   saves that step's checkpoint. No step is trained twice on the resume.

A process that does not answer within ``AGREE_TIMEOUT_S`` (dead, or stuck in a collective
with a dead peer: the launcher's teardown after a failure) leaves no agreement: each process
says so and stops, and the next attempt resumes from the previous checkpoint. With one
process there is nothing to agree: the notice stops it after the step it dispatched last.
What a process says of it is ``worker.contract.notice``'s (the launcher reads it).
"""

from __future__ import annotations

import threading
import time
from typing import Callable

from worker.contract.notice import AGREED_FORMAT, FAILED_FORMAT

NOTICE_KEY = "podlaunch/notice"
REPORT_DIR = "podlaunch/notice-step/"
BARRIER = "podlaunch-notice"
SAVED_BARRIER = "podlaunch-notice-saved"  # every process stopped, process 0 saved
END = "end"  # NOTICE_KEY's value once a process finished its last step: stop watching
# Every live process answers from its watcher thread within a few round trips to the
# coordinator, whatever its training loop is doing; a process silent this long is gone.
AGREE_TIMEOUT_S = 2.0
_FOREVER_MS = 2**31 - 1


class Notice:
    """The notice state of one process's training loop (see the module's docstring).

    Args:
      process_id, num_processes: this process's identity.
      grace_s: from the notice to the end of its checkpoint (``checkpoint.notice_grace_s``).
      client: the coordination service's client (``jax.distributed``), or None with one
        process.
      clock: seconds, monotonic.
      lead: steps added to the maximum of the reports: 0 for the trainer (it asks before it
        dispatches a step), 1 for a program (``worker.program.stop_after``: it asks after a
        step, and may be in the next one when another process's notice comes; JAX's own
        rule is the maximum + 1 for that reason).
    """

    def __init__(self, process_id: int, num_processes: int, grace_s: float, client=None,
                 clock: Callable[[], float] = time.monotonic, lead: int = 0):
        self.process_id, self.num_processes, self.grace_s = process_id, num_processes, grace_s
        self.lead = lead  # added to the maximum: a program may be in the step after its report
        self.client, self.clock = client, clock
        self._held_at: float | None = None
        self._lock = threading.Lock()
        self._dispatched = 0  # the last step the loop dispatched
        self._held = False
        self._agreed: int | None = None  # the step every process stops after
        self._source: int | None = None
        self._why = ""
        self._done = threading.Event()  # the agreement ended (with a step or without)
        self._signalled = threading.Event()  # this process's own SIGTERM
        self._threads: list = []

    def start(self) -> None:
        """Start the watcher threads (daemons; ``close`` ends them)."""
        targets = [self._publish] + ([self._watch] if self.client is not None else [])
        for target in targets:
            thread = threading.Thread(target=target, daemon=True, name=f"notice-{target.__name__}")
            thread.start()
            self._threads.append(thread)

    def signalled(self, signum: int) -> None:
        """The SIGTERM handler's part (``worker.runtime.interrupts.notices``): wake the publisher.
        Safe in a signal handler: it takes no lock the loop may hold."""
        self._signalled.set()

    def _publish(self) -> None:
        self._signalled.wait()
        if self._done.is_set():
            return
        if self.client is None:  # one process: nothing to agree, stop after the last step
            with self._lock:
                self._held, self._source = True, self.process_id
                self._agreed = self._dispatched + self.lead
                self._held_at = self.clock()
            self._done.set()
            return
        try:
            self.client.key_value_set(NOTICE_KEY, str(self.process_id))
        except Exception:  # noqa: BLE001 - ALREADY_EXISTS: another process's notice came first
            pass

    def _watch(self) -> None:
        try:
            value = self.client.blocking_key_value_get(NOTICE_KEY, _FOREVER_MS)
        except Exception:  # noqa: BLE001 - the service went away: the run is ending anyway
            return
        if value == END or self._done.is_set():
            return
        with self._lock:
            self._held = True  # before the step is read: the loop's quiet calls (``passes``)
            mine, self._held_at = self._dispatched, self.clock()  # take no lock
        self._source = int(value) if value.isdigit() else None
        try:
            self.client.key_value_set(f"{REPORT_DIR}{self.process_id}", str(mine))
            self.client.wait_at_barrier(BARRIER, int(AGREE_TIMEOUT_S * 1000))
            steps = {key.rsplit("/", 1)[-1]: int(v) for key, v in self.client.key_value_dir_get(REPORT_DIR)}
            self._agreed = max(steps.values()) + self.lead
        except Exception as exc:  # noqa: BLE001 - a process did not answer
            self._why = self._silent(exc)
        self._done.set()

    def _silent(self, exc: Exception) -> str:
        try:
            answered = {int(k.rsplit("/", 1)[-1]) for k, _ in self.client.key_value_dir_get(REPORT_DIR)}
        except Exception:  # noqa: BLE001
            answered = set()
        silent = [p for p in range(self.num_processes) if p not in answered]
        first = str(exc).splitlines()[0][:160] if str(exc) else type(exc).__name__
        who = (f"process_id {', '.join(map(str, silent))} did not answer" if silent
               else "the agreement failed")
        return f"{who} within {AGREE_TIMEOUT_S:g} s ({first})"

    def passes(self, step: int) -> bool:
        """``may_dispatch`` without the lock, for the loop's quiet calls: records ``step`` as
        dispatched, then says whether no notice holds the loop (False: ask ``may_dispatch``).
        The watcher sets ``held`` before it reads the step (under the GIL each is one store
        or load, in program order), so the step it reports is never below one dispatched:
        at worst it is the step about to be refused here, which the agreement then has
        every process dispatch."""
        self._dispatched = step
        return not self._held

    @property
    def held(self) -> bool:
        """A notice came and dispatches wait on its agreement: read without the lock (a stale
        False lets one more call through; the loop then asks ``may_dispatch``)."""
        return self._held

    def may_dispatch(self, step: int) -> bool:
        """Called by the loop before it dispatches the call that ends at ``step``.

        Returns:
          True: dispatch it. False: stop; ``stop_step`` says after which step (None: no
          agreement within the grace, see ``line``).
        """
        with self._lock:
            if not self._held:
                self._dispatched = step
                return True
        self._done.wait(max(0.0, self.left_s()))
        if not self._done.is_set():
            self._why = self._why or f"no agreement within checkpoint.notice_grace_s ({self.grace_s:g} s)"
            return False
        return self._agreed is not None and step <= self._agreed

    def left_s(self) -> float:
        """Seconds of the grace left (the whole grace before a notice)."""
        return self.grace_s if self._held_at is None else self._held_at + self.grace_s - self.clock()

    @property
    def stop_step(self) -> int | None:
        """The agreed step (None: not agreed)."""
        return self._agreed

    def line(self, saving: str = "") -> str:
        """What the worker prints when it stops for the notice."""
        source = "?" if self._source is None else self._source
        if self._agreed is None:
            return FAILED_FORMAT.format(source=source, why=self._why or "no agreement")
        return AGREED_FORMAT.format(source=source, step=self._agreed, saving=saving)

    def leave(self) -> None:
        """After the stop (and process 0's save): wait for every process at a barrier, then
        leave the coordination service in order (``jax.distributed.shutdown``). A process
        that exits first makes the service abort the others (JAX's coordination agent
        reports a task that went away to every task), cutting process 0's save short."""
        if self.client is None or self._agreed is None:
            return
        try:
            self.client.wait_at_barrier(SAVED_BARRIER, max(1, int(self.left_s() * 1000)))
            import jax

            jax.distributed.shutdown()
        except Exception:  # noqa: BLE001 - a process went away: exit anyway
            pass

    def close(self) -> None:
        """The loop ended: release the watchers (every process's, when this one finished
        its last step: a notice then has nothing left to save)."""
        self._done.set()
        self._signalled.set()
        if self.client is not None:
            try:
                self.client.key_value_set(NOTICE_KEY, END)
            except Exception:  # noqa: BLE001 - set already (a notice, or another's end)
                pass
            try:  # the service still answers (else the watchers' waits end with it)
                self.client.key_value_try_get(NOTICE_KEY)
            except Exception:  # noqa: BLE001
                return
        # A watcher still inside the client when JAX shuts the client down dies of a C++
        # exception (SIGABRT: "terminate called after throwing an instance of ''").
        for thread in self._threads:
            thread.join(1.0)
