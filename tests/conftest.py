"""The suite's floor plan.

Folders by the product's rooms: ``spec/`` (loading and checking the spec, messages,
versions), ``worker/`` (the worker's parts, a folder each: ``contract/``, ``data/``,
``trainer/``, ``recovery/``, ``runtime/``; and a program's helper), ``run/`` (supervision,
failure classes, restarts, interrupts, notices), ``rundir/`` (the run directory's files: the
journal, the ledger, the lock, what is trusted in it, a resume's changes), ``console/`` (what
the user sees: the first screen, the status line, the summary, next steps), ``commands/``
(the commands by run: detach, logs, stop, tensorboard, stacks, profile),
``backends/{local,ssh,tpu,slurm}/`` (single-host
runs, ...), ``fitness/`` (the house's own rules: the backend seam, the import floors, the
settings table); ``harness/`` is the
package the tests share (sshd hosts, a Slurm cluster, network namespaces, the fake gcloud,
the ``launch`` helpers) and ``programs/`` the user tasks and programs the tests run (on the
workers' PYTHONPATH).

Shared session-scoped fixtures, one per pytest-xdist worker: ``sshd_hosts`` (five sshd
hosts, restored after each test that takes ``ssh_hosts``, ``two_ssh_hosts`` or
``five_ssh_hosts``), ``slurm``
(a Slurm cluster), ``reference_run`` and ``reference_params`` (uninterrupted runs, each set of
arguments run once).

Markers by what a test starts, set from its fixtures (so no test can forget its marker):

* ``sshd``: real OpenSSH servers on loopback addresses (``sshenv``);
* ``slurm``: a real Slurm cluster on this machine (``slurmenv``);
* ``netns``: network namespaces (``netns``: a host that is really another machine);
* ``slow``: any of those, or real JAX worker processes (set by hand on the files and
  tests that launch workers).

``pytest -m "not slow"`` is the quick loop (seconds); ``-m "not sshd and not slurm"``
runs without system services; ``.ci/run`` runs everything.
"""

import atexit
import fcntl
import hashlib
import inspect
import json
import os
import shutil
import sys
import tempfile

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from harness import slurmenv, sshenv  # noqa: E402  (after the path is set)
from harness import helpers  # noqa: E402

# this venv's own `launch` on PATH, as after `source .venv/bin/activate` (the launches the tests
# start get it from helpers.env_for_tests): next steps are written as `launch ...`
os.environ["PATH"] = os.pathsep.join([os.path.dirname(sys.executable), os.environ.get("PATH", "")])
# the user's podlaunch state (the key that seals detached runs' journals, the index of runs) in
# a folder of this test process's own (0700, made here): the suite's runs never fill the
# developer's `launch runs`, and every launch a test starts (helpers.env_for_tests) shares it;
# removed when this process exits (no run of the suite leaves a folder behind); beside pytest's
# own folders where .ci/run puts them (PYTEST_DEBUG_TEMPROOT, pytest's own variable)
os.environ["XDG_STATE_HOME"] = tempfile.mkdtemp(prefix="podlaunch-test-state-",
                                                dir=os.environ.get("PYTEST_DEBUG_TEMPROOT"))
atexit.register(shutil.rmtree, os.environ["XDG_STATE_HOME"], True)
from harness.helpers import launch  # noqa: E402
from harness.runs import params  # noqa: E402

# What a fixture starts, read from its source once: the harness it calls
STARTS = {"sshd": ("hosts_or_skip", "SshTestEnv("), "slurm": ("SlurmTestEnv(",),
          "netns": ("netns.", "namespaces="), "ray": ("RayTestEnv(",)}
_starts: dict = {}


def _what(fixturedef) -> set:
    func = fixturedef.func
    if func not in _starts:
        try:
            source = inspect.getsource(func)
        except (OSError, TypeError):
            source = ""
        _starts[func] = {mark for mark, words in STARTS.items() if any(w in source for w in words)}
    return _starts[func]


def pytest_configure(config):
    for mark, words in (("sshd", "real OpenSSH servers on loopback addresses"),
                        ("slurm", "a real Slurm cluster (slurmctld, slurmd, munge)"),
                        ("netns", "network namespaces (unshare -n)"),
                        ("ray", "a real Ray cluster (a head and two worker nodes on loopback)")):
        config.addinivalue_line("markers", f"{mark}: starts {words} (set from its fixtures)")


SLURM_TESTS = os.path.join("tests", "backends", "slurm", "")


