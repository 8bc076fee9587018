"""A user's module names never take podlaunch's, nor podlaunch's theirs (issue 50, item 1).

Real runs from a directory that holds a user's own ``worker.py`` and ``launcher.py`` beside
the job file, with the real ``launch`` console script (a user's ``python -m launcher.cli``
would itself meet their ``launcher.py``).
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from harness.helpers import REPO, env_for_tests

LAUNCH_SCRIPT = os.path.join(os.path.dirname(sys.executable), "launch")
CLASH = "raise SystemExit('the own {name}.py of a user ran instead of podlaunch')\n"


def _clashing_dir(tmp_path):
    for name in ("worker", "launcher"):
        (tmp_path / f"{name}.py").write_text(CLASH.format(name=name))
    return tmp_path


def _launch(cwd, *args, timeout_s=240):
    env = env_for_tests()
    env.pop("PYTHONPATH")  # as a user has it: podlaunch installed, nothing else on the path
    return subprocess.run([LAUNCH_SCRIPT, *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=timeout_s, stdin=subprocess.DEVNULL)


@pytest.mark.slow
def test_a_trainer_job_beside_a_user_s_worker_py_runs_podlaunch_s_worker_and_the_user_s_task(
        tmp_path):
    directory = _clashing_dir(tmp_path)
    (directory / "mytask.py").write_text(
        "from worker import tasks\n\n"
        "def make():\n"
        "    print('mytask: the user task is imported', flush=True)\n"
        "    return tasks.Task(init_params=tasks.init_linear, loss_fn=tasks.mse)\n")
    (directory / "job.yaml").write_text(
        "name: mine\ntask: {name: 'mytask:make'}\n"
        "data: {source: synthetic, num_examples: 64, in_features: 2, out_features: 1}\n"
        "train: {num_steps: 4, global_batch_size: 8}\nlogging: {log_every_steps: 2}\n"
        "cluster: {backend: local, num_processes: 2, devices_per_process: 1}\n")
    done = _launch(directory, "job.yaml", "--run-dir", str(tmp_path / "run"), "--show", "all")
    out = done.stdout + done.stderr
    assert done.returncode == 0, out
    assert "ran instead of podlaunch" not in out, out
    assert out.count("mytask: the user task is imported") == 2, out


@pytest.mark.slow
@pytest.mark.parametrize("line", ["from podlaunch import program",
                                  "import podlaunch.program as program"])
def test_a_program_beside_a_user_s_worker_py_imports_the_helper_by_podlaunch_s_name(
        tmp_path, line):
    directory = _clashing_dir(tmp_path)
    (directory / "train.py").write_text(
        f"{line}\n"
        "jax = program.initialize()\n"
        "for step in (1, 2):\n"
        "    program.report(step, loss=1.0 / step)\n")
    (directory / "job.yaml").write_text(
        "name: mine\nprogram: {argv: [python, train.py], num_steps: 2}\n"
        "cluster: {backend: local, num_processes: 2, devices_per_process: 1}\n")
    done = _launch(directory, "job.yaml", "--run-dir", str(tmp_path / "run"))
    out = done.stdout + done.stderr
    assert done.returncode == 0, out
    assert "ran instead of podlaunch" not in out, out


def test_the_old_helper_name_beside_a_user_s_worker_py_is_refused_naming_the_new_one(tmp_path):
    directory = _clashing_dir(tmp_path)
    (directory / "train.py").write_text("from worker import program\nprogram.initialize()\n")
    (directory / "job.yaml").write_text("name: mine\nprogram: {argv: [python, train.py]}\n")
    done = _launch(directory, "job.yaml", "--dry-run", timeout_s=60)
    assert done.returncode == 2, done.stdout + done.stderr
    assert "write 'from podlaunch import program'" in done.stderr, done.stderr
    assert "Traceback" not in done.stderr


@pytest.mark.slow
def test_the_bring_your_own_model_page_s_task_runs_as_written(tmp_path):
    """docs/your-model.md: its task module and job file, written beside each other as the
    page says, run with the real launch from that directory."""
    with open(os.path.join(REPO, "docs", "your-model.md"), encoding="utf-8") as f:
        page = f.read()
    python = page.split("```python\n", 1)[1].split("```", 1)[0]
    job = page.split("```yaml\n", 1)[1].split("```", 1)[0]
    directory = _clashing_dir(tmp_path)  # the page promises a worker.py there is no problem
    (directory / "mymodel.py").write_text(python)
    (directory / "mymodel.yaml").write_text(job)
    done = _launch(directory, "mymodel.yaml", "--run-dir", str(tmp_path / "run"))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "OK: 2 processes succeeded" in done.stdout
