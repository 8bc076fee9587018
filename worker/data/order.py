"""Which rows form each global batch: a topology-free order, shuffled or not.

The order is a function of the step alone, never of the process count. Step
``s`` (0-based, counted over all epochs) uses global batch ``b = s % num_batches``
of epoch ``e = s // num_batches``: positions ``[b*B, (b+1)*B)`` of that epoch's
order (``B = global_batch_size``; with ``last_batch: pad`` a position past the
last row wraps to the start of the same order). Without shuffling, position
``i`` is row ``i``; with it, row ``permute(i)`` for a seeded bijection of
``[0, num_examples)`` drawn afresh for each epoch. Process ``p`` of ``P`` then
takes the contiguous slice ``[p*B/P, (p+1)*B/P)`` of the global batch, split
evenly over its local devices, so global device ``p*L + d`` sees the same rows
whatever the split, and the data position (epoch, offset in the order) is
``divmod(s * B, num_batches * B)``: the same numbers on every topology.

When the job's ``D`` devices do not divide ``B`` (a run shrunk onto fewer hosts,
``restarts.min_processes``), global device ``g`` takes positions ``[g*S, (g+1)*S)``
with ``S = ceil(B / D)``; positions past ``B`` are padding, a copy of the batch's
first row with weight 0 (``process_rows_weighted``), and the step takes a mean
weighted by those weights over the whole global batch (``worker.trainer.train``), so it
computes the same mean as the uninterrupted run's step. With ``D`` dividing ``B``
this is the split above, unweighted.

The permutation is a balanced Feistel network on the smallest power-of-4 domain
holding ``num_examples``, restricted to ``[0, num_examples)`` by cycle walking
(M. Luby, C. Rackoff, "How to construct pseudorandom permutations from
pseudorandom functions", SIAM J. Comput. 17(2), 1988; J. Black, P. Rogaway,
"Ciphers with arbitrary finite domains", CT-RSA 2002). It is computed for the
batch's positions only, so memory is bounded by the batch, not the dataset
(``numpy.random.permutation`` of 31 M rows would hold 250 MB per process).
Grain's ``index_shuffle`` is the same construction.
"""

from __future__ import annotations

import numpy as np

FEISTEL_ROUNDS = 6
# The batch key of each row's weight (float32 ``[local_device_count, per_device_batch_size]``
# in ``worker.data.batches``'s layout), present only when the devices do not divide the global
# batch; the step takes it out before the task's loss sees the batch
# (``worker.trainer.train.step_function``).
WEIGHT = "podlaunch_weight"
_MASK64 = np.uint64(0xFFFFFFFFFFFFFFFF)


