"""Failure classes and their budgets (launcher.run.classes, launcher.run.classes.Budgets),
process-free: each end as a backend reports it, each cascade in either order of arrival."""

from __future__ import annotations

import collections
import signal

import pytest

from launcher import backends
from launcher import spec as specs
from launcher.run import classes
from launcher.run.classes import FailureClass
from launcher.ends import EndedEarly, Exited, Final, Killed, Lost, Preempted, Stalled
from launcher.state import Result, State, Tracked
from worker import contract

# The last lines each cascade leaves, as jax 0.9 prints them (seen in this project's runs)
from worker.contract import causes
GLOO_RESET = ("jax.errors.JaxRuntimeError: FAILED_PRECONDITION: [Gloo] Connection closed by "
              "peer [127.0.0.1]:8615")
COORDINATION_ABORT = ("F1201 18:32:21.922875 client.h:80] Terminating process because the JAX "
                      "distributed service detected fatal errors. absl::Status: UNAVAILABLE: "
                      "Failed to send RPC to coordination service.")
TASK_ERROR = "RuntimeError: faulty_task: injected failure at step 5"


def tracked(process_id: int, ended, tail=(), state=State.FAILED) -> Tracked:
    plan = type("P", (), {"process_id": process_id, "host": f"h{process_id}",
                          "label": f"p{process_id} h{process_id}", "log_path": "/x"})()
    t = Tracked(worker=type("W", (), {"plan": plan})(), state=state, exit=ended)
    t.tail = collections.deque(tail)
    return t


def result(*processes: Tracked) -> Result:
    return Result(list(processes), processes[0], False, 1.0)


@pytest.mark.parametrize("ended, cls, words", [
    (Killed(signal.SIGKILL), FailureClass.INFRASTRUCTURE, "was killed by SIGKILL (no notice"),
    (Killed(signal.SIGSEGV), FailureClass.INFRASTRUCTURE, "was killed by SIGSEGV"),
    (Killed(signal.SIGTERM), FailureClass.PREEMPTION, "was killed by SIGTERM (a notice"),
    (Exited(143), FailureClass.PREEMPTION, "exited with code 143 (SIGTERM as a shell reports it)"),
    (Exited(137), FailureClass.INFRASTRUCTURE, "exited with code 137 (SIGKILL as a shell"),
    (Lost("no answer for 4 s"), FailureClass.INFRASTRUCTURE, "was lost (no answer for 4 s)"),
    (Preempted("Slurm job 4 is being preempted; task exit code 143"), FailureClass.PREEMPTION,
     "was preempted (Slurm job 4 is being preempted"),
    (Stalled("no step progress for 3.0 s"), FailureClass.STALL, "stalled (no step progress"),
    (Exited(1), FailureClass.PROGRAM, "exited with code 1: a Python error in the job"),
    (Exited(7), FailureClass.PROGRAM, "exited with code 7"),
    (Exited(contract.EXIT_MISMATCH), FailureClass.PROGRAM, "exited with code 3"),
    (EndedEarly("after step 3 of 10"), FailureClass.PROGRAM, "exited with code 0 after step 3"),
    (Final("Slurm job 4 reached its time limit"), FailureClass.FINAL,
     "ended: Slurm job 4 reached its time limit"),
])
def test_each_end_has_its_class(ended, cls, words):
    verdict = classes.classify(result(tracked(2, ended)))
    assert verdict.failure_class is cls and verdict.process_id == 2
    assert verdict.why.startswith("process_id 2 on h2 ") and words in verdict.why, verdict.why


def test_listed_exit_codes_are_infrastructure_and_exit_1_is_a_program_error_unless_listed():
    assert classes.classify(result(tracked(0, Exited(75))), (75,)).failure_class \
        is FailureClass.INFRASTRUCTURE
    assert classes.classify(result(tracked(0, Exited(1)))).failure_class is FailureClass.PROGRAM
    assert classes.classify(result(tracked(0, Exited(1))), (1,)).failure_class \
        is FailureClass.INFRASTRUCTURE


