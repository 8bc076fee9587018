"""The launcher's own cost against the host count, with real sshd hosts (issue 29, item 1).

For each N (default 1, 8, 32, 64) it starts N real sshd hosts on loopback addresses
(127.0.0.2.., each its own host key and workdir: tests/harness/sshenv.py; needs root and
openssh-server) and runs ``launch jobs/linear.yaml --cluster <N hosts> --dry-run`` as users
do: the spec, ``ssh -G`` per host, a connection and host-key check per host, the preflight
program on every host and the coordinator reach check; no worker starts (N JAX workers do
not fit on this machine). Measured from outside, per launch: the launcher process's own CPU
seconds (user + sys, its reaped children such as ``ssh -G`` included: ``os.wait4``), its
peak resident memory (``ru_maxrss``) and the wall seconds. Per-host cost is the slope of a
least-squares line over N, not one figure; every sshd and remote program shares this
machine's cores, so the wall time says little and the CPU is the figure.

    python bench/bench_launch_scale.py                     # N = 1 8 32 64, 3 launches each
    python bench/bench_launch_scale.py --hosts 1 16 64 128 --repeat 2

``--run``: a whole launch instead of the dry run, of a program job whose every process
leaves a marker file and ends (N of them fit on this machine, N JAX workers do not):
everything above, then each host's start (the program's directory synced over SFTP, the job
file written by each host's first start script, the wrapper started on its channel),
supervision to the end, teardown and the summary. Its CPU is also read once every marker is
there (``/proc/PID/stat``, reaped children included): the launcher's CPU up to every worker
started, issue 29's figure.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [REPO, os.path.join(REPO, "tests")]

import yaml  # noqa: E402

from harness import sshenv  # noqa: E402


def cluster_file(base: str, env: sshenv.SshTestEnv, count: int) -> str:
    path = os.path.join(base, f"cluster-{count}.yaml")
    with open(path, "w") as f:
        yaml.safe_dump({"backend": "ssh", "ssh_config_file": env.ssh_config, "python": sys.executable,
                        "hosts": [{"host": h, "workdir": os.path.join(base, f"h{i}")}
                                  for i, h in enumerate(env.hosts[:count])],
                        "env": {"PYTHONPATH": REPO, "SCALE_MARKERS": markers_dir(base)}}, f)
    return path


def markers_dir(base: str) -> str:
    """Where each process of ``PROGRAM_JOB`` leaves a file named by its process_id."""
    return os.path.join(base, "markers")


# Each process leaves a marker and ends: the launcher's CPU is read once every marker is there
# (every worker started, issue 29's figure) and again when the launch has ended.
PROGRAM_JOB = """\
name: scale_probe
program:
  argv: [python3, -c, "import os; open(os.path.join(os.environ['SCALE_MARKERS'], os.environ['PODLAUNCH_PROCESS_ID']), 'w').close()"]
