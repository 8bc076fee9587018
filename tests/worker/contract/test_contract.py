"""The launcher -> worker contract: identity in the environment, the job in job.json.

Fast: no JAX. One test starts ``python -m worker``, which reads its identity
and job before it imports jax.
"""

import dataclasses
import json
import os
import subprocess
import sys
import textwrap

import pytest

from harness.helpers import REPO, env_for_tests
from harness.nosockets import loopback_down
from launcher import backends
from launcher.run import starts
from launcher import plan as planning
from launcher import spec as specs
from worker import contract
from worker.contract import ContractError, Identity
from worker.contract import job as jobs
from worker.contract import sections
from worker.contract.job import WorkerJob

LINEAR = os.path.join(REPO, "jobs", "linear.yaml")


def identity(**changes) -> Identity:
    fields = dict(coordinator_address="10.0.0.1:8476", num_processes=4, process_id=3,
                  local_device_count=2, platform="cpu", job_path="/runs/j/job.json",
                  run_dir="/runs/j")
    return Identity(**{**fields, **changes})


def linear_job() -> WorkerJob:
    return specs.load(LINEAR, registry=backends).job_file()


# ---- identity ---------------------------------------------------------------------------------
@pytest.mark.parametrize("optional", [
    {},
    {"attempt": 2, "resume": True, "cluster_detection_method": "gcetpu"},
    {"attempt": 1, "resume": False},
    {"compilation_cache_dir": "/runs/compilation-cache"},
    {"local_device_ids": (2, 3), "rendezvous": "stdin"},
])
def test_identity_round_trips_through_the_environment(optional):
    given = identity(**optional)
    env = given.to_env()
    assert all(isinstance(k, str) and isinstance(v, str) for k, v in env.items())
    assert env[contract.PROCESS_ID] == "3" and env[contract.JOB] == "/runs/j/job.json"
    assert Identity.from_env(env) == given
    # what the launcher's restart loop adds (attempt 0, no resume) reads as the defaults
    if not optional:
        assert contract.ATTEMPT not in env and contract.RESUME not in env
        assert Identity.from_env({**env, contract.ATTEMPT: "0", contract.RESUME: "0"}) == given


@pytest.mark.parametrize("name, value, said", [
    (contract.LOCAL_DEVICE_IDS, "0,x", "expected comma-separated integers"),
    (contract.RENDEZVOUS, "tcp", "rendezvous is 'tcp', expected 'stdin' or unset"),
])
def test_every_identity_field_is_typed_when_read(name, value, said):
    with pytest.raises(contract.ContractError, match=said):
        Identity.from_env({**identity().to_env(), name: value})


def test_the_plans_environment_is_the_identity_of_each_process(tmp_path):
    job = specs.load(LINEAR, registry=backends)
    placement = planning.Placement(host="localhost", num_processes=2, local_device_count=2,
                                   platform="cpu", python=sys.executable, run_dir=str(tmp_path),
                                   job_path=os.path.join(str(tmp_path), "job.json"))
    plan = planning.make_plan(job, [placement], str(tmp_path), "127.0.0.1:12345")
    for process in plan.processes:
        got = Identity.from_env(process.env)
        assert got == identity(coordinator_address="127.0.0.1:12345", num_processes=2,
                               process_id=process.process_id, local_device_count=2,
                               platform="cpu", job_path=plan.job_path, run_dir=str(tmp_path),
                               compilation_cache_dir=str(tmp_path / "compilation-cache"))


def _cache_dirs(local_run_dir: str, host_run_dir: str, *overrides: str) -> list:
    job = specs.load(LINEAR, overrides=list(overrides), registry=backends)
    placement = planning.Placement(host="h", num_processes=2, local_device_count=2,
                                   platform="cpu", python="python3", run_dir=host_run_dir,
                                   job_path=host_run_dir + "/job.json")
    plan = planning.make_plan(job, [placement], local_run_dir, "h:1")
    return [p.env.get(contract.COMPILATION_CACHE_DIR) for p in plan.processes]