def test_a_python_error_is_the_cause_of_the_coordination_abort_it_brings():
    # process 0 raises; JAX's coordination client then aborts process 1 (SIGABRT), and the
    # abort may be reported first: the class is the Python error's, in either order
    error = tracked(0, Exited(1), [TASK_ERROR])
    aborted = tracked(1, Killed(signal.SIGABRT), [COORDINATION_ABORT])
    for first, other in ((aborted, error), (error, aborted)):
        verdict = classes.classify(Result([first, other], first, False, 1.0))
        assert verdict.failure_class is FailureClass.PROGRAM and verdict.process_id == 0, verdict
    assert "process_id 1 (killed by SIGABRT) was reported first, but its last lines say it " \
           "stopped because another process did" in classes.classify(
               Result([aborted, error], aborted, False, 1.0)).why


def test_an_error_of_its_own_stays_the_cause_when_the_coordination_shutdown_follows_it():
    error = tracked(0, Exited(1), ["Traceback (most recent call last):", TASK_ERROR,
                                   "E1201 coordination_service_agent.cc:286] Polled an error "
                                   "from coordination service"])
    aborted = tracked(1, Killed(signal.SIGABRT), [COORDINATION_ABORT])
    verdict = classes.classify(Result([aborted, error], aborted, False, 1.0))
    assert verdict.failure_class is FailureClass.PROGRAM and verdict.process_id == 0, verdict


def test_a_sigkill_is_the_cause_of_the_gloo_error_its_peer_reports_first():
    reset = tracked(0, Exited(1), [GLOO_RESET])  # arrived before the SIGKILL, over ssh
    killed = tracked(1, Killed(signal.SIGKILL))
    verdict = classes.classify(Result([reset, killed], reset, False, 1.0))
    assert verdict.failure_class is FailureClass.INFRASTRUCTURE and verdict.process_id == 1
    # a process the launcher stopped itself is no cause; with no cause in view, a consequence
    # means a peer went away: infrastructure, not the consequence's own exit code
    stopped = tracked(1, Killed(signal.SIGTERM), state=State.STOPPED)
    verdict = classes.classify(Result([reset, stopped], reset, False, 1.0))
    assert verdict.failure_class is FailureClass.INFRASTRUCTURE and verdict.process_id == 0
    assert "none of which failed by itself in view" in verdict.why


@pytest.mark.parametrize("consequence", [
    tracked(0, Exited(1), [GLOO_RESET]),  # gloo's reset: exit 1
    tracked(0, Killed(signal.SIGABRT), [COORDINATION_ABORT]),  # the coordination abort
    tracked(0, Exited(1), [COORDINATION_ABORT]),  # the same, as jax 0.9 also ends it
])
def test_a_host_found_lost_only_after_the_teardown_began_is_still_the_cause(consequence):
    # ssh notices a silent host after keepalive_timeout_s, srun a dead node when Slurm
    # marks it down: by then that process is STOPPED, its end Lost, and still the cause
    lost = tracked(1, Lost("no answer from 127.0.0.3 for 15 s"), state=State.STOPPED)
    verdict = classes.classify(Result([consequence, lost], consequence, False, 1.0))
    assert verdict.failure_class is FailureClass.INFRASTRUCTURE and verdict.process_id == 1


def test_a_process_that_never_joined_is_a_program_error_whatever_its_tail_says():
    # its peers cannot be the cause: the coordinator was never reached (its tail holds the
    # coordination service's "failed to connect", which otherwise reads as a consequence)
    never = tracked(1, Exited(1), ["UNAVAILABLE: failed to connect to all addresses"])
    never.joining = "127.0.0.1:27362"  # it said it was joining, and never that it joined
    verdict = classes.classify(result(never))
    assert verdict.failure_class is FailureClass.PROGRAM and "could not join" in verdict.why


def test_a_process_that_found_the_coordinator_unreachable_is_named_with_its_own_words():
    # worker.runtime.joining ends the wait at once (the loopback down: ENETUNREACH); the
    # summary says that, not JAX's timeout and firewalls
    said = ("the coordinator at 127.0.0.1:27362 cannot be reached from this host (Network is "
            "unreachable, errno 101): the loopback interface is down here")
    never = tracked(1, Exited(contract.EXIT_INIT), [causes.line(causes.UNREACHABLE, said)])
    never.joining = "127.0.0.1:27362"
    verdict = classes.classify(result(never))
    assert verdict.failure_class is FailureClass.PROGRAM and verdict.process_id == 1
    assert verdict.why == (f"process_id 1 on h1 exited with code {contract.EXIT_INIT}, a network "
                           f"problem of its host that a restart repeats: {said}")
    assert "firewall" not in verdict.why


