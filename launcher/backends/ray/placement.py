"""The run's placement group: its bundles (one per process), the refusal of a request the
cluster can never meet, the reservation with its count-down, and where each bundle went.

A request is impossible (bad input, exit 2, nothing reserved) where no alive node has what
one bundle asks, the cluster has less than all bundles ask together, or a strategy cannot be
met by the nodes it has (STRICT_SPREAD: a node per bundle; STRICT_PACK: one node for all). A
request the cluster can meet but not now (other jobs hold the resources) waits up to
``cluster.placement_timeout_s`` with a count-down on the console. An autoscaling cluster
that would add nodes for the request is refused as it is now (docs/ray.md).
"""

from __future__ import annotations

import time

from launcher.errors import LaunchError, Problem, SpecError
from launcher.words import plural

SAY_EVERY_S = 5.0  # the count-down's period
FIRST_SAY_S = 1.0  # a group reserved sooner says nothing
POLL_S = 0.2


def bundles(cluster, job) -> list:
    """Every process's bundle, in process order (``RayCluster.bundle``)."""
    return [cluster.bundle(i) for i in range(job.num_processes)]


def _amount(value: float) -> str:
    return f"{value:g}"


def _asked(bundle: dict) -> str:
    return ", ".join(f"{k} {_amount(v)}" for k, v in bundle.items())


def _key_of(resource: str, cluster) -> str:
    """The setting that asked for ``resource``: where the user changes the request."""
    if resource == "CPU":
        return "cpus_per_process"
    if resource in ("GPU", "TPU"):
        return "tpu_slice" if cluster.tpu_slice and resource == "TPU" else "devices_per_process"
    if resource.startswith("TPU-") and resource.endswith("-head"):
        return "tpu_slice"
    return f"resources.{resource}"


def _nodes_text(nodes: list, names: set) -> str:
    def has(node):
        found = [f"{k} {_amount(node['Resources'].get(k, 0))}" for k in sorted(names)]
        return f"{node['NodeManagerAddress']} ({', '.join(found)})"
    return "; ".join(has(n) for n in nodes)


