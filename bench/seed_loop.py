"""The seed (shared/seed.md) as written, timed: the baseline of bench/bench_step.py.

One process (the seed as written: every CPU device of this process), or the
seed made multi-process by hand (``--num-processes P``): each process calls
``jax.distributed.initialize`` (gloo CPU collectives, as the worker does),
then runs the seed's loop unchanged on its own shard of the global batch
(``[local_device_count, per_device, features]``); ``pmean`` then spans
every device of every process.

Nothing of podlaunch is imported: the step, the init, the data and the
loop (a loss printed every 20 steps, which syncs) are the seed's, with the
seed's batch of 256 x 4 generalised to ``--batch`` x ``--features``.
Prints ``RATE <steps/s>`` (after the first step, i.e. compilation excluded)
on process 0.

    JAX_NUM_CPU_DEVICES=4 python bench/seed_loop.py --steps 3000
"""

from __future__ import annotations

import argparse
import os
import time


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=3000)
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--features", type=int, default=4)
    parser.add_argument("--num-processes", type=int, default=1)
    parser.add_argument("--process-id", type=int, default=0)
    parser.add_argument("--coordinator", default="")
    args = parser.parse_args()
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    import jax
    import jax.numpy as jnp

    if args.num_processes > 1:
        jax.config.update("jax_cpu_collectives_implementation", "gloo")
        jax.distributed.initialize(coordinator_address=args.coordinator,
                                   num_processes=args.num_processes, process_id=args.process_id,
                                   cluster_detection_method="deactivate")

    def predict(params, x):
        w, b = params
        return x @ w + b

    def loss_fn(params, x, y):
        preds = predict(params, x)
        return jnp.mean((preds - y) ** 2)

    def train_step(params, x, y):
        loss, grads = jax.value_and_grad(loss_fn)(params, x, y)
        grads = jax.lax.pmean(grads, axis_name='batch')
        loss = jax.lax.pmean(loss, axis_name='batch')
        w, b = params
        gw, gb = grads
        lr = 0.01
        new_params = (w - lr * gw, b - lr * gb)
        return new_params, loss

    p_train_step = jax.pmap(train_step, axis_name='batch')

    n_devices = jax.local_device_count()  # == jax.device_count() in one process, as the seed has it
    key = jax.random.PRNGKey(0)
    k1, k2 = jax.random.split(key)
    params = (jax.random.normal(k1, (args.features, 1)) * 0.1, jnp.zeros((1,)))
    replicated_params = jax.tree.map(lambda x: jnp.stack([x] * n_devices), params)
    total_batch = args.batch
    per_device = total_batch // jax.device_count()
    X = jax.random.normal(jax.random.PRNGKey(1), (total_batch, args.features))
    y = jax.random.normal(jax.random.PRNGKey(2), (total_batch, 1))
    rows = slice(args.process_id * n_devices * per_device, (args.process_id + 1) * n_devices * per_device)
    X_sharded = X[rows].reshape(n_devices, per_device, args.features)
    y_sharded = y[rows].reshape(n_devices, per_device, 1)

    replicated_params, losses = p_train_step(replicated_params, X_sharded, y_sharded)
    losses.block_until_ready()  # compilation, outside the timing
    start = time.perf_counter()
    for step in range(args.steps):
        replicated_params, losses = p_train_step(replicated_params, X_sharded, y_sharded)
        if step % 20 == 0:
            if args.process_id == 0:
                print(f"Step {step}: Loss = {losses[0]:.6f}")
            else:
                float(losses[0])  # every process syncs alike
    jax.block_until_ready(replicated_params)
    rate = args.steps / (time.perf_counter() - start)
    if args.process_id == 0:
        print(f"RATE {rate:.3f}", flush=True)
    if args.num_processes > 1:
        jax.distributed.shutdown()


if __name__ == "__main__":
    main()