@pytest.mark.parametrize("verdict_end", [
    Final("Slurm job 4 reached its time limit"), Lost("no answer for 4 s"),
    Preempted("Slurm job 4 is being preempted"), Stalled("no step progress for 3.0 s")])
def test_a_backends_or_the_watchdogs_verdict_is_never_read_as_a_consequence(verdict_end):
    first = tracked(0, verdict_end, [GLOO_RESET, COORDINATION_ABORT])
    other = tracked(1, Exited(1), [TASK_ERROR])
    assert classes.classify(Result([first, other], first, False, 1.0)).process_id == 0


@pytest.mark.parametrize("own", [
    "failed at step 5: RuntimeError: injected failure at step 5",  # the worker's own line
    "ExceptionGroup: two errors (2 sub-exceptions)", "  | ValueError: bad shard",
    "KeyboardInterrupt"])
def test_an_error_of_its_own_is_read_in_every_form_the_worker_prints(own):
    error = tracked(0, Exited(1), [own, COORDINATION_ABORT])
    aborted = tracked(1, Killed(signal.SIGABRT), [COORDINATION_ABORT])
    verdict = classes.classify(Result([aborted, error], aborted, False, 1.0))
    assert verdict.failure_class is FailureClass.PROGRAM and verdict.process_id == 0, own


def test_a_native_stack_trace_after_the_coordination_services_words_leaves_them_in_the_tail():
    """Issue 71: a peer aborted by JAX's coordination service prints its words, then absl's
    stack trace, a dozen frames; read after the whole trace (a loaded machine), the tail held
    frames alone, the abort was not read as a consequence, and the peer of a frozen process
    was named the cause (test_restart's frozen-process test failed under load)."""
    aborted = tracked(0, Killed(signal.SIGABRT))
    trace = [COORDINATION_ABORT, "1", "The tasks have crashed. Check the task logs for an earlier "
             "error, or scheduler events (e.g. preemption, eviction) to debug further.",
             "RPC: /xla.coordination.CoordinationService/PollForError "
             "[type.googleapis.com/tensorflow.CoordinationServiceError='']",
             "*** Check failure stack trace: ***",
             *[f"    @     0x7f1d1024{n:04x}  absl::log_internal::LogMessage::Flush()"
               for n in range(20)], "    @     0x7f1d1f4a71f5  (unknown)"]
    for line in trace:
        assert aborted.observe(line, 0.0)  # every line is still the log's and the console's
    assert list(aborted.tail) == trace[:5]
    assert classes.follows_from_another(aborted)


def test_budgets_are_per_class_with_defaults_a_long_run_survives_on():
    policy = specs.RestartSpec()
    assert (policy.program_errors, policy.infrastructure, policy.preemptions, policy.stalls,
            policy.max_restarts) == (0, 10, 100, 3, None)
    budgets = classes.Budgets(policy)
    assert budgets.refusal(FailureClass.PROGRAM) == (  # no retry hint: a restart repeats it
        "not retried: a restart repeats it (restarts.program_errors is 0)")
    assert budgets.refusal(FailureClass.FINAL) == "a restart would end the same way"
    for n in range(10):
        assert budgets.refusal(FailureClass.INFRASTRUCTURE) is None
        budgets.take(FailureClass.INFRASTRUCTURE)
    assert budgets.refusal(FailureClass.INFRASTRUCTURE) == (
        "not retrying: restarts.infrastructure is 10 and 10 used")
    # another class's budget is untouched by the infrastructure restarts
    assert budgets.refusal(FailureClass.PREEMPTION) is None
    assert budgets.count_text(FailureClass.INFRASTRUCTURE) == "infrastructure restart 10 of 10"


def test_max_restarts_caps_every_class_together():
    budgets = classes.Budgets(specs.RestartSpec(max_restarts=2))
    budgets.take(FailureClass.PREEMPTION)
    budgets.take(FailureClass.STALL)
    assert budgets.count_text(FailureClass.STALL) == "stall restart 1 of 3; restart 2 of 2 in all"
    assert budgets.refusal(FailureClass.INFRASTRUCTURE) == (
        "not retrying: restarts.max_restarts is 2 and 2 used")


