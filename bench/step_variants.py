"""Where a fused call's device time goes: the step's limit against variants of the trainer's body.

Each variant runs K steps of the linear job's step (mean squared error, SGD) in one
jitted call on one device, the batch resident, called back to back with one
``block_until_ready`` at the end (no trainer loop around it: bench/tpu_check.py
measures that). Prints ``RATE <variant> <K> <steps/s>``.

* ``limit``: bench/step_limit.py's loop (``fori_loop`` of ``jax.grad``, the batch a
  constant of the program).
* ``limit_arg``: the same with the batch an argument (resident, as the trainer's).
* ``trainer``: the trainer's own fused call (``worker.trainer.sharded.make_train_step``,
  metrics of every step, the window indexed per step).
* ``trainer_nometrics``: the same without metrics (the loss of every step only).
* ``last_metrics``: metrics of the call's last step only, every step's loss kept.
* ``last_only``: metrics and loss of the call's last step only.
* ``limit_auto``, ``last_only_auto``: ``limit_arg`` and ``last_only`` with the batch in
  the layout the compiled program asks for (``Layout.AUTO``), not the default row-major one.

    python bench/step_variants.py --batch 256 --features 4 --ks 100 1000
"""

from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--features", type=int, default=4)
    parser.add_argument("--ks", type=int, nargs="+", default=[100, 1000])
    parser.add_argument("--steps", type=int, default=30000)
    parser.add_argument("--variants", nargs="+", default=[
        "limit", "limit_arg", "trainer", "trainer_nometrics", "last_metrics", "last_only",
        "limit_auto", "last_only_auto"])
    args = parser.parse_args()
    import jax
    import jax.numpy as jnp
    import numpy as np
    import optax

    from worker import tasks
    from worker.trainer import sharded
    from worker.trainer.train import averaging

    lr = 0.01
    key_x, key_y = jax.random.split(jax.random.PRNGKey(0))
    x = jax.random.normal(key_x, (args.batch, args.features))
    y = jax.random.normal(key_y, (args.batch, 1))
    task = tasks.resolve("linear_regression", {})
    loss_fn = task.batch_loss()
    optimizer = optax.sgd(lr)
    init = jax.tree.map(np.asarray, task.init_params(jax.random.PRNGKey(1), args.features, 1))

    def auto_layout(fn, state, *batch):
        """``fn(state, *batch)`` compiled with the batch in the layout it prefers."""
        from jax.experimental.layout import Format, Layout

        jitted = jax.jit(fn, in_shardings=(None,) + (Format(Layout.AUTO),) * len(batch),
                         donate_argnums=0)
        compiled = jitted.lower(state, *batch).compile()
        placed = [jax.device_put(b, f) for b, f in zip(batch, compiled.input_formats[0][1:])]
        return lambda s: compiled(s, *placed)

    def limit(k, as_argument, auto=False):
        def loss(p, x, y):
            w, b = p
            return jnp.mean((x @ w + b - y) ** 2)

        def run(p, bx, by):
            return jax.lax.fori_loop(0, k, lambda _, p: jax.tree.map(
                lambda a, g: a - lr * g, p, jax.grad(loss)(p, bx, by)), p)

        if auto:
            return auto_layout(run, jax.tree.map(jnp.asarray, init), x, y)
        if as_argument:
            fn = jax.jit(run, donate_argnums=0)
            return lambda p: fn(p, x, y)
        fn = jax.jit(lambda p: run(p, x, y), donate_argnums=0)
        return fn

    def lean(k, keep_loss, auto=False):
        average = averaging("per_leaf")

        def one(params, opt_state, batch):
            loss, grads = jax.value_and_grad(loss_fn)(params, batch)
            grads, loss = average((grads, loss))
            updates, opt_state = optimizer.update(grads, opt_state, params)
            return optax.apply_updates(params, updates), opt_state, loss, grads

        def call(state, batch):
            params, opt_state = state

            def body(carry, _):
                params, opt_state, loss, _ = one(*carry, batch)
                return (params, opt_state), (loss if keep_loss else None)

            (params, opt_state), losses = jax.lax.scan(body, (params, opt_state), None,
                                                       length=k - 1)
            params_before = params
            params, opt_state, loss, grads = one(params, opt_state, batch)
            metrics = jnp.stack([loss, optax.global_norm(grads), optax.global_norm(params)])
            del params_before
            return (params, opt_state), losses, metrics

        mapped = jax.vmap(call, in_axes=(None, None), out_axes=None, axis_name="batch",
                          axis_size=1)
        if auto:
            run = auto_layout(lambda s, bx, by: mapped(s, {"x": bx, "y": by}),
                              (jax.tree.map(jnp.asarray, init), optimizer.init(init)), x, y)
            return lambda state: run(state)[0]
        fn = jax.jit(mapped, donate_argnums=0)
        return lambda state: fn(state, {"x": x, "y": y})[0]

    def trainer(k, with_metrics):
        step = sharded.make_train_step(loss_fn, optimizer, with_metrics=with_metrics,
                                       steps_per_call=k, allreduce="packed")
        window = sharded.placer(k)({"x": np.asarray(x)[None, None], "y": np.asarray(y)[None, None]})
        first = sharded.placer(k)(np.zeros((1,), np.int32))
        return lambda state: tuple(step(*state, window, first)[:2])

    for k in args.ks:
        for name in args.variants:
            if name.startswith("limit"):
                run = limit(k, name != "limit", name == "limit_auto")
                state = jax.tree.map(jnp.asarray, init)
            elif name.startswith("trainer"):
                run = trainer(k, name == "trainer")
                state = (sharded.replicate(init), sharded.replicate(optimizer.init(init)))
            else:
                run = lean(k, name == "last_metrics", name.endswith("_auto"))
                state = (jax.tree.map(jnp.asarray, init), optimizer.init(init))
            state = jax.block_until_ready(run(state))
            calls = max(1, args.steps // k)
            start = time.perf_counter()
            for _ in range(calls):
                state = run(state)
            jax.block_until_ready(state)
            print(f"RATE {name} {k} {calls * k / (time.perf_counter() - start):.1f}", flush=True)


if __name__ == "__main__":
    main()
