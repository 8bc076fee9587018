"""Which hosts the next attempt of an ssh run uses (launcher.backends.ssh.spares),
process-free: a spare that keeps the run at its floor of processes, a shrink down to
``restarts.min_processes``, and the quarantine of a slow host, judged by the host's own
time per step (outside JAX) against the other hosts', never the whole step time every
process shares in the all-reduce."""

from __future__ import annotations

import collections
import textwrap
import types

from launcher import backends
from launcher import spec as specs
from launcher.backends.ssh import spares
from launcher.backends.ssh.session import SshSession
from launcher.backends.ssh.settings import SshHost
from launcher.run.classes import FailureClass, Verdict
from launcher.ends import Exited
from launcher.state import Result, State, Tracked
from launcher.stats import ProcessStats


def process(process_id: int, own_ms: float, step_ms: float = 120.0) -> Tracked:
    plan = type("P", (), {"process_id": process_id, "host": f"h{process_id}",
                          "label": f"p{process_id}", "log_path": "/x"})()
    t = Tracked(worker=type("W", (), {"plan": plan})(), state=State.STOPPED, exit=Exited(1))
    t.tail = collections.deque()
    t.stats = ProcessStats()
    for step in (10, 20):  # two log intervals of 10 steps, as the worker prints them
        t.stats.observe(f"step {step}/40 loss 0.5 | 8.0 steps/s | step_time_s {step_ms / 1e3:g} "
                        f"(own {own_ms / 1e3:g})")
    return t


def result(*own_ms: float) -> Result:
    processes = [process(i, ms) for i, ms in enumerate(own_ms)]
    return Result(processes, processes[0], False, 1.0)


def one_each(n: int) -> list:
    return [range(i, i + 1) for i in range(n)]


def test_the_host_whose_own_time_per_step_is_far_over_the_others_is_named():
    # four hosts of one process; the third spends 100 ms of each step in its own code
    found = spares.slow_hosts(result(0.5, 0.7, 100.0, 0.3), one_each(4), 3.0)
    assert [i for i, _ in found] == [2]
    assert ("own time per step was 100.0 ms, 200.0 times the median of the other hosts' 0.5 ms "
            "(restarts.quarantine_slower_than 3)") in found[0][1], found


def test_two_hosts_are_enough_to_tell_the_slow_one():
    # the median of the others, not of all: with two hosts the slow one's own time would
    # pull a median of both to half its own, and no ratio of 2 or more could ever be met
    assert [i for i, _ in spares.slow_hosts(result(100.0, 0.5), one_each(2), 2.0)] == [0]


def test_a_host_is_judged_by_its_slowest_process_and_small_gaps_are_noise():
    ids = [range(0, 2), range(2, 4)]  # two hosts of two processes: host 1's second is slow
    assert [i for i, _ in spares.slow_hosts(result(1.0, 1.2, 1.1, 40.0), ids, 2.0)] == [1]
    small = spares.SLOW_MARGIN_S * 1e3 / 2  # ten times the others, yet a few ms: no verdict
    assert spares.slow_hosts(result(0.1, 0.1, 0.1, small), one_each(4), 2.0) == []
    assert spares.slow_hosts(result(5.0), one_each(1), 2.0) == []  # nothing to compare with


def host(name: str, num_processes: int | None = None) -> SshHost:
    return SshHost(host=name, num_processes=num_processes)


def layout(counts, spare_counts=()) -> spares.Layout:
    return spares.Layout([host(f"h{i}", c) for i, c in enumerate(counts)], list(counts),
                         [host(f"s{i}", c) for i, c in enumerate(spare_counts)])


def processes_on(h: SshHost) -> int:
    return h.num_processes or 1


def test_a_spare_takes_the_place_and_the_ids_are_the_attempt_befores():
    plan = layout([2, 2], [2])
    change = spares.replace(plan, 1, "unreachable", None, 4, processes_on)
    assert change["text"] == "h1 (p2,p3) replaced by spare s0: unreachable"
    assert change["process_ids"] == [2, 3] and change["num_processes"] == 4
    assert [h.host for h in plan.specs] == ["h0", "s0"] and plan.spares == []