def test_the_first_infrastructure_fault_or_preemption_restarts_at_once_and_backoff_grows_as_a_class_repeats():
    budgets = classes.Budgets(specs.RestartSpec(backoff_s=1.5, program_errors=5))
    waits = [budgets.take(c) for c in (
        FailureClass.INFRASTRUCTURE, FailureClass.INFRASTRUCTURE, FailureClass.INFRASTRUCTURE,
        FailureClass.PREEMPTION, FailureClass.INFRASTRUCTURE,
        FailureClass.PROGRAM, FailureClass.PROGRAM, FailureClass.STALL)]
    assert waits == [0.0, 1.5, 3.0, 0.0, 0.0, 1.5, 3.0, 1.5]


def test_a_bad_budget_is_a_spec_error_naming_its_key(tmp_path):
    from launcher.errors import SpecError

    with pytest.raises(SpecError) as refused:
        specs.load("jobs/linear.yaml", overrides=("restarts.preemptions=-1",
                                                  "restarts.program_error=1"), registry=backends)
    text = str(refused.value)
    assert "restarts.preemptions: expected 0 to 10000, got -1" in text
    assert "restarts.program_error: unknown key; did you mean 'program_errors'?" in text


def test_a_programs_own_exit_3_is_no_disagreement_with_the_plan():
    # issue 51.2: sys.exit(3) in a program was "JAX disagrees with the plan"
    verdict = classes.classify(result(tracked(0, Exited(3), ["my_program: nothing to do"])))
    assert verdict.failure_class is FailureClass.PROGRAM
    assert verdict.why == "process_id 0 on h0 exited with code 3", verdict.why


def test_the_workers_explanation_decides_the_class_and_the_advice():
    said = causes.line(causes.MISMATCH, "JAX disagrees with the launcher's plan: "
                                        "local_device_count is 3, the plan says 2")
    verdict = classes.classify(result(tracked(0, Exited(contract.EXIT_MISMATCH), [said])))
    assert verdict.failure_class is FailureClass.PROGRAM
    assert "a configuration problem that a restart repeats: JAX disagrees" in verdict.why
    said = causes.line(causes.DATA, "data error: d.npy: row 3 (0-based), column 1: nan")
    verdict = classes.classify(result(tracked(1, Exited(contract.EXIT_DATA), [said])))
    assert verdict.failure_class is FailureClass.PROGRAM and "bad data" in verdict.why


def test_a_full_disk_the_worker_explained_is_final_with_its_advice_not_a_program_error():
    # issue 51.2: the disk filled during a save; the worker said so, and the attempt was
    # "a Python error in the job [program error]" with the hint to retry program errors
    full = causes.line(causes.DISK_FULL, "the disk is full (No space left on device) writing "
                       "/r/checkpoints: free space there (df shows it), or lower "
                       "checkpoint.keep, then continue with launch --resume RUN_DIR")
    tail = ["Traceback (most recent call last):", "OSError: [Errno 28] No space left on device",
            full]
    verdict = classes.classify(result(tracked(0, Exited(1), tail)), (1,))
    assert verdict.failure_class is FailureClass.FINAL, verdict
    assert "Python error" not in verdict.why and "free space there" in verdict.why
    assert "launch --resume" in verdict.why
    budgets = classes.Budgets(specs.RestartSpec(program_errors=5, infrastructure=5))
    assert budgets.refusal(verdict.failure_class) == "a restart would end the same way"


def test_an_explanation_line_printed_by_the_program_earlier_is_not_read_from_a_signal():
    # a death by a signal is the machine's, whatever the lines before it said
    full = causes.line(causes.DISK_FULL, "the disk is full")
    verdict = classes.classify(result(tracked(0, Killed(signal.SIGKILL), [full])))
    assert verdict.failure_class is FailureClass.INFRASTRUCTURE


def _joining(process_id: int, at: float | None, ended=None, state=State.FAILED) -> Tracked:
    t = tracked(process_id, ended, ["UNAVAILABLE: failed to connect to all addresses"], state)
    if at is not None:
        t.joining, t.joining_at, t.joining_timeout_s = "10.0.0.1:8476", at, 10.0
    return t


@pytest.mark.parametrize("late_at, words", [(None, "never began joining"),
                                            (12.0, "began joining 12.0 s after it")])
