"""Which hosts a TPU cluster has: ask gcloud for every slice, check each is READY and as specified.

Discovery asks the gcloud CLI (``gcloud compute tpus tpu-vm describe NAME
--zone Z [--project P] --format=json``; for a queued resource first
``gcloud compute tpus queued-resources describe``) and reads the TPU API's
Node resource: ``state``, ``acceleratorType`` and ``networkEndpoints`` (one per
TPU VM host, in worker order; https://cloud.google.com/tpu/docs/reference/rest/v2/projects.locations.nodes).
"""

from __future__ import annotations

import dataclasses
import json
import re
import shlex
import subprocess

from launcher.backends.tpu.settings import TpuCluster
from launcher.errors import LaunchError, Problem, SpecError
from launcher.words import plural

# What to do about a slice that is not READY (TPU API Node.State values).
_STATE_HINTS = {
    "CREATING": "wait until it is READY",
    "STARTING": "wait until it is READY",
    "RESTARTING": "wait until it is READY",
    "REPAIRING": "wait until it is READY",
    "REIMAGING": "wait until it is READY",
    "STOPPED": "start it: gcloud compute tpus tpu-vm start NAME --zone ZONE",
    "STOPPING": "wait, then start it: gcloud compute tpus tpu-vm start NAME --zone ZONE",
    "PREEMPTED": "it was preempted and cannot run; delete and recreate it (or use a queued resource)",
    "TERMINATED": "delete and recreate it",
    "DELETING": "it is being deleted; create a new one",
}


@dataclasses.dataclass(frozen=True)
class TpuHost:
    """One TPU VM host as gcloud reports it."""

    slice_index: int
    slice_name: str
    worker_index: int     # its place in networkEndpoints: the --worker=N of gcloud ... ssh
    address: str          # the IP podlaunch connects to (internal or external)


@dataclasses.dataclass(frozen=True)
class Discovery:
    """The slices of a TPU cluster, in slice order, and their hosts slice-major.

    Slice-major (slice 0's workers in worker order, then slice 1's, ...) is the
    order JAX's own TPU cluster detection numbers processes in
    (jax/_src/clusters/cloud_tpu_cluster.py); placements keep it, so
    ``make_plan`` gives ``process_id = slice_index x hosts_per_slice + worker_index``.
    """

    slices: tuple          # (name, acceleratorType, state) per slice
    hosts: tuple           # TpuHost, slice-major

    def table(self, labels=None) -> str:
        """Slices and their hosts; ``labels`` (per host, e.g. "p2") are appended when given."""
        labels = labels or [""] * len(self.hosts)
        rows = []
        for index, (name, accelerator_type, state) in enumerate(self.slices):
            rows.append(f"slice {index} {name} ({accelerator_type}, {state}):")
            rows += [f"  worker {h.worker_index}  {h.address}  {label}".rstrip()
                     for h, label in zip(self.hosts, labels) if h.slice_index == index]
        return "\n".join(rows)


def gcloud_json(cluster: TpuCluster, source: str, args: list, key: str) -> dict:
    """Run ``gcloud ARGS --zone Z [--project P] --format=json`` and parse its output.

    Args:
      cluster: the TPU cluster (gcloud path, zone, project, timeout_s).
      source: the spec file, for error messages.
      args: the command after ``gcloud``, e.g. ["compute", "tpus", "tpu-vm", "describe", NAME].
      key: the spec key that named the resource (``cluster.tpu``, ...), for error messages.

    Raises:
      SpecError: gcloud is missing, or the resource does not exist (NOT_FOUND).
      LaunchError: gcloud failed otherwise, timed out, or printed something that is not JSON.
    """
    argv = [cluster.gcloud, *args, "--zone", cluster.zone]
    if cluster.project:
        argv += ["--project", cluster.project]
    argv.append("--format=json")
    shown = " ".join(shlex.quote(a) for a in argv)
    try:
        done = subprocess.run(argv, capture_output=True, text=True, stdin=subprocess.DEVNULL,
                              timeout=cluster.gcloud_timeout_s)
    except FileNotFoundError:
        raise SpecError([Problem(source, None, "cluster.gcloud",
                                 f"{cluster.gcloud!r} not found on PATH; install the Google Cloud "
                                 "CLI or set cluster.gcloud to its path")]) from None
    except subprocess.TimeoutExpired:
        raise LaunchError(f"`{shown}` gave no answer within {cluster.gcloud_timeout_s:g} s; "
                          "nothing was started") from None
    if done.returncode != 0:
        raise _failure(done.stderr, shown, cluster, source, key, args[-1])
    try:
        return json.loads(done.stdout)
    except ValueError:
        raise LaunchError(f"`{shown}` printed no JSON: {done.stdout[:200]!r}") from None


# What gcloud's error says, and what the user does about it: (words in its text, the spec key
# at fault or None where the input is not, what to do). gcloud 5xx's own words.
_GCLOUD_ADVICE = (
    (("Failed to find attribute [project]", "required property [project] is not currently set"),
     "cluster.project", "set cluster.project, or gcloud's own: gcloud config set project PROJECT"),
    (("do not currently have an active account", "gcloud auth login"), None,
     "sign in first (gcloud auth login, or gcloud config set account ACCOUNT), then launch again"),
    (("PERMISSION_DENIED",), None, "check that the account gcloud uses may use TPUs in that "
     "project (gcloud auth list; the TPU Viewer role at least) and that cluster.project is right"),
    (("Invalid value for [--zone]", "INVALID_ARGUMENT"), "cluster.zone",
     "check cluster.zone (gcloud compute tpus locations list)"),
)


