"""The slurm backend's session: find or submit the job, wait for it, run one step per process.

Allocation mode (``SLURM_JOB_ID`` set by salloc or an sbatch script): the
processes run as steps of that job; the job is the user's and is never
cancelled, only podlaunch's steps are. Submit mode: the preflight (``queued``: partition,
``sbatch --test-only``), a stale-job check, ``sbatch`` of ``script.script_text``,
then the job is followed (``pending (reason)`` on the status line) until it
runs; at the end, or on Ctrl-C/SIGTERM/SIGHUP at any point, it is cancelled
and waited out of the queue.

After a failed attempt (``prepare(restart=True)``) the job's state decides
(never a walltime guess): RUNNING: new steps in it; PENDING after a requeue:
wait; PREEMPTED (PreemptMode=CANCEL), NODE_FAIL, BOOT_FAIL: submit again;
TIMEOUT or CANCELLED by someone else: no restart.
"""

from __future__ import annotations

import shlex
import os
import threading
import time

from launcher import interrupts
from launcher import plan as planning
from launcher.backends.base import Session
from launcher.backends.slurm import adoption, gpus, launches, lifecycle, nodes as nodefacts
from launcher.backends.slurm import queued, script
from launcher.backends.slurm.commands import Slurm
from launcher.backends.slurm.exclusions import NodeExclusions
from launcher.backends.slurm.filed import FiledWorker
from launcher.backends.slurm.workers import SrunWorker, srun_argv
from launcher.errors import LaunchError, Problem, SpecError
from launcher.plan import Placement, Plan
from launcher.ends import Exit, Lost
from launcher.words import plural
from worker.contract.address import host_port, split_host_port
from worker.contract import redact, runfiles