def test_a_host_late_to_join_is_named_not_the_coordinators_network(late_at, words):
    # issue 51.2: at a restart one host starts 12 s late; process 0 gives up after
    # initialization_timeout_s 10: the message blamed process 0 and firewalls
    waited = _joining(0, 0.0, Killed(signal.SIGABRT))
    late = _joining(2, late_at, Killed(signal.SIGTERM), State.STOPPED)
    on_time = _joining(1, 0.4, Killed(signal.SIGABRT))
    verdict = classes.classify(Result([waited, on_time, late], waited, False, 11.0))
    assert verdict.process_id == 2 and verdict.failure_class is FailureClass.PROGRAM
    assert verdict.why.startswith(f"process_id 2 on h2 {words}, and process_id 0 on h0 gave up "
                                  "waiting for it"), verdict.why
    assert "distributed.initialization_timeout_s 10 s" in verdict.why
    assert "firewall" not in verdict.why


def test_a_join_that_fails_with_every_process_in_time_points_at_the_network():
    waited = _joining(0, 0.0, Killed(signal.SIGABRT))
    other = _joining(1, 1.5, Killed(signal.SIGABRT))
    verdict = classes.classify(Result([waited, other], waited, False, 11.0))
    assert verdict.process_id == 0 and "firewalls" in verdict.why


@pytest.mark.parametrize("order", [(0, 1, 2), (1, 0, 2), (2, 0, 1), (1, 2, 0)])
def test_a_cascade_of_three_is_read_from_its_cause_not_from_a_consequence(order):
    # issue 51.9: with two processes the other one is the cause whether or not the search
    # skips consequences; with three, the one that failed by itself must be found
    ends = [tracked(0, Exited(1), [GLOO_RESET]),                          # a consequence
            tracked(1, Killed(signal.SIGABRT), [COORDINATION_ABORT]),     # a consequence
            tracked(2, Killed(signal.SIGKILL))]                           # the cause
    arrived = [ends[i] for i in order]
    verdict = classes.classify(Result(arrived, arrived[0], False, 1.0))
    assert verdict.failure_class is FailureClass.INFRASTRUCTURE and verdict.process_id == 2, verdict


def test_a_join_timed_out_on_a_late_process_shows_our_sentence_not_jaxs_fatal_lines():
    # issue 50.5: the summary's last lines held JAX's fatal line and its RPC line; where a
    # process never began joining the launcher says the cause itself, and JAX's lines stay in
    # the log. A join that fails with every process in time keeps them (they are the cause).
    from launcher.console import status

    def waited():
        t = _joining(0, 0.0, Killed(signal.SIGABRT))
        t.tail = collections.deque(["joining the coordinator at 10.0.0.1:8476 (initialization_timeout_s 10)",
                                    COORDINATION_ABORT, "RPC: /tensorflow.CoordinationService/RegisterTask"])
        return t

    first = waited()
    text = status.summary(Result([first, _joining(1, None, Killed(signal.SIGTERM), State.STOPPED)],
                                 first, False, 11.0))
    block = text[text.index("FAILED: "):text.index("process  host")]
    assert "Terminating process" not in block and "RPC: /tensorflow" not in block, block
    assert "  | joining the coordinator at 10.0.0.1:8476" in block
    assert "(JAX's own lines on the timed-out join are in the log)" in block
    assert "process_id 1 on h1 never began joining the coordinator" in block
    first = waited()
    text = status.summary(Result([first, _joining(1, 0.5, Killed(signal.SIGABRT))], first, False, 11.0))
    assert "Terminating process" in text[text.index("FAILED: "):text.index("process  host")]


def test_a_loss_that_stopped_the_run_is_said_in_its_own_words_not_as_a_python_error():
    # issue 50.4: a non-finite loss was filed as "a Python error in the job"
    stopped = ("failed at step 10: FloatingPointError: loss is nan at step 10 "
               "(logging.on_nonfinite_loss: stop; set it to warn to keep going)")
    verdict = classes.classify(result(tracked(1, Exited(1), ["step 10/100 loss nan", stopped])))
    assert verdict.failure_class is FailureClass.PROGRAM and verdict.process_id == 1
    assert "loss is nan at step 10" in verdict.why and "optimizer.learning_rate" in verdict.why
    assert "Python error" not in verdict.why
    other = classes.classify(result(tracked(1, Exited(1), ["failed at step 3: RuntimeError: x"])))
    assert "a Python error in the job" in other.why
