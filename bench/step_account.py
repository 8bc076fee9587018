"""Where a fused call's device time goes: the trainer's own calls against the step's limit.

The account docs/tpu.md gives ("The step on the chip, from its profile") is made with this
script on the chip: each variant runs K steps of the linear job's step in one call on one
device, data resident, called back to back with one ``block_until_ready`` at the end (no
trainer loop around it: bench/tpu_check.py measures that), and prints
``RATE <variant> <K> <steps/s>``. With ``--hlo DIR`` it writes each variant's optimized HLO
(``DIR/<variant>-<K>.hlo.txt``, what the compiler made of it: the ops of one step are the
body of its ``while``), with ``--trace DIR`` an XProf trace of a few calls of each
(``DIR/<variant>-<K>/``, read with ``xprof`` or TensorBoard's Profile tab).

* ``grad+batch-constant`` and every other name of bench/step_limit.py's ``FORMS``: that
  formulation of the hand-written loop, built as step_limit builds it.
* ``bare``, ``rows``: the trainer's calls as the loop makes them
  (``worker.trainer.parallelism.of(...).make_train_step``, the state as a list of leaves,
  the batch placed by its ``placer``): a call with no log step, and one with rows of
  metrics every ``--every`` steps; after a ``:``, options: ``u<N>`` the loop unrolled N steps
  a turn, ``d`` the state not donated, ``c`` the batch a constant of the program.
* ``bare_pmap``: the bare call under ``pmap`` (``train.parallelism: pmap``).
* ``novmap``: the trainer's bare step (``worker.trainer.train.step_function``) jitted alone,
  no ``vmap`` over a device axis and no mean over it, the state a list of leaves.
* ``sgd``: ``novmap`` with the update written ``p - lr * g`` in place of optax's.
* ``u<N>[n<M>][d][c]``: the trainer's one step in a hand-made loop: ``fori_loop`` unrolled N
  steps a turn, nested M loops of K / M, the state not donated (d), the batch a constant (c).

    python bench/step_account.py --batch 256 --features 4 --ks 1 100 1000 --steps 300000
"""

from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

