"""Keep going without a host (issue 28): a spare in the place of a host gone for good, and a
run shrunk onto the hosts left, each ending at the params of the run that never lost one.

Real sshd hosts on loopback addresses; the host "goes away" with its sshd and every process
started through it (``SshTestEnv.stop_host``: the worker gets SIGKILL) while the run trains,
so the restart's preflight finds it unreachable. The references are uninterrupted local runs
(``reference_params``): podlaunch's data order and step do not depend on the topology.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import sys

import pytest
import yaml

from harness.helpers import (PROGRAMS, REPO, checked_ledger, launch, launched, pids_with_env,
                             program_job)
from harness.runs import LOSES_A_HOST, STEPS_LOST, assert_same_params, params, remote_run_dir
from launcher import backends

pytestmark = pytest.mark.slow

STEPS = STEPS_LOST
COMMON = LOSES_A_HOST


def cluster_file(tmp_path, env, num_hosts: int, spares: int = 0, **settings) -> str:
    """``num_hosts`` of ``env``'s hosts, then ``spares`` more as cluster.spares."""
    entry = [{"host": h, "workdir": str(tmp_path / f"host{i}")} for i, h in enumerate(env.hosts)]
    cluster = {
        "backend": "ssh", "ssh_config_file": env.ssh_config, "python": sys.executable,
        "hosts": entry[:num_hosts], "spares": entry[num_hosts:num_hosts + spares],
        "env": {"PYTHONPATH": os.pathsep.join([PROGRAMS, REPO])},
        "grace_s": 2, "keepalive_interval_s": 1, "keepalive_timeout_s": 4, **settings,
    }
    (tmp_path / "cluster.yaml").write_text(yaml.safe_dump(cluster))
    return str(tmp_path / "cluster.yaml")


def lose_host_mid_run(tmp_path, env, host: int, cluster: str, *args: str) -> tuple[int, str]:
    """Launch, and once process 0 has logged step 10, take host ``host`` away for good."""
    run_dir = tmp_path / "run"
    with launched("jobs/linear.yaml", "--cluster", cluster, *COMMON, *args,
                  "--run-dir", str(run_dir)) as out:
        out.wait_for(r"^\[p0 127\.0\.0\.2\] step 10/", 120)
        env.stop_host(host)
        return out.finish(240)


def nothing_left(tmp_path, num_hosts: int, job: str = "linear") -> None:
    for i in range(num_hosts):
        remote = remote_run_dir(tmp_path / f"host{i}", tmp_path / "run", job)
        assert remote.is_dir(), f"host {i} ran nothing of {job}"
        assert not pids_with_env("PODLAUNCH_RUN_DIR", str(remote)), f"host {i}"


def test_a_host_gone_for_good_is_replaced_by_the_spare_and_the_run_ends_at_the_same_params(
        tmp_path, five_ssh_hosts, reference_params):
    """Four hosts and one spare: host 3's sshd stopped and its worker killed at step 10 or
    after. The restart's preflight finds host 3 unreachable; the spare takes its place,
    restores from the newest checkpoint, and the run ends at the uninterrupted 4-process
    params. Process 0 was slow on attempt 0 (its own 100 ms a step): quarantined for it
    (``restarts.quarantine_slower_than``), yet kept, as the one spare went to the host
    that is gone."""
    code, out = lose_host_mid_run(tmp_path, five_ssh_hosts, 3,
                                  cluster_file(tmp_path, five_ssh_hosts, 4, spares=1),
                                  "--set", "restarts.quarantine_slower_than=2")
    assert code == 0, out[-5000:]
    assert "podlaunch: spares: 1 host fit to take a place" in out, out[-5000:]
    assert re.search(r"^podlaunch: 127\.0\.0\.2 \(p0\) quarantined: its processes' own time per "
                     r"step was \d+\.\d ms, .* the median of the other hosts' .*; kept: no spare or "
                     r"shrink can take its place$", out, re.M), out[-5000:]
    assert re.search(r"^podlaunch: 127\.0\.0\.5 \(p3\) replaced by spare 127\.0\.0\.6: preflight "
                     r"after the fault: unreachable: connection refused", out, re.M), out[-5000:]
    assert re.search(r"attempt 1 \(infrastructure restart 1 of 10\): starting 4 processes x 1 cpu "
                     r"device on 4 hosts", out), out[-5000:]
    assert re.search(r"^p0\s+127\.0\.0\.2\s+succeeded", out, re.M), out[-5000:]
    assert re.search(r"^p3\s+127\.0\.0\.6\s+succeeded\s+exit code 0\s+40\b", out, re.M), out[-5000:]
    assert re.search(r"^\[p0 127\.0\.0\.2\] resumed from the checkpoint of step 1[05] \(attempt 1\)",
                     out, re.M), out[-5000:]
    assert_same_params(params(tmp_path / "run"), reference_params(
        *COMMON, "--set", "cluster.num_processes=4", "--set", "cluster.devices_per_process=1"))
    # the summary, the ledger and run.json say which host replaced which, and why
    assert re.search(r"before it: 127\.0\.0\.5 \(p3\) replaced by spare 127\.0\.0\.6", out), out[-3000:]
    change = {"host": "127.0.0.5", "process_ids": [3], "by": "127.0.0.6", "num_processes": 4}
    ledger = checked_ledger(tmp_path / "run")
    assert [{k: c[k] for k in change} for c in ledger["attempts"][1]["host_changes"]] == [change]
    record = json.loads((tmp_path / "run" / "run.json").read_text())
    assert [{k: c[k] for k in change} for c in record["host_changes"]] == [change]
    assert record["host_changes"][0]["attempt"] == 1
    assert "unreachable" in record["host_changes"][0]["why"]
    nothing_left(tmp_path, 5)


