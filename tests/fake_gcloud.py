"""A stand-in for the gcloud CLI, for the tpu backend's tests (the one seam that cannot run here).

``install(bin_dir, nodes, queued_resources)`` writes an executable ``gcloud``
into ``bin_dir``; put that directory first on PATH. It answers only

    gcloud compute tpus tpu-vm describe NAME --zone Z [--project P] --format=json
    gcloud compute tpus queued-resources describe NAME --zone Z [--project P] --format=json

with JSON shaped like the TPU API v2 resources gcloud prints (Node:
https://cloud.google.com/tpu/docs/reference/rest/v2/projects.locations.nodes;
QueuedResource: .../projects.locations.queuedResources): full resource
``name``, ``acceleratorType``, ``state``, ``health``, ``networkEndpoints`` in
worker order with ``ipAddress``, ``port`` and ``accessConfig.externalIp``.
An unknown name fails as gcloud does: exit 1 and
``ERROR: (gcloud.compute.tpus.tpu-vm.describe) NOT_FOUND: Resource '...' was not found``.
Every call is appended to ``bin_dir/gcloud.calls`` (one JSON argv per line).
"""

from __future__ import annotations

import json
import os
import stat
import sys

PROJECT = "test-project"

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
name = argv[4]
resource = "projects/%s/locations/%s/%s/%s" % (project, zone, group, name)
item = db[kind].get(name)
if item is None or item["zone"] != zone:
    sys.stderr.write("ERROR: (gcloud.%s) NOT_FOUND: Resource '%s' was not found\n" % (command, resource))
    sys.exit(1)
out = dict(item["json"])
out["name"] = resource
print(json.dumps(out, indent=2))
'''


def node(accelerator_type: str, ips: list, state: str = "READY", external: bool = True,
         queued_resource: str | None = None, zone: str = "us-central2-b") -> dict:
    """A TPU VM as ``tpu-vm describe --format=json`` prints it (``name`` is filled in on output)."""
    endpoints = []
    for ip in ips:
        endpoint = {"ipAddress": ip, "port": 8470}
        if external:
            endpoint["accessConfig"] = {"externalIp": ip}
        endpoints.append(endpoint)
    out = {
        "acceleratorConfig": {"topology": "2x2x2", "type": "V4"},
        "acceleratorType": accelerator_type,
        "apiVersion": "V2",
        "cidrBlock": "10.128.0.0/20",
        "createTime": "2026-11-30T08:00:00.000000Z",
        "health": "HEALTHY" if state == "READY" else "HEALTH_UNSPECIFIED",
        "id": "1234567890123456789",
        "networkConfig": {"enableExternalIps": external, "network": f"projects/{PROJECT}/global/networks/default",
                          "subnetwork": f"projects/{PROJECT}/regions/us-central2/subnetworks/default"},
        "networkEndpoints": endpoints if state == "READY" else [],
        "runtimeVersion": "tpu-ubuntu2204-base",
        "schedulingConfig": {},
        "serviceAccount": {"email": "1234-compute@developer.gserviceaccount.com",
                           "scope": ["https://www.googleapis.com/auth/cloud-platform"]},
        "shieldedInstanceConfig": {},
        "state": state,
    }
    if queued_resource:
        out["queuedResource"] = f"projects/{PROJECT}/locations/{zone}/queuedResources/{queued_resource}"
        out["multisliceNode"] = True
    return out


def queued_resource(accelerator_type: str, node_count: int, prefix: str, state: str = "ACTIVE",
                    zone: str = "us-central2-b") -> dict:
    """A multislice queued resource as ``queued-resources describe --format=json`` prints it."""
    return {
        "createTime": "2026-11-30T07:55:00.000000Z",
        "state": {"state": state, "stateInitiator": "USER"},
        "tpu": {"nodeSpec": [{
            "multisliceParams": {"nodeCount": node_count, "nodeIdPrefix": prefix},
            "node": {"acceleratorType": accelerator_type, "runtimeVersion": "tpu-ubuntu2204-base",
                     "networkConfig": {"enableExternalIps": True}},
            "parent": f"projects/{PROJECT}/locations/{zone}",
        }]},
    }


def install(bin_dir, nodes: dict, queued_resources: dict | None = None,
            zone: str = "us-central2-b") -> str:
    """Write the fake ``gcloud`` into ``bin_dir``; returns its path.

    Args:
      nodes: {name: node(...)} for ``tpu-vm describe``.
      queued_resources: {name: queued_resource(...)} for ``queued-resources describe``.
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
        f.write(_SCRIPT.format(python=sys.executable, db=db, project=PROJECT,
                               calls=os.path.join(bin_dir, "gcloud.calls")))
    os.chmod(path, os.stat(path).st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return path


def calls(bin_dir) -> list:
    """Every argv the fake was called with, in order."""
    try:
        with open(os.path.join(str(bin_dir), "gcloud.calls")) as f:
            return [json.loads(line) for line in f]
    except FileNotFoundError:
        return []
