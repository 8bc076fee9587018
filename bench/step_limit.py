"""The step's limit on this machine's devices: K steps in one jitted ``fori_loop``, data resident.

The reference the TPU benchmark divides by (bench/tpu_check.py): the seed's step (linear
regression, mean squared error, ``value_and_grad``, SGD), run K times inside one jitted
``lax.fori_loop`` over a batch already on the device, nothing between the steps, one
device (the chip). Nothing of podlaunch is imported. The limit is the best of its
formulations (``FORMS``: ``grad`` or ``value_and_grad``, donated or not, the batch a
constant of the program or passed in, resident, as a trainer's is; a step a turn of the loop
or ``UNROLL``): one of them alone was
beaten by the launch on the v5e (1.31 of it), which only says the limit was wrong. Prints
``FORM <K> <form> <steps/s>`` for each, then ``RATE <K> <steps/s>``, the best, per K,
compilation excluded (each is compiled and run once first), timed over ``--steps`` steps with
one ``block_until_ready`` at the end. ``honest_ratio`` is how a benchmark divides by it.

    python bench/step_limit.py --batch 256 --features 4 --ks 1 100 1000 --steps 30000
"""

from __future__ import annotations

import argparse
import time


# The formulations tried per K (the best is the limit): the gradient alone or with the loss,
# the parameters donated or not, the batch a constant of the program or passed in, and for
# K > 1 the loop a step a turn or UNROLL steps a turn (the trainer's: on a TPU v5e a turn of
# the loop cost the 256 x 4 step as much as the step, docs/tpu.md). A launch that beats all
# of them by more than LIMIT_SLACK means a formulation is missing here.
UNROLL = 10
FORMS = [(grad, donate, arg, unroll) for unroll in (1, UNROLL)
         for grad in ("grad", "value_and_grad") for donate in (True, False) for arg in (False, True)]
LIMIT_SLACK = 1.05


def form_name(grad: str, donate: bool, arg: bool, unroll: int = 1) -> str:
    return (f"{grad}{'+donate' if donate else ''}"
            f"{'+batch-argument' if arg else '+batch-constant'}"
            f"{f'+unroll{unroll}' if unroll > 1 else ''}")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--features", type=int, default=4)
    parser.add_argument("--ks", type=int, nargs="+", default=[1, 100, 1000])
    parser.add_argument("--steps", type=int, default=30000, help="steps timed per K and form")
    parser.add_argument("--lr", type=float, default=0.01)
    parser.add_argument("--batch-argument", action="store_true",
                        help="only the forms that pass the batch in (as a trainer's is)")
    parser.add_argument("--one-form", action="store_true",
                        help="only grad, donated (the limit as measured before 2026-12-07)")
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

    def step_of(grad: str):
        def step(p, x, y):
            if grad == "grad":
                grads = jax.grad(loss_fn)(p, x, y)
            else:
                _, grads = jax.value_and_grad(loss_fn)(p, x, y)
            return jax.tree.map(lambda a, g: a - args.lr * g, p, grads)
        return step

    forms = [f for f in FORMS if (not args.batch_argument or f[2])
             and (not args.one_form or (f[0] == "grad" and f[1] and f[3] == 1))]
    for k in args.ks:
        best = 0.0
        for grad, donate, arg, unroll in forms:
            if unroll > 1 and k == 1:
                continue  # one step a call: nothing to unroll
            step = step_of(grad)
            donated = (0,) if donate else ()
            if arg:
                run = jax.jit(lambda p, x, y, k=k, step=step, u=unroll: jax.lax.fori_loop(
                    0, k, lambda _, p: step(p, x, y), p, unroll=min(u, k)),
                    donate_argnums=donated)
                batch = (x, y)
            else:
                run = jax.jit(lambda p, k=k, step=step, u=unroll: jax.lax.fori_loop(
                    0, k, lambda _, p: step(p, x, y), p, unroll=min(u, k)),
                    donate_argnums=donated)
                batch = ()
            p = jax.block_until_ready(run(jax.tree.map(jnp.copy, params), *batch))
            calls = max(1, args.steps // k)
            start = time.perf_counter()
            for _ in range(calls):
                p = run(p, *batch)
            jax.block_until_ready(p)
            rate = calls * k / (time.perf_counter() - start)
            print(f"FORM {k} {form_name(grad, donate, arg, unroll)} {rate:.1f}", flush=True)
            best = max(best, rate)
        print(f"RATE {k} {best:.1f}", flush=True)


def honest_ratio(launch_rate: float, limit_rate: float, what: str) -> float:
    """``launch_rate / limit_rate``, refused (SystemExit naming what to add) when the launch
    beats its limit by more than ``LIMIT_SLACK``: then the limit is wrong, and every ratio
    built on it with it."""
    ratio = launch_rate / limit_rate
    if ratio > LIMIT_SLACK:
        raise SystemExit(f"{what}: launch {launch_rate:,.0f} steps/s beats its limit "
                         f"{limit_rate:,.0f} by {100 * (ratio - 1):.0f}%: the limit is wrong; add "
                         "the formulation the trainer uses to bench/step_limit.py's FORMS "
                         "(not reported)")
    return ratio


if __name__ == "__main__":
    main()
