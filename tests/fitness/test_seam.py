"""The backend seam: the pure plan over placements, the registry, and what no module may do.

No process is started here: these are the launcher's own contracts, checked in
milliseconds.
"""

from __future__ import annotations

import ast
import glob
import dataclasses
import os
import re

import pytest

from launcher import backends, plan as planning, spec as specs
from launcher.backends.base import Backend, ClusterSettings, Options, Session
from launcher.errors import SpecError
from worker import contract

from harness.helpers import REPO, launch, pids_with_env, run_pids

LAUNCHER = os.path.join(REPO, "launcher")


def _job(tmp_path, cluster: str = "", extra: str = "") -> specs.JobSpec:
    path = tmp_path / "job.yaml"
    path.write_text("name: seam\ntrain: {num_steps: 2, global_batch_size: 24}\n" + extra
                    + (f"cluster:\n{cluster}" if cluster else ""))
    return specs.load(str(path), registry=backends)


def _placement(host: str, num_processes: int, **kw) -> planning.Placement:
    return planning.Placement(host=host, num_processes=num_processes, local_device_count=2,
                              platform=kw.pop("platform", "cpu"), python="py",
                              run_dir=f"/remote/{host}/run", job_path=f"/remote/{host}/job.json",
                              **kw)


# ---- the plan ----------------------------------------------------------------------
def test_make_plan_assigns_dense_ids_in_placement_order(tmp_path):
    job = _job(tmp_path, "  num_processes: 6\n  devices_per_process: 2\n")
    placements = [_placement("a", 1), _placement("b", 3, env={"ONLY_B": "1"}), _placement("c", 2)]
    plan = planning.make_plan(job, placements, "/local/run", "10.0.0.1:1234")
    assert [p.process_id for p in plan.processes] == [0, 1, 2, 3, 4, 5]
    assert [p.host for p in plan.processes] == ["a", "b", "b", "b", "c", "c"]
    assert [p.label for p in plan.processes][:2] == ["p0 a", "p1 b"]
    for p in plan.processes:
        assert p.env[contract.PROCESS_ID] == str(p.process_id)
        assert p.env[contract.NUM_PROCESSES] == "6"
        assert p.env[contract.COORDINATOR_ADDRESS] == "10.0.0.1:1234"
        # each host's workers see that host's paths; the log stays on this machine
        assert p.env[contract.RUN_DIR] == f"/remote/{p.host}/run"
        assert p.env[contract.JOB] == f"/remote/{p.host}/job.json"
        assert p.log_path == f"/local/run/logs/process-{p.process_id:03d}.log"
        assert ("ONLY_B" in p.env) == (p.host == "b")
        assert p.argv == ("py", "-P", "-m", "worker", "--job", job.name, "--run", "run",
                          "--process-id", str(p.process_id))
    assert [p.process_id for p in plan.on_host(1)] == [1, 2, 3]
    assert [p.process_id for p in plan.on_host(2)] == [4, 5]


def test_make_plan_sets_cpu_devices_only_for_cpu_and_refuses_a_wrong_count(tmp_path):
    job = _job(tmp_path, "  num_processes: 2\n  devices_per_process: 2\n")
    plan = planning.make_plan(job, [_placement("a", 1), _placement("b", 1, platform="tpu")],
                              "/r", "h:1")
    assert plan.processes[0].env["JAX_NUM_CPU_DEVICES"] == "2"
    assert "JAX_PLATFORMS" not in plan.processes[1].env
    assert plan.processes[1].env[contract.PLATFORM] == "tpu"
    with pytest.raises(ValueError, match="placements hold 3 processes, the spec 2"):
        planning.make_plan(job, [_placement("a", 3)], "/r", "h:1")


def test_the_plan_is_data_only(tmp_path):
    """No live resource in a plan: every field is plain data (it prints, compares, copies)."""
    job = _job(tmp_path, "  num_processes: 2\n  devices_per_process: 2\n")
    plan = planning.make_plan(job, [_placement("a", 2)], "/r", "h:1")
    plain = (str, int, float, bool, tuple, dict, type(None))
    for obj in (plan, *plan.processes, *plan.placements):
        for f in dataclasses.fields(obj):
            value = getattr(obj, f.name)
            assert isinstance(value, plain) or value is job, (type(obj).__name__, f.name, value)
    assert dataclasses.replace(plan) == plan


def test_for_attempt_changes_logs_and_resume_only(tmp_path):
    job = _job(tmp_path, "  num_processes: 2\n  devices_per_process: 2\n")
    plan = planning.make_plan(job, [_placement("a", 2)], "/r", "h:1")
    again = planning.for_attempt(plan, 2, resume=True)
    assert [p.log_path for p in again.processes] == ["/r/logs/attempt-2/process-000.log",
                                                     "/r/logs/attempt-2/process-001.log"]
    assert {p.env[contract.ATTEMPT] for p in again.processes} == {"2"}
    assert {p.env[contract.RESUME] for p in again.processes} == {"1"}
    assert [p.process_id for p in again.processes] == [0, 1]


