"""A real small model as your own program: an MLP digit classifier (plain JAX + optax).

    launch jobs/mlp_digits.yaml

The data are jobs/data/digits.csv (the UCI handwritten digits, 1,797 images of 8 x 8
pixels with values 0-16, and a ``label`` 0-9; source in jobs/data/README.md). A fixed
permutation (seed 0) holds out ``--holdout`` rows; the rest are the training rows.

Data parallel, as the built-in trainer: every process replicates the parameters and the
optimizer state on its *local* devices, takes its own contiguous shard of the training
rows, and draws its share of each global batch from it; ``jax.pmap`` runs the step with
``lax.pmean`` of the gradients and the loss over every device of every process, so the
parameters stay identical everywhere. Each process scores the held-out rows with its
replica (identical on all), and ``program.report`` sends the loss and the held-out
accuracy to the launcher (status line, watchdog, TensorBoard and metrics.jsonl through
process 0). Batches: ``[local_device_count, per_device_batch_size, 64]`` float32 pixels
scaled to [0, 1], labels ``[local_device_count, per_device_batch_size]`` int32.
"""

import argparse
import os

import numpy as np

from podlaunch import program

jax = program.initialize()  # jax.distributed.initialize(...) + the topology check
import jax.numpy as jnp  # noqa: E402
import optax  # noqa: E402

parser = argparse.ArgumentParser()
parser.add_argument("--data", default=os.path.join("jobs", "data", "digits.csv"))
parser.add_argument("--steps", type=int, default=300)
parser.add_argument("--global-batch-size", type=int, default=256)
parser.add_argument("--hidden", type=int, default=128)
parser.add_argument("--learning-rate", type=float, default=3e-3)
parser.add_argument("--holdout", type=int, default=297)
parser.add_argument("--seed", type=int, default=0)
args = parser.parse_args()

num_processes, process_id = jax.process_count(), jax.process_index()
n_devices = jax.local_device_count()
if args.global_batch_size % (num_processes * n_devices):
    raise SystemExit(f"--global-batch-size {args.global_batch_size} must divide by device_count "
                     f"{num_processes * n_devices}")
per_process = args.global_batch_size // num_processes
per_device = per_process // n_devices

# ---- data: the same split on every process, then this process's shard of the training rows
table = np.loadtxt(args.data, delimiter=",", skiprows=1, dtype=np.float32)
pixels, labels = table[:, :64] / 16.0, table[:, 64].astype(np.int32)
order = np.random.default_rng(args.seed).permutation(len(table))
held, train = order[:args.holdout], order[args.holdout:]
shard = np.array_split(train, num_processes)[process_id]
if len(shard) < per_process:
    raise SystemExit(f"process {process_id}: {len(shard)} training rows, fewer than its "
                     f"{per_process} rows of each global batch")
x_held, y_held = pixels[held], labels[held]  # constants of the step


def batches():
    """This process's share of each global batch: a fresh permutation of its shard per epoch."""
    rng = np.random.default_rng([args.seed, process_id])
    while True:
        rows = rng.permutation(shard)
        for start in range(0, len(rows) - per_process + 1, per_process):
            take = rows[start:start + per_process]
            yield (pixels[take].reshape(n_devices, per_device, 64),
                   labels[take].reshape(n_devices, per_device))


# ---- model: 64 -> hidden (ReLU) -> 10 logits
def init(key):
    k1, k2 = jax.random.split(key)
    return {"w1": jax.random.normal(k1, (64, args.hidden)) * jnp.sqrt(2.0 / 64),
            "b1": jnp.zeros((args.hidden,)),
            "w2": jax.random.normal(k2, (args.hidden, 10)) * jnp.sqrt(1.0 / args.hidden),
            "b2": jnp.zeros((10,))}


def logits_fn(params, x):
    hidden = jax.nn.relu(x @ params["w1"] + params["b1"])
    return hidden @ params["w2"] + params["b2"]


def loss_fn(params, x, y):
    return optax.softmax_cross_entropy_with_integer_labels(logits_fn(params, x), y).mean()


optimizer = optax.adam(args.learning_rate)


def held_out_accuracy(params):
    return jnp.mean(jnp.argmax(logits_fn(params, x_held), axis=-1) == y_held)


def train_step(params, opt_state, x, y):
    loss, grads = jax.value_and_grad(loss_fn)(params, x, y)
    grads = jax.lax.pmean(grads, axis_name="batch")  # over every device of every process
    loss = jax.lax.pmean(loss, axis_name="batch")
    updates, opt_state = optimizer.update(grads, opt_state, params)
    params = optax.apply_updates(params, updates)
    # scored in the same pmap: a separate jit on one device between the steps' collectives
    # hung the CPU runtime (gloo) in a 2 x 2 run
    return params, opt_state, loss, held_out_accuracy(params)


p_train_step = jax.pmap(train_step, axis_name="batch")


params = init(jax.random.PRNGKey(args.seed))  # the same key everywhere: the same start
opt_state = optimizer.init(params)
params, opt_state = jax.tree.map(lambda leaf: jnp.stack([leaf] * n_devices), (params, opt_state))

data = batches()
for step in range(1, args.steps + 1):
    x, y = next(data)
    params, opt_state, losses, accuracies = p_train_step(params, opt_state, x, y)
    program.report(step, loss=losses[0], accuracy=accuracies[0])

accuracy = float(accuracies[0])  # every replica holds the same parameters
print(f"held-out accuracy {accuracy:.4f} ({round(accuracy * args.holdout)}/{args.holdout} "
      f"rows) after {args.steps} steps", flush=True)
