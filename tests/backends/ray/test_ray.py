"""The ray backend against a real Ray cluster on this machine (``harness.rayenv``): a head with
no CPUs of its own (so the run's bundles go to the worker nodes) and two worker nodes of 2 CPUs
on 127.0.0.2 and 127.0.0.3, started once for the module. After every test the cluster has no
actor and no placement group left alive, and no worker process of the run lives.

The references are uninterrupted local runs (``reference_params``): podlaunch's data order
and step do not depend on where the processes run.
"""

from __future__ import annotations

import os
import re
import signal
import time

import pytest
import yaml

from harness import rayenv
from harness.helpers import PROGRAMS, REPO, launch, launched, program_job, run_pids
from harness.runs import LOSES_A_HOST, STEPS_LOST, assert_same_params, fault, params

pytestmark = pytest.mark.slow

STEPS = STEPS_LOST
COMMON = LOSES_A_HOST  # as the ssh spares' tests
# process 0 slower on attempt 0 (12 s for the 40 steps): a node stopped at step 10 is stopped
# before the run ends even on a busy machine (the same params: sleeping changes no number)
SLOWER = ("--set", "task.args.sleep_s=0.3")

@pytest.fixture(scope="module")
def ray_cluster():
    why = rayenv.available()
    assert why is None, f"Ray cannot run here: {why}"
    with pytest.MonkeyPatch.context() as patch, \
            rayenv.RayTestEnv(head_cpus=0, worker_cpus=(2, 2)) as env:
        for name, value in rayenv.AUTH.items():  # the launches' too (env_for_tests)
            patch.setenv(name, value)
        yield env


@pytest.fixture
def ray_env(ray_cluster):
    """The module's cluster with every worker node (one a test before stopped started again:
    the module's last test stops one, and nothing starts it again for nothing), and nothing
    left on it after the test."""
    ray_cluster.restore()
    yield ray_cluster
    deadline = time.monotonic() + 30  # a lost node's actors are told dead within seconds
    while (left := ray_cluster.left()) != {"actors": [], "groups": []} \
            and time.monotonic() < deadline:
        time.sleep(1)
    assert left == {"actors": [], "groups": []}, left


def cluster_file(tmp_path, env, **settings) -> str:
    cluster = {"backend": "ray", "address": env.address, "num_processes": 2,
               "devices_per_process": 2, "placement_timeout_s": 60, "grace_s": 2,
               "env": {"PYTHONPATH": os.pathsep.join([PROGRAMS, REPO])}, **settings}
    path = tmp_path / "ray.yaml"
    path.write_text(yaml.safe_dump(cluster))
    return str(path)


def test_the_main_job_trains_on_two_ray_nodes_to_the_local_params(tmp_path, ray_env,
                                                                   reference_params):
    cluster = cluster_file(tmp_path, ray_env)
    run_dir = tmp_path / "run"
    dry = launch("jobs/linear.yaml", "--cluster", cluster, "--run-dir", str(run_dir),
                 "--dry-run", timeout_s=120)
    assert dry.returncode == 0, dry.stdout[-3000:] + dry.stderr
    # the placement: every bundle, what it reserves and its node, one per node (SPREAD)
    bundles = re.findall(r"^  bundle (\d): CPU 1 on node (127\.0\.0\.[23]) -> process \1",
                         dry.stdout, re.M)
    assert [b[0] for b in bundles] == ["0", "1"], dry.stdout
    assert {b[1] for b in bundles} == {"127.0.0.2", "127.0.0.3"}, dry.stdout
    assert ray_env.left() == {"actors": [], "groups": []}  # the dry run released its group
    assert not run_pids(str(run_dir))

    result = launch("jobs/linear.yaml", "--cluster", cluster, "--run-dir", str(run_dir),
                    timeout_s=240)
    out = result.stdout
    assert result.returncode == 0, out[-4000:] + result.stderr
    assert re.search(r"attempt 0: starting 2 processes x 2 CPU devices on the Ray cluster at "
                     rf"{re.escape(ray_env.address)} \(placement group podlaunch/run-[0-9a-f]{{8}}, "
                     r"SPREAD over 2 nodes: 127\.0\.0\.2, 127\.0\.0\.3\), coordinator "
                     r"(127\.0\.0\.[23]):\d+", out), out[-3000:]
    assert re.search(r"^p1\s+127\.0\.0\.[23]\s+succeeded\s+exit code 0\s+100\b", out, re.M), out
    assert_same_params(params(run_dir), reference_params())
    assert not run_pids(str(run_dir))


