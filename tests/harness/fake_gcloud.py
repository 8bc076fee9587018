"""A stand-in for the gcloud CLI, for the tpu backend's tests (the one seam that cannot run here).

``install(bin_dir, nodes, queued_resources)`` writes an executable ``gcloud``
into ``bin_dir``; put that directory first on PATH. It answers only

    gcloud compute tpus tpu-vm describe NAME --zone Z [--project P] --format=json
    gcloud compute tpus queued-resources describe NAME --zone Z [--project P] --format=json

with JSON shaped like the TPU API v2 resources gcloud prints, field for field as
the published reference defines them:

- Node: https://cloud.google.com/tpu/docs/reference/rest/v2/projects.locations.nodes#Node
  (full resource ``name``, ``acceleratorType``, ``state``, ``networkEndpoints`` in
  worker order, each ``ipAddress`` (internal), ``port`` and, only when the node has
  external IPs, ``accessConfig.externalIp``). Optional fields are left out where the
  API leaves them out: no ``networkEndpoints`` or ``health`` while a node is not
  READY, no ``accessConfig`` without external IPs, no ``queuedResource`` for a node
  made on its own. External IPs differ from internal ones (203.0.113.x, TEST-NET-3,
  by default), as on a real TPU VM, so a mix-up between the two shows.
- QueuedResource: https://cloud.google.com/tpu/docs/reference/rest/v2/projects.locations.queuedResources#QueuedResource
  with ``tpu.nodeSpec[].multisliceParams`` = {``nodeCount`` (required),
  ``nodeIdPrefix`` (optional: "If this field is not provided we use
  queued_resource_id as the node_id_prefix")}, #MultisliceParams on that page.

An unknown name fails as gcloud does (exit 1), with gcloud's three-line error:
the NOT_FOUND line, then the google.rpc.ResourceInfo detail as YAML (as users
report it, e.g. https://github.com/marin-community/marin/issues/3404)::

    ERROR: (gcloud.compute.tpus.tpu-vm.describe) NOT_FOUND: Resource 'projects/P/locations/Z/nodes/N' was not found. This command is authenticated as ...
    - '@type': type.googleapis.com/google.rpc.ResourceInfo
      resourceName: projects/P/locations/Z/nodes/N

Every call is appended to ``bin_dir/gcloud.calls`` (one JSON argv per line).

``install(..., signed_in=False)`` answers every call as gcloud without an account does, and
``default_project=None`` one without ``--project`` as gcloud with no configured project
does: exit 1, the texts gcloud 5xx prints (``NO_ACCOUNT``, ``NO_PROJECT``, taken from the
real CLI on this machine).
"""

from __future__ import annotations

import json
import os
import stat
import sys

PROJECT = "test-project"

NO_ACCOUNT = """ERROR: (gcloud.%s) You do not currently have an active account selected.
Please run:

  $ gcloud auth login

to obtain new credentials.

If you have already logged in with a different account, run:

  $ gcloud config set account ACCOUNT

to select an already authenticated account to use.
"""
NO_PROJECT = """ERROR: (gcloud.%s) Error parsing [tpu].
The [tpu] resource is not properly specified.
Failed to find attribute [project]. The attribute can be set in the following ways: 
- provide the argument `tpu` on the command line with a fully specified name
- provide the argument `--project` on the command line
- set the property `core/project`
"""

_SCRIPT = r'''#!{python}
import json, sys
db = json.load(open({db!r}))
argv = sys.argv[1:]
with open({calls!r}, "a") as f:
    f.write(json.dumps(argv) + "\n")
def opt(name):
    return argv[argv.index(name) + 1] if name in argv else None
zone, project = opt("--zone"), opt("--project") or {project!r}
if argv[:4] == ["compute", "tpus", "tpu-vm", "describe"]:
    kind, group, command = "nodes", "nodes", "compute.tpus.tpu-vm.describe"
elif argv[:4] == ["compute", "tpus", "queued-resources", "describe"]:
    kind, group, command = "queued_resources", "queuedResources", "compute.tpus.queued-resources.describe"
else:
    sys.stderr.write("ERROR: (gcloud) Invalid choice: %r. (fake gcloud)\n" % " ".join(argv[:4]))
    sys.exit(2)
if project is None:
    sys.stderr.write({no_project!r} % command)
    sys.exit(1)
if not {signed_in!r}:
    sys.stderr.write({no_account!r} % command)
    sys.exit(1)
name = argv[4]
resource = "projects/%s/locations/%s/%s/%s" % (project, zone, group, name)
item = db[kind].get(name)
if item is None or item["zone"] != zone:
    sys.stderr.write("ERROR: (gcloud.%s) NOT_FOUND: Resource '%s' was not found. This command is "
                     "authenticated as tester@example.com which is the active account specified by "
                     "the [core/account] property\n" % (command, resource))
    sys.stderr.write("- '@type': type.googleapis.com/google.rpc.ResourceInfo\n")
    sys.stderr.write("  resourceName: %s\n" % resource)
    sys.exit(1)
out = dict(item["json"])
out["name"] = resource
print(json.dumps(out, indent=2))
'''