# ---- the registry ------------------------------------------------------------------
@pytest.mark.parametrize("name", backends.names())
def test_every_registered_backend_is_complete(name):
    backend = backends.get(name)
    assert isinstance(backend, Backend)
    assert backend.name == name
    assert issubclass(backend.cluster_type, ClusterSettings)
    assert dataclasses.is_dataclass(backend.cluster_type)
    # the cluster type declares the backend it belongs to
    backend_field = {f.name: f for f in dataclasses.fields(backend.cluster_type)}["backend"]
    assert backend_field.default == name
    # its settings' pages exist (tests/spec/test_spec.py holds every field to them)
    assert backend.docs and all(os.path.isfile(os.path.join(REPO, d)) for d in backend.docs)


def test_an_unknown_backend_is_bad_input_listing_the_registered_ones(tmp_path):
    with pytest.raises(SpecError) as err:
        _job(tmp_path, "  backend: slurmm\n")
    text = str(err.value)
    assert "cluster.backend" in text
    for name in backends.names():
        assert name in text


def test_local_session_plans_every_process_on_this_machine(tmp_path):
    job = _job(tmp_path, "  num_processes: 3\n  devices_per_process: 2\n  env: {X: 'y'}\n")
    backend = backends.for_job(job)
    session = backend.session(job, str(tmp_path / "run"), None, Options(python="/py"))
    assert isinstance(session, Session)
    try:
        plan = session.plan()
    finally:
        session.close()
    assert [p.process_id for p in plan.processes] == [0, 1, 2]
    assert {p.host for p in plan.processes} == {"localhost"}
    assert [p.label for p in plan.processes] == ["p0", "p1", "p2"]
    assert plan.coordinator_address.startswith("127.0.0.1:")
    assert all(p.env["X"] == "y" and p.argv[0] == "/py" for p in plan.processes)


def test_a_coordinator_port_in_use_is_refused_before_anything_starts(tmp_path):
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        run_dir = tmp_path / "run"
        result = launch("jobs/linear.yaml", "--set", f"cluster.coordinator_port={port}",
                        "--run-dir", str(run_dir), timeout_s=60)
        assert result.returncode == 2, result.stdout[-2000:] + result.stderr
        assert re.search(rf"cluster\.coordinator_port: port {port} is in use \(.*\) on 127\.0\.0\.1; "
                         r"pick another or use 0", result.stderr), result.stderr
        assert "step 1/" not in result.stdout and not run_pids(str(run_dir))


@pytest.mark.parametrize("given", ["job", "--set", "--cluster"])
def test_a_coordinator_port_in_use_is_named_where_it_was_set(tmp_path, given):
    # it named jobs/linear.yaml without a line, whichever of them set the port
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with open(os.path.join(REPO, "jobs", "linear.yaml"), encoding="utf-8") as f:
            text = f.read()
        job = tmp_path / "job.yaml"
        job.write_text(text.replace("  devices_per_process: 2\n",
                                    f"  devices_per_process: 2\n  coordinator_port: {port}\n"))
        line = job.read_text().splitlines().index(f"  coordinator_port: {port}") + 1
        cluster = tmp_path / "cluster.yaml"
        cluster.write_text(f"backend: local\nnum_processes: 2\ncoordinator_port: {port}\n")
        args, where = {
            "job": ([str(job)], f"{job}:{line}"),
            "--set": (["jobs/linear.yaml", "--set", f"cluster.coordinator_port={port}"], "--set"),
            "--cluster": (["jobs/linear.yaml", "--cluster", str(cluster)], f"{cluster}:3"),
        }[given]
        result = launch(*args, "--dry-run", timeout_s=60)
    assert result.returncode == 2, result.stdout[-2000:] + result.stderr
    assert f"error: {where}: cluster.coordinator_port: port {port} is in use " in result.stderr


def test_rehearse_on_a_non_tpu_backend_is_bad_input(tmp_path):
    job = _job(tmp_path)
    assert backends.for_job(job).rehearsal(job) is None  # the launch refuses the flag
    # what the refusal lists is the registry's: each backend that has a rehearsal says its own
    assert backends.rehearsing() == tuple(b.rehearses for b in map(backends.get, backends.names())
                                          if b.rehearses)
    assert "tpu" in backends.rehearsing()
    result = launch("jobs/linear.yaml", "--rehearse", "--kill-stale", "--dry-run", timeout_s=60)
    assert result.returncode == 2
    assert ("--rehearse: only applies to cluster.backend: " + ", or ".join(backends.rehearsing())
            + " (this job's is local on cpu); remove the flag") in result.stderr