@pytest.mark.parametrize("parallelism, steps_per_call", [("pmap", 1), ("jit", 5)])
def test_four_hosts_shrink_to_three_and_end_at_the_four_host_params(
        tmp_path, ssh_hosts, reference_params, parallelism, steps_per_call):
    """No spare, ``restarts.min_processes: 3``: host 3 gone, the run goes on with 3 processes
    of 1 device. 3 does not divide the global batch of 256: each device holds 86 rows, 2 of
    them padding of weight 0, and the step's weighted mean gives the 4-host params (of the
    pmap run with one step per call: jit and fused steps end there too)."""
    code, out = lose_host_mid_run(
        tmp_path, ssh_hosts, 3, cluster_file(tmp_path, ssh_hosts, 4),
        "--set", "restarts.min_processes=3", "--set", f"train.parallelism={parallelism}",
        "--set", f"train.steps_per_call={steps_per_call}")
    assert code == 0, out[-5000:]
    assert re.search(r"^podlaunch: 127\.0\.0\.5 \(p3\) dropped \(no spare left in cluster\.spares\): preflight after "
                     r"the fault: unreachable: connection refused .*; the run shrinks to 3 processes "
                     r"\(restarts\.min_processes 3\), the same global batch", out, re.M), out[-5000:]
    assert "starting 3 processes x 1 cpu device on 3 hosts" in out, out[-5000:]
    assert re.search(r"256 rows over 3 devices: 86 per device with 2 padding rows of weight 0",
                     out), out[-5000:]
    assert_same_params(params(tmp_path / "run"), reference_params(
        *COMMON, "--set", "cluster.num_processes=4", "--set", "cluster.devices_per_process=1"))
    nothing_left(tmp_path, 4)


def test_two_hosts_of_two_devices_shrink_to_one(tmp_path, two_ssh_hosts, reference_params):
    """2 x 2 to 1 x 2: host 1 gone, host 0's process alone goes on with its 2 devices."""
    code, out = lose_host_mid_run(
        tmp_path, two_ssh_hosts, 1, cluster_file(tmp_path, two_ssh_hosts, 2, devices_per_process=2),
        "--set", "restarts.min_processes=1")
    assert code == 0, out[-5000:]
    assert "the run shrinks to 1 process (restarts.min_processes 1)" in out, out[-5000:]
    assert "starting 1 process x 2 cpu devices on 1 host" in out, out[-5000:]
    assert_same_params(params(tmp_path / "run"), reference_params(*COMMON))  # local 2 x 2
    nothing_left(tmp_path, 2)


def test_without_a_spare_or_shrinking_the_restart_names_the_host_and_why_none_took_its_place(
        tmp_path, two_ssh_hosts):
    code, out = lose_host_mid_run(tmp_path, two_ssh_hosts, 1, cluster_file(tmp_path, two_ssh_hosts, 2))
    assert code == 1, out[-5000:]
    assert re.search(r"127\.0\.0\.3\s+p1\s+unreachable: connection refused", out), out[-5000:]
    assert ("no spare left in cluster.spares, and restarts.min_processes is unset (no shrinking)"
            in out), out[-5000:]
    nothing_left(tmp_path, 2)