def test_a_spare_with_fewer_processes_is_a_shrink_and_obeys_the_floor():
    # never shrink (min_processes unset): the 1-process spare is skipped for the next
    plan = layout([2, 2], [1, 2])
    change = spares.replace(plan, 1, "unreachable", None, 4, processes_on)
    assert change["by"] == "s1" and [h.host for h in plan.spares] == ["s0"]
    # none fits the floor and no shrink allowed: nothing changes
    plan = layout([2, 2], [1])
    assert spares.replace(plan, 1, "unreachable", None, 4, processes_on) is None
    assert [h.host for h in plan.specs] == ["h0", "h1"] and len(plan.spares) == 1
    # a floor of 3: the 1-process spare is allowed, and the text says the new size
    change = spares.replace(plan, 1, "unreachable", 3, 4, processes_on)
    assert change["text"] == "h1 (p2,p3) replaced by spare s0: unreachable; the run goes on with 3 processes"


def test_with_no_spare_the_run_shrinks_down_to_its_floor_and_no_further():
    plan = layout([1, 1, 1, 1])
    change = spares.replace(plan, 3, "unreachable", 3, 4, processes_on)
    assert change["text"].startswith("h3 (p3) dropped (no spare left in cluster.spares): "
                                     "unreachable; the run shrinks to 3 processes "
                                     "(restarts.min_processes 3)")
    assert change["by"] is None and len(plan.specs) == 3
    assert spares.replace(plan, 0, "unreachable", 3, 4, processes_on) is None
    assert len(plan.specs) == 3


def test_a_spare_that_fails_too_is_one_change_of_the_host_lost_not_a_chain():
    """The attack's "replaced by spare, then dropped": a spare put in a host's place that
    fails the same restart's preflight gives the place to the next spare, and the record
    is one change of the host the run lost, saying why that spare was not used."""
    plan = layout([1, 1], [1, 1])
    first = spares.replace(plan, 1, "unreachable", None, 2, processes_on)
    assert first["by"] == "s0"
    second = spares.replace(plan, 1, "unreachable: timed out", None, 2, processes_on,
                            instead=first)
    assert second["host"] == "h1" and second["by"] == "s1" and second["process_ids"] == [1]
    assert second["text"] == ("h1 (p1) replaced by spare s1: unreachable (spare s0 not used: "
                              "unreachable: timed out)")
    # and a shrink when no spare is left: still the host lost, never the spare
    plan = layout([1, 1, 1], [1])
    first = spares.replace(plan, 2, "unreachable", 2, 3, processes_on)
    dropped = spares.replace(plan, 2, "jax 0.0.1", 2, 3, processes_on, instead=first)
    assert dropped["host"] == "h2" and dropped["by"] is None and dropped["num_processes"] == 2
    assert "spare s0 not used: jax 0.0.1" in dropped["text"]


def test_the_refusal_says_why_no_spare_took_the_place():
    """"no spare left" only when none is left; a spare too small for the floor is named."""
    assert spares.why_no_spare(layout([2, 2]), 1, 4, processes_on) == \
        "no spare left in cluster.spares"
    assert spares.why_no_spare(layout([2, 2], [1]), 1, 4, processes_on) == (
        "the spares left (s0 with 1 process) would leave the run under 4 processes")
    assert spares.why_no_spare(layout([2, 2], [2]), 1, 4, processes_on) == (
        "no spare left that passes its check")


def test_a_spare_that_is_one_of_the_hosts_by_address_cannot_take_a_place():
    """A spare written as an ssh_config alias of a host the run uses resolves to the same
    address: it is refused before it is contacted; the run's own hosts are never refused."""
    resolved = collections.namedtuple("Resolved", "name address")
    h0, h1, s0, s1 = host("h0"), host("h1"), host("alias-of-h0"), host("s1")
    hosts = [resolved("h0", "10.1.1.1:22"), resolved("alias-of-h0", "10.1.1.1:22")]
    assert spares.address_taken(hosts, [h0, s0], {h0, h1}) == [
        None, "it is 10.1.1.1:22, already host h0 of the run"]
    hosts = [resolved("h0", "10.1.1.1:22"), resolved("s1", "10.1.1.2:22")]
    assert spares.address_taken(hosts, [h0, s1], {h0, h1}) == [None, None]


