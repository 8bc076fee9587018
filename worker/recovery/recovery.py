"""Surviving failures, the trainer's part: where a run starts from (a checkpoint or the
initial state), process 0's checkpoints and every process's heartbeats, the local tier's
copies, and the notice that turns a SIGTERM into one agreed checkpoint.

Used by ``worker.trainer.loop``; the formats of what is said are in ``worker.contract``.
"""

from __future__ import annotations

import time
from typing import Callable

from worker import contract
from worker.contract import job as jobs, runfiles, wire
from worker.runtime import interrupts
from worker.runtime.joining import client_of


def resume(identity: contract.Identity, job: jobs.WorkerJob, initial_state: Callable[[], tuple],
            num_batches: int, out, order: dict | None = None) -> tuple:
    """The state every process starts from: a checkpoint's when the launcher says resume
    and one is found, else the initial state, computed by process 0 alone.

    Computing the initial parameters op by op compiles each op (the PRNG's threefry twice):
    about 0.5 s of CPU per process, the same on every process. So process 0 computes them
    and broadcasts them (``broadcast.broadcast_exact``: bit for bit), and a resume restores
    into zeros (``broadcast.restore_broadcast``); the other processes take the shapes and
    dtypes from ``jax.eval_shape``, which compiles nothing.

    Args:
      initial_state: returns the fresh, unreplicated ``(params, opt_state)``; every process
        must call ``resume`` (it runs collectives).

    Returns:
      ``(state, first_step)``: the state (numpy leaves) and the step to start at.
    """
    import jax
    import numpy as np

    def zeros():
        return jax.tree_util.tree_map(lambda leaf: np.zeros(leaf.shape, leaf.dtype),
                                      jax.eval_shape(initial_state))

    if not identity.resume:
        return _from_process_0(identity.process_id, initial_state, zeros), 1
    from worker.recovery import broadcast

    began = time.monotonic()
    template = zeros()
    local = None
    if job.checkpoint.local_every_steps:
        from worker.recovery import localtier

        local = localtier.newest_here(job.checkpoint.local_dir, identity.run_dir,
                                      identity.process_id, jax.tree_util.tree_leaves(template),
                                      num_batches, order, warn=out)
    state, step, source = broadcast.restore_broadcast(identity.run_dir, identity.process_id,
                                                       template, num_batches, warn=out,
                                                       order=order, local=local)
    if step:
        out(wire.Resumed(step, identity.attempt, time.monotonic() - began, source or "").text())
        return state, step + 1
    out(f"no checkpoint to resume from; starting at step 1 (attempt {identity.attempt})")
    return _from_process_0(identity.process_id, initial_state, lambda: template), 1


def _from_process_0(process_id: int, initial_state: Callable[[], tuple], zeros: Callable[[], tuple]):
    """``initial_state()`` as process 0 computed it, on every process, bit for bit
    (``broadcast.broadcast_exact``; ``zeros()``: zeros of its shapes and dtypes, what the
    others send)."""
    import jax

    from worker.recovery import broadcast

    leaves, treedef = jax.tree_util.tree_flatten(initial_state() if process_id == 0 else zeros())
    return jax.tree_util.tree_unflatten(treedef, broadcast.broadcast_exact(leaves, process_id == 0))


def local_tier(identity: contract.Identity, job: jobs.WorkerJob, num_batches: int, order: dict,
                unreplicate, out, resumed_step: int):
    """This process's ``worker.recovery.localtier.LocalTier``, or None (``checkpoint.local_every_steps``
    0, or another process writes the copies of its host: ``localtier.writes_copies``)."""
    if not job.checkpoint.local_every_steps:
        return None
    from worker.recovery import localtier

    base = runfiles.local_tier_base(job.checkpoint.local_dir, identity.run_dir)
    try:
        if not localtier.writes_copies(client_of(identity), identity.process_id,
                                       identity.num_processes, base, identity.attempt):
            return None
    except OSError as exc:
        out(f"warning: the local tier cannot use {base} ({exc.strerror or exc}); no local copies "
            "this attempt")
        return None

    every = job.checkpoint.local_every_steps
    out(f"local tier: this process writes its host's copies every "
        f"{'step' if every == 1 else f'{every} steps'} in {base}")
    tier = localtier.LocalTier(localtier.directory(job.checkpoint.local_dir, identity.run_dir,
                                                   identity.process_id),
                               job.checkpoint.local_every_steps, num_batches, order, unreplicate, out)
    tier.last_step = resumed_step
    return tier


