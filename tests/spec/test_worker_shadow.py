"""A package named ``worker`` on the workers' PYTHONPATH must not replace podlaunch's worker
(issue 51.7): refused before anything starts, on this machine (local, Slurm, the TPU
rehearsal) by the spec check, on SSH hosts by their preflight. No JAX, no sshd."""

from __future__ import annotations

import os
import subprocess
import sys
import types

import pytest

from harness.helpers import LAUNCH, REPO, env_for_tests
from launcher import backends
from launcher import remote
from launcher.backends.ssh import preflight as ssh_preflight
from launcher.remote import preflight

ARGS = {"modules": ["worker.trainer.main"], "port": None, "kill_stale": False, "grace_s": 1,
        "state_dir": "none", "run_dir_env": "PODLAUNCH_RUN_DIR"}


@pytest.fixture
def shadow(tmp_path):
    """A user's library directory holding its own package named worker."""
    lib = tmp_path / "lib"
    (lib / "worker").mkdir(parents=True)
    (lib / "worker" / "__init__.py").write_text("")
    (lib / "worker" / "main.py").write_text("print('not podlaunch')\n")
    return lib


def test_a_local_job_with_a_worker_package_on_its_pythonpath_is_refused(tmp_path, shadow):
    done = subprocess.run(LAUNCH + ["jobs/linear.yaml", "--set", f"cluster.env.PYTHONPATH={shadow}",
                                    "--run-dir", str(tmp_path / "run")],
                          cwd=REPO, env=env_for_tests(), capture_output=True, text=True,
                          timeout=120, stdin=subprocess.DEVNULL)
    assert done.returncode == 2, done.stdout + done.stderr
    assert (f"--set: cluster.env.PYTHONPATH: {shadow}/worker is a module named worker on the "
            f"workers' cluster.env.PYTHONPATH (in {shadow}), before podlaunch's") in done.stderr
    assert "Traceback" not in done.stderr and not (tmp_path / "run").exists()


def test_podlaunch_first_on_the_pythonpath_is_fine(tmp_path, shadow):
    from launcher import spec as specs
    from launcher.spec import checks

    job = specs.load(os.path.join(REPO, "jobs/linear.yaml"), None,
                     (f"cluster.env.PYTHONPATH={REPO}{os.pathsep}{shadow}",), registry=backends)
    checks.check_worker_is_podlaunchs(job)  # podlaunch's comes first: nothing to refuse


def _preflight_facts(tmp_path, pythonpath: str) -> dict:
    argv = remote.python_call(sys.executable, "preflight", ARGS)
    done = subprocess.run(argv, cwd=tmp_path, capture_output=True, text=True, timeout=60,
                          env={"PATH": os.environ["PATH"], "PYTHONPATH": pythonpath})
    assert done.returncode == 0, done.stderr
    return remote.parse_marked(done.stdout, preflight.MARK)


def test_a_hosts_preflight_names_a_worker_that_is_not_podlaunchs(tmp_path, shadow):
    here = tmp_path / "workdir"
    here.mkdir()
    facts = _preflight_facts(here, f"{shadow}{os.pathsep}{REPO}")
    assert facts["foreign_worker"] == str(shadow / "worker"), facts
    assert _preflight_facts(here, f"{REPO}{os.pathsep}{shadow}")["foreign_worker"] is None
    # and the host is unfit, saying why
    check = ssh_preflight.Check(types.SimpleNamespace(name="h1"), None,
                                {**{k: "x" for k in ssh_preflight.VERSION_KEYS}, **facts})
    job = types.SimpleNamespace(name="j")
    ssh_preflight.judge([check], job, "python3", ssh_preflight.REFUSE)
    assert check.reason.startswith(f"{shadow}/worker is a module named worker found before "
                                   "podlaunch's"), check.reason


def test_a_worker_py_in_the_hosts_workdir_is_no_foreign_worker(tmp_path):
    # issue 50, item 1: workers start with python -P and search the working directory last,
    # so a user's worker.py synced there hides nothing and the host stays fit
    here = tmp_path / "workdir"
    here.mkdir()
    (here / "worker.py").write_text("raise SystemExit('the user own worker.py')\n")
    assert _preflight_facts(here, REPO)["foreign_worker"] is None