def pytest_collection_modifyitems(config, items):
    for item in items:
        info = getattr(item, "_fixtureinfo", None)
        if info is None:
            continue
        marks = set()
        for name in info.names_closure:
            for fixturedef in info.name2fixturedefs.get(name, ()):
                marks |= _what(fixturedef)
        for mark in sorted(marks):
            item.add_marker(getattr(pytest.mark, mark))
        if marks:
            item.add_marker(pytest.mark.slow)
        # .ci/run collects the Slurm tests from their folder alone: one elsewhere never runs
        if "slurm" in marks and SLURM_TESTS not in str(item.path):
            raise pytest.UsageError(f"{item.nodeid} starts a Slurm cluster: put it under "
                                    "tests/backends/slurm/, where .ci/run collects them")


# ---- shared, session-scoped ---------------------------------------------------------
@pytest.fixture(scope="session", autouse=True)
def shared_compilation_cache(tmp_path_factory):
    """One JAX compilation cache for this pytest-xdist worker's launches
    (``helpers.SHARED_COMPILATION_CACHE``): local workers get it through ``env_for_tests``,
    the sshd hosts' sessions through their sshd_config."""
    helpers.SHARED_COMPILATION_CACHE = str(tmp_path_factory.mktemp("compilation-cache"))
    yield helpers.SHARED_COMPILATION_CACHE
    helpers.SHARED_COMPILATION_CACHE = None


@pytest.fixture
def own_compilation_cache(monkeypatch):
    """For a test of the job's own compilation cache (where it lies, what it counted): this
    test's local launches get no shared one (the sshd hosts' sessions still do)."""
    monkeypatch.setattr(helpers, "SHARED_COMPILATION_CACHE", None)


@pytest.fixture(scope="session")
def sshd_hosts(tmp_path_factory, shared_compilation_cache):
    """Five real sshd hosts on 127.0.0.2-6 for the session (this xdist worker's ports), their
    sessions with the worker's shared compilation cache in JAX_COMPILATION_CACHE_DIR."""
    with sshenv.hosts_or_skip(tmp_path_factory.mktemp("sshd"), 5,
                              set_env={"JAX_COMPILATION_CACHE_DIR": shared_compilation_cache}) as env:
        yield env


@pytest.fixture
def ssh_hosts(sshd_hosts):
    """The first four of the session's sshd hosts (127.0.0.2-5), restored after the test
    (``SshTestEnv.restore``)."""
    yield sshenv.Subset(sshd_hosts, 4)
    sshd_hosts.restore()


@pytest.fixture
def five_ssh_hosts(sshd_hosts):
    """All five of the session's sshd hosts (four and a spare), restored after the test."""
    yield sshd_hosts
    sshd_hosts.restore()


@pytest.fixture
def two_ssh_hosts(sshd_hosts):
    """The first two of the session's sshd hosts (127.0.0.2-3), restored after the test."""
    yield sshenv.Subset(sshd_hosts, 2)
    sshd_hosts.restore()


@pytest.fixture(scope="session")
def slurm():
    """A real Slurm cluster for the session: slurmctld and three slurmd (n1-n3), munged."""
    why = slurmenv.available()
    assert why is None, f"Slurm cannot run here: {why} (bash .ci/run installs it)"
    with slurmenv.SlurmTestEnv(num_nodes=3) as env:
        yield env


@pytest.fixture(scope="session")
def reference_run(tmp_path_factory):
    """``reference_run(*args)``: the run directory of an uninterrupted, successful
    ``launch jobs/linear.yaml ARGS`` (read it, never write it), each set of arguments run once
    in the session, whichever pytest-xdist worker asks first: the others wait on its lock and
    read its run (each worker ran its own before, up to three runs of one reference)."""
    base = tmp_path_factory.getbasetemp()
    # this session's: an xdist worker's base is popen-gwN inside it. Not PYTEST_XDIST_WORKER,
    # which .ci/newest_end.sh sets without xdist for its ports: the parent was then
    # /tmp/pytest-of-USER itself, and a later session reused a reference an older tree ran
    shared = base.parent if base.name.startswith("popen-gw") else base

    def get(*args: str):
        key = hashlib.sha256(json.dumps(args).encode()).hexdigest()[:16]
        run_dir = shared / f"reference-{key}" / "run"
        with open(shared / f"reference-{key}.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # released when closed, or when its worker dies
            passed = run_dir.parent / "passed"
            if not passed.exists():
                shutil.rmtree(run_dir, ignore_errors=True)  # a worker that failed or died
                result = launch("jobs/linear.yaml", *args, "--run-dir", str(run_dir))
                assert result.returncode == 0, result.stdout[-3000:] + result.stderr
                passed.touch()
        return run_dir
    return get


@pytest.fixture(scope="session")
def reference_params(reference_run):
    """``reference_params(*args)``: the final params of ``reference_run(*args)`` (a name ->
    array dict)."""
    done: dict = {}

    def get(*args: str) -> dict:
        if args not in done:
            done[args] = params(reference_run(*args))
        return done[args]
    return get
