"""Checkpoint files without JAX processes: atomic, verified, pruned; and the restart policy."""

import dataclasses
import json
import os
import socket
import subprocess
import sys

import numpy as np
import pytest

from harness.helpers import env_for_tests, launch
from launcher import backends
from launcher.run import restarts
from launcher import spec as specs
from launcher.errors import SpecError
from launcher.plan import log_path
from worker.contract import wire
from worker.recovery import checkpoint

TEMPLATE = [np.zeros((4, 1), np.float32), np.zeros((1,), np.float32), np.zeros((), np.int32)]


def state(step: int) -> checkpoint.Checkpoint:
    leaves = [np.full((4, 1), step, np.float32), np.full((1,), -step, np.float32), np.array(step, np.int32)]
    return checkpoint.Checkpoint(step=step, leaves=leaves, next_batch=step % 3, num_batches=3)


def test_save_then_latest_round_trips_and_keeps_the_newest(tmp_path):
    for step in (5, 10, 15, 20):
        checkpoint.save(str(tmp_path), state(step), keep=2)
    assert checkpoint.list_steps(str(tmp_path)) == [15, 20]
    got = checkpoint.latest(str(tmp_path), TEMPLATE, num_batches=3)
    assert (got.step, got.next_batch, got.num_batches) == (20, 2, 3)
    for a, b in zip(got.leaves, state(20).leaves):
        np.testing.assert_array_equal(a, b)
        assert a.dtype == b.dtype
    assert not [n for n in os.listdir(tmp_path) if n.startswith(".")]  # no temporaries left


def test_no_checkpoint_is_none(tmp_path):
    assert checkpoint.latest(str(tmp_path / "absent"), TEMPLATE, 3) is None


