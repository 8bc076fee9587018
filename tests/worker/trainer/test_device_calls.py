"""How the loop's device calls are dispatched (worker.trainer.calls): both executables compiled
before the first call runs, then called as they are (``StepCalls``); how far the host runs
ahead (``InFlight``); which calls go without the actions (``worker.trainer.actions.Quiet``)."""

import math
import os

import numpy as np

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

from worker.trainer.actions import Quiet  # noqa: E402
from worker.trainer.calls import (MAX_CALLS_IN_FLIGHT, QUEUE_S, InFlight, StepCalls,  # noqa: E402
                                  in_flight)


class Counted:
    """A pmapped function that counts the calls that go through pmap's own (per-call) path."""

    def __init__(self, fn):
        self.fn, self.calls, self.lowered = fn, 0, 0

    def __call__(self, *args):
        self.calls += 1
        return self.fn(*args)

    def lower(self, *args):
        self.lowered += 1
        return self.fn.lower(*args)


def _calls(treedef):
    def rows(state, x):
        p, = state
        return [p + x.sum()], jax.lax.pmean((p * x).mean(), "d")[None]

    def bare(state, x):
        return [state[0] + x.sum()]

    mapped = {name: Counted(jax.pmap(fn, axis_name="d", donate_argnums=(0,)))
              for name, fn in (("rows", rows), ("bare", bare))}
    return StepCalls(treedef, mapped["rows"], mapped["bare"], run_compiled=True), mapped


def test_both_calls_are_compiled_before_the_first_runs_and_keep_pmaps_results_and_donation():
    calls, mapped = _calls(jax.tree_util.tree_structure(([0], ())))  # params [p], no opt_state
    state, x = calls.flatten([jnp.ones((1, 3))], ()), jnp.arange(6.0).reshape(1, 2, 3)
    assert len(state) == 1
    assert calls.bare is None  # nothing compiled before a first call
    want = np.ones((1, 3))
    for rows in (False, True, False):
        donated = state[0]
        state, metrics = calls(state, (x,), rows)
        if rows:
            np.testing.assert_allclose(np.asarray(metrics),
                                       [[np.mean(want * np.arange(6.0).reshape(2, 3))]])
        else:
            assert metrics is None  # a bare call returns the state alone
        want = want + 15.0
        assert donated.is_deleted()  # the executables keep pmap's donation
    np.testing.assert_allclose(np.asarray(state[0]), want)
    # both lowered once, before the first call; pmap's per-call path never taken
    assert [(m.lowered, m.calls) for m in mapped.values()] == [(1, 0), (1, 0)]
    assert calls.bare is not None and calls.bare is not mapped["bare"]


def test_a_call_with_other_shapes_falls_back_to_the_mapped_function():
    calls, mapped = _calls(jax.tree_util.tree_structure(([0], ())))
    state, _ = calls([jnp.ones((1, 3))], (jnp.ones((1, 2, 3)),), False)
    state, _ = calls([jnp.ones((1, 4))], (jnp.ones((1, 2, 4)),), False)
    np.testing.assert_allclose(np.asarray(state[0]), 9 * np.ones((1, 4)))
    assert (mapped["bare"].lowered, mapped["bare"].calls) == (1, 1)


def test_without_a_bare_call_every_call_returns_rows():
    treedef = jax.tree_util.tree_structure(([0], ()))
    rows = Counted(jax.pmap(lambda s, x: ([s[0] + 1], s[0].sum()[None]), donate_argnums=(0,)))
    calls = StepCalls(treedef, rows)  # several processes' pmap: compiled at its first call
    state, metrics = calls([jnp.ones((1, 2))], (jnp.ones((1, 2)),), False)
    assert metrics is not None and calls.bare is None
    assert (rows.lowered, rows.calls) == (0, 1)


def test_the_state_is_the_leaves_of_params_and_optimizer_state():
    params, opt_state = {"w": np.ones(2), "b": np.zeros(1)}, ((), {"mu": np.full(2, 3.0)})
    calls = StepCalls(jax.tree_util.tree_structure((params, opt_state)), rows=None)
    state = calls.flatten(params, opt_state)
    assert len(state) == 3
    back = calls.unflatten(state)
    np.testing.assert_array_equal(back[1][1]["mu"], opt_state[1]["mu"])
    assert back[0].keys() == params.keys()


