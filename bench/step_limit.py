"""The step's limit on this machine's devices: K steps in one jitted ``fori_loop``, data resident.

The reference the TPU benchmark divides by (bench/tpu_check.py): the seed's step (linear
regression, mean squared error, ``value_and_grad``, SGD), run K times inside one jitted
``lax.fori_loop`` over a batch already on the device, nothing between the steps, one
device (the chip). Nothing of podlaunch is imported. Prints ``RATE <K> <steps/s>`` per K,
compilation excluded (each K is compiled and run once first), timed over ``--steps`` steps
with one ``block_until_ready`` at the end. The batch is a constant of the program; with
``--batch-argument`` it is passed in (resident on the device, as a trainer's batch always
is): XLA compiles the constant's step faster for a large batch (docs/tpu.md).

    python bench/step_limit.py --batch 256 --features 4 --ks 1 100 1000 --steps 30000
"""

from __future__ import annotations

import argparse
import time


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--features", type=int, default=4)
    parser.add_argument("--ks", type=int, nargs="+", default=[1, 100, 1000])
    parser.add_argument("--steps", type=int, default=30000, help="steps timed per K")
    parser.add_argument("--lr", type=float, default=0.01)
    parser.add_argument("--batch-argument", action="store_true",
                        help="pass the batch in, resident, instead of a constant of the program")
    args = parser.parse_args()
    import jax
    import jax.numpy as jnp

    key_x, key_y, key_w = jax.random.split(jax.random.PRNGKey(0), 3)
    x = jax.random.normal(key_x, (args.batch, args.features))
    y = jax.random.normal(key_y, (args.batch, 1))
    params = (jax.random.normal(key_w, (args.features, 1)) * 0.1, jnp.zeros((1,)))

    def loss_fn(p, x, y):
        w, b = p
        return jnp.mean((x @ w + b - y) ** 2)

    def step(p, x, y):
        grads = jax.grad(loss_fn)(p, x, y)
        return jax.tree.map(lambda a, g: a - args.lr * g, p, grads)

    for k in args.ks:
        if args.batch_argument:
            run = jax.jit(lambda p, x, y, k=k: jax.lax.fori_loop(
                0, k, lambda _, p: step(p, x, y), p), donate_argnums=0)
            batch = (x, y)
        else:
            run = jax.jit(lambda p, k=k: jax.lax.fori_loop(0, k, lambda _, p: step(p, x, y), p),
                          donate_argnums=0)
            batch = ()
        p = jax.block_until_ready(run(jax.tree.map(jnp.copy, params), *batch))
        calls = max(1, args.steps // k)
        start = time.perf_counter()
        for _ in range(calls):
            p = run(p, *batch)
        jax.block_until_ready(p)
        print(f"RATE {k} {calls * k / (time.perf_counter() - start):.1f}", flush=True)


if __name__ == "__main__":
    main()