def test_a_run_in_the_jobs_directory_shares_the_jobs_compilation_cache():
    # the default layout, locally: runs/<job>/compilation-cache, for every run of the job
    assert _cache_dirs("/w/runs/linear/20260101-000000-000", "/w/runs/linear/20260101-000000-000") \
        == ["/w/runs/linear/compilation-cache"] * 2
    # on another host (ssh, tpu): that host's <workdir>/runs/<job>/compilation-cache
    assert _cache_dirs("/w/runs/linear/r1", "/home/u/pl/runs/linear/r1") \
        == ["/home/u/pl/runs/linear/compilation-cache"] * 2
    # --run-dir elsewhere: the run's own, on every host (the remote one is in the layout)
    assert _cache_dirs("/tmp/x/mine", "/tmp/x/mine") == ["/tmp/x/mine/compilation-cache"] * 2
    assert _cache_dirs("/tmp/x/mine", "/home/u/pl/runs/linear/mine") \
        == ["/home/u/pl/runs/linear/mine/compilation-cache"] * 2
    # runs/ of another job's name, or a directory named like a job outside runs/: the run's own
    assert _cache_dirs("/w/runs/other/r1", "/w/runs/other/r1") == ["/w/runs/other/r1/compilation-cache"] * 2
    assert _cache_dirs("/w/linear/r1", "/w/linear/r1") == ["/w/linear/r1/compilation-cache"] * 2
    # train.compilation_cache false: none named (the worker uses none)
    assert _cache_dirs("/w/runs/linear/r1", "/w/runs/linear/r1",
                       "train.compilation_cache=false") == [None, None]


@pytest.mark.parametrize("change, message", [
    ({contract.PROCESS_ID: None}, "missing environment PODLAUNCH_PROCESS_ID: start workers with `launch`"),
    ({contract.RUN_DIR: ""}, "missing environment PODLAUNCH_RUN_DIR"),
    ({contract.NUM_PROCESSES: "four"}, "PODLAUNCH_NUM_PROCESSES='four' is not an integer"),
    ({contract.ATTEMPT: "x"}, "PODLAUNCH_ATTEMPT='x' is not an integer"),
    ({contract.RESUME: "yes"}, "PODLAUNCH_RESUME='yes', expected 0 or 1"),
    ({contract.PROCESS_ID: "4"}, "process_id 4 is outside 0..3"),
    ({contract.PROCESS_ID: "-1"}, "process_id -1 is outside 0..3"),
    ({contract.LOCAL_DEVICE_COUNT: "0"}, "local_device_count is 0, expected >= 1"),
])
def test_a_missing_or_malformed_identity_is_a_contract_error(change, message):
    env = identity().to_env()
    for name, value in change.items():
        if value is None:
            del env[name]
        else:
            env[name] = value
    with pytest.raises(ContractError) as err:
        Identity.from_env(env)
    assert message in str(err.value)


def test_an_identity_checks_its_types():
    with pytest.raises(ContractError, match=r"process_id: expected int, got '3' \(str\)"):
        identity(process_id="3")
    with pytest.raises(ContractError, match=r"resume: expected bool, got 1 \(int\)"):
        identity(resume=1)


# ---- the job ----------------------------------------------------------------------------------
def test_a_real_spec_round_trips_through_job_json(tmp_path):
    job = linear_job()
    assert job.name == "linear"
    assert job.train == sections.Train(num_steps=100, global_batch_size=256, seed=0,
                                            steps_per_call="auto", allreduce="packed",
                                            parallelism="auto", compilation_cache=True)
    assert job.optimizer.learning_rate == 0.1 and job.optimizer.momentum is None
    assert job.data.noise_std == 0.1 and job.data.path is None
    path = str(tmp_path / "job.json")
    job.to_json(path)
    assert WorkerJob.from_json(path) == job
    assert WorkerJob.from_dict(json.loads(json.dumps(job.to_dict()))) == job


def test_job_json_holds_exactly_the_workers_keys():
    resolved = specs.load(LINEAR, registry=backends).to_dict()
    sent = linear_job().to_dict()
    assert list(sent) == ["name", "secrets", "task", "data", "optimizer", "train", "logging", "distributed",
                          "checkpoint", "watchdog", "profile"]
    assert "cluster" in resolved and "restarts" in resolved  # in the spec, not sent
    assert "global_batch_size" not in sent  # only train.global_batch_size
    for section, values in sent.items():  # each section whole: a projection of the spec
        if isinstance(values, dict):
            assert values == resolved[section], section


