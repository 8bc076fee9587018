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

import os
import re

from launcher.backends.slurm import launches
from launcher.backends.slurm.filed import FiledWorker
from launcher.errors import Problem, SpecError
from launcher.plan import Plan

ONE_USER = re.compile(r"\((\d+)\)")  # scontrol's UserId=name(uid)


def _refused(text: str) -> SpecError:
    return SpecError([Problem("RUN", None, "", f"{text}: nothing was signalled; cancel what is left "
                              "of it (scancel) and continue with `launch JOB.yaml --resume RUN`")])


def checked_entry(entry: dict) -> dict:
    """The journal's ``session`` entry of a Slurm run (``SlurmSession.journaled``), checked.

    Raises:
      SpecError: it names no usable job.
    """
    job_id, nodes = entry.get("job_id"), entry.get("nodes")
    if not (isinstance(job_id, str) and job_id.isdigit()
            and entry.get("mode") in ("allocation", "submit")
            and isinstance(nodes, list) and nodes and all(isinstance(n, str) for n in nodes)
            and isinstance(entry.get("coordinator"), str)):
        raise _refused(f"the run's journal names no usable Slurm job ({entry!r})")
    return dict(entry)


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


class Adoption:
    """``SlurmSession``'s part in taking a run back (``launcher.backends.base.Session``'s
    ``journaled``, ``rejoin``, ``adopt`` and ``stop_strays``)."""

    adopts = True  # a detached run's steps outlive its supervisor (``filed``)

    def journaled(self) -> dict:
        if not (self._ours and self.job_id):
            return {}
        return {"job_id": self.job_id, "mode": self.mode, "nodes": list(self.nodes),
                "coordinator": self._coordinator}

    def rejoin(self, entry: dict) -> None:
        self._rejoined = checked_entry(entry)

    def _rejoin_prepare(self) -> tuple[tuple, str]:
        """The killed supervisor's job, proven this run's, and its nodes: the plan it made."""
        entry, self._rejoined = self._rejoined, None
        self.mode, job_id = entry["mode"], entry["job_id"]
        prove(job_id, self.slurm.job(job_id), self.mode, self.name, self.run_dir)
        self.job_id, self.nodes = job_id, list(entry["nodes"])
        placements, _ = self._placements(self.nodes, port=0)
        self._ours = True  # its steps and job are this session's to stop from now on
        if self.mode == "submit":
            self._heartbeat()  # its batch script waits on this supervisor now
        return placements, entry["coordinator"]

    def adopt(self, plan: Plan, records: list) -> list:
        self.exclusions.last_processes = plan.processes
        # a journal that does not name the steps: refused, and nothing cancelled at the close
        self._ours = False
        workers = adopted_steps(plan, records, self.slurm, self.job_id, self.step_prefix,
                                self.judge)
        self._ours = True
        return workers

    def stop_strays(self) -> list:
        steps = self.slurm.steps_named(self.job_id, self.step_prefix) if self.job_id else []
        self._cancel_steps(steps)
        return [step for step, _ in steps]