@pytest.mark.parametrize("damage", ["truncate", "flip", "manifest", "missing"])
def test_a_damaged_latest_is_skipped_for_the_previous_with_a_warning(tmp_path, damage):
    for step in (10, 20):
        checkpoint.save(str(tmp_path), state(step), keep=3)
    newest = tmp_path / "step-0000020"
    data = (newest / "state.npz").read_bytes()
    if damage == "truncate":
        (newest / "state.npz").write_bytes(data[: len(data) // 2])
    elif damage == "flip":  # same size: only the sha256 can tell
        (newest / "state.npz").write_bytes(data[:-40] + bytes(b ^ 0xFF for b in data[-40:]))
    elif damage == "manifest":
        (newest / "manifest.json").write_text('{"step": 20, "sta')
    else:
        (newest / "state.npz").unlink()
    warnings = []
    got = checkpoint.latest(str(tmp_path), TEMPLATE, 3, warn=warnings.append)
    assert got.step == 10
    assert len(warnings) == 1 and "skipping checkpoint" in warnings[0] and "step-0000020" in warnings[0]
    if damage == "truncate":
        assert "truncated" in warnings[0]
    if damage == "flip":
        assert "sha256" in warnings[0]


# A real writer, SIGKILLed at one point of checkpoint.save: the hooks stand in for the
# moment a preemption lands. "bytes:NAME:N" dies after N bytes of NAME reached the disk;
# "fsync:K" / "rename:K" die just before save's K-th os.fsync / os.rename call.
_KILLED_WRITER = r"""
import builtins, os, signal, sys
import numpy as np
from worker.recovery import checkpoint
ckpt_dir, point, step = sys.argv[1], sys.argv[2], int(sys.argv[3])
kind, _, arg = point.partition(":")
def die():
    os.kill(os.getpid(), signal.SIGKILL)
if kind == "bytes":
    name, limit = arg.split(":")
    real_open = builtins.open
    class Dying:
        def __init__(self, f):
            self.f, self.n = f, 0
        def write(self, data):
            room = int(limit) - self.n
            if len(data) >= room:
                self.f.write(data[:room]); self.f.flush(); os.fsync(self.f.fileno())
                print("dying at", point, flush=True); die()
            self.n += len(data)
            return self.f.write(data)
        def __getattr__(self, attr):
            return getattr(self.f, attr)
        def __enter__(self):
            return self
        def __exit__(self, *exc):
            return self.f.__exit__(*exc)
    def dying_open(path, mode="r", *args, **kwargs):
        f = real_open(path, mode, *args, **kwargs)
        return Dying(f) if os.path.basename(str(path)) == name and "w" in mode else f
    checkpoint.open = dying_open  # the module's name for open, nothing else's
elif kind != "none":
    calls = {"n": 0}
    real = getattr(os, kind)
    def counted(*args):
        calls["n"] += 1
        if calls["n"] == int(arg):
            print("dying at", point, args, flush=True)
            die()
        return real(*args)
    setattr(os, kind, counted)
leaves = [np.full((64, 64), step, np.float32), np.full((1,), -step, np.float32), np.array(step, np.int32)]
checkpoint.save(ckpt_dir, checkpoint.Checkpoint(step, leaves, step % 3, 3), keep=3)
print("saved")
"""

KILL_TEMPLATE = [np.zeros((64, 64), np.float32), np.zeros((1,), np.float32), np.zeros((), np.int32)]


def _write_in_a_process_killed_at(ckpt_dir: str, point: str, step: int):
    return subprocess.run([sys.executable, "-c", _KILLED_WRITER, ckpt_dir, point, str(step)],
                          env=env_for_tests(), capture_output=True, text=True, timeout=60)


# save's own order: state.npz written, fsync 1 (state), manifest written, fsync 2 (manifest),
# fsync 3 (the temporary directory), rename (into place), fsync 4 (the checkpoints directory)
@pytest.mark.parametrize("point,complete", [
    ("bytes:state.npz:1", False), ("bytes:state.npz:9000", False), ("fsync:1", False),
    ("bytes:manifest.json:40", False), ("fsync:2", False), ("fsync:3", False), ("rename:1", False),
    ("fsync:4", True)])
def test_a_writer_killed_mid_save_leaves_nothing_a_reader_takes(tmp_path, point, complete):
    ckpt_dir = str(tmp_path)
    checkpoint.save(ckpt_dir, checkpoint.Checkpoint(10, [np.full((64, 64), 10, np.float32),
                                                        np.full((1,), -10, np.float32), np.array(10, np.int32)],
                                                    1, 3), keep=3)
    killed = _write_in_a_process_killed_at(ckpt_dir, point, 20)
    # it died where it was meant to (not before, not after finishing)
    assert killed.returncode == -9 and "dying at" in killed.stdout, (point, killed.stdout, killed.stderr)
    warnings = []
    got = checkpoint.latest(ckpt_dir, KILL_TEMPLATE, 3, warn=warnings.append)
    # killed before the rename: no step-* name may exist for step 20 at all (a reader that lists
    # checkpoints must not even see it); killed after: step 20 is complete and verifies
    assert checkpoint.list_steps(ckpt_dir) == ([10, 20] if complete else [10]), (point, os.listdir(ckpt_dir))
    assert (got.step, warnings) == ((20 if complete else 10), []), point
    np.testing.assert_array_equal(got.leaves[0], np.full((64, 64), got.step, np.float32))
    # the next writer (another process than the killed one) cleans up what that one left
    checkpoint.save(ckpt_dir, checkpoint.Checkpoint(30, [a + 20 for a in got.leaves[:2]] + [np.array(30, np.int32)],
                                                    0, 3), keep=3)
    assert not [n for n in os.listdir(ckpt_dir) if n.startswith(".")], os.listdir(ckpt_dir)
    assert checkpoint.latest(ckpt_dir, KILL_TEMPLATE, 3).step == 30


def test_a_step_saved_again_replaces_the_old_one(tmp_path):
    checkpoint.save(str(tmp_path), state(10), keep=3)
    redone = dataclasses.replace(state(10), leaves=[a + 1 for a in state(10).leaves])
    checkpoint.save(str(tmp_path), redone, keep=3)
    got = checkpoint.latest(str(tmp_path), TEMPLATE, 3)
    np.testing.assert_array_equal(got.leaves[0], redone.leaves[0])


def test_another_jobs_checkpoint_is_an_error_not_skipped(tmp_path):
    checkpoint.save(str(tmp_path), state(10), keep=3)
    with pytest.raises(checkpoint.IncompatibleCheckpoint, match="different model or optimizer"):
        checkpoint.latest(str(tmp_path), [np.zeros((8, 1), np.float32)] + TEMPLATE[1:], 3)
    with pytest.raises(checkpoint.IncompatibleCheckpoint, match="different data or batch size"):
        checkpoint.latest(str(tmp_path), TEMPLATE, num_batches=4)
    manifest = json.loads((tmp_path / "step-0000010" / "manifest.json").read_text())
    assert manifest["data"] == {"next_batch": 1, "num_batches": 3, "epoch": 3}
    assert len(manifest["state_file"]["sha256"]) == 64


def test_a_manifest_of_an_unknown_format_is_refused_with_its_writer(tmp_path):
    checkpoint.save(str(tmp_path), state(10), keep=3)
    path = tmp_path / "step-0000010" / "manifest.json"
    manifest = json.loads(path.read_text())
    for fmt, writer, said in ((2, "podlaunch 3.1.0", "podlaunch 3.1.0"), (None, None, "an unknown version")):
        edited = {k: v for k, v in manifest.items() if k not in ("format", "written_by")}
        edited.update({"format": fmt} if fmt else {}, **({"written_by": writer} if writer else {}))
        path.write_text(json.dumps(edited))
        with pytest.raises(checkpoint.IncompatibleCheckpoint,
                           match=rf"format {fmt!r}, written by {said}; this podlaunch .* reads format 1"):
            checkpoint.latest(str(tmp_path), TEMPLATE, 3)


def test_a_checkpoint_of_another_data_order_is_an_error(tmp_path):
    shuffled = {"shuffle": True, "shuffle_seed": 7}
    checkpoint.save(str(tmp_path), dataclasses.replace(state(10), order=shuffled), keep=3)
    manifest = json.loads((tmp_path / "step-0000010" / "manifest.json").read_text())
    assert manifest["data"] == {"next_batch": 1, "num_batches": 3, "epoch": 3,
                                "shuffle": True, "shuffle_seed": 7}
    assert checkpoint.latest(str(tmp_path), TEMPLATE, 3, order=shuffled).step == 10
    for other, said in (({"shuffle": True, "shuffle_seed": 8}, "shuffled, seed 8"),
                        (None, "not shuffled")):
        with pytest.raises(checkpoint.IncompatibleCheckpoint,
                           match=rf"data order \(shuffled, seed 7\) differs from this job's \({said}\)"):
            checkpoint.latest(str(tmp_path), TEMPLATE, 3, order=other)


# ---- the restart policy (launcher side, no processes) -------------------------
# starts only the launcher, which refuses before anything runs (not slow)
def test_resume_refuses_what_is_not_a_run_of_this_job(tmp_path):
    result = launch("jobs/linear.yaml", "--resume", str(tmp_path))
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert f"--resume: {tmp_path} is not a run directory" in result.stderr
    (tmp_path / "spec.yaml").write_text("name: other\n")
    result = launch("jobs/linear.yaml", "--resume", str(tmp_path))
    assert result.returncode == 2
    assert f"--resume: {tmp_path} holds a run of job 'other', not 'linear'" in result.stderr


def test_attempt_logs_and_numbering(tmp_path):
    assert log_path("/r", 3) == "/r/logs/process-003.log"
    assert log_path("/r", 3, attempt=2) == "/r/logs/attempt-2/process-003.log"
    assert restarts.next_attempt(str(tmp_path)) == 0
    (tmp_path / "logs").mkdir()
    (tmp_path / "logs" / "process-000.log").write_text("")
    assert restarts.next_attempt(str(tmp_path)) == 1
    (tmp_path / "logs" / "attempt-4").mkdir()
    assert restarts.next_attempt(str(tmp_path)) == 5


def test_recovery_settings_are_validated_together():
    with pytest.raises(SpecError) as err:
        specs.load("jobs/linear.yaml", overrides=(
            "checkpoint.keep=0", "restarts.retry_exit_codes=[1,300]", "restarts.max_restart=1",
            "watchdog.stall_timeout_s=-1", "restarts.backoff_s=soon"), registry=backends)
    text = str(err.value)
    assert "--set: checkpoint.keep: expected 1 to 1000, got 0" in text
    assert "restarts.retry_exit_codes: expected exit codes 1 to 255, got [300]" in text
    assert "restarts.max_restart: unknown key; did you mean 'max_restarts'?" in text
    assert "watchdog.stall_timeout_s: expected a number > 0, got -1" in text
    assert "restarts.backoff_s: expected a number, got 'soon'" in text
    job = specs.load("jobs/linear.yaml", overrides=("watchdog.stall_timeout_s=null",), registry=backends)
    assert job.watchdog.stall_timeout_s is None and job.watchdog.first_step_timeout_s == 900


def test_heartbeats_parse_as_progress():
    line = wire.HEARTBEAT_FORMAT.format(step=41)
    assert wire.parse(line) == wire.Heartbeat(41)
    assert not isinstance(wire.parse("step 40/100 loss 0.1 | 3.0 steps/s"), wire.Heartbeat)
    assert wire.heartbeat_interval_s(3) == 0.5 and wire.heartbeat_interval_s(300) == 10
    assert wire.heartbeat_interval_s(None) is None


def test_a_local_tier_outside_the_run_directory_is_the_runs_own(tmp_path):
    """An absolute (or ``..``) checkpoint.local_dir is shared by every run that names it: each
    run keeps its copies in a directory of its own there (the same on every attempt), so a
    restart never loads another run's state and a run's cleanup never removes another's."""
    from worker.recovery import localtier

    one, two = str(tmp_path / "runs" / "linear" / "r1"), str(tmp_path / "runs" / "linear" / "r2")
    assert localtier.directory("local-checkpoints", one, 3) == os.path.join(
        one, "local-checkpoints", "process-003")  # inside the run directory: its own already
    shared = str(tmp_path / "shm")
    a, b = localtier.directory(shared, one, 0), localtier.directory(shared, two, 0)
    assert a != b and a.startswith(shared + os.sep) and b.startswith(shared + os.sep)
    assert localtier.directory(shared, one, 0) == a  # every attempt and --resume
    assert os.path.dirname(localtier.directory("../shared", one, 1)) != \
        os.path.dirname(localtier.directory("../shared", two, 1))


def test_the_runs_end_removes_every_layouts_local_copies(tmp_path):
    """After a shrink or a spare the process ids moved: the end removes every
    ``process-NNN`` of the run's local directory, not only the last layout's, and the
    directory itself once empty; a file of the user's beside them stays."""
    from worker.recovery import localtier

    base = tmp_path / "shm" / "run"
    for name in ("process-000", "process-003"):
        (base / name).mkdir(parents=True)
        (base / name / "step-10.npz").write_bytes(b"x")
    localtier.remove_all(str(base))
    assert not base.exists()
    (base / "process-001").mkdir(parents=True)
    (base / "notes.txt").write_text("mine")
    localtier.remove_all(str(base))
    assert sorted(os.listdir(base)) == ["notes.txt"]



_EXACT_BROADCAST = r"""
import json, sys
import jax
jax.config.update("jax_cpu_collectives_implementation", "gloo")
process_id, port = int(sys.argv[1]), sys.argv[2]
jax.distributed.initialize(f"127.0.0.1:{port}", num_processes=2, process_id=process_id,
                           initialization_timeout=60)
import ml_dtypes
import numpy as np
from worker.recovery import checkpoint, recovery
from worker import tasks

def hard():  # what a sum with zeros does not keep: -0.0, subnormals, a NaN's payload
    return {"f32": np.array([-0.0, 1e-42, -3e-39, np.float32(np.nan), 1.5], np.float32),
            "bf16": np.array([-0.0, 1e-40], ml_dtypes.bfloat16),
            "i32": np.array([[-7, 2**31 - 1]], np.int32), "flag": np.array(True),
            "seed": tasks.init_linear(jax.random.PRNGKey(0), 4, 1)[0]}, ()

nan = np.array([0x7FC00123], np.uint32).view(np.float32)
def with_payload():
    state = hard()
    state[0]["f32"][3] = nan[0]
    return state

shapes = jax.eval_shape(with_payload)
zeros = lambda: jax.tree_util.tree_map(lambda s: np.zeros(s.shape, s.dtype), shapes)
got = jax.tree_util.tree_leaves(recovery._from_process_0(process_id, with_payload, zeros))
want = [np.asarray(a) for a in jax.tree_util.tree_leaves(with_payload())]
print(json.dumps([g.dtype == w.dtype and g.shape == w.shape and g.tobytes() == w.tobytes()
                  for g, w in zip(got, want)]), flush=True)
jax.distributed.shutdown()
"""


@pytest.mark.slow
def test_the_initial_state_and_a_restore_reach_every_process_bit_for_bit():
    """``worker.recovery.recovery``'s broadcast of process 0's initial state (``broadcast.
    broadcast_exact``, also the restore's), in two real JAX processes over gloo: every leaf
    arrives with its bytes, dtype and shape, including what a sum with zeros (the plain
    ``broadcast_one_to_all``) loses: -0.0, subnormal floats (flushed to +0.0 there), a NaN's
    payload; bfloat16, int32, bool and the seed's own init too."""
    with socket.socket() as probe:  # a port free now, for process 0's coordination service
        probe.bind(("127.0.0.1", 0))
        port = str(probe.getsockname()[1])
    procs = [subprocess.Popen([sys.executable, "-c", _EXACT_BROADCAST, str(i), port],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              env={**env_for_tests(), "JAX_PLATFORMS": "cpu"}) for i in (0, 1)]
    outs = [p.communicate(timeout=120) for p in procs]
    for p, (out, err) in zip(procs, outs):
        assert p.returncode == 0, err[-3000:]
        assert json.loads(out.strip().splitlines()[-1]) == [True] * 5, out + err[-2000:]


def test_local_copies_are_no_closer_than_the_minimum_interval_however_fast_the_steps(tmp_path):
    """A copy every step asked for (the clock is the test's): a call boundary within
    ``MIN_INTERVAL_S`` of the last copy takes none, the first one after it does (the 256 x 4
    job at 100 steps a call copied 1,500 times a second on the chip)."""
    import time

    from worker.recovery import localtier

    now = [100.0]
    params, opt_state = {"w": np.ones((4, 1), np.float32)}, ()

    def tier(path):
        return localtier.LocalTier(str(path), every_steps=1, num_batches=3, order=None,
                                   unreplicate=lambda tree: tree, clock=lambda: now[0])

    def written(path, steps):  # and the writer free for the next copy
        deadline = time.monotonic() + 30
        while (checkpoint.list_steps(str(path)) != steps or spaced.writing) and \
                time.monotonic() < deadline:
            time.sleep(0.01)
        return checkpoint.list_steps(str(path))

    spaced = tier(tmp_path / "spaced")
    try:
        spaced.after_step(201, params, opt_state)
        assert written(tmp_path / "spaced", [201]) == [201]
        now[0] += localtier.MIN_INTERVAL_S / 2
        spaced.after_step(202, params, opt_state)  # within the interval: no copy
        now[0] += localtier.MIN_INTERVAL_S
        spaced.after_step(203, params, opt_state)
        assert written(tmp_path / "spaced", [201, 203]) == [201, 203]
    finally:
        spaced.close()


def test_an_interval_whose_first_boundary_came_too_soon_takes_its_copy_at_a_later_one(tmp_path):
    """A copy every 10 steps, a call a step: step 20, the first boundary of its interval,
    comes within ``MIN_INTERVAL_S`` of step 10's copy and takes none; the interval is not
    counted as copied for that, so step 21, past the minimum interval, takes it (not step 30,
    an interval later)."""
    import time

    from worker.recovery import localtier

    now = [100.0]
    params, opt_state = {"w": np.ones((4, 1), np.float32)}, ()
    path = tmp_path / "tier"
    tier = localtier.LocalTier(str(path), every_steps=10, num_batches=3, order=None,
                               unreplicate=lambda tree: tree, clock=lambda: now[0])

    def written(steps):  # and the writer free for the next copy
        deadline = time.monotonic() + 30
        while (checkpoint.list_steps(str(path)) != steps or tier.writing) and \
                time.monotonic() < deadline:
            time.sleep(0.01)
        return checkpoint.list_steps(str(path))

    try:
        for step in range(1, 11):
            tier.after_step(step, params, opt_state)
        assert written([10]) == [10]
        now[0] += localtier.MIN_INTERVAL_S / 2
        for step in range(11, 21):  # 20: a new interval, too soon after the last copy
            tier.after_step(step, params, opt_state)
        assert not tier.writing and checkpoint.list_steps(str(path)) == [10]
        now[0] += localtier.MIN_INTERVAL_S
        tier.after_step(21, params, opt_state)
        # handed to the writer now (``writing`` is set before after_step returns), or written
        assert tier.writing or 21 in checkpoint.list_steps(str(path))
        assert written([10, 21]) == [10, 21]
    finally:
        tier.close()
