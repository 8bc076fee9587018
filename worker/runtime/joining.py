"""Joining the job's JAX runtime: the coordinator, the checks of what JAX reports, and the
Slurm rendezvous that comes before it.

``join`` is shared by the built-in trainer (``worker.trainer.main``) and program jobs
(``worker.program.initialize``). jax is imported inside the functions: this module
imports cheaply, and a process's environment is read and checked before jax starts.
"""

from __future__ import annotations

import dataclasses
import os
import socket
import sys
import time

from worker import contract
from worker.contract.address import split_host_port
from worker.contract import causes, nodefacts, wire
from worker.contract.address import unreachable
from worker.contract import job as jobs


class Mismatch(contract.ContractError):
    """What JAX reports differs from the launcher's plan."""


PROXY_VARIABLES = ("http_proxy", "https_proxy", "grpc_proxy", "all_proxy")


def bypass_proxies(coordinator_address: str, environ=os.environ) -> None:
    """Keep the coordinator's gRPC traffic off HTTP proxies: add its host to no_proxy.

    gRPC honours ``http_proxy``/``https_proxy`` (and ``grpc_proxy``) for its channels; with
    a corporate proxy in the environment every process would try to reach the coordinator
    through it and fail to register. ``no_proxy`` and ``NO_PROXY`` both get the host.
    """
    proxies = [name for name in environ if name.lower() in PROXY_VARIABLES and environ[name]]
    if not proxies:  # nothing to bypass (and JAX warns about any *_proxy variable it sees)
        return
    host = split_host_port(coordinator_address)[0]
    for name in ("no_proxy", "NO_PROXY", "no_grpc_proxy"):
        items = [item.strip() for item in environ.get(name, "").split(",") if item.strip()]
        if host not in items:
            environ[name] = ",".join(items + [host])


COORDINATOR_POLL_S = 0.02   # between tries while the coordinator's port is closed
COORDINATOR_TRY_S = 1.0     # one try's connect timeout (a firewall that drops: no answer)


def wait_for_coordinator(address: str, timeout_s: float, clock=time.monotonic,
                         sleep=time.sleep) -> bool:
    """Wait until ``address`` (``host:port``) accepts a TCP connection, up to ``timeout_s``.

    Why: a process that calls ``jax.distributed.initialize`` before process 0's coordination
    service listens gets a refused connection, and gRPC retries on its reconnect backoff
    (1 s, then 1.6 times longer each time, with jitter: gRPC's connection-backoff.md), so
    the whole job joins up to seconds after the service is up (measured here: 1.0 s, and 9.5 s
    for a process 5 s early, against 0.03 s when the port is open first). A plain connect
    every ``COORDINATOR_POLL_S`` costs nothing and ends the wait within 20 ms of it.

    A refusal or a timeout is retried (the coordinator may not be up yet); an error no wait
    cures (the network unreachable, no route, the address family unsupported:
    ``worker.contract.address.UNREACHABLE_ERRNOS``) ends the wait at once.

    Returns:
      True once a connection was accepted (closed at once), False at ``timeout_s``: the
      caller initializes anyway and JAX reports its own timeout.

    Raises:
      Unreachable: ``address`` cannot be reached from this host (for 127.0.0.1: the
        loopback interface is down), with the errno's meaning.
    """
    host, port = split_host_port(address)
    deadline = clock() + timeout_s
    while True:
        try:
            socket.create_connection((host, port), timeout=COORDINATOR_TRY_S).close()
            return True
        except OSError as exc:
            said = unreachable(host, port, exc)
            if said is not None:
                raise Unreachable(f"the coordinator at {said}") from None
            if clock() >= deadline:
                return False
            sleep(COORDINATOR_POLL_S)


class Unreachable(contract.ContractError):
    """The coordinator's address cannot be reached from this host: no wait would change it."""


