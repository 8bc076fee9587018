"""Every node's facts (``worker.contract.nodefacts``) checked before a job's processes join.

Two ways to get them (docs/slurm.md): the built-in worker prints them as its
first line and waits for the coordinator address on stdin
(``contract.RENDEZVOUS``), so no step runs before the workers; a program job
(not the built-in worker) gets a probe step first, one task per node, running
``worker/contract/nodefacts.py``'s source. Either way ``check`` decides, with the same
errors: versions that differ are a launch failure (exit 1), a fixed
``coordinator_port`` in use on the first node is bad input (exit 2).
"""

from __future__ import annotations

import json
import threading
import time

from launcher.errors import LaunchError
from worker.contract import nodefacts

KEYS = ("python", "jax", "jaxlib")


def probe_argv(job_id: str, nodes: list, step_name: str, python: str, port: int) -> list:
    """The probe step: one task per node; the first one checks ``port`` (0: picks one)."""
    with open(nodefacts.__file__, encoding="utf-8") as f:
        source = f.read()
    return ["srun", f"--jobid={job_id}", f"--nodes={len(nodes)}", "--ntasks-per-node=1",
            f"--nodelist={','.join(nodes)}", "--overlap", f"--job-name={step_name}", "--quiet",
            python, "-c", source, str(port)]


def parse(stdout: str) -> list:
    """The JSON answers in a probe step's output, one per node."""
    answers = []
    for line in stdout.splitlines():
        try:
            answers.append(json.loads(line))
        except ValueError:
            pass
    return answers


def check(answers: list, python: str, problem) -> int:
    """The coordinator port, once every node's Python and JAX match the first node's.

    Args:
      answers: ``nodefacts.facts`` of every node; exactly one has ``port``.
      python: the interpreter the nodes run (named when jax is missing).
      problem: ``(key, message) -> SpecError`` for a ``cluster.<key>`` problem.

    Raises:
      LaunchError: the versions differ, or jax/jaxlib is not installed.
      SpecError: the fixed coordinator port cannot be bound on the first node.
    """
    first = next(a for a in answers if "port" in a)
    bad = [f"{a['node']}: " + ", ".join(f"{k} {a[k]} ({first['node']}: {first[k]})" for k in KEYS
                                        if a[k] != first[k]) for a in answers
           if any(a[k] != first[k] for k in KEYS)]
    bad += [f"{a['node']}: jax/jaxlib not installed for {python}" for a in answers
            if not (a["jax"] and a["jaxlib"])]
    if bad:
        raise LaunchError("the nodes' Python and JAX differ: " + "; ".join(bad))
    if "port_error" in first:
        raise problem("coordinator_port", f"{first['port_error']} on {first['node']}; pick "
                      "another or use 0")
    return first["port"]


def rendezvous(workers: list, timeout_s: float, python: str, problem) -> int:
    """Every worker's facts line (``contract.RENDEZVOUS``) read and checked: the coordinator port.

    The workers import jax meanwhile: this replaces a probe step before them.

    Args:
      workers: ``SrunWorker``s just started, process 0 first.
      timeout_s: how long a worker may take to say its facts (its step may queue).
      python, problem: as for ``check``.

    Raises:
      LaunchError: a step ended or stayed silent, or the versions differ (``check``).
      SpecError: as ``check``.
    """
    answers: list = [None] * len(workers)

    def read(i):
        answers[i] = workers[i].facts()
    threads = [threading.Thread(target=read, args=(i,), daemon=True) for i in range(len(workers))]
    for t in threads:
        t.start()
    deadline = time.monotonic() + timeout_s
    for t in threads:
        t.join(max(0.0, deadline - time.monotonic()))
    silent = [w for w, a in zip(workers, answers) if a is None]
    if silent:
        w = silent[0]
        raise LaunchError(f"the step of process_id {w.plan.process_id} on {w.plan.host} ended or "
                          f"said nothing within {timeout_s:g} s: "
                          + (" | ".join(w.early_lines()[-5:]) or "no output"))
    first = [a for a in answers if "port" in a]
    return check(first + [a for a in answers if "port" not in a], python, problem)