def num_batches(num_examples: int, global_batch_size: int, pad: bool = False) -> int:
    """Global batches per epoch: whole ones only (``drop``), or the last one filled (``pad``)."""
    return -(-num_examples // global_batch_size) if pad else num_examples // global_batch_size


def _mix(z: np.ndarray) -> np.ndarray:
    """SplitMix64's finaliser (Steele, Lea, Flood, OOPSLA 2014): a 64-bit mixing function."""
    z = z ^ (z >> np.uint64(30))
    z = z * np.uint64(0xBF58476D1CE4E5B9)
    z = z ^ (z >> np.uint64(27))
    z = z * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


class Permutation:
    """A seeded bijection of ``[0, size)``, one per ``(seed, epoch)``.

    Args:
      size: the domain (rows of the dataset), >= 1.
      seed: ``data.shuffle_seed``, 0 to 2**32-1.
      epoch: the epoch (0-based); each gets an independent permutation.
    """

    def __init__(self, size: int, seed: int, epoch: int):
        self.size = int(size)
        bits = max(2, int(self.size - 1).bit_length())
        self.half = (bits + 1) // 2  # both halves of a balanced network: a domain of 4**half
        self.keys = np.random.default_rng([seed, epoch, 0x5EED]).integers(
            0, 2**63, FEISTEL_ROUNDS, dtype=np.uint64)

    def _encrypt(self, x: np.ndarray) -> np.ndarray:
        half = np.uint64(self.half)
        mask = np.uint64((1 << self.half) - 1)
        left, right = x >> half, x & mask
        with np.errstate(over="ignore"):  # modular 64-bit arithmetic is the point
            for key in self.keys:
                left, right = right, left ^ (_mix(right ^ key) & mask)
        return (left << half) | right

    def __call__(self, positions: np.ndarray) -> np.ndarray:
        """The rows at ``positions`` (int, each in ``[0, size)``) of this epoch's order (int64)."""
        out = np.asarray(positions, dtype=np.uint64).copy()
        todo = np.arange(out.size)
        while todo.size:  # cycle walking: expected < 4 rounds, as the domain is < 4 * size
            out[todo] = self._encrypt(out[todo])
            todo = todo[out[todo] >= np.uint64(self.size)]
        return out.astype(np.int64)


class Order:
    """The rows of every global batch, and this process's share of them.

    Args:
      num_examples: rows of the dataset.
      global_batch_size: examples per step over all devices.
      pad: ``data.last_batch: pad`` (a last partial batch filled from the start).
      shuffle: ``data.shuffle``; ``seed``: ``data.shuffle_seed``.

    Raises:
      ValueError: the rows cannot fill one global batch.
    """

    def __init__(self, num_examples: int, global_batch_size: int, pad: bool = False,
                 shuffle: bool = False, seed: int = 0):
        self.num_examples, self.global_batch_size = num_examples, global_batch_size
        self.shuffle, self.seed = shuffle, seed
        self.num_batches = num_batches(num_examples, global_batch_size, pad)
        if self.num_batches == 0:
            raise ValueError(f"{num_examples} rows cannot fill a global batch of "
                             f"{global_batch_size}")
        self._permutation: Permutation | None = None

    def position(self, step: int) -> dict:
        """The data position before 0-based ``step``: topology-free, for checkpoints."""
        epoch, batch = divmod(step, self.num_batches)
        return {"epoch": epoch, "offset": batch * self.global_batch_size,
                "next_batch": batch, "num_batches": self.num_batches,
                "shuffle": self.shuffle, "shuffle_seed": self.seed}

    def global_rows(self, step: int) -> np.ndarray:
        """Row indices ``[global_batch_size]`` int64 of 0-based ``step``'s global batch."""
        epoch, batch = divmod(step, self.num_batches)
        positions = (np.arange(self.global_batch_size, dtype=np.int64)
                     + batch * self.global_batch_size) % self.num_examples
        if not self.shuffle:
            return positions
        if self._permutation is None or self._permutation_epoch != epoch:
            self._permutation = Permutation(self.num_examples, self.seed, epoch)
            self._permutation_epoch = epoch
        return self._permutation(positions)

    def process_rows(self, step: int, process_id: int, num_processes: int) -> np.ndarray:
        """This process's rows ``[global_batch_size / num_processes]`` of ``step``'s batch.

        Raises:
          ValueError: the global batch does not divide over the processes.
        """
        if self.global_batch_size % num_processes:
            raise ValueError(f"global_batch_size {self.global_batch_size} does not divide over "
                             f"{num_processes} processes")
        share = self.global_batch_size // num_processes
        return self.global_rows(step)[process_id * share:(process_id + 1) * share]

    def process_rows_weighted(self, step: int, process_id: int, num_processes: int,
                              local_device_count: int) -> tuple:
        """This process's rows of ``step``'s batch when its devices do not divide it.

        Returns:
          ``(rows, weight)``: rows int64 ``[local_device_count * S]`` and weight float32
          of the same shape, 1 for a row of the batch and 0 for padding (a copy of the
          batch's first row), ``S = per_device_rows(...)``; global device ``g`` holds
          positions ``[g*S, (g+1)*S)`` of the batch (see the module's docstring).
        """
        per_device = per_device_rows(self.global_batch_size, num_processes * local_device_count)
        first = process_id * local_device_count * per_device
        positions = np.arange(first, first + local_device_count * per_device, dtype=np.int64)
        real = positions < self.global_batch_size
        rows = self.global_rows(step)
        return (np.where(real, rows[np.minimum(positions, self.global_batch_size - 1)], rows[0]),
                real.astype(np.float32))


def per_device_rows(global_batch_size: int, device_count: int) -> int:
    """Rows each device holds: ``global_batch_size / device_count``, rounded up (padding)."""
    return -(-global_batch_size // device_count)