"""


def _cpu_s(pid: int) -> float:
    """A live process's CPU seconds, its reaped children's included (/proc/PID/stat)."""
    with open(f"/proc/{pid}/stat", "rb") as f:
        fields = f.read().rsplit(b")", 1)[1].split()
    return sum(int(x) for x in fields[11:15]) / os.sysconf("SC_CLK_TCK")


def one_launch(cluster: str, count: int, program_job: str | None = None,
               markers: str | None = None) -> tuple:
    """(launcher CPU s, peak RSS MiB, wall s, CPU s when every worker had started or None) of
    one ``--dry-run`` over ``count`` hosts, or of a whole launch of ``program_job`` (a spec
    path) there, its processes' markers in ``markers``."""
    if program_job is None:
        batch = 64 * count
        argv = [sys.executable, "-m", "launcher.cli", "jobs/linear.yaml", "--cluster", cluster,
                "--dry-run", "--set", f"train.global_batch_size={batch}",
                "--set", f"data.num_examples={batch}", "--set", "cluster.devices_per_process=1"]
    else:
        argv = [sys.executable, "-m", "launcher.cli", program_job, "--cluster", cluster]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("JAX_", "PODLAUNCH_"))}
    if markers is not None:
        shutil.rmtree(markers, ignore_errors=True)
        os.makedirs(markers)
    started = time.perf_counter()
    proc = subprocess.Popen(argv, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            stdin=subprocess.DEVNULL, text=True)
    output: list = []
    reader = threading.Thread(target=lambda: output.append(proc.stdout.read()))
    reader.start()
    all_started = None
    while markers is not None and all_started is None and reader.is_alive():
        if len(os.listdir(markers)) >= count:
            all_started = _cpu_s(proc.pid)
        else:
            time.sleep(0.02)
    reader.join()
    out = output[0]
    _, status, usage = os.wait4(proc.pid, 0)
    if markers is not None and all_started is None:  # ended before a poll saw every marker
        all_started = usage.ru_utime + usage.ru_stime
    wall = time.perf_counter() - started
    proc.returncode = os.waitstatus_to_exitcode(status)
    done = f"OK: {count} process" if program_job else f"preflight ok on {count} host"
    if proc.returncode != 0 or done not in out:
        raise SystemExit(f"launch {'' if program_job else '--dry-run '}over {count} hosts failed ({proc.returncode}):\n{out[-3000:]}")
    return usage.ru_utime + usage.ru_stime, usage.ru_maxrss / 1024, wall, all_started


def slope(xs: list, ys: list) -> tuple:
    """(intercept, slope) of the least-squares line through (xs, ys)."""
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    b = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)
    return my - b * mx, b


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hosts", type=int, nargs="+", default=[1, 8, 32, 64])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--run", action="store_true",
                        help="a whole launch of a program job of `python3 -c pass` processes")
    args = parser.parse_args()
    what = "a whole launch of `python3 -c pass` per host" if args.run else "launch --dry-run"
    print(f"{what} over N real sshd hosts; {args.repeat} launches each, median; "
          f"{os.cpu_count()} cores")
    print(f"{'N':>5} {'CPU s':>8} {'CPU ms/host':>12} {'peak MiB':>9} {'wall s':>8}"
          + (f" {'CPU s, all started':>19}" if args.run else ""))
    rows = []
    with tempfile.TemporaryDirectory() as base, sshenv.SshTestEnv(base, max(args.hosts)) as env:
        env.start(timeout_s=120)
        job = None
        if args.run:
            os.makedirs(os.path.join(base, "job"))  # program.dir: the spec's, one file to sync
            job = os.path.join(base, "job", "scale_probe.yaml")
            with open(job, "w") as f:
                f.write(PROGRAM_JOB)
        for count in args.hosts:
            cluster = cluster_file(base, env, count)
            runs = [one_launch(cluster, count, job, markers_dir(base) if job else None)
                    for _ in range(args.repeat)]
            cpu, rss, wall = (statistics.median(r[i] for r in runs) for i in range(3))
            at_start = statistics.median(r[3] for r in runs) if job else None
            rows.append((count, cpu, rss, wall, at_start))
            print(f"{count:>5} {cpu:>8.2f} {1000 * cpu / count:>12.1f} {rss:>9.1f} {wall:>8.1f}"
                  + (f" {at_start:>19.2f}" if job else ""), flush=True)
    if len(rows) > 1:
        ns = [r[0] for r in rows]
        (cpu0, cpu_slope), (rss0, rss_slope) = slope(ns, [r[1] for r in rows]), slope(ns, [r[2] for r in rows])
        print(f"slope: {1000 * cpu_slope:.1f} ms of launcher CPU per host (intercept {cpu0:.2f} s); "
              f"{rss_slope:.2f} MiB of peak memory per host (intercept {rss0:.1f} MiB)")
        if args.run:
            start0, start_slope = slope(ns, [r[4] for r in rows])
            print(f"up to every worker started: {1000 * start_slope:.1f} ms of launcher CPU per "
                  f"host (intercept {start0:.2f} s)")


if __name__ == "__main__":
    main()
