"""Supervision of a simulated 1,024 to 4,096-process job: the launcher's own cost, no processes.

The real ``launcher.run.supervise`` (real clock, real threads, the real console writing to
a pipe as it would to a log) watches ``--processes`` scripted workers: each prints a
progress line every ``--step-s`` seconds and a heartbeat between them, as a worker of a
job at that step rate does; after ``--fail-after-s`` one of them, chosen at random, exits
with code 1 after a traceback, and every other one ends ``--term-delay-s`` after its
SIGTERM, as a healthy worker does. Measured in one run per process count: the launcher
process's CPU seconds (user + sys, ``resource.getrusage``) per process-second of
supervision before the failure, as a share of one core; its peak memory (max RSS) growth;
the seconds from the failing worker's exit to every other worker told to stop (its
``terminate``); and how many console lines were written while the run went well (one
status line and process 0's lines expected, not one per process).

    python bench/bench_supervise_scale.py --processes 256 1024 4096
"""

from __future__ import annotations

import argparse
import io
import os
import random
import resource
import signal
import sys
import threading
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [REPO, os.path.join(REPO, "tests")]

from harness.fakes import process_plan  # noqa: E402
from launcher.console import Console  # noqa: E402
from launcher.run import supervise as supervision  # noqa: E402
from launcher.ends import Exited, Killed  # noqa: E402
from launcher.state import Watchdog  # noqa: E402
from worker.contract import wire  # noqa: E402


class ScriptedWorker:
    """A worker in real time: a progress line every ``step_s``, a heartbeat between; it
    fails at ``fail_at`` (monotonic) when given; it ends ``term_delay_s`` after SIGTERM."""

    def __init__(self, plan, started: float, step_s: float, fail_at: float | None, term_delay_s: float):
        self.plan, self.step_s, self.fail_at, self.term_delay_s = plan, step_s, fail_at, term_delay_s
        self.started = started
        self.ended: Exited | Killed | None = None
        self.end_at: float | None = None
        self.terminated_at: float | None = None
        self.wake = threading.Event()

    def lines(self):
        step = 0
        next_at = self.started + self.step_s * random.random()  # each its own phase
        while True:
            now = time.monotonic()
            if self.fail_at is not None and now >= self.fail_at and self.ended is None:
                yield "Traceback (most recent call last):"
                yield "RuntimeError: injected failure"
                self.end_at, self.ended = time.monotonic(), Exited(1)
                return
            if self.ended is not None and now >= self.end_at:
                return
            if now >= next_at:
                step += 1
                yield wire.PROGRESS_FORMAT.format(step=step, num_steps=10**6, loss=0.5,
                                                      steps_per_s=1 / self.step_s,
                                                      step_time_s=self.step_s, own_step_time_s=0.001)
                next_at += self.step_s
                continue
            if now >= next_at - self.step_s / 2 and step:  # a heartbeat half way
                yield wire.HEARTBEAT_FORMAT.format(step=step)
            wait = next_at - now
            if self.fail_at is not None:
                wait = min(wait, max(0.0, self.fail_at - now))
            if self.end_at is not None:
                wait = min(wait, max(0.0, self.end_at - now))
            self.wake.wait(min(wait, self.step_s / 2))
            self.wake.clear()

    def poll(self):
        if self.ended is not None and time.monotonic() >= self.end_at:
            return self.ended
        return None

    def terminate(self):
        if self.terminated_at is None:
            self.terminated_at = time.monotonic()
        if self.ended is None:
            self.end_at, self.ended = time.monotonic() + self.term_delay_s, Killed(signal.SIGTERM)
            self.wake.set()

    def kill(self):
        if self.ended is None or time.monotonic() < self.end_at:
            self.end_at, self.ended = time.monotonic(), Killed(signal.SIGKILL)
            self.wake.set()

    def stopped(self):
        return False

    def dump_stacks(self):
        pass


class CountingStream(io.TextIOBase):
    def __init__(self):
        self.lines = 0

    def write(self, text):
        self.lines += text.count("\n")
        return len(text)