LR = 0.1


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--features", type=int, default=4)
    parser.add_argument("--ks", type=int, nargs="+", default=[1, 100, 1000])
    parser.add_argument("--steps", type=int, default=30000)
    parser.add_argument("--every", type=int, nargs="+", default=[100, 1000],
                        help="rows' metrics_every (those that divide K)")
    parser.add_argument("--variants", nargs="+",
                        default=["grad+batch-constant", "grad+batch-argument", "bare", "rows",
                                 "bare:u10d", "rows:u10d", "bare_pmap", "novmap", "sgd"])
    parser.add_argument("--hlo", help="write each variant's optimized HLO here")
    parser.add_argument("--trace", help="write an XProf trace of each variant here")
    args = parser.parse_args()
    import jax
    import jax.numpy as jnp
    import numpy as np

    from worker import tasks
    from worker.trainer import parallelism
    from worker.trainer.train import make_optimizer
    from worker.contract import sections

    task = tasks.resolve("linear_regression", {})
    optimizer = make_optimizer(sections.Optimizer(name="sgd", learning_rate=LR))
    rng = np.random.default_rng(0)
    x = rng.standard_normal((args.batch, args.features)).astype(np.float32)
    y = rng.standard_normal((args.batch, 1)).astype(np.float32)
    params0 = jax.tree.map(np.asarray, task.init_params(jax.random.PRNGKey(1), args.features, 1))

    def trainer(k, name, every):
        # NAME: bare, rows or bare_pmap, then ":" and the options: u<unroll>, d (the state not
        # donated), c (the resident batch a constant of the program, jit only)
        import re as _re
        base, _, opts = name.partition(":")
        unroll = int((_re.search(r"u(\d+)", opts) or _re.search("(1)", "1")).group(1))
        constant = "c" in opts
        how = "pmap" if base == "bare_pmap" else ("jit" if constant else "auto")
        parallel = parallelism.of(how, k, 1, 1)
        state = (parallel.replicate(params0), parallel.replicate(optimizer.init(params0)))
        place = parallel.placer(k)
        if k == 1:
            inputs = (place({"x": x[None], "y": y[None]}),)
        else:
            inputs = (place({"x": x[None, None], "y": y[None, None]}),
                      place(np.zeros((1,), np.int32)))
        extra = {"constants": inputs} if constant else {}
        calls = parallel.make_train_step(task.batch_loss(), optimizer, state, steps_per_call=k,
                                         allreduce="packed", metrics_every=every,
                                         unroll=unroll, donate="d" not in opts, **extra)
        leaves = calls.flatten(*state)
        rows = base == "rows"
        # the call as the loop makes it (StepCalls: pmap's compiled executables, jit itself)
        return (lambda s, *i: calls(s, i, rows)[0]), inputs, leaves, calls._mapped[rows]

    def lean(k, name):
        from worker.trainer.train import flat_state, step_function

        opt = optimizer
        if name == "sgd":
            import optax
            opt = optax.GradientTransformation(
                lambda p: (), lambda g, s, p=None: (jax.tree.map(lambda a: -LR * a, g), s))
        state = (jax.tree.map(jnp.asarray, params0), opt.init(params0))
        treedef = jax.tree_util.tree_structure(state)
        step = step_function(task.batch_loss(), opt, lambda parts: parts, False, k)
        fn = jax.jit(flat_state(step, treedef), donate_argnums=(0,))
        batch = {"x": jnp.asarray(x), "y": jnp.asarray(y)}
        inputs = (batch,) if k == 1 else (jax.tree.map(lambda a: a[None], batch),
                                          jnp.zeros((), jnp.int32))
        return fn, inputs, treedef.flatten_up_to(state), fn

    def form(k, name):
        # bench/step_limit.py's formulation NAME, built as it builds it
        import step_limit
        grad, donate, arg, unroll = next(f for f in step_limit.FORMS
                                         if step_limit.form_name(*f) == name)
        xd, yd = jnp.asarray(x), jnp.asarray(y)

        def loss(p, bx, by):
            w, b = p
            return jnp.mean((bx @ w + b - by) ** 2)

        def step(p, bx, by):
            grads = (jax.grad(loss)(p, bx, by) if grad == "grad"
                     else jax.value_and_grad(loss)(p, bx, by)[1])
            return jax.tree.map(lambda a, g: a - LR * g, p, grads)

        donated = (0,) if donate else ()
        if arg:
            fn = jax.jit(lambda p, bx, by: jax.lax.fori_loop(
                0, k, lambda _, p: step(p, bx, by), p, unroll=min(unroll, k)), donate_argnums=donated)
            return fn, (xd, yd), jax.tree.map(jnp.asarray, params0)
        fn = jax.jit(lambda p: jax.lax.fori_loop(0, k, lambda _, p: step(p, xd, yd), p,
                                                 unroll=min(unroll, k)), donate_argnums=donated)
        return fn, (), jax.tree.map(jnp.asarray, params0)

    def shaped(k, spec):
        # the trainer's one step (step_function, no device axis) in a loop of another shape:
        # spec "u<unroll>[n<outer>][d][c]": fori_loop unrolled, nested outer x k/outer, not
        # donated (d), the batch a constant (c)
        import re as _re
        from worker.trainer.train import flat_state, step_function
        unroll = int(_re.search(r"u(\d+)", spec).group(1))
        outer = int((_re.search(r"n(\d+)", spec) or _re.search("()", "")).group(1) or 1)
        state = (jax.tree.map(jnp.asarray, params0), optimizer.init(params0))
        treedef = jax.tree_util.tree_structure(state)
        one = step_function(task.batch_loss(), optimizer, lambda parts: parts)
        batch = {"x": jnp.asarray(x), "y": jnp.asarray(y)}

        def loop(params, opt_state, b):
            def inner(carry):
                return jax.lax.fori_loop(0, k // outer, lambda _, c: one(*c, b), carry,
                                         unroll=unroll)
            if outer == 1:
                return inner((params, opt_state))
            return jax.lax.fori_loop(0, outer, lambda _, c: inner(c), (params, opt_state))

        donated = () if "d" in spec else (0,)
        if "c" in spec:
            fn = jax.jit(flat_state(lambda p, o: loop(p, o, batch), treedef), donate_argnums=donated)
            return fn, (), treedef.flatten_up_to(state), fn
        fn = jax.jit(flat_state(loop, treedef), donate_argnums=donated)
        return fn, (batch,), treedef.flatten_up_to(state), fn

    for k in args.ks:
        for name in args.variants:
            everys = ([e for e in args.every if k % e == 0] or [k]) if name.startswith("rows") else [None]
            for every in everys:
                tag = name if every is None else f"{name}-e{every}".replace(":", "_")
                tag = tag.replace(":", "_")
                if name in ("novmap", "sgd"):
                    fn, inputs, state, jitted = lean(k, name)
                elif name.startswith(("grad", "value_and_grad")):
                    fn, inputs, state = form(k, name)
                    jitted = fn
                elif name.startswith("u"):
                    fn, inputs, state, jitted = shaped(k, name)
                else:
                    fn, inputs, state, jitted = trainer(k, name, every)
                if args.hlo:
                    os.makedirs(args.hlo, exist_ok=True)
                    text = jitted.lower(state, *inputs).compile().as_text()
                    with open(os.path.join(args.hlo, f"{tag}-{k}.hlo.txt"), "w") as f:
                        f.write(text)
                state = jax.block_until_ready(fn(state, *inputs))
                count = max(1, args.steps // k)
                begun = time.perf_counter()
                for _ in range(count):
                    state = fn(state, *inputs)
                jax.block_until_ready(state)
                rate = count * k / (time.perf_counter() - begun)
                print(f"RATE {tag} {k} {rate:.1f}", flush=True)
                if args.trace:
                    with jax.profiler.trace(os.path.join(args.trace, f"{tag}-{k}")):
                        for _ in range(min(count, 5)):
                            state = fn(state, *inputs)
                        jax.block_until_ready(state)


if __name__ == "__main__":
    main()