def test_a_host_that_failed_twice_is_quarantined_and_the_spare_takes_its_place(
        tmp_path, five_ssh_hosts, reference_params):
    """Two hosts and a spare: process 1 SIGKILLs itself after step 7 on attempts 0 and 1.
    Host 1 still passes its preflight, but its processes failed twice
    (``restarts.quarantine_after`` 2): attempt 2 runs on the spare and ends at the params of
    the run that never failed."""
    run_dir = tmp_path / "run"
    args = ("--set", f"train.num_steps={STEPS}", "--set", "cluster.devices_per_process=1",
            "--set", "logging.log_every_steps=5", "--set", "checkpoint.every_steps=5",
            "--set", "restarts.backoff_s=0.2")
    result = launch("jobs/linear.yaml", "--cluster", cluster_file(tmp_path, five_ssh_hosts, 2,
                                                                  spares=1),
                    *args, "--set", "task.name=faulty_task:first_attempt",
                    "--set", "task.args.fault_attempts=2", "--set", "task.args.crash_at_step=7",
                    "--set", "task.args.crash_process_id=1", "--set", "task.args.mode=sigkill",
                    "--run-dir", str(run_dir))
    out = result.stdout
    assert result.returncode == 0, out[-5000:] + result.stderr
    assert len(re.findall(r"^podlaunch: attempt \d[^:\n]* failed: process_id 1 on 127\.0\.0\.3 was killed by SIGKILL",
                          out, re.M)) == 2, out[-5000:]
    assert re.search(r"^podlaunch: 127\.0\.0\.3 \(p1\) replaced by spare 127\.0\.0\.4: quarantined: "
                     r"its processes failed 2 times in this run \(restarts\.quarantine_after 2; "
                     r"last: process_id 1 on 127\.0\.0\.3 was killed by SIGKILL", out, re.M), out[-5000:]
    assert re.search(r"^p1\s+127\.0\.0\.4\s+succeeded", out, re.M), out[-5000:]
    assert_same_params(params(run_dir), reference_params(*args))
    nothing_left(tmp_path, 3)


def test_a_program_job_is_told_its_new_num_processes_after_a_shrink(tmp_path, two_ssh_hosts):
    """Program jobs shrink too: the restart's processes get the new ``num_processes`` (the
    program's ``jax.process_count()`` says 1 where it said 2)."""
    job = program_job(tmp_path / "job", steps=200)
    run_dir = tmp_path / "run"
    with launched(job, "--cluster", cluster_file(tmp_path, two_ssh_hosts, 2),
                  "--set", "restarts.min_processes=1", "--run-dir", str(run_dir)) as out:
        out.wait_for(r"^\[p0 127\.0\.0\.2\] step 10/200", 120)
        two_ssh_hosts.stop_host(1)
        code, text = out.finish(240)
    assert code == 0, text[-5000:]
    assert "the run shrinks to 1 process (restarts.min_processes 1)" in text, text[-5000:]
    assert "process 0/2 joined" in (run_dir / "logs" / "process-000.log").read_text()
    # one process joins no jax.distributed (it said "joined" before; nothing had been)
    assert "process 0/1: one process, in-process collectives" in (
        run_dir / "logs" / "attempt-1" / "process-000.log").read_text()
    nothing_left(tmp_path, 2, job="faulty")


