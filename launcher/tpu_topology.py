"""Hosts and JAX devices per host of a Cloud TPU accelerator type (``v4-32``, ...).

The number in an accelerator type counts TensorCores for v2, v3, v4 and v5p,
and chips for v5e (``v5litepod-N``) and v6e. Sources (Cloud TPU docs, system
architecture and per-version pages: https://cloud.google.com/tpu/docs/system-architecture-tpu-vm,
https://cloud.google.com/tpu/docs/v4, .../v5p, .../v5e, .../v6e):

==========  =============  ==============  ===============  ===========================
type        number counts  chips per host  TensorCores/chip JAX devices per host
==========  =============  ==============  ===============  ===========================
v2-N, v3-N  TensorCores    4               2                8 (one per TensorCore)
v4-N        TensorCores    4               2 (megacore)     4 (one per chip)
v5p-N       TensorCores    4               2 (megacore)     4 (one per chip)
v5litepod-N chips          N if N <= 8,    1                N if N <= 8, else 4
                           else 4
v6e-N       chips          as v5e          1                as v5e
==========  =============  ==============  ===============  ===========================

So v4-32 is 32 TensorCores = 16 chips = 4 hosts x 4 chips, and JAX sees 4
devices on each host. Imports nothing of the launcher (``spec`` uses it).
"""

from __future__ import annotations

import dataclasses
import re

_TYPE = re.compile(r"^(?P<version>v2|v3|v4|v5p|v5litepod|v6e)-(?P<size>\d+)$")
_KNOWN = "v2-N, v3-N, v4-N, v5p-N (N TensorCores), v5litepod-N, v6e-N (N chips)"


@dataclasses.dataclass(frozen=True)
class Topology:
    """One slice of an accelerator type.

    Attributes:
      accelerator_type: e.g. "v4-32".
      hosts: TPU VM hosts in the slice (JAX processes, one per host).
      chips_per_host: TPU chips on each host.
      devices_per_host: JAX devices each host's process sees.
    """

    accelerator_type: str
    hosts: int
    chips_per_host: int
    devices_per_host: int

    @property
    def chips(self) -> int:
        return self.hosts * self.chips_per_host

    @property
    def device_count(self) -> int:
        return self.hosts * self.devices_per_host


def _split(accelerator_type: str) -> tuple[str, int]:
    match = _TYPE.match(accelerator_type)
    if match is None:
        raise ValueError(f"expected a Cloud TPU accelerator type ({_KNOWN}), got {accelerator_type!r}")
    return match["version"], int(match["size"])


def topology(accelerator_type: str) -> Topology:
    """Hosts, chips and JAX devices of one slice of ``accelerator_type``.

    Raises:
      ValueError: not a known accelerator type, or a size that does not fill whole hosts.
    """
    version, size = _split(accelerator_type)
    if version in ("v2", "v3", "v4", "v5p"):  # size counts TensorCores, 2 per chip, 4 chips per host
        if size < 8 or size % 8:
            raise ValueError(f"{accelerator_type}: {version} sizes count TensorCores, 8 per host; "
                             f"expected a multiple of 8, got {size}")
        devices = 8 if version in ("v2", "v3") else 4
        return Topology(accelerator_type, size // 8, 4, devices)
    # v5litepod / v6e: size counts chips; up to 8 chips fit one host, larger slices use 4 per host
    if size <= 8:
        if size not in (1, 4, 8):
            raise ValueError(f"{accelerator_type}: single-host {version} slices have 1, 4 or 8 chips, "
                             f"got {size}")
        return Topology(accelerator_type, 1, size, size)
    if size % 4:
        raise ValueError(f"{accelerator_type}: multi-host {version} slices have 4 chips per host; "
                         f"expected a multiple of 4, got {size}")
    return Topology(accelerator_type, size // 4, 4, 4)


def check_accelerator_type(value: str) -> str | None:
    """Spec check: None when ``value`` is a known accelerator type, else the problem."""
    try:
        topology(value)
    except ValueError as exc:
        return str(exc)
    return None


def jax_coordinator_port(jax_version: str | None) -> int:
    """The port JAX's TPU cluster detection puts the coordinator on, for a jax version.

    8482 since jax 0.8.1 and 8476 before (``coordinator_port`` in
    jax/_src/clusters/cloud_tpu_cluster.py). Unknown or unparsable versions get
    the current default.
    """
    parts = re.findall(r"\d+", jax_version or "")[:3]
    if len(parts) < 3:
        return 8482
    return 8482 if tuple(int(p) for p in parts) >= (0, 8, 1) else 8476