def test_each_job_section_is_declared_once_for_launcher_and_worker():
    # issue 24: a setting such as data.resident is one field declaration, the launcher's
    # spec section and the worker's job.json section being the same class; issue 47: with
    # one name, worker.contract.sections'
    from launcher.spec.programspec import ProgramSpec
    from worker.contract import sections
    from worker.contract.fields import hints_of

    spec_side, worker_side = hints_of(specs.TrainerJobSpec), hints_of(WorkerJob)
    for name, shared in (("task", sections.Task), ("data", sections.Data),
                         ("optimizer", sections.Optimizer), ("train", sections.Train),
                         ("logging", sections.Logging), ("distributed", sections.Distributed),
                         ("checkpoint", sections.Checkpoint), ("watchdog", sections.Watchdog),
                         ("profile", sections.Profile)):
        assert spec_side[name] is worker_side[name] is shared, name
    assert issubclass(ProgramSpec, sections.ProgramSteps)
    assert hints_of(jobs.ProgramJob)["program"] is sections.ProgramSteps
    # every field of the worker's side is declared in worker/contract/sections.py, none in job.py
    import inspect
    source = inspect.getsource(jobs)
    for name in ("resident", "compilation_cache", "shuffle_seed", "num_steps"):
        assert f"{name}:" not in source, name


def test_the_launcher_writes_job_json_through_the_contract(tmp_path):
    placement = planning.Placement(host="localhost", num_processes=2, local_device_count=2,
                                   platform="cpu", python=sys.executable, run_dir=str(tmp_path),
                                   job_path=os.path.join(str(tmp_path), "job.json"))
    plan = planning.make_plan(specs.load(LINEAR,
                                         registry=backends), [placement], str(tmp_path), "127.0.0.1:1")
    starts.write_run_files(plan)
    assert os.stat(plan.job_path).st_mode & 0o777 == 0o600  # it may hold the task's secrets
    with open(plan.job_path, encoding="utf-8") as f:
        assert set(json.load(f)) == {field.name for field in dataclasses.fields(WorkerJob)}
    assert WorkerJob.from_json(plan.job_path) == linear_job()


def test_the_spec_defaults_reach_the_worker(tmp_path):
    path = tmp_path / "bare.yaml"
    path.write_text(textwrap.dedent("""\
        name: bare
        train:
          num_steps: 5
          global_batch_size: 64
        """))
    job = specs.load(str(path), registry=backends).job_file()
    # the spec's defaults (launcher/spec/__init__.py), not the worker's old fallbacks (every 0, keep 1)
    assert job.checkpoint == sections.Checkpoint(every_steps=1000, keep=3)
    assert job.watchdog.stall_timeout_s == 300.0
    assert job.logging == sections.Logging(log_every_steps=10, tensorboard=True,
                                                 on_nonfinite_loss="stop")
    assert job.task == sections.Task(name="linear_regression", args={})


def test_a_missing_key_is_named_by_its_dotted_key():
    d = linear_job().to_dict()
    del d["checkpoint"]["keep"]
    del d["watchdog"]
    with pytest.raises(ContractError) as err:
        WorkerJob.from_dict(d)
    assert "checkpoint.keep: missing" in str(err.value)
    assert "watchdog: missing" in str(err.value)


def test_an_unknown_key_is_named_by_its_dotted_key():
    d = linear_job().to_dict()
    d["train"]["num_stepz"] = 5
    d["global_batch_size"] = 256  # what job.json used to carry
    d["watchdog"]["first_step_timeouts"] = 900.0
    with pytest.raises(ContractError) as err:
        WorkerJob.from_dict(d)
    for key in ("train.num_stepz", "global_batch_size", "watchdog.first_step_timeouts"):
        assert f"{key}: unknown key" in str(err.value)


@pytest.mark.parametrize("section, key, value, message", [
    ("train", "num_steps", "100", "train.num_steps: expected int, got '100' (str)"),
    ("train", "num_steps", True, "train.num_steps: expected int, got True (bool)"),
    ("train", "seed", 1.5, "train.seed: expected int, got 1.5 (float)"),
    ("optimizer", "momentum", "high", "optimizer.momentum: expected float or null, got 'high' (str)"),
    ("logging", "tensorboard", "yes", "logging.tensorboard: expected bool, got 'yes' (str)"),
    ("task", "args", [], "task.args: expected dict, got [] (list)"),
    ("data", "source", "ftp", "data.source: expected 'synthetic' or 'file', got 'ftp' (str)"),
    ("train", "parallelism", "pjit", "train.parallelism: expected 'auto' or 'pmap' or 'jit', got 'pjit'"),
])
def test_a_value_of_the_wrong_type_is_named_by_its_dotted_key(section, key, value, message):
    d = linear_job().to_dict()
    d[section][key] = value
    with pytest.raises(ContractError) as err:
        WorkerJob.from_dict(d)
    assert message in str(err.value)