def test_a_resume_puts_the_spare_in_the_place_of_a_host_gone_since(tmp_path, five_ssh_hosts,
                                                                   reference_params):
    """``--resume`` follows a fault too: host 1 went away after the first launch ended, and
    the resumed run starts on the spare instead of refusing."""
    args = ("--set", "cluster.devices_per_process=1", "--set", "logging.log_every_steps=5",
            "--set", "checkpoint.every_steps=5")
    cluster = cluster_file(tmp_path, five_ssh_hosts, 2, spares=1)
    run_dir = tmp_path / "run"
    first = launch("jobs/linear.yaml", "--cluster", cluster, *args, "--set", "train.num_steps=20",
                   "--run-dir", str(run_dir))
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr
    five_ssh_hosts.stop_host(1)
    again = launch("jobs/linear.yaml", "--cluster", cluster, *args, "--set", "train.num_steps=40",
                   "--resume", str(run_dir))
    out = again.stdout
    assert again.returncode == 0, out[-5000:] + again.stderr
    assert re.search(r"^podlaunch: 127\.0\.0\.3 \(p1\) replaced by spare 127\.0\.0\.4: preflight "
                     r"after the fault: unreachable", out, re.M), out[-5000:]
    assert "[p0 127.0.0.2] resumed from the checkpoint of step 20 (attempt 1)" in out, out[-5000:]
    # the one setting the user changed, not the hosts the spare changed
    assert re.search(r"resuming with 1 changed setting .*: train\.num_steps: 20 -> 40$", out, re.M), out
    assert_same_params(params(run_dir), reference_params(*args, "--set", "train.num_steps=40"))
    record = json.loads((run_dir / "run.json").read_text())
    assert [(c["host"], c["by"], c["attempt"]) for c in record["host_changes"]] == [
        ("127.0.0.3", "127.0.0.4", 1)], record
    # a new run (no --resume) refuses the host instead: the spec is to be fixed
    fresh = launch("jobs/linear.yaml", "--cluster", cluster, *args, "--run-dir", str(tmp_path / "new"))
    assert fresh.returncode == 1 and "preflight failed on 1 of 2 hosts" in fresh.stderr, fresh.stderr


def test_a_spare_of_other_versions_is_not_the_reference_and_the_fit_hosts_stay(
        tmp_path, five_ssh_hosts, reference_params):
    """Host 0 gone; the spare's jax says 0.0.1 (package metadata in its workdir). The run's
    hosts set the versions, not the first host that answers: the spare is unfit and
    dropped in turn (``min_processes`` 2), the two fit hosts go on, the params are exact."""
    # on the hosts' PYTHONPATH as a relative folder, which the spare's workdir alone holds
    # (the workdir itself is searched last, as the workers search it: python -P)
    metadata = tmp_path / "host3" / "jaxmeta" / "jax-0.0.1.dist-info"
    metadata.mkdir(parents=True)
    (metadata / "METADATA").write_text("Metadata-Version: 2.1\nName: jax\nVersion: 0.0.1\n")
    cluster = cluster_file(tmp_path, five_ssh_hosts, 3, spares=1)
    settings = yaml.safe_load(open(cluster))
    settings["env"]["PYTHONPATH"] = os.pathsep.join(["jaxmeta", PROGRAMS, REPO])
    (tmp_path / "cluster.yaml").write_text(yaml.safe_dump(settings))
    code, out = lose_host_mid_run(tmp_path, five_ssh_hosts, 0, cluster,
                                  "--set", "restarts.min_processes=2",
                                  "--set", "train.global_batch_size=240")
    assert code == 0, out[-5000:]
    # said at the start, when it can still be fixed
    assert re.search(r"^podlaunch: warning: spare 127\.0\.0\.5 is not fit now \(version mismatch: "
                     r"jax 0\.0\.1 \(the run's hosts: \d", out, re.M), out[-5000:]
    # one change, of the host the run lost: the spare that failed in its place is the reason
    assert re.search(r"^podlaunch: 127\.0\.0\.2 \(p0\) dropped \(no spare left in cluster\.spares\): preflight after the "
                     r"fault: unreachable: .*\(spare 127\.0\.0\.5 not used: preflight after the fault: "
                     r"version mismatch: jax 0\.0\.1 \(the run's hosts: ", out, re.M), out[-5000:]
    assert "replaced by spare" not in out, out[-5000:]
    assert "starting 2 processes x 1 cpu device on 2 hosts" in out, out[-5000:]
    assert re.search(r"^p0\s+127\.0\.0\.3\s+succeeded", out, re.M), out[-5000:]
    assert_same_params(params(tmp_path / "run"), reference_params(
        *COMMON, "--set", "train.global_batch_size=240", "--set", "cluster.num_processes=3",
        "--set", "cluster.devices_per_process=1"))
    nothing_left(tmp_path, 3)


def test_a_refusal_after_a_spare_failed_in_the_hosts_place_says_whose_place_it_was(
        tmp_path, five_ssh_hosts):
    """Third attack: the spare (its sshd down) is tried in host 1's place and fails; the
    refusal named only the spare and said "no spare left". It now says whose place the spare
    was in, and why that host went."""
    cluster = cluster_file(tmp_path, five_ssh_hosts, 2, spares=1)  # spare: 127.0.0.4
    five_ssh_hosts.stop_host(2)
    code, out = lose_host_mid_run(tmp_path, five_ssh_hosts, 1, cluster)
    assert code == 1, out[-5000:]
    assert re.search(r"spare 127\.0\.0\.4, in the place of 127\.0\.0\.3 \(p1\) \(preflight after the "
                     r"fault: unreachable: .*\), failed its check too; no spare left in "
                     r"cluster\.spares, and restarts\.min_processes is unset", out), out[-5000:]


