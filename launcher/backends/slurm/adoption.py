"""A detached Slurm run taken back by a new supervisor (``launch attach`` of a run whose
supervisor was killed): the job and the steps the killed one journaled, each proven the run's
own before anything is signalled (docs/long-runs.md).

The job (``prove``): this user's (``UserId``), and, when podlaunch submitted it, named for the
job (``podlaunch.<job>``) with its batch output in this run directory (``StdOut``: job ids are
not reused while Slurm knows a job, and its name and output path are the run's). A job gone
(ended) is not refused: its steps ended with it, and each is classified from what it left
(``filed``), read against the job's state. Each step (``adopted_steps``): the journal's record names
this run's step name (``<job name>.<run tag>.p<id>``) in this job, and the step id it names,
if Slurm still lists it, carries that name; a step no longer listed has ended.
"""

from __future__ import annotations

import dataclasses
import os
import re

from launcher.backends.base import Handle, Reattach
from launcher.backends.slurm import launches
from launcher.backends.slurm.filed import FiledWorker
from launcher.errors import Problem, SpecError
from launcher.plan import Plan

ONE_USER = re.compile(r"\((\d+)\)")  # scontrol's UserId=name(uid)


def _refused(text: str) -> SpecError:
    return SpecError([Problem("RUN", None, "", f"{text}: nothing was signalled; cancel what is left "
                              "of it (scancel) and continue with `launch resume RUN`")])


@dataclasses.dataclass(frozen=True)
class SlurmHandle(Handle):
    """What a detached Slurm run holds beyond its steps, in its journal: the job (``job_id``,
    the one podlaunch submitted or the user's allocation: ``mode``), the nodes it placed the
    processes on, and the coordinator's address they joined."""

    job_id: str
    mode: str  # "allocation" or "submit"
    nodes: tuple
    coordinator: str

    def to_json(self) -> dict:
        return {"job_id": self.job_id, "mode": self.mode, "nodes": list(self.nodes),
                "coordinator": self.coordinator}

    @classmethod
    def from_json(cls, entry: dict) -> "SlurmHandle":
        """Raises:
          SpecError: the entry names no usable job."""
        job_id, nodes = entry.get("job_id"), entry.get("nodes")
        if not (isinstance(job_id, str) and job_id.isdigit()
                and entry.get("mode") in ("allocation", "submit")
                and isinstance(nodes, list) and nodes and all(isinstance(n, str) for n in nodes)
                and isinstance(entry.get("coordinator"), str)):
            raise _refused(f"the run's journal names no usable Slurm job ({entry!r})")
        return cls(job_id, entry["mode"], tuple(nodes), entry["coordinator"])


def prove(job_id: str, record: dict | None, mode: str, name: str, run_dir: str) -> None:
    """Job ``job_id`` (``record``: scontrol's, None once gone) is the run's.

    Raises:
      SpecError: it is another's.
    """
    if record is None:
        return
    user = ONE_USER.search(record.get("UserId", ""))
    theirs = [] if user and int(user.group(1)) == os.getuid() else [f"UserId={record.get('UserId')}"]
    if mode == "submit":
        if record.get("JobName") != name:
            theirs.append(f"JobName={record.get('JobName')}")
        found = launches.batch_run_dir(record)
        if not found or os.path.realpath(found) != os.path.realpath(run_dir):
            theirs.append(f"StdOut={record.get('StdOut')}")
    if theirs:
        raise _refused(f"Slurm job {job_id}, which the run's journal names, is not this run's "
                       f"({', '.join(theirs)})")


def adopted_steps(plan: Plan, records: list, slurm, job_id: str, step_prefix: str, judge) -> list:
    """One ``FiledWorker`` per process of ``plan``, from the journal's ``records``, each step
    proven (or found ended) in job ``job_id`` (already proven the run's).

    Raises:
      SpecError: a record is missing or names another step; nothing was signalled.
    """
    by_id = {r["process_id"]: r for r in records
             if isinstance(r, dict) and isinstance(r.get("process_id"), int)}
    listed = dict(slurm.steps_named(job_id, step_prefix))
    workers = []
    for p in plan.processes:
        record, name = by_id.get(p.process_id), f"{step_prefix}p{p.process_id}"
        step = (record or {}).get("step")
        if record is None or record.get("step_name") != name or record.get("job_id") != job_id \
                or not isinstance(record.get("pid"), int) or listed.get(step, name) != name:
            raise _refused(f"the run's journal does not name {p.label}'s step {name} of Slurm "
                           f"job {job_id} ({record!r})")
        if step is None:  # the killed supervisor had not seen it listed yet
            step = next((s for s, n in listed.items() if n == name), None)
        try:
            workers.append(FiledWorker.adopted(p, record, slurm, judge,
                                               step if step in listed else None))
        except (TypeError, ValueError) as exc:
            raise _refused(f"the run's journal is not usable ({exc!r})") from None
    return workers


class SlurmReattach(Reattach):
    """A Slurm run's part in being taken back: its job and nodes (``SlurmHandle``), proven
    the run's at the first ``plan`` (``prepare``), then its steps (``adopt``), or those no
    journal names cancelled (``stop_strays``).

    Args:
      session: the ``SlurmSession`` it takes back (its job, nodes, and whether they are
        ``ours`` to cancel: not until proven).
    """

    handle_type = SlurmHandle

    def __init__(self, session):
        self.session = session
        self.pending: SlurmHandle | None = None  # rejoined, to be proven at the first plan

    def handle(self) -> SlurmHandle | None:
        s = self.session
        if not (s.ours and s.job_id):
            return None
        return SlurmHandle(s.job_id, s.mode, tuple(s.nodes), s.coordinator)

    def rejoin(self, handle: SlurmHandle | None) -> None:
        if handle is None:
            raise _refused("the run's journal names no Slurm job")
        self.pending = handle

    def prepare(self) -> tuple[tuple, str]:
        """The killed supervisor's job, proven this run's, and its nodes: the plan it made."""
        handle, self.pending, s = self.pending, None, self.session
        prove(handle.job_id, s.slurm.job(handle.job_id), handle.mode, s.name, s.run_dir)
        s.mode, s.job_id, s.nodes = handle.mode, handle.job_id, list(handle.nodes)
        placements, _ = s.placements_on(s.nodes, port=0)
        s.ours = True  # its steps and job are this session's to stop from now on
        if s.mode == "submit":
            s.heartbeat()  # its batch script waits on this supervisor now
        return placements, handle.coordinator

    def adopt(self, plan: Plan, records: list) -> list:
        s = self.session
        s.exclusions.last_processes = plan.processes
        # a journal that does not name the steps: refused, and nothing cancelled at the close
        s.ours = False
        workers = adopted_steps(plan, records, s.slurm, s.job_id, s.step_prefix, s.judge)
        s.ours = True
        return workers

    def stop_strays(self) -> list:
        s = self.session
        steps = s.slurm.steps_named(s.job_id, s.step_prefix) if s.job_id else []
        s.cancel_steps(steps)
        return [step for step, _ in steps]