def test_numbers_and_nulls_the_spec_allows_are_accepted():
    d = linear_job().to_dict()
    d["optimizer"]["learning_rate"] = 1  # an int is a float
    d["optimizer"]["momentum"] = 0.9
    d["watchdog"]["stall_timeout_s"] = None  # watchdog off
    d["task"]["args"] = {"anything": [1, {"nested": None}]}  # user data, passed as is
    job = WorkerJob.from_dict(d)
    assert job.optimizer.learning_rate == 1 and job.watchdog.stall_timeout_s is None
    assert job.task.args == {"anything": [1, {"nested": None}]}


def test_a_section_that_is_not_a_mapping_and_a_file_that_is_not_json(tmp_path):
    d = linear_job().to_dict()
    d["logging"] = 10
    with pytest.raises(ContractError, match=r"logging: expected a mapping, got 10 \(int\)"):
        WorkerJob.from_dict(d)
    bad = tmp_path / "job.json"
    bad.write_text('{"name": ')
    with pytest.raises(ContractError, match="job.json: not JSON"):
        WorkerJob.from_json(str(bad))


def test_a_job_file_without_a_worker_key_is_a_contract_error():
    d = linear_job().to_dict()
    del d["distributed"]["heartbeat_timeout_s"]
    with pytest.raises(ContractError, match="distributed.heartbeat_timeout_s: missing"):
        WorkerJob.from_dict(d)