def test_with_several_cpu_devices_two_calls_are_in_flight_and_the_older_ones_have_finished():
    assert in_flight("cpu", 2) == (2, None)
    queue = InFlight(*in_flight("cpu", 2), finished_step=100)
    assert queue.per_call
    outputs = [jnp.full((2,), float(i)) for i in range(4)]
    queue.add(outputs[0], 110)
    queue.add(outputs[1], 120)
    assert queue.finished_step == 100  # nothing waited for yet
    queue.add(outputs[2], 130)
    assert queue.finished_step == 110
    queue.add(outputs[3], 140)
    assert queue.finished_step == 120


def test_one_cpu_device_queues_calls_as_a_chip_does():
    assert in_flight("cpu", 1) == in_flight("tpu", 1) == (MAX_CALLS_IN_FLIGHT, QUEUE_S)
    assert not InFlight(*in_flight("cpu", 1)).per_call


def test_a_bare_calls_state_is_waited_on_only_until_the_next_call_takes_it():
    queue = InFlight(2, None)
    step = jax.jit(lambda s: [s[0] + 1], donate_argnums=(0,))
    state = [jnp.zeros(3)]
    for last in (1, 2, 3):
        state = step(state)
        queue.add(state, last, own=False)
    # the third call went over the bound: calls 1 and 2 had nothing left to wait on (their
    # states were donated), so the wait was for call 3's state, the newest: all finished
    assert queue.finished_step == 3
    state = step(state)
    queue.add(state, 4, own=False)
    metrics = jnp.ones(2)
    queue.add(metrics, 5)  # a call with rows: waited on through its own result
    queue.add(jnp.ones(2), 6)
    assert queue.finished_step == 5  # call 4's state was donated: waited through 5's rows
    np.testing.assert_allclose(np.asarray(state[0]), 4 * np.ones(3))


def test_a_run_of_calls_counts_as_its_calls_and_its_first_calls_age():
    now = [0.0]
    queue = InFlight(100, 0.1, clock=lambda: now[0])
    queue.add(jnp.ones(1), 10, calls=60, since=0.0)
    queue.add(jnp.ones(1), 20, calls=30, since=0.01)
    assert queue.finished_step == 0
    queue.add(jnp.ones(1), 30, calls=20, since=0.02)  # 110 calls: over the bound
    assert queue.finished_step == 10
    now[0] = 0.2
    queue.add(jnp.ones(1), 40, calls=1)  # the run of step 20 began 0.19 s ago
    assert queue.finished_step == 20  # waited for down to two queued (30 and 40)


def test_on_a_chip_calls_queue_until_the_oldest_has_waited_queue_s():
    max_calls, queue_s = in_flight("tpu")
    assert max_calls >= 100 and queue_s == 0.1
    now = [0.0]
    queue = InFlight(max_calls, queue_s, clock=lambda: now[0])
    for step in range(1, 51):  # 50 calls in 0.05 s: all stay queued
        now[0] = step * 0.001
        queue.add(jnp.full((2,), float(step)), step)
    assert queue.finished_step == 0
    now[0] = 0.15  # the calls dispatched before 0.05 s are now older than 0.1 s
    queue.add(jnp.zeros(2), 51)
    assert queue.finished_step == 49  # waited for down to two queued: 50 and 51
    small = InFlight(3, 10.0, clock=lambda: 0.0)
    for step in range(1, 6):
        small.add(jnp.zeros(2), step)
    assert small.finished_step == 2  # max_calls bounds it too


class _Profiler:
    def __init__(self, next_step):
        self.next = next_step

    def next_step(self, step):
        return self.next


def test_a_call_is_quiet_until_the_next_periods_step_or_the_profilers_for_a_while():
    now = [0.0]
    quiet = Quiet([100, 1000, 0, 250], _Profiler(math.inf), quiet_s=0.01, clock=lambda: now[0])
    assert not quiet.quiet(1)  # nothing ran yet: the first call has its actions
    quiet.ran(1)
    assert quiet.quiet(2) and quiet.quiet(99) and not quiet.quiet(100)  # a log step, say
    quiet.ran(100)
    assert quiet.quiet(199) and not quiet.quiet(200)
    quiet.ran(200)
    assert quiet.quiet(249) and not quiet.quiet(250)  # a local copy's period
    now[0] = 0.011
    assert not quiet.quiet(201)  # QUIET_S went by: the clock's work gets a call
    windowed = Quiet([100], _Profiler(40), clock=lambda: 0.0)
    windowed.ran(10)
    assert windowed.quiet(39) and not windowed.quiet(40)  # a profile window starts at 40
    hooked = Quiet([100], _Profiler(math.inf), every_call=True, clock=lambda: 0.0)
    hooked.ran(1)
    assert not hooked.quiet(2)  # a task's hook sees every call