def notice(identity: contract.Identity, job: jobs.WorkerJob, out):
    """The loop's ``worker.recovery.notice.Notice``, started; None when ``checkpoint.notice_grace_s``
    is 0 (a SIGTERM then stops the process at once, as before the loop)."""
    if not job.checkpoint.notice_grace_s:
        return None
    from worker.recovery.notice import Notice

    notice = Notice(identity.process_id, identity.num_processes, job.checkpoint.notice_grace_s,
                    client_of(identity))
    notice.start()
    return notice


class Recovery:
    """Per-step host work for surviving failures: checkpoints (process 0) and heartbeats.

    A heartbeat waits for the step's loss on the device, so it proves the step
    ran (collectives included) rather than was dispatched; it costs one sync
    per ``wire.heartbeat_interval_s``, never one per step.
    """

    def __init__(self, identity: contract.Identity, job: jobs.WorkerJob, num_batches: int,
                 out, unreplicate: Callable, order: dict | None = None):
        self.every, self.keep = job.checkpoint.every_steps, job.checkpoint.keep
        self.num_steps = job.train.num_steps
        self.interval_s = wire.heartbeat_interval_s(job.watchdog.stall_timeout_s)
        self.identity, self.num_batches, self.out = identity, num_batches, out
        self.unreplicate = unreplicate  # pmap's or jit's layout of the replicated state
        self.order = order
        self.last_beat = -float("inf")  # the first step beats at once: compilation is over
        self.saved_step, self.save_s = 0, 0.0  # the newest save, and how long it took

    def saves(self, step: int) -> bool:
        """Whether ``step`` is a checkpoint step (on every process; process 0 writes it)."""
        return bool(self.every) and (step % self.every == 0 or step == self.num_steps)

    def after_step(self, step: int, params, opt_state, done, wait=None) -> None:
        """Save a checkpoint at checkpoint steps (process 0); beat when one is due.

        Args:
          params, opt_state: the state after ``step`` (used only at a checkpoint step).
          done: arrays ready once ``step``'s call has run (the heartbeat waits for them).
          wait: blocks until a device array is ready (default
            ``jax.block_until_ready``; the loop passes ``StepLogger.wait`` so the
            wait is not counted as the host's own step time).
        """
        import jax

        wait = wait or jax.block_until_ready
        saving = self.saves(step)
        if saving and self.identity.process_id == 0:
            self.save(step, params, opt_state)
        if self.interval_s is None:
            return
        if saving or time.monotonic() - self.last_beat >= self.interval_s:
            wait(done)
            self.out(wire.Heartbeat(step).text())
            self.last_beat = time.monotonic()


    def save(self, step: int, params, opt_state) -> None:
        """Process 0: save ``step``'s checkpoint and say so (``wire.CheckpointSaved``)."""
        from worker.recovery import broadcast

        with interrupts.held():  # a SIGTERM mid-save: the save and its line, then the exit
            began = time.monotonic()
            path = broadcast.save_replicated(self.identity.run_dir, step, params, opt_state,
                                              self.num_batches, self.keep, self.order,
                                              self.unreplicate)
            self.saved_step, self.save_s = step, time.monotonic() - began
            self.out(wire.CheckpointSaved(step, self.save_s, path).text())

    def after_notice(self, notice, step: int, params, opt_state) -> None:
        """The loop stopped for a notice after ``step``: say so; process 0 saves that step
        when it is the agreed one, unsaved, and the grace still holds a save as long as the
        last one (``checkpoint.notice_grace_s``)."""
        if notice.stop_step is None or self.identity.process_id != 0:
            self.out(notice.line())
            return
        if not self.every:
            self.out(notice.line("; checkpoints are off (checkpoint.every_steps: 0), so none is saved"))
        elif self.saved_step == step:
            self.out(notice.line("; process 0 saved it already"))
        elif self.save_s > notice.left_s():
            self.out(notice.line(f"; too little of checkpoint.notice_grace_s is left "
                                 f"({notice.left_s():.1f} s) for a save ({self.save_s:.1f} s last "
                                 "time): the next attempt resumes from the last checkpoint"))
        else:
            self.out(notice.line("; process 0 saves it"))
            self.save(step, params, opt_state)
