"""What one device call costs the host, by API: ``jax.jit``, ``jax.pmap`` and their compiled forms.

The seed's 256 x 4 step (one step a call, donated params), N calls back to back: with no
bound on the calls in flight, with 2 (the worker on CPU devices) and with 64. Prints calls/s
and the host's seconds inside each call (its dispatch). Nothing of podlaunch is imported.
On the TPU v5e (docs/tpu.md): 150-180 us a call whatever the API; on CPU devices the compiled
forms skip pmap's per-call Python.

    python bench/dispatch_costs.py            # the machine's default devices (the chip on a TPU VM)
    JAX_PLATFORMS=cpu python bench/dispatch_costs.py
"""

import collections
import time

import jax
import jax.numpy as jnp

print(jax.__version__, jax.devices())
x = jax.random.normal(jax.random.PRNGKey(0), (256, 4)); y = jnp.ones((256, 1))
def step(p, x, y):
    g = jax.grad(lambda p: jnp.mean((x @ p[0] + p[1] - y) ** 2))(p)
    return jax.tree.map(lambda a, b: a - 0.01 * b, p, g), jnp.mean(g[0])
def pstep(p, x, y):
    (p2, l) = step(p, x, y); return p2, jax.lax.pmean(l, "d")
p0 = (jnp.zeros((4, 1)), jnp.zeros((1,)))
jit = jax.jit(step, donate_argnums=0)
pm = jax.pmap(pstep, axis_name="d", donate_argnums=0)
px, py = x[None], y[None]
pp0 = jax.tree.map(lambda a: a[None], p0)
variants = {
 "jit": (jit, p0, (x, y)),
 "jit-aot": (jit.lower(p0, x, y).compile(), p0, (x, y)),
 "pmap": (pm, pp0, (px, py)),
 "pmap-aot": (pm.lower(pp0, px, py).compile(), pp0, (px, py)),
}
N = 5000
for name, (f, p, args) in variants.items():
    p = jax.tree.map(jnp.copy, p)
    for depth in (None, 2, 64):
        p = jax.tree.map(jnp.copy, p)
        p, l = f(p, *args); jax.block_until_ready(p)
        q = collections.deque(); host = 0.0
        t = time.perf_counter()
        for _ in range(N):
            a = time.perf_counter()
            p, l = f(p, *args)
            host += time.perf_counter() - a
            if depth:
                q.append(l)
                if len(q) > depth: jax.block_until_ready(q.popleft())
        jax.block_until_ready(p)
        wall = time.perf_counter() - t
        print(f"{name:9s} depth {depth}: {N/wall:8.0f} calls/s, dispatch {host/N*1e6:6.1f} us/call", flush=True)
