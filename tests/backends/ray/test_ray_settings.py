"""The ray backend's cluster section, read as a spec (no cluster is contacted): a TPU slice's
bundles, the strategy it forces, and the problems refused on load."""

from __future__ import annotations

import os

import pytest

from launcher import backends, spec
from launcher.errors import SpecError

from harness.helpers import REPO

LINEAR = os.path.join(REPO, "jobs", "linear.yaml")


def _load(tmp_path, text: str):
    path = tmp_path / "ray.yaml"
    path.write_text("backend: ray\n" + ("" if "address:" in text else "address: auto\n") + text)
    return spec.load(LINEAR, cluster_path=str(path), registry=backends)


def test_a_tpu_slice_is_one_bundle_per_host_with_the_head_resource_on_process_0(tmp_path):
    job = _load(tmp_path, "platform: tpu\ntpu_slice: v4-16\n")
    cluster = job.cluster
    assert job.num_processes == 2 and job.local_device_count == 4  # v4-16: 2 hosts x 4 chips
    assert cluster.placement_strategy == "STRICT_SPREAD"  # one host each, the whole slice
    assert cluster.bundle(0) == {"CPU": 1.0, "TPU": 4, "TPU-v4-16-head": 1}
    assert cluster.bundle(1) == {"CPU": 1.0, "TPU": 4}


def test_the_defaults_and_custom_resources(tmp_path):
    job = _load(tmp_path, "resources: {my_label: 0.5}\n")
    assert job.num_processes == 2 and job.local_device_count == 2
    assert job.cluster.placement_strategy == "SPREAD"
    assert job.cluster.bundle(1) == {"CPU": 1.0, "my_label": 0.5}


@pytest.mark.parametrize("text, message", [
    ("tpu_slice: v4-16\n", "cluster.tpu_slice: a TPU slice needs platform: tpu (it is cpu)"),
    ("platform: tpu\ntpu_slice: v4-16\nnum_processes: 3\n",
     "cluster.num_processes: v4-16 has 2 hosts, one process each; got 3"),
    ("tpu_slice: v4-15\nplatform: tpu\n", "cluster.tpu_slice: v4-15: v4 sizes count TensorCores"),
    ("resources: {TPU: 4}\n", "cluster.resources: 'TPU' is set by cluster.cpus_per_process"),
    ("address: 'ray:/head'\n", "cluster.address: expected local (a Ray head started for the run)"),
    ("cpus_per_process: 0\n", "cluster.cpus_per_process: a bundle must reserve something"),
])
def test_bad_input_is_refused_on_load_naming_the_key(tmp_path, text, message):
    with pytest.raises(SpecError) as err:
        _load(tmp_path, text)
    assert message in str(err.value), str(err.value)


def test_a_node_unlike_the_launcher_is_named_with_what_differs():
    """The preflight's verdict on one actor's facts (``session.unfit``): the same Python
    major.minor, jax, jaxlib and podlaunch as the launcher, the run directory seen there, the
    coordinator port free."""
    import importlib.metadata
    import platform

    from launcher.backends.ray.session import unfit

    same = {name: importlib.metadata.version(name) for name in ("jax", "jaxlib", "podlaunch")}
    here = {"python": "/venv/bin/python", "python_version": platform.python_version(),
            "run_dir_seen": True, **same}
    assert unfit(here) == []
    found = unfit({**here, "python_version": "3.9.1", "jax": "0.4.1", "run_dir_seen": False,
                   "port_error": "port 1234 is in use"})
    assert found[0].startswith("Python 3.9.1 (/venv/bin/python), the launcher's ")
    assert f"jax 0.4.1, the launcher's {same['jax']}: install the same in the node's Python" \
        in found
    assert any(f.startswith("does not see the run directory") for f in found), found
    assert any(f.startswith("coordinator port: port 1234 is in use") for f in found), found