def _primitives(jaxpr) -> set:
    """Every primitive's name in ``jaxpr``, its sub-jaxprs' (loops, scans) included."""
    names = set()
    for eqn in jaxpr.eqns:
        names.add(eqn.primitive.name)
        for param in eqn.params.values():
            for sub in (param if isinstance(param, (list, tuple)) else [param]):
                inner = getattr(sub, "jaxpr", sub)
                if hasattr(inner, "eqns"):
                    names |= _primitives(inner)
    return names


def test_one_device_averages_without_packing_the_gradients_into_one_buffer():
    """On one device ``packed`` is ``per_leaf``: its ravel (a concatenate) and unravel ran in
    every step of a fused call and held a chip at 0.74 of the step's rate; on two devices the
    gradients are still packed into one collective."""
    import optax

    from worker.trainer.train import AXIS, averaging, step_function

    def loss_fn(params, batch):
        return jnp.mean((batch["x"] @ params["w"] + params["b"] - batch["y"]) ** 2)

    params = {"w": jnp.zeros((4, 1)), "b": jnp.zeros((1,))}
    batch = {"x": jnp.ones((2, 8, 4)), "y": jnp.ones((2, 8, 1))}
    optimizer = optax.sgd(0.1)

    def primitives(device_count):
        step = step_function(loss_fn, optimizer, averaging("packed", device_count))
        mapped = jax.vmap(step, in_axes=(None, None, 0), out_axes=None, axis_name=AXIS)
        return _primitives(jax.make_jaxpr(mapped)(params, optimizer.init(params), batch).jaxpr)

    assert "concatenate" not in primitives(1)
    assert "concatenate" in primitives(2)


def test_a_run_of_quiet_calls_is_no_longer_than_the_devices_run_in_queue_s():
    """Until the queue has measured the devices' rate, each quiet call is one run (its bounds
    meet every call); then a run is what the devices run in ``queue_s``: a slow step's is one
    call, so the host gets no further ahead of it than the bounds let it."""
    now = [0.0]
    queue = InFlight(1000, 0.1, clock=lambda: now[0])
    assert queue.ahead_calls(1) == 1
    for step in range(1, 4):  # calls of 1 s each, dispatched at once; waited for by age
        now[0] = step * 1.0
        queue.add(jnp.ones(1), step)
    # step 1 found finished (waited for) 2 s after the first call: 0.5 steps/s, a run of 1
    assert queue.steps_per_s == 0.5 and queue.ahead_calls(1) == 1
    fast = InFlight(1000, 0.1, clock=lambda: now[0])
    now[0] = 0.0
    fast.add(jnp.ones(1), 1000, calls=1000, since=0.0)
    now[0] = 0.2
    fast.add(jnp.ones(1), 2000, calls=1000, since=0.1)
    fast.add(jnp.ones(1), 2001)  # over the age bound: 1,000 steps found finished in 0.2 s
    assert fast.steps_per_s == 5000.0
    assert fast.ahead_calls(1) == 500 and fast.ahead_calls(100) == 5
    assert InFlight(2, None).ahead_calls(1) == 1  # the bound is a few calls: every call added


def test_the_rate_is_measured_once_a_wait_over_every_call_it_found_finished():
    """A wait through the newest bare call pops every call before it: the rate is the steps
    it found finished over the time since the last measure, not each popped call's steps
    over the microseconds between two pops (that read 20 million steps/s for 100)."""
    now = [0.0]

    def clock():
        now[0] += 1e-6  # every read a microsecond later, as a real clock
        return now[0]

    queue = InFlight(1000, 0.1, clock=clock)
    step_fn = jax.jit(lambda s: [s[0] + 1], donate_argnums=(0,))
    state = [jnp.zeros(2)]
    for step in range(1, 13):  # 100 calls a second: one every 10 ms
        now[0] = step * 0.01
        state = step_fn(state)
        queue.add(state, step, own=False)
    assert queue.finished_step == 12  # the 12th went over the age bound: all waited for
    assert 80 < queue.steps_per_s < 120
    assert queue.ahead_calls(1) in (8, 9, 10, 11)