def refuse_impossible(ray, job) -> None:
    """Refuse, before anything is reserved, a group the cluster's alive nodes can never hold.

    Raises:
      SpecError: one sentence per missing thing: the setting that asked, what it asked, what
        the cluster has (node by node).
    """
    cluster = job.cluster
    nodes = [n for n in ray.nodes() if n.get("Alive")]
    wanted = bundles(cluster, job)
    names = {k for b in wanted for k in b}
    where = f"the Ray cluster at {cluster.address} ({plural(len(nodes), 'alive node')}: " \
        f"{_nodes_text(nodes, names)})"
    problems = []
    for resource in sorted(names):
        each = max(b.get(resource, 0) for b in wanted)
        most = max((n["Resources"].get(resource, 0) for n in nodes), default=0)
        total_asked = sum(b.get(resource, 0) for b in wanted)
        total = sum(n["Resources"].get(resource, 0) for n in nodes)
        key = _key_of(resource, cluster)
        if each > most:
            problems.append((key, f"a process asks for {resource} {_amount(each)}, and no node "
                             f"of {where} has that much"))
        elif total_asked > total:
            problems.append((key, f"{plural(job.num_processes, 'process')} ask for {resource} "
                             f"{_amount(total_asked)} in all, and {where} has {_amount(total)}"))
    fit = [n for n in nodes if all(n["Resources"].get(k, 0) >= v
                                   for k, v in wanted[-1].items())]
    # every bundle but process 0's (a slice's head resource) is the same: how many fit a node
    each = {k: v for k, v in wanted[-1].items() if v > 0}
    room = sum(min(int(n["Resources"].get(k, 0) // v) for k, v in each.items())
               for n in nodes) if each else len(wanted)
    if not problems and room < len(wanted):
        key = _key_of(min(each, key=lambda k: sum(n["Resources"].get(k, 0) // each[k]
                                                  for n in nodes)), cluster)
        problems.append((key, f"{plural(len(wanted), 'bundle')} of {_asked(wanted[-1])} do "
                         f"not fit: the nodes of {where} hold {room} such bundles at most, "
                         "whole bundles on one node each"))
    if not problems and cluster.placement_strategy == "STRICT_SPREAD" and len(fit) < len(wanted):
        problems.append(("strategy" if not cluster.tpu_slice else "tpu_slice",
                         f"STRICT_SPREAD puts each of {plural(len(wanted), 'bundle')} on a node "
                         f"of its own, and only {plural(len(fit), 'node')} of {where} can hold "
                         "one; use SPREAD or fewer processes"))
    if not problems and cluster.placement_strategy == "STRICT_PACK" and not any(
            all(n["Resources"].get(k, 0) >= sum(b.get(k, 0) for b in wanted) for k in names)
            for n in nodes):
        problems.append(("strategy", f"STRICT_PACK puts every bundle on one node, and no node "
                         f"of {where} holds them all; use PACK or SPREAD"))
    if problems:
        raise SpecError([Problem(*job.where(("cluster",) + tuple(key.split(".", 1))),
                                 f"cluster.{key}", text) for key, text in problems])


def _state(ray, group) -> str:
    return ray.util.placement_group_table(group).get("state", "")


def wait_ready(ray, group, job, console) -> None:
    """Wait until every bundle of ``group`` is reserved (again, after a node was lost), saying
    how long is left every ``SAY_EVERY_S``.

    Raises:
      LaunchError: not reserved within ``cluster.placement_timeout_s`` (the group is
        released).
    """
    cluster = job.cluster
    timeout_s = cluster.placement_timeout_s
    began = time.monotonic()
    say_at = began + FIRST_SAY_S
    while _state(ray, group) != "CREATED":
        now = time.monotonic()
        left = timeout_s - (now - began)
        if left <= 0:
            free = {k: v for k, v in sorted(ray.available_resources().items())
                    if not k.startswith("node:") and "memory" not in k}
            release(ray, group)
            raise LaunchError(
                f"the Ray cluster at {cluster.address} did not reserve the run's "
                f"{plural(job.num_processes, 'bundle')} ({_asked(cluster.bundle(0))} each, "
                f"{cluster.placement_strategy}) in {timeout_s:g} s: other work holds what it "
                f"needs (free now: {_asked(free) or 'nothing'}); free it, or raise "
                "cluster.placement_timeout_s")
        if now >= say_at:
            console.say(f"waiting for the Ray cluster to reserve "
                        f"{plural(job.num_processes, 'bundle')} ({_asked(cluster.bundle(0))} "
                        f"each): {left:.0f} s left (cluster.placement_timeout_s)")
            say_at = now + SAY_EVERY_S
        time.sleep(POLL_S)


def reserve(ray, job, name: str, console):
    """The run's placement group, reserved (``wait_ready``)."""
    from ray.util.placement_group import placement_group

    cluster = job.cluster
    group = placement_group(bundles(cluster, job), strategy=cluster.placement_strategy,
                            name=name)
    wait_ready(ray, group, job, console)
    return group


def release(ray, group) -> None:
    from ray.util.placement_group import remove_placement_group

    try:
        remove_placement_group(group)
    except Exception:  # noqa: BLE001 - removed already, or the cluster is gone
        pass


def bundle_nodes(ray, group) -> list:
    """The address of the node each bundle is on, in bundle order."""
    table = ray.util.placement_group_table(group)
    addresses = {n["NodeID"]: n["NodeManagerAddress"] for n in ray.nodes()}
    placed = table.get("bundles_to_node_id", {})
    return [addresses.get(placed.get(i), "?") for i in range(len(table.get("bundles", {})))]


def describe(job, name: str, nodes: list, address: str) -> str:
    """The dry run's placement: each bundle, what it reserves and the node it went to (the
    group was reserved to learn it, then released)."""
    cluster = job.cluster
    lines = [f"placement group {name} on the Ray cluster at {address}, "
             f"{cluster.placement_strategy} (reserved to show where it goes, then released):"]
    for i, node in enumerate(nodes):
        role = " (coordinator)" if i == 0 else ""
        lines.append(f"  bundle {i}: {_asked(cluster.bundle(i))} on node {node} -> "
                     f"process {i}{role}")
    if not cluster.coordinator_port:
        lines.append(f"  coordinator: on node {nodes[0]}, a port free there picked at start "
                     "(the plan below says :0)")
    return "\n".join(lines)