def test_a_program_job_runs_on_the_ray_nodes(tmp_path, ray_env):
    job = program_job(tmp_path, steps=10, num_processes=2)
    result = launch(job, "--cluster", cluster_file(tmp_path, ray_env, devices_per_process=1),
                    "--run-dir", str(tmp_path / "run"), timeout_s=240)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr
    assert re.search(r"^OK: 2 processes succeeded", result.stdout, re.M), result.stdout[-3000:]


def test_an_impossible_request_is_refused_before_anything_starts(tmp_path, ray_env):
    cluster = cluster_file(tmp_path, ray_env)
    run_dir = tmp_path / "run"
    for args, key, text in [
        (("--set", "cluster.platform=tpu", "--set", "cluster.devices_per_process=4"),
         "devices_per_process", "a process asks for TPU 4, and no node of the Ray cluster"),
        (("--set", "cluster.cpus_per_process=3"),
         "cpus_per_process", "a process asks for CPU 3, and no node of the Ray cluster"),
        (("--set", "cluster.num_processes=3", "--set", "cluster.devices_per_process=1",
          "--set", "cluster.cpus_per_process=1.2", "--set", "train.global_batch_size=96"),
         "cpus_per_process", "3 bundles of CPU 1.2 do not fit: the nodes of the Ray cluster"),
        (("--set", "cluster.num_processes=4", "--set", "cluster.devices_per_process=1",
          "--set", "cluster.strategy=STRICT_SPREAD"),
         "strategy", "STRICT_SPREAD puts each of 4 bundles on a node of its own, and only 2 "
                     "nodes of the Ray cluster")]:
        result = launch("jobs/linear.yaml", "--cluster", cluster, "--run-dir", str(run_dir),
                        *args, timeout_s=120)
        assert result.returncode == 2, result.stdout[-3000:] + result.stderr
        assert f"cluster.{key}: {text} at {ray_env.address} (3 alive nodes: " in result.stderr, \
            result.stderr
        assert "Traceback" not in result.stderr and "step 1" not in result.stdout
        assert ray_env.left() == {"actors": [], "groups": []}


def test_a_group_the_cluster_cannot_hold_now_waits_with_a_count_down(tmp_path, ray_env):
    with ray_env.holding([{"CPU": 2}, {"CPU": 2}]):  # other work holds every CPU
        result = launch("jobs/linear.yaml", "--cluster",
                        cluster_file(tmp_path, ray_env, placement_timeout_s=7),
                        "--run-dir", str(tmp_path / "run"), timeout_s=120)
    assert result.returncode == 1, result.stdout[-3000:] + result.stderr
    said = re.findall(r"^podlaunch: waiting for the Ray cluster to reserve 2 bundles \(CPU 1 "
                      r"each\): (\d) s left \(cluster\.placement_timeout_s\)$", result.stdout, re.M)
    assert len(said) == 2 and int(said[0]) > int(said[1]), result.stdout  # at 1 s, then 6 s
    assert (f"the Ray cluster at {ray_env.address} did not reserve the run's 2 bundles (CPU 1 "
            "each, SPREAD) in 7 s: other work holds what it needs (free now: ") in result.stderr, \
        result.stderr
    assert "Traceback" not in result.stderr and "step 1" not in result.stdout