def _failure(stderr: str, shown: str, cluster: TpuCluster, source: str, key: str,
             name: str) -> Exception:
    """gcloud's failure as one sentence with what to do and the doc to read: a SpecError (exit
    2) where the spec is at fault (an unknown name, no project, a bad zone), else a LaunchError."""
    # gcloud's own error is its "ERROR: (gcloud.<command>) ..." line; what follows it is
    # detail (a NOT_FOUND is followed by a google.rpc.ResourceInfo block as YAML)
    lines = [line.strip() for line in stderr.strip().splitlines() if line.strip()]
    error = next((line for line in lines if line.startswith("ERROR:")), " ".join(lines[-2:]))
    said = re.sub(r"^ERROR: \(gcloud[^)]*\) ", "", error) or "no output"
    where = f"zone {cluster.zone}" + (f", project {cluster.project}" if cluster.project else "")
    if "NOT_FOUND" in stderr:
        return SpecError([Problem(source, None, key, f"{name!r} was not found in {where} "
                                  f"(gcloud: {said}); check the name, zone and project (docs/tpu.md)")])
    for words, at_fault, todo in _GCLOUD_ADVICE:
        if any(w in stderr for w in words):
            if at_fault is not None:
                return SpecError([Problem(source, None, at_fault, f"gcloud could not describe "
                                          f"{name!r} in {where}: {said}; {todo} (docs/tpu.md)")])
            return LaunchError(f"gcloud could not describe {name!r} in {where}: {said}; {todo} "
                               "(docs/tpu.md); nothing was started")
    return LaunchError(f"gcloud could not describe {name!r} in {where} (`{shown}`): {said}; see "
                       "docs/tpu.md; nothing was started")


def slice_names(job) -> tuple[list, str]:
    """The slice names in slice order, and the spec key they came from."""
    cluster: TpuCluster = job.cluster
    if cluster.tpu:
        return [cluster.tpu], "cluster.tpu"
    if cluster.slices:
        return list(cluster.slices), "cluster.slices"
    name = cluster.queued_resource
    qr = gcloud_json(cluster, job.source, ["compute", "tpus", "queued-resources", "describe", name],
                     "cluster.queued_resource")
    state = (qr.get("state") or {}).get("state", "STATE_UNSPECIFIED")
    if state != "ACTIVE":
        raise LaunchError(f"queued resource {name} is {state}, not ACTIVE; its TPUs are not "
                          "provisioned yet (wait, or check `gcloud compute tpus queued-resources "
                          f"describe {name}`); nothing was started")
    names = []
    for spec in (qr.get("tpu") or {}).get("nodeSpec", []):
        multi = spec.get("multisliceParams")
        if multi:  # slices of a multislice request are named <nodeIdPrefix>-<i>; the prefix is
            # optional and defaults to the queued resource's id (TPU API v2 MultisliceParams)
            prefix = multi.get("nodeIdPrefix") or name
            names += [f"{prefix}-{i}" for i in range(int(multi["nodeCount"]))]
        else:
            names.append(spec["nodeId"])
    if len(names) != cluster.slice_count:
        raise SpecError([Problem(job.source, None, "cluster.num_slices",
                                 f"queued resource {name} holds {plural(len(names), 'slice')} ({', '.join(names)}), "
                                 f"the spec says {cluster.slice_count}; set num_slices: {len(names)}")])
    return names, "cluster.queued_resource"


def discover(job) -> Discovery:
    """Describe every slice with gcloud; check each is READY and of the spec's type.

    Returns:
      The slices and their hosts, slice-major.

    Raises:
      SpecError: a slice does not exist, has another accelerator type or host count
        than the spec, or lacks the requested (external) IPs.
      LaunchError: a slice (or the queued resource) is not READY (ACTIVE); gcloud failed.
    """
    cluster: TpuCluster = job.cluster
    names, key = slice_names(job)
    hosts_per_slice = cluster.hosts_per_slice
    slices, hosts, problems, not_ready = [], [], [], []
    for index, name in enumerate(names):
        node = gcloud_json(cluster, job.source, ["compute", "tpus", "tpu-vm", "describe", name], key)
        state = node.get("state", "STATE_UNSPECIFIED")
        accelerator_type = str(node.get("acceleratorType", "")).rsplit("/", 1)[-1]
        slices.append((name, accelerator_type, state))
        if state != "READY":
            hint = _STATE_HINTS.get(state, "check it in the Cloud console").replace("NAME", name)
            not_ready.append(f"TPU {name} is {state}, not READY: {hint.replace('ZONE', cluster.zone)}")
            continue
        if accelerator_type != cluster.accelerator_type:
            problems.append(Problem(job.source, None, "cluster.accelerator_type",
                                    f"gcloud reports {accelerator_type!r} for {name}, the spec says "
                                    f"{cluster.accelerator_type!r}; fix the spec or the name"))
            continue
        endpoints = node.get("networkEndpoints") or []
        if len(endpoints) != hosts_per_slice:
            problems.append(Problem(job.source, None, key,
                                    f"{name} has {len(endpoints)} network endpoints, a "
                                    f"{accelerator_type} has {plural(hosts_per_slice, 'host')}"))
            continue
        for worker_index, endpoint in enumerate(endpoints):
            if cluster.ip == "external":
                address = (endpoint.get("accessConfig") or {}).get("externalIp")
                if not address:
                    problems.append(Problem(job.source, None, "cluster.ip",
                                            f"{name} worker {worker_index} has no external IP; use "
                                            "ip: internal (from a machine in the same VPC)"))
                    continue
            else:
                address = endpoint["ipAddress"]
            hosts.append(TpuHost(index, name, worker_index, address))
    if not_ready:
        raise LaunchError("; ".join(not_ready) + ". Nothing was started.")
    if problems:
        raise SpecError(problems)
    return Discovery(tuple(slices), tuple(hosts))