def test_a_host_the_run_took_out_does_not_come_back_as_a_spare_of_another_name():
    """Third attack on issue 28, F5: h1 was quarantined (or dropped) at an earlier restart; a
    spare written as an ssh_config alias of it resolves to h1's address and is refused
    before it is contacted, in the restart's check and in a spare's own check alike."""
    resolved = collections.namedtuple("Resolved", "name address")
    h0, s0, s1 = host("h0"), host("alias-of-h1"), host("s1")
    from launcher.backends.ssh.takenout import TakenOut

    taken_out = TakenOut(None, None, "/runs/linear/r1", None)
    taken_out.seen([host("h1")], [resolved("h1", "10.1.1.2:22")])
    taken_out.addresses["10.1.1.2:22"] = "h1"  # took([h1]) without the copies' removal
    hosts = [resolved("h0", "10.1.1.1:22"), resolved("alias-of-h1", "10.1.1.2:22")]
    assert spares.address_taken(hosts, [h0, s0], {h0}, taken_out.reason) == [
        None, "it is 10.1.1.2:22, host h1, which the run took out earlier (a host taken out "
              "does not come back under another name)"]
    hosts = [resolved("h0", "10.1.1.1:22"), resolved("s1", "10.1.1.3:22")]
    assert spares.address_taken(hosts, [h0, s1], {h0}, taken_out.reason) == [None, None]


# ---- restarts.quarantine_after, in the ssh session itself (issue 51.9: only sshd tests) ----
def _session(tmp_path, quarantine_after: int = 2):
    (tmp_path / "job.yaml").write_text(textwrap.dedent(f"""\
        name: q
        train: {{num_steps: 4, global_batch_size: 8}}
        restarts: {{infrastructure: 5, stalls: 5, program_errors: 5,
                    quarantine_after: {quarantine_after}}}
        cluster: {{backend: ssh, hosts: [127.0.0.2, 127.0.0.3], spares: [127.0.0.4]}}
        """))
    job = specs.load(str(tmp_path / "job.yaml"), None, (), registry=backends)
    return SshSession(job, str(tmp_path / "run"))


def _plan(counts=(1, 1)):
    return types.SimpleNamespace(placements=[types.SimpleNamespace(num_processes=n) for n in counts])


def test_a_host_is_quarantined_at_its_quarantine_after_th_fault_and_not_before(tmp_path):
    session = _session(tmp_path)
    second = session.ssh.specs[1]
    killed = Verdict(FailureClass.INFRASTRUCTURE, 1, "process_id 1 on 127.0.0.3 was killed")
    session.failed(_plan(), killed)
    assert session.quarantine == {} and session.failures == {second: 1}
    # a program error or a preemption is no fault of the host's: not counted
    session.failed(_plan(), Verdict(FailureClass.PROGRAM, 1, "exited with code 1"))
    session.failed(_plan(), Verdict(FailureClass.PREEMPTION, 1, "SIGTERM"))
    assert session.quarantine == {}
    session.failed(_plan(), Verdict(FailureClass.STALL, 1, "process_id 1 stalled"))
    assert list(session.quarantine) == [second]
    assert session.quarantine[second].startswith(
        "quarantined: its processes failed 2 times in this run (restarts.quarantine_after 2; "
        "last: process_id 1 stalled)")
    assert session.ssh.specs[0] not in session.failures


def test_the_fault_counts_against_the_host_of_its_process(tmp_path):
    session = _session(tmp_path, quarantine_after=1)
    # two processes on the first host, one on the second: process 2 is the second host's
    session.failed(_plan((2, 1)), Verdict(FailureClass.INFRASTRUCTURE, 2, "lost"))
    assert list(session.quarantine) == [session.ssh.specs[1]]