class SlurmSession(Session):
    def __init__(self, job, run_dir, console=None, options=None, slurm: Slurm | None = None):
        super().__init__(job, run_dir, console, options)
        self.slurm = slurm or Slurm()
        cluster = job.cluster
        outer = os.environ.get("SLURM_JOB_ID")
        self.mode = cluster.mode if cluster.mode != "auto" else ("allocation" if outer else "submit")
        self.job_id: str | None = outer if self.mode == "allocation" else None
        self.name = script.job_name(job)
        # steps named per launch (<name>.<run tag>.p<id>): a sweep's launches cancel only their own
        self.step_prefix = f"{self.name}.{launches.run_tag(run_dir)}."
        self.nodes: list = []
        self.test_only_nodes: list = []
        self.exclusions = NodeExclusions(self.slurm, self.console, self.host_changes,
                                         job.restarts.quarantine_after)
        self._beat_stop = threading.Event()
        self._beat: threading.Thread | None = None
        self.lifecycle = lifecycle.JobLifecycle(self.slurm.job, job.cluster.poll_s)
        # taking a run back (adoption.SlurmReattach): nothing is cancelled until proven ours
        self.ours = not self.options.adopting
        self.coordinator = ""
        self.reattach = adoption.SlurmReattach(self)
        self.node_gpus: dict = {}  # node -> a gpu job's GPUs there, by Slurm's index

    # ---- prepare ----------------------------------------------------------------
    def prepare(self, restart: bool = False) -> tuple[tuple, str]:
        if self.reattach.pending is not None:
            return self.reattach.prepare()
        cluster = self.job.cluster
        if self.mode == "allocation":
            if not self.job_id:
                raise self._problem("mode", "is allocation but SLURM_JOB_ID is not set: run launch "
                                    "inside salloc or an sbatch script, or use mode: submit")
            record = self.slurm.job(self.job_id)
            if record is None or record.get("JobState") != "RUNNING":
                raise LaunchError(f"the allocation {self.job_id} (SLURM_JOB_ID) is "
                                  f"{'gone' if record is None else record.get('JobState')}")
            unused = cluster.submit_only()
            if not restart and unused:  # mode auto, inside the user's job
                self.console.say(f"warning: {', '.join('cluster.' + k for k in unused)} "
                                 f"{'is' if len(unused) == 1 else 'are'} not used in allocation "
                                 f"{self.job_id} (SLURM_JOB_ID): only a job podlaunch submits "
                                 "(mode: submit) reads them")
            queued.stale_steps(self.slurm, self.job_id, self.name, self.step_prefix, restart,
                               self.options, self.console, self.cancel_steps)
            if not self.options.dry_run:
                launches.register_run(self.run_dir)
        else:
            if self.job_id is None:
                self.test_only_nodes = queued.check_request(self.slurm, self.job, self.run_dir,
                                                            self.options.detached, self._problem)
                queued.stale_jobs(self.slurm, self.name, self.job.name, self.options, self.console,
                                  self._cancel_and_wait)
                if self.options.dry_run:
                    return self.placements_on(self.test_only_nodes or [f"node{i}" for i in
                                            range(cluster.nodes)], port=cluster.coordinator_port)
                self._submit()
            elif restart:
                self._after_failure()
            record = self._wait_running()
        nodes = self.slurm.hostnames(record["NodeList"])
        if len(nodes) < cluster.nodes:
            raise self._problem("nodes", f"asks for {cluster.nodes} nodes; Slurm job {self.job_id} "
                                f"holds {len(nodes)} ({record['NodeList']}); ask salloc for more "
                                "or lower cluster.nodes")
        before, self.nodes = self.nodes, nodes[:cluster.nodes]
        self.exclusions.placed(before, self.nodes)
        if cluster.gpus_per_node:  # too few in the user's allocation: refused (``gpus.check``)
            self.node_gpus = gpus.check(self.slurm, cluster, self.job_id, self.nodes, self.mode,
                                        self._problem)
        if self.options.dry_run or self.job.rendezvous:  # the workers say their facts
            return self.placements_on(self.nodes, port=cluster.coordinator_port)
        return self.placements_on(self.nodes, port=self._probe())

    def placements_on(self, nodes: list, port: int) -> tuple[tuple, str]:
        cluster, job = self.job.cluster, self.job
        python = cluster.python or self.options.python
        job_path = os.path.join(self.run_dir, "job.json")  # a shared filesystem: the same path
        # a program runs from its own directory, the same path on every node (shared, not synced)
        cwd = job.working_directory
        placements = []
        for node in nodes:
            env = dict(cluster.env)
            if cluster.platform == "cpu":
                placements.append(Placement(node, cluster.processes_per_node, job.local_device_count,
                                            "cpu", python, self.run_dir, job_path, env, cwd=cwd))
            else:  # one placement per process, each its own GPUs named explicitly (``gpus``)
                placements += gpus.placements(job, node, python, self.run_dir, job_path, env, cwd)
        addr = self.slurm.node_addrs(nodes[:1]).get(nodes[0], nodes[0]) if self.job_id else nodes[0]
        return tuple(placements), host_port(addr, port)

    def _problem(self, key: str, message: str) -> SpecError:
        return SpecError([Problem(*self.job.where(("cluster", key)), f"cluster.{key}", message)])

    # ---- the job --------------------------------------------------------------------
    def _submit(self) -> None:
        os.makedirs(os.path.join(self.run_dir, "slurm"), exist_ok=True)
        path = os.path.join(self.run_dir, "slurm", "job.sbatch")
        runfiles.write_whole(path, script.script_text(self.job, self.run_dir, self.exclusions.excluded,
                                                     detached=self.options.detached))
        self.heartbeat()
        out = self.slurm.run(["sbatch", "--parsable", path]).stdout.strip()
        self.job_id = out.split(";")[0]
        self.console.say(f"submitted Slurm job {self.job_id} ({plural(self.job.cluster.nodes, 'node')} "
                         f"x {plural(self.job.cluster.processes_per_node, 'task')}; script {path})")

    def heartbeat(self) -> None:
        """Renew the file the batch script watches (it ends the job when the launcher is gone)."""
        path = script.heartbeat_path(self.run_dir)
        with open(path, "a", encoding="utf-8", opener=runfiles.opener):
            os.utime(path)
        if self._beat is None:
            def beat():
                while not self._beat_stop.wait(script.HEARTBEAT_EVERY_S):
                    try:
                        os.utime(path)
                    except OSError:
                        pass
            self._beat = threading.Thread(target=beat, name="slurm-heartbeat", daemon=True)
            self._beat.start()

    def _wait_running(self) -> dict:
        """Follow the job until it runs; Ctrl-C, SIGTERM or SIGHUP meanwhile cancel it
        (an ignored SIGHUP, ``nohup launch``, stays ignored: the job outlives the terminal)."""
        said = None
        try:
            with interrupts.handled(interrupts.raise_keyboard_interrupt):
                def pending(text: str) -> None:
                    nonlocal said
                    if text != said:
                        self.console.say(f"Slurm job {self.job_id}: {text}")
                        said = text
                    self.console.live.update(f"Slurm job {self.job_id} {text}")
                record = self.lifecycle.wait_running(self.job_id, pending)
                self.console.end_status()
                return record
        except KeyboardInterrupt as exc:
            self.console.end_status()
            self.console.say(f"interrupted ({exc or 'SIGINT'}) while job {self.job_id} was pending; "
                             "cancelling it")
            self.close()
            raise

    def _after_failure(self) -> None:
        """Decide by the job's state how the next attempt gets nodes (``lifecycle.Phase``):
        running: new steps in it; waiting (a requeue): wait; resubmittable: submit again."""
        # preemption's grace time (requeued or cancelled next), or a requeue passing through
        # COMPLETING on its way back to PENDING, is waited out first
        record = self.lifecycle.settled(self.job_id, limit_s=120)
        now, state = lifecycle.phase(record), lifecycle.state_text(record)
        if state == "RUNNING" or now is lifecycle.Phase.WAITING:
            if state == "RUNNING":
                self.cancel_steps(self.slurm.steps_named(self.job_id, self.step_prefix))
            return
        if now is lifecycle.Phase.TIMEOUT:
            raise LaunchError(f"Slurm job {self.job_id} reached its time limit (state {state}); not "
                              "resubmitted: raise cluster.time_limit and continue with --resume "
                              f"{self.run_dir}")
        if now is not lifecycle.Phase.RESUBMIT:
            raise LaunchError(f"Slurm job {self.job_id} ended ({state}); not resubmitted")
        self.console.say(f"Slurm job {self.job_id} is {state}: submitting it again")
        self.job_id = None
        self.exclusions.before_resubmission(self.job, self.run_dir)
        self._submit()

    def judge(self, ended: Exit, failed_node: str | None = None, time_limit: bool = False) -> Exit:
        """A failed step read against its job: preemption, node failure, time limit
        (``JobLifecycle.judge``; ``time_limit``: slurmstepd said the step reached it). The node srun reported failed (``failed_node``), and those
        of the job's nodes Slurm holds unfit when a step is lost with its job, are excluded
        when the job is submitted again (``NodeExclusions``)."""
        # the lead is what podlaunch asked of the job it submitted; an allocation's is the user's
        lead_s = self.job.cluster.signal_lead_s if self.mode == "submit" else 0
        verdict = self.lifecycle.judge(self.job_id, ended, self.run_dir, lead_s=lead_s,
                                       time_limit=time_limit)
        if isinstance(verdict, Lost) and self.nodes:
            self.exclusions.lost(self.nodes, failed_node)
        return verdict

    def failed(self, plan: Plan, failure, result=None) -> None:
        self.exclusions.failed(plan, failure)

    def _probe(self) -> int:
        """A program job's probe step: Python and JAX on every node agree; the coordinator port."""
        python = self.job.cluster.python or self.options.python
        result = self.slurm.run(nodefacts.probe_argv(self.job_id, self.nodes, f"{self.step_prefix}probe",
                                                     python, self.job.cluster.coordinator_port),
                                check=False)
        answers = nodefacts.parse(result.stdout)
        if result.returncode != 0 or len(answers) != len(self.nodes):
            raise LaunchError(f"the preflight step on {','.join(self.nodes)} failed (rc "
                              f"{result.returncode}): {(result.stderr or result.stdout).strip()[-500:]}")
        return nodefacts.check(answers, python, self._problem)

    # ---- steps --------------------------------------------------------------------
    def describe(self, plan: Plan) -> str:
        """``--dry-run``: the batch script (submit mode), the plan, each process's step and devices."""
        c = plan.job.cluster
        out = []
        if self.mode == "submit":
            where = ",".join(self.test_only_nodes) or "not known before submission"
            out += [f"# the batch script (not submitted; sbatch --test-only expects nodes {where}):",
                    script.script_text(plan.job, self.run_dir)]
        else:
            out.append(f"# steps of the allocation {self.job_id} (SLURM_JOB_ID) on {','.join(self.nodes)}")
        if plan.coordinator_address.endswith(":0"):
            out.append("# coordinator port 0: a free port is picked on the first node at launch")
        out.append(planning.describe(plan))
        out.append("devices (JAX's own Slurm detection is off: every value is explicit):")
        for p in plan.processes:
            ids = p.local_device_ids
            devices = (gpus.devices_text(c, p, self.node_gpus) if ids else
                       f"JAX_NUM_CPU_DEVICES={p.local_device_count}")
            step = srun_argv(self.job_id or "<job id>", p.host, f"{self.step_prefix}p{p.process_id}",
                             c, p.argv, p.cwd or c.workdir)
            shown = redact.masked_argv(step, plan.job.secrets)
            out.append(f"  {p.label}: {devices}; step: {' '.join(shlex.quote(a) for a in shown)}")
        return "\n".join(out)

    def describe_start(self, plan: Plan) -> str:
        c = plan.job.cluster
        return (f"starting {plural(plan.num_processes, 'process')} ({c.processes_per_node} per node x "
                f"{plural(c.devices_per_process, c.platform + ' device')}) as steps of Slurm job {self.job_id} "
                f"({self.mode}) on {','.join(self.nodes)}, coordinator {plan.coordinator_address}"
                + (" (0: a free port there, once the workers have said their facts)"
                   if plan.coordinator_address.endswith(":0") else ""))

    def start(self, plan: Plan) -> list:
        cluster = plan.job.cluster
        workers: list = []
        self.exclusions.last_processes = plan.processes
        self.coordinator = plan.coordinator_address
        try:
            for process in plan.processes:
                name = f"{self.step_prefix}p{process.process_id}"
                argv = srun_argv(self.job_id, process.host, name, cluster, process.argv,
                                 process.cwd or cluster.workdir)
                # detached: its output in files, its srun outliving this supervisor (``filed``)
                step = FiledWorker.started if self.options.detached else SrunWorker
                workers.append(step(process, self.job_id, name, argv, self.slurm,
                                    judge=self.judge, rendezvous=plan.job.rendezvous))
            if plan.job.rendezvous:
                self._rendezvous(plan, workers)
        except BaseException:
            for w in workers:
                w.kill()
            raise
        return workers

    def _rendezvous(self, plan: Plan, workers: list) -> None:
        """Every worker's facts checked (``contract.RENDEZVOUS``), then the coordinator address sent."""
        port = nodefacts.rendezvous(workers, self.slurm.timeout_s,
                                    self.job.cluster.python or self.options.python, self._problem)
        address = host_port(split_host_port(plan.coordinator_address)[0], port)
        for w in workers:
            w.send(address)

    def cancel_steps(self, steps: list) -> None:
        for step, _ in steps:
            self.slurm.cancel(step, signal="KILL")
        deadline = time.monotonic() + 10
        while steps and time.monotonic() < deadline:
            time.sleep(0.1)
            steps = self.slurm.steps_named(self.job_id, self.step_prefix)

    def _cancel_and_wait(self, job_id: str, timeout_s: float = 15.0) -> None:
        self.slurm.cancel(job_id)
        self.lifecycle.gone(job_id, timeout_s)

    def end_attempt(self) -> None:
        if self.job_id and self.ours and not self.options.dry_run:
            steps = self.slurm.steps_named(self.job_id, self.step_prefix)
            if steps:
                self.cancel_steps(steps)

    def close(self) -> None:
        self._beat_stop.set()
        if self.options.dry_run or not self.job_id or not self.ours:
            return
        if self.mode == "submit":
            job_id, self.job_id = self.job_id, None
            self._cancel_and_wait(job_id)
        else:
            self.end_attempt()
