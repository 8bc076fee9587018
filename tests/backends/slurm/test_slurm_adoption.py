"""A detached Slurm run taken back, process-free: the job and each step proven the run's before
anything is signalled, and a step that ended unwatched classified from what it left
(``launcher.backends.slurm.adoption``, ``filed``); tests/backends/slurm/test_slurm.py takes a
real run back."""

from __future__ import annotations

import os
import json
import re
import subprocess

import pytest

from launcher import plan as planning
from launcher.backends.slurm import adoption, launches, script
from launcher.backends.slurm.commands import parse_record
from launcher.backends.slurm.filed import FiledWorker, srun_path
from launcher.errors import SpecError
from launcher.ends import Exited, Killed, Lost

NAME = "podlaunch.linear"
PREFIX = f"{NAME}.abc."


def record(run_dir, **fields) -> dict:
    return {"JobId": "7", "JobState": "RUNNING", "UserId": f"me({os.getuid()})", "JobName": NAME,
            "StdOut": os.path.join(run_dir, "slurm", "batch-7.out"), **fields}


def test_only_the_runs_own_job_is_taken_back(tmp_path):
    run_dir = str(tmp_path)
    adoption.prove("7", record(run_dir), "submit", NAME, run_dir)
    adoption.prove("7", None, "submit", NAME, run_dir)  # ended: its steps are classified
    for fields, named in (({"UserId": "other(4242)"}, "UserId=other(4242)"),
                          ({"JobName": "podlaunch.other"}, "JobName=podlaunch.other"),
                          ({"StdOut": "/elsewhere/slurm/batch-7.out"}, "StdOut=/elsewhere")):
        with pytest.raises(SpecError, match=f"Slurm job 7, which the run's journal names, is not "
                           f"this run's \\({re.escape(named)}.*nothing was signalled"):
            adoption.prove("7", record(run_dir, **fields), "submit", NAME, run_dir)
    # the user's own allocation: only its user is the run's to prove
    adoption.prove("7", record(run_dir, JobName="interactive", StdOut=""), "allocation", NAME, run_dir)


@pytest.mark.parametrize("entry", [{}, {"job_id": "7; rm -rf ~", "mode": "submit", "nodes": ["n1"],
                                        "coordinator": "n1:0"},
                                   {"job_id": "7", "mode": "other", "nodes": ["n1"], "coordinator": ""},
                                   {"job_id": "7", "mode": "submit", "nodes": [], "coordinator": ""}])
def test_a_journal_naming_no_usable_job_is_refused(entry):
    with pytest.raises(SpecError, match="names no usable Slurm job"):
        adoption.SlurmHandle.from_json(entry)


def test_the_handle_a_journal_keeps_reads_back_as_it_was_written():
    handle = adoption.SlurmHandle("7", "submit", ("n1", "n2"), "n1:1234")
    entry = json.loads(json.dumps(handle.to_json()))  # through the journal's file
    assert adoption.SlurmHandle.from_json(entry) == handle


class Steps:
    def __init__(self, listed):
        self.listed = listed

    def steps_named(self, job_id, prefix):
        return [(s, n) for s, n in self.listed if n.startswith(prefix)]


def plan_of(run_dir, count=2) -> planning.Plan:
    processes = tuple(planning.ProcessPlan(
        process_id=i, host=f"n{i + 1}", local_device_count=1, env={}, argv=("python",),
        log_path=planning.log_path(run_dir, i, 0), label=f"p{i}", run_dir=run_dir)
        for i in range(count))
    return planning.Plan(job=None, processes=processes, coordinator_address="n1:0", run_dir=run_dir)


def journaled(i, step, **fields) -> dict:
    return {"process_id": i, "job_id": "7", "step": step, "step_name": f"{PREFIX}p{i}",
            "pid": 1 << 30, "since": 1, "offset": 0, "err_from": 0, **fields}


def test_each_step_is_proven_by_its_id_and_name_or_found_ended(tmp_path):
    run_dir = str(tmp_path)
    listed = Steps([("7.0", f"{PREFIX}p0"), ("7.3", f"{PREFIX}p1")])
    workers = adoption.adopted_steps(plan_of(run_dir), [journaled(0, "7.0"), journaled(1, None)],
                                     listed, "7", PREFIX, None)
    assert [w.step() for w in workers] == ["7.0", "7.3"]  # p1's found by its name
    ended = adoption.adopted_steps(plan_of(run_dir), [journaled(0, "7.0"), journaled(1, "7.1")],
                                   listed, "7", PREFIX, None)
    assert [w.step() for w in ended] == ["7.0", None]  # 7.1 is no longer listed: it ended
    for records in ([journaled(0, "7.3"), journaled(1, "7.1")],  # 7.3 is p1's
                    [journaled(0, "7.0")],  # p1 missing
                    [journaled(0, "7.0", job_id="8"), journaled(1, "7.1")],
                    [journaled(0, "7.0", step_name=f"{NAME}.other.p0"), journaled(1, "7.1")]):
        with pytest.raises(SpecError, match="does not name p[01]'s step .*nothing was signalled"):
            adoption.adopted_steps(plan_of(run_dir), records, listed, "7", PREFIX, None)
    with pytest.raises(SpecError, match="journal is not usable"):
        adoption.adopted_steps(plan_of(run_dir), [journaled(0, "7.0"), journaled(1, "7.3", offset="x")],
                               listed, "7", PREFIX, None)


