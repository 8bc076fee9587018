"""Cloud TPU VM slices: discover the hosts with gcloud, clear stale TPU holders, run over SSH.

Discovery asks the gcloud CLI (``gcloud compute tpus tpu-vm describe NAME
--zone Z [--project P] --format=json``; for a queued resource first
``gcloud compute tpus queued-resources describe``) and reads the TPU API's
Node resource: ``state``, ``acceleratorType`` and ``networkEndpoints`` (one per
TPU VM host, in worker order; https://cloud.google.com/tpu/docs/reference/rest/v2/projects.locations.nodes).
Everything after discovery is the ssh backend (``launcher.backends.ssh``):
preflight, fan-out, streaming, fail-fast and teardown.

Process ids follow JAX's own TPU cluster detection
(jax/_src/clusters/cloud_tpu_cluster.py): ``process_id = slice_index x
hosts_per_slice + worker_index``; with several slices every worker also gets
``MEGASCALE_COORDINATOR_ADDRESS`` (slice 0, worker 0), ``MEGASCALE_NUM_SLICES``,
``MEGASCALE_SLICE_ID`` and ``MEGASCALE_PORT``.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import json
import os
import shlex
import subprocess

from launcher import tpu_topology
from launcher.backends import ssh, ssh_remote
from launcher.errors import LaunchError, Problem, SpecError
from launcher.spec import JobSpec, SshCluster, SshHost, SshSettings, TpuCluster
from worker import contract

DEFAULT_IDENTITY_FILE = "~/.ssh/google_compute_engine"
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
class Worker:
    """One TPU VM host as gcloud reports it."""

    slice_index: int
    slice_name: str
    worker_index: int
    address: str          # the IP podlaunch connects to (internal or external)
    process_id: int


@dataclasses.dataclass(frozen=True)
class Discovery:
    """The slices of a TPU cluster, in slice order, and their hosts in process_id order."""

    slices: tuple          # (name, acceleratorType, state) per slice
    workers: tuple         # Worker, in process_id order

    def table(self) -> str:
        rows = []
        for index, (name, accelerator_type, state) in enumerate(self.slices):
            rows.append(f"slice {index} {name} ({accelerator_type}, {state}):")
            rows += [f"  worker {w.worker_index}  {w.address}  p{w.process_id}"
                     for w in self.workers if w.slice_index == index]
        return "\n".join(rows)


# ---- gcloud ----------------------------------------------------------------------
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
    error = " ".join(done.stderr.strip().splitlines()[-2:])
    if done.returncode != 0:
        if "NOT_FOUND" in done.stderr:
            where = f"zone {cluster.zone}" + (f", project {cluster.project}" if cluster.project else "")
            raise SpecError([Problem(source, None, key, f"{args[-1]!r} was not found in {where} "
                                     f"(gcloud: {error}); check the name, zone and project")])
        raise LaunchError(f"`{shown}` failed with exit {done.returncode}: {error or 'no output'}; "
                          "nothing was started")
    try:
        return json.loads(done.stdout)
    except ValueError:
        raise LaunchError(f"`{shown}` printed no JSON: {done.stdout[:200]!r}") from None


def _slice_names(job: JobSpec) -> tuple[list, str]:
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
        if multi:  # slices of a multislice request are named <nodeIdPrefix>-<i>
            names += [f"{multi['nodeIdPrefix']}-{i}" for i in range(int(multi["nodeCount"]))]
        else:
            names.append(spec["nodeId"])
    if len(names) != cluster.slice_count:
        raise SpecError([Problem(job.source, None, "cluster.num_slices",
                                 f"queued resource {name} holds {len(names)} slices ({', '.join(names)}), "
                                 f"the spec says {cluster.slice_count}; set num_slices: {len(names)}")])
    return names, "cluster.queued_resource"


def discover(job: JobSpec) -> Discovery:
    """Describe every slice with gcloud; check each is READY and of the spec's type.

    Returns:
      The slices and their hosts, process_id = slice_index x hosts_per_slice + worker_index.

    Raises:
      SpecError: a slice does not exist, has another accelerator type or host count
        than the spec, or lacks the requested (external) IPs.
      LaunchError: a slice (or the queued resource) is not READY (ACTIVE); gcloud failed.
    """
    cluster: TpuCluster = job.cluster
    names, key = _slice_names(job)
    hosts_per_slice = cluster.hosts_per_slice
    slices, workers, problems, not_ready = [], [], [], []
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
                                    f"{accelerator_type} has {hosts_per_slice} hosts"))
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
            workers.append(Worker(index, name, worker_index, address,
                                  index * hosts_per_slice + worker_index))
    if not_ready:
        raise LaunchError("; ".join(not_ready) + ". Nothing was started.")
    if problems:
        raise SpecError(problems)
    ids = [w.process_id for w in workers]
    assert ids == list(range(len(workers))), ids  # unique and dense by construction
    return Discovery(tuple(slices), tuple(workers))


# ---- env ---------------------------------------------------------------------------
def slice_env(cluster: TpuCluster, process_id: int, coordinator_ip: str) -> dict:
    """Environment of one TPU worker beyond the launcher's contract.

    Multislice (https://cloud.google.com/tpu/docs/multislice-introduction): every
    worker gets MEGASCALE_COORDINATOR_ADDRESS (slice 0 worker 0, ``ip:megascale_port``),
    MEGASCALE_NUM_SLICES, MEGASCALE_SLICE_ID and MEGASCALE_PORT; a single slice gets none.
    """
    env = {contract.CLUSTER_DETECTION_METHOD: cluster.cluster_detection_method}
    if cluster.slice_count > 1:
        env.update({
            "MEGASCALE_COORDINATOR_ADDRESS": f"{coordinator_ip}:{cluster.megascale_port}",
            "MEGASCALE_NUM_SLICES": str(cluster.slice_count),
            "MEGASCALE_SLICE_ID": str(process_id // cluster.hosts_per_slice),
            "MEGASCALE_PORT": str(cluster.megascale_port),
        })
    return env


def ssh_job(job: JobSpec, discovery: Discovery) -> JobSpec:
    """The same job on an ssh cluster of the discovered hosts (one process each, in id order)."""
    cluster: TpuCluster = job.cluster
    shared = {f.name: getattr(cluster, f.name) for f in dataclasses.fields(SshSettings)}
    if cluster.identity_file == DEFAULT_IDENTITY_FILE and not os.path.exists(
            os.path.expanduser(DEFAULT_IDENTITY_FILE)):
        shared["identity_file"] = None  # no gcloud key here: ssh_config and ssh-agent still apply
    return dataclasses.replace(job, cluster=SshCluster(
        **shared, hosts=tuple(SshHost(host=w.address) for w in discovery.workers),
        processes_per_host=1, devices_per_process=cluster.devices_per_process,
        platform=cluster.platform,
        coordinator_port=0 if cluster.coordinator_port is None else cluster.coordinator_port))


# ---- stale TPU holders --------------------------------------------------------------
HOLDERS_MARK = "podlaunch-tpu-holders "
HOLDERS = r'''
import glob, json, os, signal, socket, sys, time
a = json.loads(sys.argv[1])
paths = set(os.path.realpath(p) for g in a["globs"] for p in glob.glob(g))
lock = os.path.realpath(a["lockfile"])
me = os.getpid()

def holders():
    found, unreadable = {}, 0
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == me:
            continue
        try:
            fds = os.listdir("/proc/%s/fd" % entry)
        except PermissionError:
            unreadable += 1
            continue
        except OSError:
            continue
        for fd in fds:
            try:
                target = os.readlink("/proc/%s/fd/%s" % (entry, fd))
            except OSError:
                continue
            if target in paths or target == lock:
                found.setdefault(int(entry), set()).add(target)
    return found, unreadable

def describe(pid, held):
    out = {"pid": pid, "paths": sorted(held), "cmd": "?", "podlaunch_run_dir": None}
    try:
        with open("/proc/%d/cmdline" % pid, "rb") as f:
            out["cmd"] = f.read().replace(b"\0", b" ").decode(errors="replace").strip()[:120]
        with open("/proc/%d/environ" % pid, "rb") as f:
            for item in f.read().split(b"\0"):
                if item.startswith(b"PODLAUNCH_RUN_DIR="):
                    out["podlaunch_run_dir"] = item.split(b"=", 1)[1].decode(errors="replace")
    except OSError:
        pass
    return out

found, unreadable = holders()
out = {"holders": [describe(p, h) for p, h in sorted(found.items())], "unreadable": unreadable,
       "stopped": [], "lockfile": None}
if found and a["stop_others"] and not a["dry_run"]:
    for pid in found:
        for sig in (signal.SIGTERM, signal.SIGCONT):
            try:
                os.kill(pid, sig)
            except OSError:
                pass
    deadline = time.time() + a["grace_s"]
    while time.time() < deadline and set(found) & set(holders()[0]):
        time.sleep(0.05)
    for pid in set(found) & set(holders()[0]):
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    deadline = time.time() + 5
    while time.time() < deadline and set(found) & set(holders()[0]):
        time.sleep(0.05)
    left = holders()[0]
    out["stopped"] = [h["pid"] for h in out["holders"] if h["pid"] not in left]
    out["holders"] = [describe(p, h) for p, h in sorted(left.items())]
if os.path.exists(lock):
    # libtpu's lock outlives a killed holder; removing it while held would let two
    # processes drive the same chips, so only a file nobody has open goes.
    if any(lock in h["paths"] for h in out["holders"]):
        out["lockfile"] = "held"
    elif a["dry_run"]:
        out["lockfile"] = "stale"
    else:
        os.unlink(lock)
        out["lockfile"] = "removed"
if a["port"] is not None:
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    # as gRPC (JAX's coordinator) does: connections of an earlier run in TIME_WAIT
    # do not keep the port from being bound
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        s.bind(("", a["port"]))
    except OSError as exc:
        out["port_error"] = "port %d is in use (%s)" % (a["port"], exc.strerror)
    finally:
        s.close()
print("''' + HOLDERS_MARK + r'''" + json.dumps(out), flush=True)
'''


def _holders_on(host: ssh.Host, cluster: TpuCluster, port: int | None, dry_run: bool) -> ssh.Check:
    args = {"globs": list(cluster.tpu_device_paths), "lockfile": cluster.libtpu_lockfile,
            "stop_others": cluster.stop_other_tpu_holders, "dry_run": dry_run,
            "grace_s": cluster.grace_s, "port": port}
    argv = ssh_remote.python_call(cluster.python, HOLDERS, args)
    try:
        status, output = ssh.run_script(host.connection.transport,
                                        " ".join(shlex.quote(a) for a in argv) + "\n")
    except Exception as exc:  # noqa: BLE001  every failure becomes a table row
        return ssh.Check(host, f"TPU holder check failed: {exc}")
    for line in output.splitlines():
        if line.startswith(HOLDERS_MARK):
            facts = json.loads(line[len(HOLDERS_MARK):])
            check = ssh.Check(host, None, facts)
            if facts.get("port_error"):
                check.reason = (f"coordinator {facts['port_error']}; stop what holds it or set "
                                "cluster.coordinator_port")
            elif facts["holders"]:
                held = "; ".join(f"pid {h['pid']} ({h['cmd']}) holds {', '.join(h['paths'])}"
                                 + (" [a podlaunch worker]" if h["podlaunch_run_dir"] else "")
                                 for h in facts["holders"])
                check.reason = ("TPU in use: " + held + ("; they survived SIGKILL"
                                if cluster.stop_other_tpu_holders and not dry_run else
                                "; --set cluster.stop_other_tpu_holders=true stops them"))
            return check
    tail = " | ".join(output.strip().splitlines()[-3:]) or "no output"
    return ssh.Check(host, f"TPU holder check failed with exit {status}: {tail}")


def clear_holders(hosts: list, cluster: TpuCluster, port: int | None, dry_run: bool) -> list:
    """On every host: find processes holding the TPU devices or libtpu's lock file.

    Holders recorded by an earlier run of this job were already stopped by the
    ssh preflight (pid files). Others are stopped (TERM, ``grace_s``, KILL) only
    with ``cluster.stop_other_tpu_holders``; a lock file nobody holds is removed.
    Host 0 also checks that the coordinator ``port`` is free.

    Returns:
      One ssh.Check per host with its facts (holders, stopped pids, lockfile).

    Raises:
      LaunchError: a host still has holders, the port is taken, or the check failed
        (a table of hosts and reasons; nothing was started).
    """
    with concurrent.futures.ThreadPoolExecutor(min(cluster.max_parallel, len(hosts))) as pool:
        checks = list(pool.map(lambda h: _holders_on(h, cluster, port if h.index == 0 else None,
                                                     dry_run), hosts))
    ssh.refuse_unfit(checks, hosts, "TPU check")
    return checks


# ---- the backend -------------------------------------------------------------------
def prepare(job: JobSpec, run_dir: str, python: str, console=None, kill_stale: bool = True,
            dry_run: bool = False) -> ssh.SshPlan:
    """Discover the slices, preflight every host over SSH, clear stale TPU holders, plan.

    Args:
      job: the validated spec (``cluster.backend: tpu``).
      run_dir: the local run directory.
      python: unused (the remote interpreter is ``cluster.python``).
      console: where discovery and clean-up reports go.
      kill_stale: stop this job's survivors recorded in pid files (always, except
        in a dry run, which stops nothing).
      dry_run: report what would be stopped or removed, change nothing.

    Raises:
      SpecError: unknown TPU, wrong accelerator type, missing gcloud.
      LaunchError: a slice not READY, a host unfit, TPU devices held by others.
    """
    cluster: TpuCluster = job.cluster
    discovery = discover(job)
    if console is not None:
        console.say(f"discovered {len(discovery.slices)} slice(s) x {cluster.hosts_per_slice} hosts "
                    f"with gcloud:\n{discovery.table()}")
    on_ssh = ssh_job(job, discovery)
    hosts, checks = ssh.connect(on_ssh, console, kill_stale=kill_stale and not dry_run)
    if cluster.coordinator_port is None:
        port = tpu_topology.jax_coordinator_port(checks[0].facts.get("jax"))
    elif cluster.coordinator_port == 0:
        port = checks[0].facts["port"]
    else:
        port = cluster.coordinator_port
    ours = ssh.stopped_survivors(checks)
    if console is not None and ours:  # said before the holder check, which may refuse
        ids = ", ".join(f"p{r['process_id']} (pgid {r['pgid']})" for r in ours)
        console.say(f"stopped {len(ours)} stale process group(s) of an earlier run: {ids}")
    cleared = clear_holders(hosts, cluster, port if cluster.coordinator_port is None else None, dry_run)
    if console is not None:
        _report(console, cleared, cluster.libtpu_lockfile, dry_run)
    coordinator_ip = ssh.coordinator_ip(hosts[0])
    plan = ssh.plan_processes(on_ssh, run_dir, hosts, f"{coordinator_ip}:{port}")
    processes = tuple(dataclasses.replace(p, env={**p.env, **slice_env(cluster, p.process_id,
                                                                         coordinator_ip)})
                      for p in plan.processes)
    return dataclasses.replace(plan, job=job, processes=processes)


def _report(console, cleared: list, lockfile: str, dry_run: bool) -> None:
    for c in cleared:
        facts = c.facts
        if facts["stopped"]:
            console.say(f"{c.host.name}: stopped processes holding the TPU: "
                        + ", ".join(str(p) for p in facts["stopped"]))
        if facts["lockfile"] == "removed":
            console.say(f"{c.host.name}: removed stale {lockfile} (no process held it)")
        elif facts["lockfile"] == "stale" and dry_run:
            console.say(f"{c.host.name}: would remove stale {lockfile} (dry run)")
        if facts.get("unreadable"):
            console.say(f"{c.host.name}: could not see the open files of {facts['unreadable']} "
                        "processes of other users; run as root to check them too")


def describe_start(plan: ssh.SshPlan) -> str:
    cluster: TpuCluster = plan.job.cluster
    return (f"starting {plan.num_processes} processes ({cluster.slice_count} slice(s) x "
            f"{cluster.hosts_per_slice} hosts of {cluster.accelerator_type}) x "
            f"{plan.job.local_device_count} {cluster.platform} devices over ssh, "
            f"coordinator {plan.coordinator_address}")


start = ssh.start
