"""What the loop's host-side operations cost per call, on the machine's default device.

The 256 x 4 step, 100 steps a call (a ``fori_loop`` unrolled 10 steps a turn, the state
donated, a row of metrics out), called back to back. Prints microseconds of the host's time
for each operation the worker's loop does per call or per log step: the call's dispatch; a
rows array's early fetch (``copy_to_host_async``); ``is_ready`` on a finished and on a
running call's rows; reading a fetched and an unfetched row (``np.asarray``); 50 rows stacked
on the device and read as one; and whether a Python thread runs while the main thread
dispatches (the GIL released during a call's dispatch). Nothing of podlaunch is imported.
docs/tpu.md gives the v5e's figures.

    python bench/host_costs.py                     # the chip on a TPU VM
    JAX_PLATFORMS=cpu python bench/host_costs.py
"""

import threading
import time

import jax
import jax.numpy as jnp
import numpy as np

N = 2000
x = jax.random.normal(jax.random.PRNGKey(0), (256, 4))
y = jnp.ones((256, 1))


def call(p):
    def body(_, p):
        loss, g = jax.value_and_grad(lambda p: jnp.mean((x @ p[0] + p[1] - y) ** 2))(p)
        return jax.tree.map(lambda a, b: a - 0.01 * b, p, g)
    p = jax.lax.fori_loop(0, 100, body, p, unroll=10)
    loss = jnp.mean((x @ p[0] + p[1] - y) ** 2)
    return p, jnp.stack([loss, loss, loss]).reshape(1, 1, 3)


fn = jax.jit(call, donate_argnums=0)
stack = jax.jit(lambda *rows: jnp.concatenate(rows, axis=1))


def run(fetch=False):
    p = (jnp.zeros((4, 1)), jnp.zeros((1,)))
    p, r = fn(p)
    jax.block_until_ready(p)
    rows, inside = [], 0.0
    begin = time.perf_counter()
    for _ in range(N):
        t = time.perf_counter()
        p, r = fn(p)
        inside += time.perf_counter() - t
        if fetch:
            r.copy_to_host_async()
        rows.append(r)
    jax.block_until_ready(p)
    return (time.perf_counter() - begin) / N * 1e6, inside / N * 1e6, rows, p


def each(f, items):
    t = time.perf_counter()
    for item in items:
        f(item)
    return (time.perf_counter() - t) / len(items) * 1e6


print(jax.__version__, jax.devices())
wall, dispatch, rows, p = run()
print(f"call: {wall:.1f} us a call back to back, {dispatch:.1f} us of it in the dispatch")
wall2, dispatch2, rows2, p = run(fetch=True)
print(f"call + copy_to_host_async: {wall2:.1f} us a call, dispatch {dispatch2:.1f} us")
t = time.perf_counter()
for r in rows[:500]:
    r.copy_to_host_async()
print(f"copy_to_host_async of a finished row: {(time.perf_counter() - t) / 500 * 1e6:.1f} us")
print(f"is_ready of a finished row: {each(lambda r: r.is_ready(), rows[:500]):.1f} us")
_, _, running, p = run()
p, r = fn(p)
t = time.perf_counter(); r.is_ready(); print(f"is_ready of a running row: {(time.perf_counter() - t) * 1e6:.1f} us")
print(f"np.asarray of a fetched row: {each(np.asarray, rows2[-500:]):.1f} us")
print(f"np.asarray of an unfetched finished row: {each(np.asarray, rows[500:1000]):.1f} us")
fresh = run()[2]
print(f"jax.device_get of 50 unfetched rows: {each(jax.device_get, [fresh[i:i + 50] for i in range(0, 500, 50)]) / 50:.1f} us a row")
jax.block_until_ready(stack(*fresh[:50]))
t = time.perf_counter()
for i in range(500, 1000, 50):
    np.asarray(stack(*fresh[i:i + 50]))
print(f"50 rows stacked on the device, read as one: {(time.perf_counter() - t) / 10 / 50 * 1e6:.1f} us a row")
count, stop = [0], threading.Event()
def spin():
    while not stop.is_set():
        count[0] += 1
thread = threading.Thread(target=spin); thread.start()
time.sleep(0.3); c0 = count[0]; time.sleep(0.3); idle = count[0] - c0
c0 = count[0]; t = time.perf_counter(); run(); busy_s = time.perf_counter() - t
busy = (count[0] - c0) * 0.3 / busy_s
stop.set(); thread.join()
print(f"a Python thread's loop while the main thread dispatches: {busy / idle:.2f} of its rate alone")
