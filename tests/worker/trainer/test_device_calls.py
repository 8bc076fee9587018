"""How the loop's device calls are dispatched (worker.trainer.calls): compiled once, then called as the
executable (``compiled_at_first_call``); how far the host runs ahead (``InFlight``)."""

import os

import numpy as np

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

from worker.trainer.calls import InFlight, compiled_at_first_call, in_flight  # noqa: E402


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


def test_the_step_is_compiled_once_and_gives_pmaps_results_with_donation():
    mapped = jax.pmap(lambda p, x: (p + x.sum(), (p * x).mean()), axis_name="d",
                      donate_argnums=(0,))
    counted = Counted(mapped)
    step = compiled_at_first_call(counted)
    p, x = jnp.ones((1, 3)), jnp.arange(6.0).reshape(1, 2, 3)
    want = np.ones((1, 3))
    for _ in range(3):
        donated = p
        p, mean = step(p, x)
        np.testing.assert_allclose(np.asarray(mean), [np.mean(want * np.arange(6.0).reshape(2, 3))])
        want = want + 15.0
        assert donated.is_deleted()  # the executable keeps pmap's donation
    np.testing.assert_allclose(np.asarray(p), want)
    assert (counted.lowered, counted.calls) == (1, 0)  # compiled once; pmap's path never taken


def test_a_call_with_other_shapes_falls_back_to_the_mapped_function():
    counted = Counted(jax.pmap(lambda a: a * 2))
    step = compiled_at_first_call(counted)
    np.testing.assert_allclose(np.asarray(step(jnp.ones((1, 3)))), 2 * np.ones((1, 3)))
    np.testing.assert_allclose(np.asarray(step(jnp.ones((1, 4)))), 2 * np.ones((1, 4)))
    np.testing.assert_array_equal(np.asarray(step(jnp.ones((1, 3), jnp.int32))),
                                  2 * np.ones((1, 3), np.int32))
    assert (counted.lowered, counted.calls) == (1, 2)


def test_on_cpu_two_calls_are_in_flight_and_the_older_ones_have_finished():
    assert in_flight("cpu") == (2, None)
    queue = InFlight(*in_flight("cpu"), finished_step=100)
    outputs = [jnp.full((2,), float(i)) for i in range(4)]
    queue.add(outputs[0], 110)
    queue.add(outputs[1], 120)
    assert queue.finished_step == 100  # nothing waited for yet
    queue.add(outputs[2], 130)
    assert queue.finished_step == 110
    queue.add(outputs[3], 140)
    assert queue.finished_step == 120


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
