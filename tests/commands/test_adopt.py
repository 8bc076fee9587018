"""A detached run whose supervisor is SIGKILLed loses nothing: ``launch attach`` takes its live
processes back (or the restart's wait it was in) and the run ends as it would have without
the interruption. Real launcher, real JAX workers, the local backend; every wait polls a
condition against a deadline."""

from __future__ import annotations

import json
import re
import subprocess
import time

import pytest

from harness.adopted import STEPS, attach, attach_to_end, journal, kill, logged_step
from harness.detached import launch, supervisor, supervisors, until  # noqa: F401 (a fixture)
from harness.helpers import LAUNCH, REPO, checked_ledger, env_for_tests, run_pids
from harness.runs import assert_same_params, fault, params

pytestmark = pytest.mark.slow  # real workers

# 2 processes x 2 devices (jobs/linear.yaml's), process 0 sleeping 50 ms a step: about 10 s
PACED = ("jobs/linear.yaml", "--set", f"train.num_steps={STEPS}", "--set", "logging.log_every_steps=20",
         "--set", "task.args.sleep_s=0.05", "--set", "task.args.slow_process_id=0")


def _reference(run_dir) -> subprocess.Popen:
    """The same run uninterrupted and unpaced (faulty_task's math is jobs/linear.yaml's),
    started beside the test's run."""
    return subprocess.Popen(LAUNCH + ["jobs/linear.yaml", "--set", f"train.num_steps={STEPS}",
                                      "--run-dir", str(run_dir)],
                            cwd=REPO, env=env_for_tests(), stdout=subprocess.DEVNULL,
                            stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)


def test_a_killed_supervisor_is_taken_back_by_one_attach_and_the_run_ends_as_uninterrupted(
        tmp_path, supervisors):
    run_dir, ref_dir = tmp_path / "r", tmp_path / "ref"
    reference = _reference(ref_dir)
    # 0.12 s a step here (24 s in all): the take-back and the third supervisor's refusal
    # happen while it runs, however loaded the machine (at 0.05 s it had ended first)
    started = launch(*PACED, "--set", "task.name=faulty_task:make", "--set",
                     "task.args.sleep_s=0.12", "--run-dir", str(run_dir),
                     "--detach")
    assert started.returncode == 0, started.stdout + started.stderr
    killed = supervisor(run_dir)
    supervisors.append(killed)
    until(lambda: logged_step(run_dir) >= 40, "step 40 in process 0's log")
    workers = sorted(run_pids(str(run_dir)))
    wrappers = sorted(w["pid"] for w in journal(run_dir)["workers"])
    assert len(workers) == 2 and len(wrappers) == 2
    kill(killed)
    killed_at = time.time()
    # nobody watches: the workers train on (no PR_SET_PDEATHSIG for a detached run)
    assert sorted(run_pids(str(run_dir))) == workers
    # a wait started now sees a free lock while run.json says running: it said the supervisor
    # was gone (exit 1) while a take-back was starting; it waits for the hand-over
    waiting = subprocess.Popen(LAUNCH + ["wait", str(run_dir)], cwd=REPO, env=env_for_tests(),
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                               stdin=subprocess.DEVNULL)
    time.sleep(1.0)  # it has looked, and found the lock free
    # two attaches at once: one takes the run back, the other is refused naming it
    first, second = attach(run_dir), attach(run_dir)
    until(lambda: supervisor(run_dir) != killed, "a new supervisor in run.json")
    supervisors.append(supervisor(run_dir))
    # taken back, not restarted: the new supervisor's journal names the very wrappers the
    # killed one started, and their workers go on
    until(lambda: journal(run_dir).get("alive_at", 0) > killed_at and journal(run_dir)["workers"],
          "the new supervisor's journal")
    assert sorted(w["pid"] for w in journal(run_dir)["workers"]) == wrappers
    assert sorted(run_pids(str(run_dir))) == workers
    # a second supervisor for the run while the first holds it, as the attach that loses the
    # race starts it (`launch ARGV --adopt RUN_DIR`): refused by name, nothing taken
    journaled = journal(run_dir)
    third = subprocess.run(LAUNCH + journaled["argv"] + ["--adopt", str(run_dir)],
                           cwd=journaled.get("cwd") or REPO, env=env_for_tests(),
                           stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=60)
    assert third.returncode == 2 and "is in use by another launcher (pid" in third.stdout + third.stderr, \
        third.stdout + third.stderr
    codes = sorted([(first.wait(timeout=60), first), (second.wait(timeout=60), second)],
                   key=lambda pair: pair[0])
    (ok, viewer), (other_code, other) = codes
    viewed, said = viewer.stdout.read(), other.stdout.read()
    assert ok == 0, viewed[-3000:]
    assert "OK: 2 processes succeeded" in viewed, viewed[-3000:]
    # issue 70: the taking launch's seconds beside the run's, the goodput line's (every launch)
    took = re.search(r"OK: 2 processes succeeded in the run's ([0-9.]+) s, [0-9.]+ s of them "
                     r"this launch's\.", viewed)
    counted = re.search(r"goodput [0-9.]+: [0-9.]+ s of the run's ([0-9.]+) s went", viewed)
    assert took and counted and took[1] == counted[1], viewed[-3000:]
    # the other attach came at once: it found the run without a supervisor too and lost the
    # race for it (refused by name), or it came once the first's supervisor held the run and
    # viewed it; either way the run was taken back once
    if other_code == 2:
        assert "is in use by another launcher (pid" in said, said
        assert "another supervisor took the run back first" in said, said
    else:
        assert other_code == 0 and "OK: 2 processes succeeded" in said, said[-3000:]
    taken = re.findall(r"taking the run back after", (run_dir / "launcher.log").read_text())
    assert len(taken) == 1, taken
    assert reference.wait(timeout=120) == 0
    assert_same_params(params(run_dir), params(ref_dir))
    waited = waiting.communicate(timeout=60)[0]
    assert waiting.returncode == 0, waited
    assert "was taken back by a new supervisor; waiting on" in waited, waited
    assert "launch wait: the run succeeded (exit code 0)" in waited, waited
    record = json.loads((run_dir / "run.json").read_text())
    assert record["state"] == "succeeded" and record["attempts"] == 1, record
    assert not (run_dir / "logs" / "attempt-1").exists()
    assert not (run_dir / "supervisor.json").exists()  # the run ended: nothing to take back
    # every step line once in each process's log: none lost while nobody read, none written
    # twice (the log is cut back to what the killed supervisor's offset covered)
    for i in range(2):
        log = (run_dir / "logs" / f"process-{i:03d}.log").read_text()
        seen = [int(s) for s in re.findall(rf" step (\d+)/{STEPS} loss", log)]
        assert seen == list(range(20, STEPS + 1, 20)), (i, seen)
    ledger = checked_ledger(run_dir)
    assert len(ledger["attempts"]) == 1
    # the gap is a fact beside the buckets: its steps were trained, and count
    assert ledger["attempts"][0]["unwatched_s"] > 0, ledger
    assert ledger["attempts"][0]["buckets_s"]["unsupervised"] == 0, ledger
    assert re.search(r"taking the run back after \d+\.\d s without a supervisor: attempt 0's 2 "
                     "processes", (run_dir / "launcher.log").read_text())