def external_ip(internal: str) -> str:
    """The external IP the stand-in gives the host with internal IP ``internal``."""
    return "203.0.113." + internal.rsplit(".", 1)[-1]


def node(accelerator_type: str, ips: list, state: str = "READY", external: bool = True,
         queued_resource: str | None = None, zone: str = "us-central2-b") -> dict:
    """A TPU VM as ``tpu-vm describe --format=json`` prints it (``name`` is filled in on output).

    ``ips`` are the internal IPs, in worker order; with ``external`` each host also has
    ``external_ip(ip)``.
    """
    endpoints = []
    for ip in ips:
        endpoint = {"ipAddress": ip, "port": 8470}
        if external:
            endpoint["accessConfig"] = {"externalIp": external_ip(ip)}
        endpoints.append(endpoint)
    out = {
        "acceleratorConfig": {"topology": "2x2x2", "type": "V4"},
        "acceleratorType": accelerator_type,
        "apiVersion": "V2",
        "cidrBlock": "10.128.0.0/20",
        "createTime": "2026-11-30T08:00:00.000000Z",
        "id": "1234567890123456789",
        "networkConfig": {"enableExternalIps": external, "network": f"projects/{PROJECT}/global/networks/default",
                          "subnetwork": f"projects/{PROJECT}/regions/us-central2/subnetworks/default"},
        "runtimeVersion": "tpu-ubuntu2204-base",
        "schedulingConfig": {},
        "serviceAccount": {"email": "1234-compute@developer.gserviceaccount.com",
                           "scope": ["https://www.googleapis.com/auth/cloud-platform"]},
        "shieldedInstanceConfig": {},
        "state": state,
    }
    if state == "READY":
        out.update(health="HEALTHY", networkEndpoints=endpoints)
    if queued_resource:
        out["queuedResource"] = f"projects/{PROJECT}/locations/{zone}/queuedResources/{queued_resource}"
        out["multisliceNode"] = True
    return out


def queued_resource(accelerator_type: str, node_count: int, prefix: str | None, state: str = "ACTIVE",
                    zone: str = "us-central2-b") -> dict:
    """A multislice queued resource as ``queued-resources describe --format=json`` prints it.

    ``prefix`` None leaves ``nodeIdPrefix`` out (optional in the API: the slices are then
    named after the queued resource).
    """
    multi = {"nodeCount": node_count}
    if prefix is not None:
        multi["nodeIdPrefix"] = prefix
    return {
        "createTime": "2026-11-30T07:55:00.000000Z",
        "state": {"state": state, "stateInitiator": "USER"},
        "tpu": {"nodeSpec": [{
            "multisliceParams": multi,
            "node": {"acceleratorType": accelerator_type, "runtimeVersion": "tpu-ubuntu2204-base",
                     "networkConfig": {"enableExternalIps": True}},
            "parent": f"projects/{PROJECT}/locations/{zone}",
        }]},
    }


def install(bin_dir, nodes: dict, queued_resources: dict | None = None,
            zone: str = "us-central2-b", signed_in: bool = True,
            default_project: str | None = PROJECT) -> str:
    """Write the fake ``gcloud`` into ``bin_dir``; returns its path.

    Args:
      nodes: {name: node(...)} for ``tpu-vm describe``.
      queued_resources: {name: queued_resource(...)} for ``queued-resources describe``.
      signed_in: False: every call fails as gcloud without an active account does.
      default_project: gcloud's configured project (``core/project``); None: a call without
        ``--project`` fails as gcloud without one does.
    """
    bin_dir = str(bin_dir)
    os.makedirs(bin_dir, exist_ok=True)
    db = os.path.join(bin_dir, "gcloud.json")
    with open(db, "w") as f:
        json.dump({"nodes": {k: {"zone": zone, "json": v} for k, v in nodes.items()},
                   "queued_resources": {k: {"zone": zone, "json": v}
                                        for k, v in (queued_resources or {}).items()}}, f)
    path = os.path.join(bin_dir, "gcloud")
    with open(path, "w") as f:
        f.write(_SCRIPT.format(python=sys.executable, db=db, project=default_project,
                               calls=os.path.join(bin_dir, "gcloud.calls"), signed_in=signed_in,
                               no_account=NO_ACCOUNT, no_project=NO_PROJECT))
    os.chmod(path, os.stat(path).st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return path


def calls(bin_dir) -> list:
    """Every argv the fake was called with, in order."""
    try:
        with open(os.path.join(str(bin_dir), "gcloud.calls")) as f:
            return [json.loads(line) for line in f]
    except FileNotFoundError:
        return []