def scripts_alone(processes: int, args) -> float:
    """CPU share of one core the scripted workers' lines cost with nobody supervising (a
    thread each takes its lines, as the readers do): subtracted from supervision's."""
    started = time.monotonic()
    workers = [ScriptedWorker(process_plan(i, "/tmp"), started, args.step_s, None, 0.0)
               for i in range(processes)]

    def take(w):
        for _ in w.lines():
            pass
    threads = [threading.Thread(target=take, args=(w,), daemon=True) for w in workers]
    usage = resource.getrusage(resource.RUSAGE_SELF)
    cpu0 = usage.ru_utime + usage.ru_stime
    for t in threads:
        t.start()
    time.sleep(args.fail_after_s / 2)
    usage = resource.getrusage(resource.RUSAGE_SELF)
    share = (usage.ru_utime + usage.ru_stime - cpu0) / (time.monotonic() - started)
    for w in workers:
        w.kill()
    for t in threads:
        t.join(5)
    return share


def one(processes: int, args) -> dict:
    random.seed(processes)
    started = time.monotonic()
    fail_at = started + args.fail_after_s
    failing = random.randrange(1, processes)
    workdir = f"/tmp/bench_supervise_scale-{os.getpid()}-{processes}"
    os.makedirs(workdir, exist_ok=True)
    workers = [ScriptedWorker(process_plan(i, workdir), started, args.step_s,
                              fail_at if i == failing else None, args.term_delay_s)
               for i in range(processes)]
    stream = CountingStream()
    # the CLI's default view: process 0's lines, the others' notable ones, a status line
    console = Console(stream, tty=False, status_every_s=5, show=frozenset({0}), others=True)
    rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    cpu = {}

    def sample():  # the CPU of the run before the failure
        time.sleep(max(0.0, fail_at - time.monotonic() - 0.05))
        usage = resource.getrusage(resource.RUSAGE_SELF)
        cpu["at"], cpu["s"] = time.monotonic(), usage.ru_utime + usage.ru_stime
        cpu["lines"] = stream.lines
    usage = resource.getrusage(resource.RUSAGE_SELF)
    cpu0, t0 = usage.ru_utime + usage.ru_stime, time.monotonic()
    sampler = threading.Thread(target=sample)
    sampler.start()
    result = supervision.supervise(workers, 3.0, console, watchdog=Watchdog(stall_timeout_s=300))
    sampler.join()
    told = [w.terminated_at for w in workers if w is not workers[failing]]
    ended = workers[failing].end_at
    for w in workers:
        os.unlink(w.plan.log_path)
    os.rmdir(workdir)
    assert result.first_failure is not None and result.first_failure.plan.process_id == failing
    return {"cpu_share": (cpu["s"] - cpu0) / (cpu["at"] - t0),
            "rss_mb": (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss0) / 1024,
            "stop_s": max(told) - ended if all(t is not None for t in told) else float("nan"),
            "lines": cpu["lines"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--processes", type=int, nargs="+", default=[256, 1024])
    parser.add_argument("--step-s", type=float, default=1.0, help="seconds between progress lines")
    parser.add_argument("--fail-after-s", type=float, default=20.0)
    parser.add_argument("--term-delay-s", type=float, default=0.2)
    args = parser.parse_args()
    print(f"a progress line every {args.step_s:g} s and a heartbeat between, per process; one "
          f"fails after {args.fail_after_s:g} s")
    for n in args.processes:
        alone = scripts_alone(n, args)
        got = one(n, args)
        print(f"{n:5d} processes: supervision {100 * (got['cpu_share'] - alone):5.1f}% of one core "
              f"({100 * got['cpu_share']:.1f}% less the scripted lines' own "
              f"{100 * alone:.1f}%); max RSS "
              f"+{got['rss_mb']:.0f} MB; failure to every process told to stop "
              f"{got['stop_s']:.2f} s; console lines while it went well {got['lines']}", flush=True)


if __name__ == "__main__":
    main()