def test_a_process_that_failed_unwatched_is_classified_from_its_exit_report_and_a_supervisor_killed_in_the_restarts_wait_is_taken_back(
        tmp_path, supervisors):
    run_dir, ref_dir = tmp_path / "r", tmp_path / "ref"
    reference = _reference(ref_dir)
    # process 1 exits with code 7 after step 40 of attempt 0 (paced; attempt 1 at full speed)
    started = launch(*PACED, *fault("exit", 40), "--set", "task.args.slow_attempt=0",
                     "--set", "checkpoint.every_steps=20",
                     "--set", "restarts.program_errors=1", "--set", "restarts.backoff_s=4",
                     "--run-dir", str(run_dir), "--detach")
    assert started.returncode == 0, started.stdout + started.stderr
    killed = supervisor(run_dir)
    supervisors.append(killed)
    until(lambda: logged_step(run_dir) >= 20, "step 20 in process 0's log")
    kill(killed)
    # process 1 fails while nobody watches: what it left behind is its exit report
    until(lambda: len(run_pids(str(run_dir))) < 2, "process 1's end, unwatched")
    first = attach(run_dir)
    until(lambda: supervisor(run_dir) != killed, "the first attach's supervisor")
    adopter = supervisor(run_dir)
    supervisors.append(adopter)
    # it read the exit report, stopped the rest (fail-fast), and waits before the restart
    until(lambda: (journal(run_dir).get("waiting") or None), "the restart's wait", 120)
    kill(adopter)
    first.wait(timeout=60)
    assert run_pids(str(run_dir)) == []  # the failed attempt was torn down before the wait
    log = (run_dir / "launcher.log").read_text()
    assert re.search(r"attempt 0 failed: process_id 1 .*code 7 \[program error\]; restarting", log), log[-3000:]
    attach_to_end(run_dir, 180)
    assert reference.wait(timeout=120) == 0
    assert_same_params(params(run_dir), params(ref_dir))
    record = json.loads((run_dir / "run.json").read_text())
    assert record["state"] == "succeeded" and record["attempts"] == 2, record
    assert record["failures"] == {"program error": 1}, record
    assert record["last_failure"]["process_id"] == 1, record
    assert logged_step(run_dir, "attempt-1") == STEPS
    ledger = checked_ledger(run_dir)
    assert [a["attempt"] for a in ledger["attempts"]] == [0, 1]
    failed = ledger["attempts"][0]["buckets_s"]
    # part of the 4 s wait nobody watched (nothing ran in it: badput), and the attempt's own
    # end before it (its processes ran, one failed), a fact beside the buckets
    assert failed["unsupervised"] > 0 and failed["restart_wait"] < 4.0, failed
    assert failed["restart_wait"] + failed["unsupervised"] >= 4.0 - 0.01, failed
    assert ledger["attempts"][0]["unwatched_s"] > failed["unsupervised"], ledger["attempts"][0]