def test_a_worker_killed_mid_run_restarts_to_the_uninterrupted_params(tmp_path, ray_env,
                                                                      reference_params):
    run_dir = tmp_path / "run"
    result = launch("jobs/linear.yaml", "--cluster", cluster_file(tmp_path, ray_env,
                                                                 devices_per_process=1),
                    "--set", f"train.num_steps={STEPS}", "--set", "logging.log_every_steps=5",
                    "--set", "checkpoint.every_steps=5", "--set", "restarts.backoff_s=0.2",
                    *fault("sigkill", 17), "--run-dir", str(run_dir), timeout_s=240)
    out = result.stdout
    assert result.returncode == 0, out[-4000:] + result.stderr
    assert re.search(r"attempt 0 failed: process_id 1 on 127\.0\.0\.[23] was killed by SIGKILL "
                     r".*\[infrastructure\]; restarting from the latest checkpoint", out), out
    assert re.search(r"^\[p0 127\.0\.0\.[23]\] resumed from the checkpoint of step 15 "
                     r"\(attempt 1\)", out, re.M), out
    assert_same_params(params(run_dir), reference_params(
        "--set", f"train.num_steps={STEPS}", "--set", "cluster.devices_per_process=1",
        "--set", "logging.log_every_steps=5", "--set", "checkpoint.every_steps=5",
        "--set", "restarts.backoff_s=0.2"))
    assert not run_pids(str(run_dir))


def test_a_killed_launcher_leaves_no_actor_group_or_process(tmp_path, ray_env):
    run_dir = tmp_path / "run"
    with launched("jobs/linear.yaml", "--cluster", cluster_file(tmp_path, ray_env,
                                                               devices_per_process=1),
                  *COMMON, "--set", "train.num_steps=100000", "--run-dir", str(run_dir)) as out:
        out.wait_for(r"^\[p0 127\.0\.0\.[23]\] step 10/", 180)
        assert len(run_pids(str(run_dir))) == 2
        out.proc.send_signal(signal.SIGKILL)
        out.proc.wait(10)
    deadline = time.monotonic() + 60  # Ray tells the driver's end, then kills its actors
    while (run_pids(str(run_dir)) or ray_env.left() != {"actors": [], "groups": []}) \
            and time.monotonic() < deadline:
        time.sleep(1)
    assert not run_pids(str(run_dir))
    assert ray_env.left() == {"actors": [], "groups": []}


def test_a_worker_node_stopped_mid_run_restarts_from_the_agreed_checkpoint(tmp_path, ray_env,
                                                                          reference_params):
    """Process 1's node (its raylet and every process of it) SIGKILLed at step 10 or after: its
    actor is reported gone, an infrastructure fault; the group's bundle is placed again on the
    node left and the run resumes from its newest checkpoint, ending at the uninterrupted
    params."""
    run_dir = tmp_path / "run"
    with launched("jobs/linear.yaml", "--cluster", cluster_file(tmp_path, ray_env,
                                                               devices_per_process=1),
                  *COMMON, *SLOWER, "--show", "all", "--run-dir", str(run_dir)) as out:
        node = out.wait_for(r"^\[p1 (127\.0\.0\.[23])\] step 10/", 180)
        node = re.search(r"^\[p1 (127\.0\.0\.[23])\] step 10/", node, re.M)[1]
        ray_env.stop_node(node)
        code, text = out.finish(240)
    assert code == 0, text[-5000:]
    assert re.search(rf"process_id 1 on {re.escape(node)} (was lost|.*) .*\[infrastructure\]",
                     text), text[-5000:]
    assert re.search(r"attempt 1 \(infrastructure restart 1 of 10.*\): starting 2 processes",
                     text), text[-5000:]
    assert re.search(r"resumed from the checkpoint of step (10|15|20|25|30|35) \(attempt 1\)",
                     text), \
        text[-5000:]
    assert_same_params(params(run_dir), reference_params(
        *COMMON, "--set", "cluster.devices_per_process=1"))
    assert not run_pids(str(run_dir))
