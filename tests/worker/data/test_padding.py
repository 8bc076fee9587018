"""The padded weighted mean without JAX (issue 51.9: only real-JAX runs checked it): when
the devices do not divide the global batch, every row of the batch is on exactly one
device with weight 1, padding has weight 0, and the step's mean (sums and counts averaged
over devices, then their ratio: worker.trainer.train.weighted_means) is the batch's plain mean;
and the step's own weighted_means, in JAX on this machine's CPU, gives that mean (fast: a
slow shrink run was the only check of it)."""

from __future__ import annotations

import numpy as np
import pytest

from worker.data import order as orders


def _devices(order, step, num_processes, local_device_count):
    """Every global device's (rows, weights), in global device order."""
    out = []
    for p in range(num_processes):
        rows, weight = order.process_rows_weighted(step, p, num_processes, local_device_count)
        out += list(zip(np.split(rows, local_device_count), np.split(weight, local_device_count)))
    return out


@pytest.mark.parametrize("batch, processes, local", [(10, 3, 1), (10, 2, 2), (7, 4, 2),
                                                     (128, 3, 4), (6, 6, 1), (9, 1, 4)])
@pytest.mark.parametrize("shuffle", [False, True])
def test_every_row_once_with_weight_one_and_padding_weighs_nothing(batch, processes, local, shuffle):
    order = orders.Order(300, batch, shuffle=shuffle, seed=3)
    per_device = orders.per_device_rows(batch, processes * local)
    for step in (0, 1, 7):
        devices = _devices(order, step, processes, local)
        assert all(len(r) == per_device for r, _ in devices)
        rows = np.concatenate([r for r, _ in devices])
        weight = np.concatenate([w for _, w in devices])
        assert set(np.unique(weight)) <= {0.0, 1.0} and weight.sum() == batch
        assert sorted(rows[weight == 1]) == sorted(order.global_rows(step))
        # global device g holds positions [g*S, (g+1)*S): the batch's order, then padding
        assert list(rows[:batch]) == list(order.global_rows(step)) and not weight[batch:].any()


@pytest.mark.parametrize("batch, processes, local", [(10, 3, 1), (7, 4, 2), (128, 3, 4)])
def test_the_weighted_mean_over_devices_is_the_batchs_mean(batch, processes, local):
    order = orders.Order(300, batch)
    values = np.random.default_rng(5).standard_normal(300)  # a per-row loss, say
    devices = _devices(order, 2, processes, local)
    # what each device sums, then pmean over the devices (sum / device count) of both
    sums = np.mean([np.sum(w * values[r]) for r, w in devices])
    counts = np.mean([np.sum(w) for _, w in devices])
    assert sums / counts == pytest.approx(values[order.global_rows(2)].mean(), rel=1e-6)  # float32 counts


@pytest.mark.parametrize("batch, devices", [(10, 3), (7, 4)])
def test_the_steps_own_weighted_mean_over_padded_devices_is_the_batchs_mean(batch, devices):
    """The step's own ``worker.trainer.train.weighted_means`` (in JAX, on this machine's CPU:
    the devices a ``vmap`` over ``AXIS``, whose ``pmean`` is the one ``worker.trainer.sharded``
    takes), fed the padded rows and weights of ``process_rows_weighted``: its loss, gradient
    and metric are the global batch's plain means; a pad row (a copy of the batch's first row)
    counts for nothing, neither in the sums nor in the count."""
    import jax
    import jax.numpy as jnp

    from worker.trainer import train

    order = orders.Order(300, batch)
    rng = np.random.default_rng(7)
    x, y = rng.standard_normal(300).astype(np.float32), rng.standard_normal(300).astype(np.float32)
    params = {"w": jnp.float32(0.5)}

    def loss_fn(params, b):
        return jnp.mean((b["x"] * params["w"] - b["y"]) ** 2)

    def metrics_fn(params, b):
        return {"mean_y": jnp.mean(b["y"])}

    rows, weight = order.process_rows_weighted(2, 0, 1, devices)
    assert not weight.all()  # padded
    per_device = {"x": x[rows].reshape(devices, -1), "y": y[rows].reshape(devices, -1),
                  orders.WEIGHT: weight.reshape(devices, -1)}
    step = jax.jit(jax.vmap(lambda b: train.weighted_means(loss_fn, metrics_fn,
                                                           train.averaging("per_leaf"), params, b),
                            axis_name=train.AXIS))
    grads, loss, extra = step(per_device)
    plain = {"x": x[order.global_rows(2)], "y": y[order.global_rows(2)]}
    want_loss, want_grads = jax.value_and_grad(loss_fn)(params, plain)
    for d in range(devices):  # every device has the same means
        assert float(loss[d]) == pytest.approx(float(want_loss), rel=1e-5)
        assert float(grads["w"][d]) == pytest.approx(float(want_grads["w"]), rel=1e-5)
        assert float(extra["mean_y"][d]) == pytest.approx(float(plain["y"].mean()), rel=1e-5)