def test_a_worker_given_a_job_json_that_breaks_the_contract_exits_with_the_mismatch_code(tmp_path):
    d = linear_job().to_dict()
    d["restarts"] = {"max_restarts": 0}
    job_path = tmp_path / "job.json"
    job_path.write_text(json.dumps(d))
    env = env_for_tests(**identity(num_processes=1, process_id=0, job_path=str(job_path),
                                   run_dir=str(tmp_path)).to_env())
    done = subprocess.run([sys.executable, "-m", "worker"], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == contract.EXIT_MISMATCH, done.stdout + done.stderr
    assert f"worker: {job_path}: job: restarts: unknown key" in done.stdout


def test_the_parallelism_is_a_value_named_by_train_parallelism():
    # issue 24: chosen by name, told apart by its fields, never by a module's __name__
    from worker.trainer import parallelism, sharded, train

    pmap, jit = parallelism.of("pmap"), parallelism.of("jit")
    assert (pmap.name, pmap.description, pmap.make_train_step) == ("pmap", "", train.make_train_step)
    assert (jit.name, jit.replicate) == ("jit", sharded.replicate) and "jax.jit" in jit.description
    with pytest.raises(ValueError, match="expected 'auto', 'pmap' or 'jit'"):
        parallelism.of("pjit")
    # auto: the seed's pmap, but jit in one process of one device, and for fused calls in one
    # process or one device per process
    assert parallelism.of("auto").name == "jit"
    assert parallelism.of("auto", num_processes=2).name == "pmap"
    assert parallelism.of("auto", local_device_count=2).name == "pmap"
    assert parallelism.of("auto", steps_per_call=100, num_processes=1, local_device_count=4).name == "jit"
    assert parallelism.of("auto", steps_per_call=100, num_processes=4, local_device_count=1).name == "jit"
    assert parallelism.of("auto", steps_per_call=100, num_processes=2, local_device_count=2).name == "pmap"


def test_the_refusal_tables_process_ids_are_the_plans():
    """``preflight.labels`` numbers each host's processes without building a plan: the
    same ids as ``make_plan`` for hosts of 1, 3 and 2 processes."""
    from launcher.backends.ssh import preflight

    job = specs.load(LINEAR, overrides=["cluster.num_processes=6", "cluster.devices_per_process=1",
                                          "train.global_batch_size=252"], registry=backends)
    placements = [planning.Placement(host=f"h{i}", num_processes=n, local_device_count=1,
                                     platform="cpu", python="python3", run_dir="/r",
                                     job_path="/r/job.json") for i, n in enumerate((1, 3, 2))]
    plan = planning.make_plan(job, placements, "/r", "h0:1")
    want = [",".join(f"p{p.process_id}" for p in plan.on_host(i)) for i in range(3)]
    assert preflight.labels(job, placements) == want == ["p0", "p1,p2,p3", "p4,p5"]


def test_a_process_waits_for_the_coordinators_port_before_joining():
    """Joining before process 0's coordination service listens cost up to seconds: gRPC
    retries a refused connection on its reconnect backoff (1 s, growing). Every other
    process first waits for the port to accept a plain connection: it returns once the
    port opens (here 0.3 s after the call, long before the 30 s timeout), and False at
    the timeout when nothing ever listens (JAX's initialize then reports its own error)."""
    import socket
    import threading
    import time

    from worker.runtime import joining

    probe = socket.socket()
    probe.bind(("127.0.0.1", 0))
    port = probe.getsockname()[1]
    probe.close()  # a port nobody listens on, for now
    server = socket.socket()
    server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    opener = threading.Timer(0.3, lambda: (server.bind(("127.0.0.1", port)), server.listen()))
    began = time.monotonic()  # before the timer starts: it opens the port 0.3 s after this at the
    opener.start()            # earliest (taken after, a loaded machine measured 0.246 s)
    try:
        assert joining.wait_for_coordinator(f"127.0.0.1:{port}", 30.0)
        assert 0.29 < time.monotonic() - began < 15.0  # the open port, not the timeout
    finally:
        opener.join()
        server.close()
    clock = iter([0.0, 0.0, 0.1, 0.2, 0.3]).__next__  # the deadline 0.25 s, passed at once
    assert not joining.wait_for_coordinator(f"127.0.0.1:{port}", 0.25, clock=clock,
                                            sleep=lambda s: None)


def test_a_coordinator_this_host_cannot_reach_ends_the_wait_at_once():
    """With the loopback interface down (unshare -n), connect() to 127.0.0.1 fails with
    ENETUNREACH: every process waited out initialization_timeout_s (60 s by default), then
    the launcher blamed firewalls. Such an error ends the wait at once, with its meaning."""
    code = textwrap.dedent("""
        import time
        from worker.runtime import joining
        began = time.monotonic()
        try:
            joining.wait_for_coordinator("127.0.0.1:23456", 20.0)
        except joining.Unreachable as exc:
            print(f"{time.monotonic() - began:.2f} {exc}")
    """)
    done = subprocess.run(loopback_down() + [sys.executable, "-c", code], cwd=REPO,
                          env=env_for_tests(), capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    took, _, said = done.stdout.strip().partition(" ")
    assert float(took) < 5.0, done.stdout
    assert said == ("the coordinator at 127.0.0.1:23456 cannot be reached from this host (Network "
                    "is unreachable, errno 101): the loopback interface is down here (ip link set "
                    "lo up), or a sandbox forbids it; waiting would not change that")


@pytest.mark.parametrize("name", ["linear", "digits", "diabetes", "mlp_digits", "seed_program"])
def test_job_json_is_made_from_the_typed_spec_as_the_dict_round_trip_made_it(name):
    # issue 47.3: the job file is taken from the spec's own section objects; what it holds is
    # what the spec's dict holds at each of the worker's keys
    job = specs.load(os.path.join(REPO, "jobs", f"{name}.yaml"), registry=backends)
    kind = jobs.ProgramJob if isinstance(job, specs.ProgramJobSpec) else WorkerJob
    made = job.job_file()
    assert type(made) is kind
    written, resolved = made.to_dict(), json.loads(json.dumps(job.to_dict()))
    for key, value in written.items():
        assert value == ({k: resolved[key][k] for k in value} if isinstance(value, dict)
                         else resolved[key]), key
    assert made == kind.from_dict(json.loads(json.dumps(made.to_dict())))  # as a worker reads it


def test_the_built_in_tasks_arguments_checked_before_a_start_are_their_functions():
    """``worker.contract.tasks`` (read by the spec's checks, without jax) says what each
    built-in task takes; the functions in ``worker.tasks`` are what the workers call."""
    import inspect

    from worker import tasks
    from worker.contract.tasks import BUILTIN_TASK_ARGS

    assert set(BUILTIN_TASK_ARGS) == set(tasks.BUILTIN)
    for name, factory in tasks.BUILTIN.items():
        parameters = inspect.signature(factory).parameters
        assert {arg: p.default is inspect.Parameter.empty for arg, p in parameters.items()} == {
            arg: required for arg, (required, _) in BUILTIN_TASK_ARGS[name].items()}, name
