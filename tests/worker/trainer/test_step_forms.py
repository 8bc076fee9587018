"""The forms the trainer's step takes for speed on a chip (issue 69): a fused call's device loop
unrolled, a small state not donated, the run's one resident batch a constant of the program.
Each is the same arithmetic as the plain form: the params after the same steps are equal,
bit for bit on CPU devices, rows of metrics included; and the rules that choose them."""

import os

import numpy as np

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402

from worker import tasks  # noqa: E402
from worker.contract import sections  # noqa: E402
from worker.trainer import calls, parallelism  # noqa: E402
from worker.trainer.train import make_optimizer, turn_steps  # noqa: E402

TASK = tasks.resolve("linear_regression", {})
OPTIMIZER = make_optimizer(sections.Optimizer(name="sgd", learning_rate=0.1))
RNG = np.random.default_rng(0)
X = RNG.standard_normal((32, 4)).astype(np.float32)
Y = RNG.standard_normal((32, 1)).astype(np.float32)
PARAMS = jax.tree.map(np.asarray, TASK.init_params(jax.random.PRNGKey(1), 4, 1))


def _train(k: int, calls_run: int, how: str = "pmap", every: int | None = None, unroll: int = 1,
           donate: bool = True, constant: bool = False, rows: bool = True):
    """``calls_run`` calls of ``k`` steps on one CPU device: (params, [metrics of each call])."""
    parallel = parallelism.of(how, k, 1, 1, constant)
    state = (parallel.replicate(PARAMS), parallel.replicate(OPTIMIZER.init(PARAMS)))
    place = parallel.placer(k)
    inputs = ((place({"x": X[None], "y": Y[None]}),) if k == 1 else
              (place({"x": X[None, None], "y": Y[None, None]}), place(np.zeros((1,), np.int32))))
    step_calls = parallel.make_train_step(
        TASK.batch_loss(), OPTIMIZER, state, steps_per_call=k, metrics_every=every,
        unroll=unroll, donate=donate, **({"constants": inputs} if constant else {}))
    leaves, seen = step_calls.flatten(*state), []
    for _ in range(calls_run):
        before = leaves
        leaves, metrics = step_calls(leaves, inputs, rows)
        if not donate:  # the state given is still whole: nothing was donated
            assert all(not leaf.is_deleted() for leaf in before)
        seen.append(None if metrics is None else np.asarray(metrics))
    params = parallel.unreplicate(step_calls.unflatten(leaves)[0])
    return [np.asarray(p) for p in jax.tree.leaves(params)], seen


def _same(a, b):
    for x, y in zip(a, b):
        np.testing.assert_array_equal(x, y)


def test_an_unrolled_loop_ends_at_the_same_params_and_rows_as_a_step_a_turn():
    # 14 steps a call, rows every 7: each row's 6 bare steps unrolled 4 a turn (one turn and a
    # remainder of 2), and a bare call's 14 in three turns and a remainder
    plain, plain_rows = _train(14, 3, "jit", every=7)
    unrolled, unrolled_rows = _train(14, 3, "jit", every=7, unroll=4)
    _same(plain, unrolled)
    _same(plain_rows, unrolled_rows)
    _same(_train(14, 3, "jit", unroll=4, rows=False)[0], plain)
    _same(_train(1, 42)[0], plain)  # against one step a call, the seed's pmap


def test_a_constant_batch_ends_at_the_same_params_and_rows_as_the_batch_passed_in():
    for k, every in ((1, None), (10, 5)):
        given, given_rows = _train(k, 4, "jit", every=every)
        baked, baked_rows = _train(k, 4, "jit", every=every, constant=True, unroll=4,
                                   donate=False)
        _same(given, baked)
        _same(given_rows, baked_rows)


def test_auto_is_jit_in_one_process_of_one_device_or_where_the_batch_is_a_constant():
    # one device alone: jit at any steps_per_call (its dispatch is the cheaper); pmap where a
    # process has several devices, or one of several processes steps one at a time
    assert parallelism.of("auto", 1, 1, 1).name == "jit"
    assert parallelism.of("auto", 1, 1, 1, constant_batch=True).name == "jit"
    assert parallelism.of("auto", 1, 1, 2).name == "pmap"
    assert parallelism.of("auto", 1, 2, 1).name == "pmap"
    assert parallelism.of("auto", 10, 2, 1).name == "jit"
    assert parallelism.of("auto", 10, 2, 2).name == "pmap"


def test_what_chooses_the_forms():
    assert calls.unroll(1) == 1 and calls.unroll(4) == 4 and calls.unroll(1000) == calls.UNROLL
    # donated on CPU devices and above the size a second copy would cost; not a small state on a chip
    long = calls.UNDONATED_MIN_STEPS
    assert calls.donate("cpu", 100, long)
    assert not calls.donate("tpu", 100, long) and not calls.donate("gpu", calls.DONATE_ABOVE_BYTES, long)
    assert calls.donate("tpu", calls.DONATE_ABOVE_BYTES + 1, long)
    assert calls.donate("tpu", 100, long - 1)  # a short call: the copies in and out cost more
    # a loop's turns divide its steps where they can, so that no remainder loop runs
    assert [turn_steps(n, 10) for n in (99, 999, 100, 9, 97, 1, 14)] == [9, 9, 10, 9, 10, 1, 7]
    ok = dict(platform="tpu", num_processes=1, local_device_count=1, resident=True,
              num_batches=1, batch_bytes=1 << 20)
    assert calls.constant_batch(**ok)
    for change in (dict(platform="cpu"), dict(num_processes=2), dict(local_device_count=4),
                   dict(resident=False), dict(num_batches=2),
                   dict(batch_bytes=calls.CONSTANT_MAX_BYTES + 1)):
        assert not calls.constant_batch(**{**ok, **change}), change
