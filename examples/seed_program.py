"""A plain JAX data-parallel script (pmap + value_and_grad + pmean + SGD) run by podlaunch.

    launch jobs/seed_program.yaml

A single-host script's lines, with three changes for many hosts: ``program.initialize()``
joins JAX (every value explicit, the topology checked), each process takes its
own contiguous share of the global batch and replicates the params on its
*local* devices, and ``program.report`` feeds the launcher's status line,
watchdog and TensorBoard. The data are jobs/linear.yaml's synthetic rows
(``y = x @ w_true + b_true + noise``, generated here with numpy), so both jobs
reach the same final loss.
"""

import argparse

import numpy as np

from podlaunch import program

jax = program.initialize()  # jax.distributed.initialize(...) + the topology check
import jax.numpy as jnp  # noqa: E402

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=100)
parser.add_argument("--lr", type=float, default=0.01)
parser.add_argument("--batch", type=int, default=256)
parser.add_argument("--data-seed", type=int, default=1)
parser.add_argument("--noise-std", type=float, default=0.1)
args = parser.parse_args()


# ============================================
# Model and loss (same as single-device)
# ============================================
def predict(params, x):
    w, b = params
    return x @ w + b


def loss_fn(params, x, y):
    preds = predict(params, x)
    return jnp.mean((preds - y) ** 2)


# ============================================
# Distributed training step
# ============================================
def train_step(params, x, y):
    loss, grads = jax.value_and_grad(loss_fn)(params, x, y)
    # Synchronize gradients across devices (of every process)
    grads = jax.lax.pmean(grads, axis_name='batch')
    loss = jax.lax.pmean(loss, axis_name='batch')
    # Apply update
    w, b = params
    gw, gb = grads
    lr = args.lr
    new_params = (w - lr * gw, b - lr * gb)
    return new_params, loss


p_train_step = jax.pmap(train_step, axis_name='batch')

# ============================================
# Setup: replicate params on this process's devices, take this process's shard
# ============================================
n_devices = jax.local_device_count()

key = jax.random.PRNGKey(0)
k1, k2 = jax.random.split(key)
params = (
    jax.random.normal(k1, (4, 1)) * 0.1,
    jnp.zeros((1,))
)
replicated_params = jax.tree.map(lambda x: jnp.stack([x] * n_devices), params)

# jobs/linear.yaml's synthetic data (worker/data/batches.py): w_true, b_true from seed [s, 0],
# rows from seed [s, 1, 0]; this process's rows are its contiguous share of the batch
truth = np.random.default_rng([args.data_seed, 0])
w_true = truth.standard_normal((4, 1)).astype(np.float32)
b_true = truth.standard_normal(1).astype(np.float32)
rng = np.random.default_rng([args.data_seed, 1, 0])
X = rng.standard_normal((4096, 4), dtype=np.float32)[:args.batch]
noise = rng.standard_normal((4096, 1), dtype=np.float32)[:args.batch]
y = X @ w_true + b_true + np.float32(args.noise_std) * noise

per_process = args.batch // jax.process_count()
mine = slice(jax.process_index() * per_process, (jax.process_index() + 1) * per_process)
per_device = per_process // n_devices
X_sharded = X[mine].reshape(n_devices, per_device, 4)
y_sharded = y[mine].reshape(n_devices, per_device, 1)

# ============================================
# Training loop
# ============================================
for step in range(1, args.steps + 1):
    replicated_params, losses = p_train_step(replicated_params, X_sharded, y_sharded)
    program.report(step, loss=losses[0])  # a progress line every logging.log_every_steps