# ---- what no module may do ----------------------------------------------------------
def _launcher_sources():
    for root, _, files in os.walk(LAUNCHER):
        for name in files:
            if name.endswith(".py"):
                path = os.path.join(root, name)
                with open(path, encoding="utf-8") as f:
                    yield os.path.relpath(path, REPO), f.read()


def test_no_code_outside_the_registry_names_a_backend():
    registry = os.path.join("launcher", "backends", "__init__.py")
    offenders = []
    for path, text in _launcher_sources():
        if path == registry:
            continue
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.Compare):
                parts = [node.left, *node.comparators]
                if any(isinstance(p, ast.Attribute) and p.attr == "backend" for p in parts):
                    offenders.append(f"{path}:{node.lineno}")
    assert not offenders, offenders


def test_no_module_probes_attributes_of_plans_workers_or_clusters():
    offenders = []
    for path, text in _launcher_sources():
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) \
                    and node.func.id in ("hasattr", "getattr") and node.args:
                target = ast.unparse(node.args[0])
                if re.search(r"plan|worker|cluster|session", target):
                    offenders.append(f"{path}:{node.lineno}: {ast.unparse(node)}")
    assert not offenders, offenders


ALARM_LINES = 400  # past it, a file says in one line at its top why it holds what it holds
CEILING_LINES = 600  # past it, no reason serves: split the file by what it holds
REASON = "# long: "


def _sizes() -> list:
    worker = [(os.path.relpath(p, REPO), open(p, encoding="utf-8").read())
              for p in glob.glob(os.path.join(REPO, "worker", "**", "*.py"), recursive=True)]
    return [(path, text.count("\n"), text) for path, text in [*_launcher_sources(), *worker]]


def test_a_module_over_the_alarm_says_why_at_its_top():
    # files are cut by what they hold, not trimmed to a number: one over the alarm keeps its
    # content whole and says so in its first line (`# long: <why>`); over the ceiling, none does
    unexplained = {path: lines for path, lines, text in _sizes() if lines > ALARM_LINES
                   and not (text.startswith(REASON) and text.split("\n", 1)[0][len(REASON):].strip())}
    assert not unexplained, (f"over {ALARM_LINES} lines without a first line "
                             f"'{REASON}<why it is one file>': {unexplained}")
    too_long = {path: lines for path, lines, _ in _sizes() if lines > CEILING_LINES}
    assert not too_long, too_long


def test_no_module_imports_another_modules_private_names():
    offenders = []
    for path, _, text in _sizes():
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.ImportFrom) and node.module \
                    and node.module.split(".")[0] in ("launcher", "worker", "podlaunch"):
                offenders += [f"{path}:{node.lineno}: {a.name}" for a in node.names
                              if a.name.startswith("_") and not a.name.startswith("__")]
    assert not offenders, offenders


def test_a_local_start_that_fails_leaves_no_started_worker_running(tmp_path):
    """Process 1 cannot start (its interpreter is missing): process 0, already started, is
    SIGKILLed and gone, its wrapper too, before ``start_all`` raises (as over ssh: a start that
    failed waits until the workers it killed are gone)."""
    import subprocess
    import sys

    from launcher.backends import local
    from launcher.errors import LaunchError

    def process(process_id, python):
        return planning.ProcessPlan(
            process_id=process_id, host="localhost", local_device_count=1,
            env={"PODLAUNCH_TEST_MARK": str(tmp_path)}, argv=(python, "-c", "import time; time.sleep(60)"),
            log_path=str(tmp_path / f"p{process_id}.log"), python=python, run_dir=str(tmp_path / "run"))

    plan = planning.Plan(job=None, run_dir=str(tmp_path), coordinator_address="127.0.0.1:1",
                         processes=(process(0, sys.executable), process(1, str(tmp_path / "no-python"))))
    with pytest.raises(LaunchError):
        local.start_all(plan)
    assert not pids_with_env("PODLAUNCH_TEST_MARK", str(tmp_path))
    assert not subprocess.run(["pgrep", "-f", str(tmp_path / "run")], capture_output=True).stdout



# ---- taking a run back: optional, composed ------------------------------------------
SEAM = ("close", "describe", "describe_start", "end_attempt", "failed", "plan", "prepare",
        "start", "succeeded")
REATTACHING = ("adopt", "handle", "handle_entry", "read_handle", "rejoin", "stop_strays")