def test_a_host_taken_out_does_not_come_back_as_a_spare_under_an_alias(tmp_path, five_ssh_hosts):
    """Third attack on issue 28, F5: host 1 is quarantined and the spare 127.0.0.4 takes its
    place; when that spare is quarantined in turn, the next spare, ``again`` (an ssh_config
    alias of host 1's address), is refused before it runs anything: the host taken out does
    not come back. F6: when the run has succeeded, the host taken out has its local copies
    removed (no worker of the run is left there to do it), found from its workdir as the
    workers find it (relative to the login home here, as the default ``podlaunch`` is); a
    host kept keeps its own until its writer removes them. Real sshd, the session's own
    restarts (preflight only, no worker)."""
    from launcher import spec as specs
    from launcher.backends.ssh.session import SshSession
    from launcher.console import Console

    env = five_ssh_hosts
    lines = open(env.ssh_config).read().splitlines()
    config = tmp_path / "ssh_config"  # the env's settings, and one alias block of host 1
    config.write_text("\n".join(["Host again", f"    HostName {env.hosts[1]}", *lines[1:],
                                 *lines]) + "\n")
    relative = f"podlaunch-test-{os.getpid()}-{tmp_path.name}"  # in root's login home
    home = os.path.expanduser("~root")
    workdirs = [str(tmp_path / "host0"), relative, str(tmp_path / "host2")]
    entry = [{"host": h, "workdir": w} for h, w in zip(env.hosts, workdirs)]
    (tmp_path / "cluster.yaml").write_text(yaml.safe_dump({
        "backend": "ssh", "ssh_config_file": str(config), "python": sys.executable,
        "hosts": entry[:2], "spares": [entry[2], {"host": "again", "workdir": str(tmp_path / "again")}],
        "env": {"PYTHONPATH": os.pathsep.join([PROGRAMS, REPO])}}))
    job = specs.load(os.path.join(REPO, "jobs/linear.yaml"), str(tmp_path / "cluster.yaml"),
                     ("train.global_batch_size=32",), registry=backends)
    said: list = []
    console = Console()
    console.say = said.append
    session = SshSession(job, str(tmp_path / "run"), console)
    copies = {i: remote_run_dir(os.path.join(home, w), tmp_path / "run") / "local-checkpoints"
              / f"process-00{i}" / "step-0000010" for i, w in enumerate(workdirs)}
    for copy in copies.values():  # as the hosts' writers leave them
        copy.mkdir(parents=True)
        (copy / "state.npz").write_bytes(b"x" * 1000)
    try:
        session.prepare()
        assert any(re.match(r"warning: spare again is not fit now \(it is 127\.0\.0\.3:\d+, already "
                            r"one of cluster\.hosts\)", s) for s in said), said
        session.quarantine[session.ssh.specs[1]] = "quarantined: failed twice"
        session.prepare(restart=True)
        assert [s.host for s in session.ssh.specs] == [env.hosts[0], env.hosts[2]]
        assert (copies[1] / "state.npz").exists()  # a failed run's --resume may want them
        session.quarantine[session.ssh.specs[1]] = "quarantined: failed twice"
        said.clear()
        session.prepare(restart=True)
        assert [s.host for s in session.ssh.specs] == [env.hosts[0], env.hosts[2]], said
        assert any(re.match(r"spare again not used: it is 127\.0\.0\.3:\d+, host 127\.0\.0\.3, which "
                            r"the run took out earlier", s) for s in said), said
        assert any("kept: no spare or shrink can take its place" in s for s in said), said
        session.succeeded()
        session.close()
        assert not copies[1].parent.parent.exists(), said  # the tier's directory, left empty
        assert (copies[0] / "state.npz").exists() and (copies[2] / "state.npz").exists()  # live
        assert f"{env.hosts[1]}: its local copies removed (taken out of the run)" in said, said
    finally:
        session.close()
        shutil.rmtree(os.path.join(home, relative), ignore_errors=True)
