"""The nodes' facts before a Slurm job's processes join: the worker's rendezvous and the check.

The built-in worker says its facts (``worker.contract.nodefacts``) as its first line and
waits for the coordinator address on stdin (``contract.RENDEZVOUS``); the
launcher's ``slurm.nodes.check`` compares them. Both run here for real: the
worker as ``python -m worker`` in a subprocess, the check on facts this
interpreter reports about itself. tests/backends/slurm/test_slurm.py runs them on a real Slurm.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys

import pytest

from harness.helpers import LAUNCH, REPO, env_for_tests
from harness.nosockets import SAID, python_json
from launcher.backends.slurm import nodes
from launcher.errors import LaunchError, Problem, SpecError
from worker import contract
from worker.contract import wire
from worker.contract import nodefacts


def problem(key: str, message: str) -> SpecError:
    return SpecError([Problem("cluster.yaml", None, f"cluster.{key}", message)])


def node(name: str, port=None, **change) -> dict:
    facts = {**nodefacts.facts(port), "node": name, **change}
    return facts


def test_matching_nodes_give_the_port_found_free_on_the_first():
    port = nodes.check([node("n1", 0), node("n2"), node("n3")], sys.executable, problem)
    assert 0 < port < 65536
    with socket.socket() as s:  # the kernel's pick was free: it can be bound again
        s.bind(("", port))


def test_nodes_whose_versions_differ_are_named_with_what_the_first_node_has():
    mine = nodefacts.version("jax")
    with pytest.raises(LaunchError) as err:
        nodes.check([node("n1", 0), node("n2", jax="0.0.1"), node("n3", jaxlib=None, jax=None)],
                    sys.executable, problem)
    said = str(err.value)
    assert said.startswith("the nodes' Python and JAX differ: ")
    assert f"n2: jax 0.0.1 (n1: {mine})" in said
    assert f"n3: jax/jaxlib not installed for {sys.executable}" in said


def test_a_fixed_coordinator_port_in_use_on_the_first_node_is_bad_input():
    with socket.socket() as busy:
        busy.bind(("", 0))
        busy.listen()
        taken = busy.getsockname()[1]
        with pytest.raises(SpecError) as err:
            nodes.check([node("n1", taken), node("n2")], sys.executable, problem)
    said = str(err.value)
    assert "cluster.coordinator_port" in said and "on n1; pick another or use 0" in said


def worker(tmp_path, stdin: str, process_id: int = 0, address: str = "127.0.0.1:0"):
    identity = contract.Identity(coordinator_address=address, num_processes=2,
                                 process_id=process_id, local_device_count=1, platform="cpu",
                                 job_path=str(tmp_path / "job.json"), run_dir=str(tmp_path))
    env = env_for_tests(**identity.to_env(), **{contract.RENDEZVOUS: "stdin"})
    return subprocess.run([LAUNCH[0], "-m", "worker"], cwd=REPO, env=env, input=stdin,
                          capture_output=True, text=True, timeout=120)


def test_the_worker_says_its_facts_first_and_stops_when_stdin_ends(tmp_path):
    result = worker(tmp_path, stdin="")
    lines = result.stdout.splitlines()
    assert result.returncode == contract.EXIT_MISMATCH, result.stdout + result.stderr
    assert lines[0].startswith(wire.FACTS_PREFIX), lines
    facts = json.loads(lines[0][len(wire.FACTS_PREFIX):])
    assert facts["jax"] == nodefacts.version("jax") and facts["executable"] == sys.executable
    assert 0 < facts["port"] < 65536  # process 0: a free port for the coordinator
    assert "no coordinator address on stdin: the launcher stopped the start" in result.stdout


def test_only_process_0_checks_a_port_and_a_bad_address_is_refused(tmp_path):
    result = worker(tmp_path, stdin="not-an-address\n", process_id=1)
    lines = result.stdout.splitlines()
    assert result.returncode == contract.EXIT_MISMATCH, result.stdout + result.stderr
    assert "port" not in json.loads(lines[0][len(wire.FACTS_PREFIX):])
    assert "expected the coordinator's host:port on stdin, got 'not-an-address'" in result.stdout


def test_a_free_coordinator_port_is_picked_below_the_ephemeral_range_and_is_bindable():
    """Port 0 on the coordinator's node: a port bind(0) would hand out lies in the range every
    outgoing connection draws its local port from, and one took it before process 0 bound it
    (a CI run's Slurm job: "Failed to add port to server"); below that range none is drawn."""
    from launcher import proctl

    low, _ = proctl.ephemeral_range()
    for _ in range(20):
        port = nodefacts.port_answer(0)["port"]
        assert 1024 <= port < low, port
        with socket.socket() as s:
            s.bind(("", port))
    with socket.socket() as taken:
        taken.bind(("", 0))
        taken.listen()
        answer = nodefacts.port_answer(taken.getsockname()[1])
        assert answer["port_error"] and answer["port"] == taken.getsockname()[1]


@pytest.mark.parametrize("errno_name", sorted(SAID))
def test_a_node_without_tcp_sockets_says_so_not_in_use(tmp_path, errno_name):
    # the probe step's port check raised from socket() (a traceback instead of its facts line)
    fixed, free = python_json(tmp_path, errno_name, (
        "import json; from worker.contract import nodefacts; "
        "print(json.dumps([nodefacts.port_answer(23456), nodefacts.port_answer(0)]))"))
    said = f"this node allows no TCP socket ({SAID[errno_name]}): a sandbox or locked-down host"
    assert fixed == {"port": 23456, "port_error": said} and free["port_error"] == said