def test_the_session_seam_is_what_every_backend_does_and_taking_a_run_back_is_an_object(tmp_path):
    """Taking a run back had widened the seam from 9 methods to 13 (and a flag) for one
    optional capability, the Slurm session's share a mixin reaching into its private state:
    it is a ``Reattach`` a session may hold, each backend's its own object."""
    import inspect

    from launcher.backends.base import Reattach

    assert tuple(sorted(n for n, _ in inspect.getmembers(Session, inspect.isfunction)
                        if not n.startswith("_"))) == SEAM
    for name in backends.names():  # each backend's session module, by the registry's name
        __import__(f"launcher.backends.{name}.session" if name != "local" else "launcher.backends.local")
    sessions = {cls for cls in _subclasses(Session) if cls.__module__.startswith("launcher.")}
    assert len(sessions) >= 5, sessions  # local, its rehearsal, ssh, tpu, slurm (and theirs)
    for cls in sessions:
        assert not {n for n in REATTACHING if n in vars(cls)}, cls  # never on the seam
        assert not any(issubclass(base, Reattach) for base in cls.__mro__), cls  # never mixed in
    reattaches = {cls.__name__ for cls in _subclasses(Reattach)}
    assert reattaches >= {"LocalReattach", "SshReattach", "SlurmReattach"}, reattaches


def _subclasses(cls) -> set:
    found = set()
    for sub in cls.__subclasses__():
        found |= {sub} | _subclasses(sub)
    return found



def test_no_module_re_exports_what_another_declares():
    """Names are imported from the module that declares them: a ``from X import name`` kept
    only for other modules to import through this one (marked ``noqa: F401``) hid where a
    name lives (seven did: the spec's checks, the data's, the local tier's base, an exit
    code; then two more under ``noqa: E402,F401``, the address and field helpers through the
    ``worker.contract`` package). A bare ``import jax`` done early for its side effect is not a
    re-export."""
    offenders = [f"{path}:{n + 1}" for path, _, text in _sizes()
                 for n, line in enumerate(text.splitlines())
                 if re.search(r"noqa:[\s\w,]*\bF401\b", line) and line.lstrip().startswith("from ")]
    assert not offenders, offenders


# ---- the contract for detached runs and take-backs (launcher.backends.base.Session) ---------
TAKE_BACK_OPTIONS = ("detached", "adopting")


def contract_gaps(folder: str) -> list:
    """What the backend whose code is under ``folder`` misses of the seam's contract for a
    detached run and a take-back (``Session``'s docstring), one sentence each: a session that
    sets a ``reattach`` reads both ``options.detached`` and ``options.adopting``; one that sets
    none reads neither (its processes end with their supervisor, detached or not)."""
    paths = sorted(glob.glob(os.path.join(folder, "**", "*.py"), recursive=True)) \
        if os.path.isdir(folder) else [folder]
    reattach, read = False, set()
    for path in paths:
        with open(path, encoding="utf-8") as f:
            tree = ast.parse(f.read())
        for node in ast.walk(tree):
            if isinstance(node, ast.Assign) and any(
                    isinstance(t, ast.Attribute) and t.attr == "reattach" for t in node.targets):
                reattach = reattach or not (isinstance(node.value, ast.Constant)
                                            and node.value.value is None)
            if isinstance(node, ast.Attribute) and node.attr in TAKE_BACK_OPTIONS \
                    and ast.unparse(node.value).endswith("options"):
                read.add(node.attr)
    if reattach:
        return [f"sets a Session.reattach but never reads options.{name}"
                for name in TAKE_BACK_OPTIONS if name not in read]
    return [f"reads options.{name} but sets no Session.reattach: its processes must end with "
            "their supervisor" for name in TAKE_BACK_OPTIONS if name in read]


def _code_of(name: str) -> str:
    """The folder (or the module) of backend ``name``'s code, from its registry entry."""
    import importlib.util

    found = importlib.util.find_spec(backends.REGISTRY[name].partition(":")[0])
    return found.submodule_search_locations[0] if found.submodule_search_locations \
        else found.origin


@pytest.mark.parametrize("name", backends.names())
def test_every_backend_keeps_the_whole_take_back_contract(name):
    assert contract_gaps(_code_of(name)) == []


def test_the_contract_check_names_what_a_new_backend_forgets(tmp_path):
    forgot = tmp_path / "forgot"
    forgot.mkdir()
    (forgot / "session.py").write_text(
        "class S:\n    def __init__(self):\n        self.reattach = R()\n"
        "    def start(self, plan):\n        return go(plan, self.options.detached)\n")
    assert contract_gaps(str(forgot)) == [
        "sets a Session.reattach but never reads options.adopting"]
    leaks = tmp_path / "leaks.py"
    leaks.write_text("class S:\n    reattach = None\n"
                     "    def start(self, plan):\n        return go(plan, self.options.detached)\n")
    assert contract_gaps(str(leaks)) == [
        "reads options.detached but sets no Session.reattach: its processes must end with "
        "their supervisor"]
    whole = tmp_path / "whole.py"
    whole.write_text(forgot.joinpath("session.py").read_text()
                     + "    def prepare(self, restart=False):\n"
                       "        return self.options.adopting and not restart\n")
    assert contract_gaps(str(whole)) == []
