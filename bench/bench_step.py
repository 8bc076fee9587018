"""Steps/s of podlaunch's train step against the seed script, both in one run.

The seed side is shared/seed.md's loop as written (pmap of value_and_grad with
pmean, arrays stacked with jnp). The podlaunch side is what the worker runs:
worker.train.make_train_step with optax SGD, the batch placed on the devices
once, at most two steps in flight (worker.train.InFlight), and TensorBoard
logging (tensorboardX) every ``--log-every`` steps with the one device sync
that needs. Rounds alternate seed/podlaunch so
drift on a shared machine hits both; the ratio is podlaunch / seed steps/s
(>= 1.0 means no slower than the seed).

    python bench/bench_step.py                 # seed shapes and 65,536 x 256
    python bench/bench_step.py --devices 4 --rounds 5
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--devices", type=int, default=4, help="CPU devices (one process)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--log-every", type=int, default=10)
    args = parser.parse_args()
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    os.environ["JAX_NUM_CPU_DEVICES"] = str(args.devices)
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

    import jax
    import jax.numpy as jnp
    import numpy as np

    from worker import contract, tasks
    from worker.tracker import TensorBoardTracker
    from worker.train import InFlight, make_optimizer, make_train_step, place, replicate

    n = jax.local_device_count()

    # ---- the seed, as written in shared/seed.md ----
    def seed_train_step(params, x, y):
        loss, grads = jax.value_and_grad(tasks.mse)(params, x, y)
        grads = jax.lax.pmean(grads, axis_name="batch")
        loss = jax.lax.pmean(loss, axis_name="batch")
        w, b = params
        gw, gb = grads
        lr = 0.01
        return (w - lr * gw, b - lr * gb), loss

    seed_step = jax.pmap(seed_train_step, axis_name="batch")

    def run_seed(params0, x, y, steps):
        params = jax.tree.map(lambda a: jnp.stack([a] * n), params0)
        xs, ys = jnp.asarray(x), jnp.asarray(y)
        params, loss = seed_step(params, xs, ys)  # compile outside the timing
        jax.block_until_ready(loss)
        start = time.perf_counter()
        for step in range(steps):
            params, loss = seed_step(params, xs, ys)
            if step % 20 == 0:
                float(loss[0])  # the seed prints every 20 steps
        jax.block_until_ready(params)
        return steps / (time.perf_counter() - start)

    def run_ours(params0, x, y, steps, logdir):
        optimizer = make_optimizer(contract.OptimizerConfig(name="sgd", learning_rate=0.01,
                                                            momentum=None, weight_decay=0.0))
        step_fn = make_train_step(tasks.mse, optimizer)
        params, opt_state = replicate(params0), replicate(optimizer.init(params0))
        xs, ys = place(x[None])[0], place(y[None])[0]
        tracker = TensorBoardTracker(logdir)
        params, opt_state, loss = step_fn(params, opt_state, xs, ys)
        jax.block_until_ready(loss)
        start = time.perf_counter()
        last = start
        in_flight = InFlight()
        for step in range(1, steps + 1):
            params, opt_state, loss = step_fn(params, opt_state, xs, ys)
            in_flight.add(loss)
            if step % args.log_every == 0:
                now = time.perf_counter()
                tracker.scalars(step, {"loss": float(loss[0]), "learning_rate": 0.01,
                                       "step_time_s": (now - last) / args.log_every})
                last = now
        jax.block_until_ready(params)
        rate = steps / (time.perf_counter() - start)
        tracker.close()
        return rate

    print(f"jax {jax.__version__}, {n} CPU devices in one process, {args.rounds} rounds, "
          f"TensorBoard every {args.log_every} steps")
    for global_batch, features, steps in [(256, 4, 2000), (65536, 256, 30)]:
        per_device = global_batch // n
        rng = np.random.default_rng(0)
        x = rng.standard_normal((n, per_device, features), dtype=np.float32)
        y = rng.standard_normal((n, per_device, 1), dtype=np.float32)
        params0 = tasks.init_linear(jax.random.PRNGKey(0), features, 1)
        seed_rates, our_rates = [], []
        with tempfile.TemporaryDirectory() as logdir:
            for _ in range(args.rounds):
                seed_rates.append(run_seed(params0, x, y, steps))
                our_rates.append(run_ours(params0, x, y, steps, logdir))
        seed, ours = statistics.median(seed_rates), statistics.median(our_rates)
        print(f"global batch {global_batch:>6} x {features:>3} features: seed {seed:9.1f} steps/s, "
              f"podlaunch {ours:9.1f} steps/s, ratio {ours / seed:.3f}")


if __name__ == "__main__":
    main()