def ended_step(tmp_path, out: str, srun: str, offset: int = 0) -> FiledWorker:
    run_dir = str(tmp_path)
    plan = plan_of(run_dir, 1).processes[0]
    path = planning.output_path(run_dir, 0)
    os.makedirs(os.path.dirname(path))
    with open(path, "w") as f:
        f.write(out)
    with open(srun_path(path), "w") as f:
        f.write(srun)
    gone = subprocess.Popen(["true"])
    gone.wait()  # a holder that has ended: its pid names no live process of that start
    return FiledWorker.adopted(plan, journaled(0, None, pid=gone.pid, offset=offset), Steps([]),
                               None, None)


@pytest.mark.parametrize("srun, want", [
    ("podlaunch-srun-exit 0\n", Exited(0)),
    ("srun: error: n1: task 0: Exited with exit code 7\npodlaunch-srun-exit 7\n", Exited(7)),
    ("srun: error: n1: task 0: Killed\npodlaunch-srun-exit 137\n", Killed(9)),
])
def test_a_step_that_ended_unwatched_is_classified_from_what_it_left(tmp_path, srun, want):
    worker = ended_step(tmp_path, "step 1\nstep 2\nstep 3\n", srun, offset=len("step 1\n"))
    assert list(worker.lines()) == ["step 2", "step 3"] + srun.splitlines()[:-1]  # from the offset
    assert worker.poll() == want


def test_a_holder_gone_without_its_report_is_lost(tmp_path):
    worker = ended_step(tmp_path, "step 1\n", "")
    list(worker.lines())
    assert isinstance(worker.poll(), Lost)


def test_a_run_directorys_path_goes_to_slurm_and_comes_back_whole(tmp_path):
    """Issue 71: a space in the run directory's path made sbatch refuse the script (blamed on
    cluster.sbatch_options), and ``scontrol -o``'s StdOut, split at the space, named no run
    directory: a live launch's job was stale to the next launch and not this run's to take back.
    A line break would end the #SBATCH line and run the rest as a command; ``%`` is Slurm's."""
    run_dir = str(tmp_path / "it's a \"run\" \\ dir")
    output = [o for o in script.sbatch_options(Job, run_dir) if o.startswith("--output=")][0]
    assert f"#SBATCH {script.directive(output)}\n" in script.script_text(Job, run_dir)
    assert script.directive(output) == '--output="' + output[9:].replace("\\", "\\\\").replace(
        '"', '\\"') + '"' and script.directive("--nodes=1") == "--nodes=1"
    line = (f"JobId=7 JobName={NAME} UserId=me({os.getuid()}) JobState=RUNNING Reason=None "
            f"Socks/Node=* WorkDir=/home/me/my  work StdErr={run_dir}/slurm/batch-7.out "
            f"StdIn=/dev/null StdOut={run_dir}/slurm/batch-7.out Power=")
    found = parse_record(line)
    assert (found["WorkDir"], found["Socks/Node"], found["Power"]) == ("/home/me/my  work", "*", "")
    assert launches.batch_run_dir(found) == run_dir
    adoption.prove("7", found, "submit", NAME, run_dir)
    for bad, said in (("/tmp/a\ntouch /tmp/x", "'\\n'"), ("/tmp/100%u", "%")):
        with pytest.raises(SpecError, match=f"holds {re.escape(said)}, which a Slurm job's output "
                           "path cannot carry as it is; name a run directory without it"):
            script.check_run_dir(bad)
    script.check_run_dir(run_dir)


class Cluster:
    nodes, processes_per_node, cpus_per_process, platform, partition = 1, 1, None, "cpu", None
    time_limit = account = qos = None
    signal_lead_s, requeue, sbatch_options, orphan_timeout_s = 0, True, (), 600


class Job:
    name, cluster = "linear", Cluster


def test_a_detached_runs_batch_script_keeps_the_job_while_a_step_of_the_run_is_left(tmp_path):
    foreground, detached = (script.script_text(Job, "/r/un dir", detached=d) for d in (False, True))
    assert "squeue" not in foreground and "ending the job\"; exit 0" in foreground
    assert "steps=podlaunch.linear." in detached and 'squeue -h -s -j "$SLURM_JOB_ID"' in detached
    # run, its launcher long silent (no heartbeat file), against squeue's three answers; its
    # first sleep ends it (a fake on PATH that stops its caller)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "sleep").write_text("#!/bin/sh\nkill -TERM $PPID\n")
    for listed, said, code in ((f"batch\n{NAME}.{launches.run_tag('/r/un dir')}.p1", "steps train on", -15),
                               ("batch\nextern\nother.p0", "no step of the run left: ending the job", 0),
                               (None, "steps train on", -15)):  # squeue cannot answer: kept
        (bin_dir / "squeue").write_text("#!/bin/sh\n" + (f"printf '%s\\n' '{listed}'\n" if listed
                                                        else "exit 1\n"))
        for tool in ("sleep", "squeue"):
            (bin_dir / tool).chmod(0o755)
        ran = subprocess.run(["bash", "-c", detached], capture_output=True, text=True, timeout=30,
                             env={"PATH": f"{bin_dir}:{os.environ['PATH']}", "SLURM_JOB_ID": "7"})
        assert ran.returncode == code and said in ran.stdout, (listed, ran)
