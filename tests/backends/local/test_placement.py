"""Placing a batch on the local CPU devices: in place when the host buffer allows, else one copy.

Real JAX, in its own process with 2 CPU devices (``XLA_FLAGS``), reading real
rows through ``worker.data.sources`` and placing them with ``worker.trainer.train.place``,
then running a real ``pmap`` over the placed batch.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

from harness.helpers import REPO, env_for_tests

SCRIPT = textwrap.dedent("""
    import jax, numpy as np
    from worker.data.order import Order
    from worker.data.sources import ALIGN_BYTES, Synthetic, aligned
    from worker.trainer import train

    class Data:
        source, num_examples, in_features, out_features, noise_std, seed = "synthetic", 8192, 8, 1, 0.1, 3

    devices = jax.local_devices()
    assert len(devices) == 2, devices
    source = Synthetic(Data)

    def pointers(placed):
        return [s.data.unsafe_buffer_pointer() for s in placed.addressable_shards]

    # in order: the rows are a view of the source's table, and the devices use it in place
    rows = Order(8192, 1024, pad=False, shuffle=False, seed=0).process_rows(3, 1, 2)
    x = source.read(rows)["x"].reshape(2, 256, 8)
    assert x.ctypes.data % ALIGN_BYTES == 0
    placed = train.place({"x": x})["x"]
    assert pointers(placed) == [x[0].ctypes.data, x[1].ctypes.data], "not placed in place"
    assert [s.device for s in placed.addressable_shards] == devices
    np.testing.assert_array_equal(np.asarray(placed), x)

    # shuffled: one gather into an aligned batch, also used in place
    rows = Order(8192, 1024, pad=False, shuffle=True, seed=5).process_rows(2, 0, 2)
    x = source.read(rows)["x"].reshape(2, 256, 8)
    placed = train.place({"x": x})["x"]
    assert pointers(placed) == [x[0].ctypes.data, x[1].ctypes.data]
    np.testing.assert_array_equal(np.asarray(placed), x)

    # misaligned (a numpy default allocation shifted by 4 bytes): copied once, same values
    raw = np.zeros(2 * 256 * 8 + 1, np.float32)
    raw[1:] = np.arange(2 * 256 * 8)
    shifted = raw[1:].reshape(2, 256, 8)
    placed = train.place({"x": shifted})["x"]
    assert pointers(placed)[0] != shifted.ctypes.data
    np.testing.assert_array_equal(np.asarray(placed), shifted)
    again = aligned(shifted)
    assert again.ctypes.data % ALIGN_BYTES == 0 and aligned(again) is again

    # pmap takes the placed batch as its own layout
    sums = jax.pmap(lambda a: a.sum())(placed)
    np.testing.assert_allclose(np.asarray(sums), shifted.reshape(2, -1).sum(axis=1))
    print("placement ok")
""")


def test_a_batch_is_placed_in_place_when_aligned_and_copied_once_when_not():
    done = subprocess.run([sys.executable, "-c", SCRIPT], cwd=REPO, capture_output=True, text=True,
                          timeout=120, env=env_for_tests(
                              XLA_FLAGS="--xla_force_host_platform_device_count=2",
                              JAX_PLATFORMS="cpu"))
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    assert "placement ok" in done.stdout