def join(identity: contract.Identity, job: jobs.WorkerJob):
    """``jax.distributed.initialize``, then check what JAX reports against the plan.

    A job of one process (``identity.num_processes`` 1, identity explicit, no
    ``LOCAL_DEVICE_IDS``) skips ``jax.distributed.initialize`` (see
    ``single_process``): the same checks follow, and nothing it trains needs
    the cross-process runtime (``worker.runtime.gather`` is off for one process, and
    ``multihost_utils.broadcast_one_to_all`` returns its input).

    By default every argument is explicit (``cluster_detection_method="deactivate"``).
    When the launcher sets ``identity.cluster_detection_method``
    (``contract.CLUSTER_DETECTION_METHOD``) to another of JAX's methods
    (``gcetpu``: TPU VM metadata), JAX detects process_id and num_processes
    itself and the checks below catch any disagreement.

    Raises:
      Mismatch: process_count, process_index, local_device_count or platform
        differ from the plan.
    """
    import jax

    dist = job.distributed
    detection = identity.cluster_detection_method or "deactivate"
    explicit = {} if detection != "deactivate" else {
        "num_processes": identity.num_processes, "process_id": identity.process_id}
    if identity.local_device_ids is not None:  # slurm GPU jobs: this process's devices by index
        explicit["local_device_ids"] = list(identity.local_device_ids)
    if not single_process(identity):
        if identity.platform == "cpu":
            jax.config.update("jax_cpu_collectives_implementation", "gloo")
        bypass_proxies(identity.coordinator_address)
        print(wire.Joining(identity.coordinator_address, dist.initialization_timeout_s).text(),
              flush=True)
        timeout_s = dist.initialization_timeout_s
        if identity.process_id != 0:  # process 0 starts the service in initialize
            began = time.monotonic()
            try:
                wait_for_coordinator(identity.coordinator_address, timeout_s)
            except Unreachable as exc:
                print(causes.line(causes.UNREACHABLE, str(exc)), flush=True)
                os._exit(contract.EXIT_INIT)  # as a failed initialize below: no atexit barrier
            timeout_s = max(1, int(timeout_s - (time.monotonic() - began)))  # one timeout in all
        try:
            jax.distributed.initialize(
                coordinator_address=identity.coordinator_address,
                cluster_detection_method=detection,  # "deactivate": the launcher knows better than env sniffing
                initialization_timeout=timeout_s,
                heartbeat_timeout_seconds=dist.heartbeat_timeout_s,
                **explicit,
            )
        except Exception as exc:  # JAX aborts (SIGABRT) on a timeout; a raise is reported here
            print(wire.InitFailed(f"{type(exc).__name__}: {exc}").text(), flush=True)
            sys.stderr.flush()
            os._exit(contract.EXIT_INIT)  # not atexit's JAX shutdown barrier (_exit_now was undefined here)
    seen = {
        "process_count": (jax.process_count(), identity.num_processes),
        "process_index": (jax.process_index(), identity.process_id),
        "local_device_count": (jax.local_device_count(), identity.local_device_count),
        "device_count": (jax.device_count(),
                         identity.num_processes * identity.local_device_count),
        "platform": (jax.devices()[0].platform, identity.platform),
    }
    wrong = [f"{name} is {got}, the plan says {want}" for name, (got, want) in seen.items()
             if got != want]
    if wrong:
        source = "" if detection == "deactivate" else f" (identity detected by JAX's {detection})"
        raise Mismatch("JAX disagrees with the launcher's plan" + source + ": " + "; ".join(wrong))
    return jax


def client_of(identity: contract.Identity):
    """The coordination service's client (``worker.runtime.gather.coordination_client``: the one
    ``multihost_utils`` and orbax use), or None for a process that joined no service
    (``single_process``)."""
    if single_process(identity):
        return None
    from worker.runtime.gather import coordination_client

    return coordination_client()


def single_process(identity: contract.Identity) -> bool:
    """Whether this worker runs without ``jax.distributed.initialize``: a job of one process.

    Why: once the distributed runtime is up, JAX runs every ``pmean`` of this
    process's devices through the cross-process CPU collectives (gloo), even
    when there is no other process: the seed's step went from about 1,500 to
    about 250 steps/s on 4 CPU devices with that one call (issue 13). One
    process needs none of it. Not skipped when JAX detects the identity itself
    (``cluster_detection_method`` set: its answer must be checked) or when the
    launcher names the local devices (``local_device_ids``: only
    ``initialize`` applies them).
    """
    return (identity.num_processes == 1 and not identity.cluster_detection_method
            and identity.local_device_ids is None)


def rendezvous(identity: contract.Identity, stdin=sys.stdin, out=print) -> contract.Identity:
    """Say this node's facts, import jax meanwhile, then take the coordinator address from stdin.

    See ``contract.RENDEZVOUS``: the launcher compares every node's Python and JAX
    versions and reads process 0's free port while the processes import jax, the
    slow part of their start.

    Returns:
      ``identity`` with the coordinator address the launcher sent.

    Raises:
      ContractError: stdin ended first (the launcher refused the start), or the
        line is not ``host:port``.
    """
    port = split_host_port(identity.coordinator_address)[1] if identity.process_id == 0 else None
    out(wire.Facts(nodefacts.facts(port)).text(), flush=True)
    import jax  # noqa: F401  (the import join() needs, done while the launcher checks)

    address = stdin.readline().strip()
    if not address:
        raise contract.ContractError("no coordinator address on stdin: the launcher stopped "
                                     "the start (see its output)")
    try:
        split_host_port(address)
    except ValueError:
        raise contract.ContractError(f"expected the coordinator's host:port on stdin, got {address!r}") from None
    return dataclasses.replace(identity, coordinator_address=address)
