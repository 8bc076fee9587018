"""Which hosts the next attempt of an ssh run uses: spares, shrinking, quarantine.

After a fault, a host that fails the restart's preflight, or one quarantined (its processes
failed ``restarts.quarantine_after`` times, or were far slower than the rest:
``restarts.quarantine_slower_than``), gives its place to the next spare
(``cluster.spares``) that keeps the run at or over its floor of processes; with none, and
``restarts.min_processes`` set, the run shrinks onto the hosts left. ``Layout`` is the hosts
being planned; ``replace`` changes a copy of it, so a restart that cannot be planned whole
leaves the run's hosts as they were (``launcher.backends.ssh.session.SshSession``).
After NVIDIA's resiliency extension (hot spares, excluding a failing node) and Ray Train's
resizable worker group; podlaunch's topology-free order and exact weighted step make the
run end at the params of the run that never lost a host (docs/recovery.md).
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

from launcher.backends.ssh import preflight as checks
from launcher.words import plural
from launcher.errors import LaunchError

SLOW_MARGIN_S = 0.010  # a slow host is this much slower per step too: no verdict on noise


@dataclasses.dataclass
class Layout:
    """The hosts of the next attempt being planned.

    Attributes:
      specs: ``SshHost``s in process order; counts: processes of each.
      spares: the spares left, in the order written.
    """

    specs: list
    counts: list
    spares: list

    def copy(self) -> "Layout":
        return Layout(list(self.specs), list(self.counts), list(self.spares))

    def ids(self, index: int) -> list:
        """The process ids of host ``index`` (consecutive, in host order: ``make_plan``'s)."""
        first = sum(self.counts[:index])
        return list(range(first, first + self.counts[index]))

    def label(self, index: int) -> str:
        """``127.0.0.5 (p3)``: the host and its processes as the attempt before numbered them."""
        return f"{self.specs[index].host} (" + ",".join(f"p{i}" for i in self.ids(index)) + ")"


def replace(layout: Layout, index: int, why: str, floor: int | None, spec_processes: int,
            processes_on, usable=lambda spare: True, instead: dict | None = None) -> dict | None:
    """Put a spare in the place of host ``index`` of ``layout``, or drop the host.

    The first spare that keeps the run at or over its floor (``restarts.min_processes``, or
    the spec's process count when unset: a spare with fewer processes is a shrink too) and
    that ``usable`` accepts takes the place; with none, the host is dropped when
    ``floor`` is set and the processes left stay at or over it.

    Args:
      layout: changed in place when a change is made.
      index: the host to replace.
      why: the reason, for the console and the records.
      floor: ``restarts.min_processes`` (None: never fewer processes than the spec's).
      spec_processes: the spec's ``num_processes``.
      processes_on: ``SshHost -> its processes`` (the cluster's ``processes_on``).
      usable: ``spare -> bool``: a spare that may take a place (one checked first).
      instead: the change that put the spare now at ``index`` there in this same restart
        (it failed too): the new change is of the host that spare replaced, and says why
        the spare was not used (one change per host lost, not a chain).

    Returns:
      the change (``{host, process_ids, by, why, num_processes, text, label}``), or None
      when neither can be done (``layout`` unchanged).
    """
    label, ids, gone = layout.label(index), layout.ids(index), layout.specs[index].host
    total = sum(layout.counts)
    if instead is not None:
        why = f"{instead['why']} (spare {instead['by']} not used: {why})"
        label, ids, gone = instead["label"], instead["process_ids"], instead["host"]
    lowest = spec_processes if floor is None else floor
    for k, spare in enumerate(layout.spares):
        left = total - layout.counts[index] + processes_on(spare)
        if left < lowest or not usable(spare):
            continue
        del layout.spares[k]
        layout.specs[index], layout.counts[index] = spare, processes_on(spare)
        text = f"{label} replaced by spare {spare.host}: {why}" + (
            "" if left == total else f"; the run goes on with {plural(left, 'process')}")
        return {"host": gone, "process_ids": ids, "by": spare.host, "why": why,
                "num_processes": left, "text": text, "label": label}
    left = total - layout.counts[index]
    if floor is None or left < floor or len(layout.specs) < 2:
        return None
    none_left = why_no_spare(layout, index, lowest, processes_on)
    del layout.specs[index], layout.counts[index]
    text = (f"{label} dropped ({none_left}): {why}; the run shrinks to {plural(left, 'process')} "
            f"(restarts.min_processes {floor}), the same global batch")
    return {"host": gone, "process_ids": ids, "by": None, "why": why, "num_processes": left,
            "text": text, "label": label}


def why_no_spare(layout: Layout, index: int, lowest: int, processes_on) -> str:
    """Why no spare took the place of host ``index`` (``replace`` found none), in words."""
    if not layout.spares:
        return "no spare left in cluster.spares"
    without = sum(layout.counts) - layout.counts[index]
    small = [s for s in layout.spares if without + processes_on(s) < lowest]
    if len(small) < len(layout.spares):
        return "no spare left that passes its check"
    sizes = ", ".join(f"{s.host} with {plural(processes_on(s), 'process')}" for s in small)
    return (f"the spares left ({sizes}) would leave the run under "
            f"{plural(lowest, 'process')}")


def address_taken(hosts: list, specs: Sequence, earlier: set,
                  taken_out=lambda address: None) -> list:
    """Per planned host, why it cannot be used before it is contacted: a host new to the run
    (a spare) that is one of the others by resolved address (an ssh_config alias of one, say)
    would run two places on one machine, and one at the address of a host the run took out
    (quarantined, dropped, replaced) would bring that host back under another name. The
    run's own hosts (``earlier``) keep an address first; None for a host that is fine.

    Args:
      hosts: the resolved hosts (``address``, ``name``), in host order.
      specs: each host's ``SshHost`` entry, the same order.
      earlier: the entries the run used before this restart.
      taken_out: ``address -> why`` a host there is out (one the run took out earlier), or
        None (``takenout.TakenOut.reason``).
    """
    owner: dict = {}
    for ours in (True, False):
        for host, spec in zip(hosts, specs):
            if (spec in earlier) == ours:
                owner.setdefault(host.address, host.name)
    out = []
    for host, spec in zip(hosts, specs):
        if spec in earlier:
            out.append(None)
        elif out_why := taken_out(host.address):
            out.append(out_why)
        elif owner[host.address] != host.name:
            out.append(f"it is {host.address}, already host {owner[host.address]} of the run")
        else:
            out.append(None)
    return out


def slow_hosts(result, ids: list, ratio: float) -> list:
    """``(host index, why)`` of the hosts whose slowest process's own time per step
    (``ProcessStats.mean_own_step_time_s``: outside JAX) was over ``ratio`` times, and
    ``SLOW_MARGIN_S`` more than, the median of the *other* hosts' processes
    (``restarts.quarantine_slower_than``; a median that counts the slow process itself
    could never be doubled by it with two hosts).

    Args:
      result: the attempt's ``state.Result``.
      ids: per host, its process ids (``plan.process_ids``).
      ratio: the factor over the median.
    """
    own = {t.plan.process_id: t.stats.mean_own_step_time_s for t in result.processes}
    out = []
    for index, host_ids in enumerate(ids):
        others = sorted(v for i, v in own.items() if v is not None and i not in host_ids)
        worst = max((own[i] for i in host_ids if own.get(i) is not None), default=None)
        if worst is None or not others:
            continue
        half = len(others) // 2
        median = others[half] if len(others) % 2 else (others[half - 1] + others[half]) / 2
        if worst > ratio * median and worst > median + SLOW_MARGIN_S:
            times = f"{worst / median:.1f} times" if median else "far over"
            out.append((index, f"quarantined: its processes' own time per step was "
                        f"{worst * 1e3:.1f} ms, {times} the median of the other hosts' "
                        f"{median * 1e3:.1f} ms (restarts.quarantine_slower_than {ratio:g})"))
    return out


def refuse(found: list, labels: list, restart: bool, no_spare: str, floor: int | None) -> None:
    """Raise preflight's refusal table (``found``, ``labels``), saying why no spare
    (``no_spare``) or shrink (``floor``: ``restarts.min_processes``) took the place.

    Raises:
      LaunchError: always.
    """
    what = "the restart's attempt was not started" if restart else "nothing was started"
    try:
        checks.refuse_unfit(found, [c.host for c in found], "preflight", labels, what)
    except LaunchError as exc:
        raise LaunchError(f"{exc}\n{no_spare}, and "
                          + ("restarts.min_processes is unset (no shrinking)" if floor is None
                             else f"restarts.min_processes {floor} allows no fewer "
                             "processes")) from None
