"""The TPU check: ``launch`` end to end on this machine's TPU chip, every item in one go.

Run on a TPU VM (or the TPU test machine, ../shared/tpu/README.md) from the project's root:

    python bench/tpu_check.py --out OUT_DIR            # every check, then the benchmark
    python bench/tpu_check.py --out OUT_DIR --only train_linear holder
    python bench/tpu_check.py --out OUT_DIR --platform cpu   # the same checks on CPU devices

Each check runs ``launch`` as a user does (``python -m launcher.cli``) with
``cluster.platform`` set, and prints ``PASS name: detail`` or ``FAIL name: detail``:

* ``train_linear``: jobs/linear.yaml trains on the chip; the start line, process 0's log,
  ``launch runs`` (its devices column) and TensorBoard (the ``devices`` text process 0 writes)
  name the platform.
* ``train_large``: a 65,536 x 256 job trains on the chip.
* ``compile_cache``: a second run of the same job loads its programs from the compilation cache.
* ``notice_restart``: SIGTERM to the worker mid-run stops it after a step the run agrees on,
  which is saved; the launcher restarts from it and the run ends at the params of the same
  job run without interruption (rtol 1e-6).
* ``resume``: SIGINT to the launcher (Ctrl-C) stops the run at a saved agreed step;
  ``launch --resume RUN_DIR`` continues it to the uninterrupted params.
* ``local_tier``: SIGKILL to the worker mid-run; the restart takes the newest local copy and
  the run ends at the uninterrupted params.
* ``profile``: a ``profile:`` section's trace holds the chip's plane (its ``.xplane.pb``
  names the TPU device).
* ``holder``: a second ``launch`` while the first holds the chip names the holder (pid and
  command) and starts nothing.
* ``bench``: steps/s of ``launch`` (the job's defaults, ``steps_per_call`` 1 and 100, and 1,000
  with ``train.parallelism: jit``), of the
  seed as written (bench/seed_loop.py), and of the step's limit (bench/step_limit.py: K steps
  in one jitted fori_loop over resident data, the batch a constant of the program and, as a
  trainer's, passed in) for 256 x 4 and 65,536 x 256, with the ratios. A ``launch`` side's rate
  is its steady one, the first 5% of its steps left out (the first call's one-time device work
  lands there; the references leave out their first call); ``bench_after_first_call`` in the
  json keeps each run's rate with only its first call left out.

Run directories are kept under OUT_DIR/runs (for TensorBoard, read back elsewhere), and every
result goes to OUT_DIR/tpu_check.json. Exit 0 when every check passed.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import re
import shutil
import signal
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from step_limit import honest_ratio  # noqa: E402  (bench/step_limit.py, beside this file)
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from launcher import logtimes, proctl  # noqa: E402  (after the path is set)
from worker.contract import wire  # noqa: E402

SHAPES = {"seed": (256, 4), "large": (65536, 256)}
# the bench's rates leave out the first 5% of each run's steps: the first call's device work
# and the queue's filling (``_rate_after_first_call``)
WARMUP_FRACTION = 0.05


class Check:
    def __init__(self, out: str, platform: str, restart_shape: str = "large"):
        self.out, self.platform, self.restart_shape = out, platform, restart_shape
        self.runs = os.path.join(out, "runs")
        os.makedirs(self.runs, exist_ok=True)
        self.results: dict = {}

    # ---- launching ------------------------------------------------------------------------
    def args(self, name: str, *sets: str, shape: str = "seed", job: str = "jobs/linear.yaml",
             extra=()) -> list:
        batch, features = SHAPES[shape]
        args = [sys.executable, "-m", "launcher.cli", job, "--run-dir",
                os.path.join(self.runs, name), "--status-every", "0",
                "--set", f"cluster.platform={self.platform}",
                "--set", "cluster.num_processes=1",
                "--set", f"cluster.devices_per_process={'null' if self.platform != 'cpu' else 1}",
                "--set", f"train.global_batch_size={batch}",
                "--set", f"data.num_examples={batch}", "--set", f"data.in_features={features}"]
        for item in sets:
            args += ["--set", item]
        return args + list(extra)

    def launch(self, args: list, timeout_s: float = 300) -> subprocess.CompletedProcess:
        return subprocess.run(args, cwd=REPO, capture_output=True, text=True, timeout=timeout_s,
                              env=_env())

    def start(self, args: list) -> subprocess.Popen:
        return subprocess.Popen(args, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                text=True, env=_env())

    def record(self, name: str, ok: bool, detail: str, **facts) -> None:
        self.results[name] = {"pass": bool(ok), "detail": detail, **facts}
        print(f"{'PASS' if ok else 'FAIL'} {name}: {detail}", flush=True)

    # ---- the checks -----------------------------------------------------------------------
    def train_linear(self) -> None:
        run = os.path.join(self.runs, "linear")
        done = self.launch(self.args("linear"))
        log = _read(os.path.join(run, "logs", "process-000.log"))
        # launch runs lists <root>/<job>/<run>: here every run under OUT/runs
        # wide enough for every column (launch runs fits its columns to the terminal's width)
        runs = subprocess.run([sys.executable, "-m", "launcher.cli", "runs", "--root",
                               os.path.dirname(self.runs)], cwd=REPO, capture_output=True,
                              text=True, timeout=300, env={**_env(), "COLUMNS": "400"})
        row = next((line for line in runs.stdout.splitlines()
                    if line.rstrip().endswith(os.path.join("runs", "linear"))), "")
        events = glob.glob(os.path.join(run, "tensorboard", "**", "events.out.tfevents.*"),
                           recursive=True)
        texts = _texts(events)
        device = re.search(r"on (\d+ \w+ devices?)", log)
        ok = (done.returncode == 0 and device is not None and self.platform in device.group(1)
              and events != [] and self.platform.upper() in done.stdout + done.stderr
              and f" {self.platform} " in row
              and f" {self.platform} device" in texts.get("devices", ""))
        self.record("train_linear", ok, f"exit {done.returncode}; process 0: "
                    f"{device.group(1) if device else '?'}; {len(events)} event file(s), "
                    f"TensorBoard's devices text: {texts.get('devices')!r}; launch runs: "
                    f"{' '.join(row.split()[-3:-1]) or 'not listed'}; "
                    f"start line: {_line(done.stdout, 'starting')}",
                    runs=runs.stdout[-2000:], tail=_tail(done))

    def train_large(self) -> None:
        done = self.launch(self.args("large", "train.num_steps=200", "logging.log_every_steps=100",
                                     shape="large"))
        self.record("train_large", done.returncode == 0 and self.platform in _read(
            os.path.join(self.runs, "large", "logs", "process-000.log")),
            f"exit {done.returncode}; {_line(done.stdout, 'steps/s')}", tail=_tail(done))

    def compile_cache(self) -> None:
        # a run directory beside another of the same job shares runs/<job>/compilation-cache
        args = [a for a in self.args("unused")]
        first = args.index("--run-dir")
        results = []
        for i in (1, 2):
            args[first + 1] = os.path.join(self.runs, "cache", "runs", "linear", f"run{i}")
            results.append(self.launch(args))
        line = _line(_read(os.path.join(self.runs, "cache", "runs", "linear", "run2", "logs", "process-000.log")),
                     "compilation cache")
        hits = re.search(r"(\d+) hits", line or "")
        self.record("compile_cache", all(r.returncode == 0 for r in results) and hits is not None
                    and int(hits.group(1)) > 0, f"second run: {line}")

    def _interrupted(self, name: str, how: str) -> None:
        """``how``: term-worker, kill-worker or int-launcher, sent once step 2,000 is logged."""
        sets = ("train.num_steps=20000", "train.steps_per_call=1", "logging.log_every_steps=100",
                "checkpoint.every_steps=5000", "checkpoint.local_every_steps=1000",
                "restarts.backoff_s=0")
        shape = self.restart_shape
        reference = self.launch(self.args(f"{name}-reference", *sets, shape=shape), 600)
        proc = self.start(self.args(name, *sets, shape=shape))
        run = os.path.join(self.runs, name)
        lines = []
        for line in proc.stdout:
            lines.append(line)
            step = re.match(r"\S*\s*step (\d+)/", line.split("| ")[-1] if "| " in line else line)
            if step is None:
                step = re.search(r"\bstep (\d+)/20000", line)
            if step and int(step.group(1)) >= 2000:
                break
        if how == "int-launcher":
            proc.send_signal(signal.SIGINT)
        else:
            for pid in _workers(run):
                os.kill(pid, signal.SIGTERM if how == "term-worker" else signal.SIGKILL)
        rest, _ = proc.communicate(timeout=600)
        text = "".join(lines) + rest
        if how == "int-launcher":
            again = self.args(name, *sets, shape=shape)
            again[again.index("--run-dir")] = "--resume"  # launch JOB.yaml --resume RUN_DIR
            resumed = self.launch(again, 600)
            text += resumed.stdout + resumed.stderr
            code = resumed.returncode
        else:
            code = proc.returncode
        same, detail = _same_params(os.path.join(self.runs, f"{name}-reference"), run)
        said = [_line(text, w) for w in ("agreed", "local copy", "resumed from", "restart")]
        self.record(name, reference.returncode == 0 and code == 0 and same,
                    f"exit {code}; params {detail}; " + " / ".join(s for s in said if s),
                    tail=text[-3000:])

    def notice_restart(self) -> None:
        self._interrupted("notice_restart", "term-worker")

    def resume(self) -> None:
        self._interrupted("resume", "int-launcher")

    def local_tier(self) -> None:
        self._interrupted("local_tier", "kill-worker")

    def profile(self) -> None:
        done = self.launch(self.args("profile", "train.num_steps=300", "profile.start_step=100", "profile.num_steps=10",
                                     "logging.log_every_steps=10"))
        planes = glob.glob(os.path.join(self.runs, "profile", "**", "*.xplane.pb"), recursive=True)
        device = self.platform.upper() if self.platform != "cpu" else "/host:CPU"
        held = [p for p in planes if device.encode() in _read_bytes(p)]
        self.record("profile", done.returncode == 0 and held != [],
                    f"exit {done.returncode}; {len(planes)} trace(s), {len(held)} with a "
                    f"{device} plane", tail=_tail(done))

    def holder(self) -> None:
        first = self.start(self.args("holder-first", "train.num_steps=2000000",
                                     "train.steps_per_call=1", "logging.log_every_steps=1000"))
        for line in first.stdout:  # process 0 names its devices once it holds them
            if " device" in line and "batch" in line:
                break
        started = time.monotonic()
        second = self.launch(self.args("holder-second"), 120)
        seconds = time.monotonic() - started
        first.send_signal(signal.SIGINT)
        first.communicate(timeout=120)
        text = second.stdout + second.stderr
        named = re.search(r"in use: pid (\d+) \(([^)]*)\)", text)
        self.record("holder", second.returncode != 0 and named is not None and not os.path.exists(
            os.path.join(self.runs, "holder-second", "logs", "process-000.log")),
            f"exit {second.returncode} in {seconds:.1f} s: {_line(text, 'in use')}")

    def bench(self, rounds: int, shapes=tuple(SHAPES), scale: float = 1.0) -> None:
        facts = {}
        # Steps per side: enough calls that a run's fixed costs (its first calls, the first
        # writes) do not decide the rate: 1,000,000 steps of the 256 x 4 job take about 2.6 s
        # at the chip's limit; steps one call each are slower, so 30,000
        # the 65,536 x 256 job's sides 10,000 steps each: 30,000 took it past one 10-minute
        # command on the v5e (508 s with the limit run twice)
        for shape, steps, fast_steps in (("seed", 30000, 1000000), ("large", 10000, 10000)):
            if shape not in shapes:
                continue
            steps, fast_steps = (max(1000, int(n * scale)) for n in (steps, fast_steps))
            batch, features = SHAPES[shape]
            # one run of every formulation: the limit is the best of all, the limit of a
            # program that takes its batch in the best of those that pass it
            # (the large job's formulations 3,000 steps each: a call of one of its steps is
            # 0.2 ms, and its 40 formulations at 10,000 steps took the command past its time)
            limit, forms = _rates([sys.executable, os.path.join(REPO, "bench", "step_limit.py"),
                                   "--batch", str(batch), "--features", str(features),
                                   "--steps", str(steps if shape == "seed" else steps * 3 // 10)],
                                  forms=True)
            limit_arg = {k: max(rate for (fk, name), rate in forms.items()
                                if fk == k and "batch-argument" in name) for k in limit}
            seed = _seed_rate(batch, features, steps)
            # the job's defaults (steps_per_call auto; logging every 100 steps, every 10 and
            # every 1,000: a log step must cost its own metrics and no more, issue 69);
            # steps_per_call 1 and 100; 1,000 with parallelism jit
            sides = {"default": (), "default-log10": ("logging.log_every_steps=10",),
                     "default-log1000": ("logging.log_every_steps=1000",),
                     "k1": ("train.steps_per_call=1",),
                     "k100": ("train.steps_per_call=100",),
                     "k1000-jit": ("train.steps_per_call=1000", "logging.log_every_steps=1000",
                                   "train.parallelism=jit")}
            if shape == "large":  # the log interval's cost is the small step's question
                sides = {n: v for n, v in sides.items() if not n.startswith("default-log")}
            rates: dict = {name: [] for name in sides}
            for index in range(rounds):
                for name, sets in sides.items():
                    tag = f"bench-{shape}-{name}-{index}"
                    rates[name].append(self._steps_per_s(tag, shape, steps if name == "k1"
                                                         else fast_steps, sets))
            best = max(limit.values())
            # a launch above its limit (by more than step_limit.LIMIT_SLACK) refuses the ratio:
            # the limit (the best of step_limit's formulations) would be wrong, not the launch
            def ratio(name: str, of: float, what: str) -> float:
                return honest_ratio(max(rates[name]), of, f"{shape} {name} / {what}")

            row = {"limit": limit, "limit_batch_argument": limit_arg, "seed": seed,
                   "forms": {f"{k} {name}": rate for (k, name), rate in forms.items()},
                   **{n: max(r) for n, r in rates.items()},
                   "default/limit": ratio("default", best, "limit"),
                   "default/limit_batch_argument": ratio("default", max(limit_arg.values()),
                                                         "limit, the batch passed in"),
                   **{f"{n}/limit": ratio(n, best, "limit") for n in sides
                      if n.startswith("default-log")},
                   "k1/limit_k1": ratio("k1", limit[1], "limit at K=1"),
                   "k100/limit_k100": ratio("k100", limit[100], "limit at K=100"),
                   "k1000-jit/limit_k1000": ratio("k1000-jit", limit[1000], "limit at K=1000"),
                   "default/seed": max(rates["default"]) / seed}
            facts[shape] = row
            print(f"{batch} x {features}, {steps} steps: limit " + ", ".join(
                f"K={k} {v:,.0f}" for k, v in limit.items()) + " (the batch passed in: " + ", ".join(
                f"K={k} {v:,.0f}" for k, v in limit_arg.items()) + f"); seed {seed:,.0f}; launch "
                + ", ".join(f"{n} {max(r):,.0f}" for n, r in rates.items())
                + f" steps/s; default/best limit {row['default/limit']:.2f} (the batch passed in: "
                f"{row['default/limit_batch_argument']:.2f}"
                + "".join(f"; {n}: {row[n + '/limit']:.2f}" for n in sides
                          if n.startswith("default-log")) + "), k1/K=1 "
                f"{row['k1/limit_k1']:.2f}, k100/K=100 {row['k100/limit_k100']:.2f}, k1000-jit/K=1000 "
                f"{row['k1000-jit/limit_k1000']:.2f}", flush=True)
        self.results["bench"] = facts

    def _steps_per_s(self, tag: str, shape: str, steps: int, sets) -> float:
        args = self.args(tag, f"train.num_steps={steps}", "logging.log_every_steps=100",
                         "checkpoint.every_steps=0", *sets, shape=shape)
        done = self.launch(args, 600)
        if done.returncode != 0:
            raise SystemExit(f"{tag} failed:\n{_tail(done)}")
        text = logtimes.unstamped(_read(os.path.join(self.runs, tag, "logs", "process-000.log")))
        shutil.rmtree(os.path.join(self.runs, tag), ignore_errors=True)
        # the steady rate: the first 5% of the steps left out (``_rate_after_first_call``);
        # the rate after the first call alone is kept beside it
        self.results.setdefault("bench_after_first_call", {})[tag] = _rate_after_first_call(text)
        return _rate_after_first_call(text, WARMUP_FRACTION)


def _rate_after_first_call(text: str, warmup_fraction: float = 0.0) -> float:
    """Steps/s of process 0's progress lines (each a log step's seconds per step since the
    previous one), the intervals that hold the first call left out: the references time
    after their first call too (the limit runs each K once first, the seed its first step),
    and a first call on a chip holds one-time work (the program's first run: about 0.14 s
    on the v5e, 5% of a 1,000,000-step run of 256 x 4).

    ``warmup_fraction``: also leave out the intervals before that fraction of the run's last
    step. A log step is timed on the host when it is known to have finished, and with calls
    queued up to 0.1 s ahead of the chip the first call's device work (its one-time part
    included) lands in the intervals after it: on the v5e the 65,536 x 256 job's interval
    from step 100 to 200 held 0.43 s, 20 calls' worth, and a 30,000-step run's rate after
    its first call read 4,619 steps/s against 4,775 for the same run from step 1,100
    (docs/tpu.md)."""
    match = re.search(r", (\d+) steps per call", text)
    first_call = int(match.group(1)) if match else 1
    progress = [p for p in map(wire.parse, text.splitlines())
                if isinstance(p, wire.Progress) and p.step_time_s is not None]
    start = max(first_call, int(warmup_fraction * max((p.step for p in progress), default=0)))
    steps = seconds = 0.0
    previous = None
    for line in progress:
        if previous is not None and previous >= start:
            steps += line.step - previous
            seconds += line.step_time_s * (line.step - previous)
        previous = line.step
    return steps / seconds


def _texts(paths: list) -> dict:
    """The text summaries (TensorBoard's text tab: tag -> text) of these event files, read
    with tensorboardX's own ``Event`` proto (TensorBoard itself need not be installed).

    An event file is TFRecord: per record a little-endian uint64 length, a uint32 masked CRC
    of it, the data and a uint32 masked CRC of the data (checksums not checked here)."""
    import struct

    from tensorboardX.proto.event_pb2 import Event

    texts = {}
    for path in paths:
        with open(path, "rb") as f:
            data = f.read()
        at = 0
        while at + 12 <= len(data):
            (length,) = struct.unpack_from("<Q", data, at)
            event = Event.FromString(data[at + 12:at + 12 + length])
            at += 12 + length + 4
            for value in event.summary.value:
                if value.tag.endswith("/text_summary") and value.tensor.string_val:
                    texts[value.tag[:-len("/text_summary")]] = value.tensor.string_val[0].decode()
    return texts


def _env() -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("JAX_PLATFORMS", "PODLAUNCH_"))}
    return env


def _rates(args: list, forms: bool = False):
    """bench/step_limit.py's ``RATE K`` lines: ``{K: steps/s}``; with ``forms``, also its
    ``FORM K NAME`` lines, ``{(K, NAME): steps/s}``."""
    done = subprocess.run(args, capture_output=True, text=True, timeout=600, env=_env())
    if done.returncode != 0:
        raise SystemExit(f"{args[1]} failed:\n{done.stdout[-2000:]}{done.stderr[-2000:]}")
    rates = {int(k): float(v) for k, v in re.findall(r"^RATE (\d+) ([\d.]+)$", done.stdout, re.M)}
    if not forms:
        return rates
    return rates, {(int(k), name): float(v) for k, name, v in
                   re.findall(r"^FORM (\d+) (\S+) ([\d.]+)$", done.stdout, re.M)}


def _seed_rate(batch: int, features: int, steps: int) -> float:
    env = {**_env(), "JAX_PLATFORMS": ""}  # the seed sets cpu unless told otherwise
    done = subprocess.run([sys.executable, os.path.join(REPO, "bench", "seed_loop.py"), "--steps",
                           str(steps), "--batch", str(batch), "--features", str(features)],
                          capture_output=True, text=True, timeout=600, env=env)
    match = re.search(r"^RATE ([\d.]+)", done.stdout, re.M)
    return float(match.group(1)) if match else float("nan")


def _workers(run_dir: str) -> list:
    want = f"PODLAUNCH_RUN_DIR={run_dir}".encode()
    return [pid for pid in proctl.pids() if want in proctl.environ(pid)
            and "worker" in proctl.cmdline(pid)]


def _same_params(a: str, b: str) -> tuple:
    import numpy as np

    try:
        pa, pb = np.load(os.path.join(a, "params.npz")), np.load(os.path.join(b, "params.npz"))
    except OSError as exc:
        return False, f"missing ({exc})"
    worst = max(float(np.max(np.abs(pa[k] - pb[k]) / (np.abs(pa[k]) + 1e-30))) for k in pa.files)
    same = sorted(pa.files) == sorted(pb.files) and all(
        np.allclose(pa[k], pb[k], rtol=1e-6, atol=0) for k in pa.files)
    return same, f"{'equal' if same else 'DIFFER'} (largest relative difference {worst:.2e})"


def _read(path: str) -> str:
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return f.read()
    except OSError:
        return ""


def _read_bytes(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()


def _line(text: str, word: str) -> str | None:
    """The first line of ``text`` holding ``word``, without a log file's time."""
    return next((logtimes.unstamped(line).strip() for line in text.splitlines() if word in line),
                None)


def _tail(done) -> str:
    return (done.stdout + done.stderr)[-3000:]


CHECKS = ("train_linear", "holder", "train_large", "compile_cache", "profile", "bench",
          "notice_restart", "resume", "local_tier")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--platform", default="tpu", choices=("tpu", "gpu", "cpu"))
    parser.add_argument("--only", nargs="+", choices=CHECKS, default=list(CHECKS))
    parser.add_argument("--rounds", type=int, default=2, help="benchmark rounds")
    parser.add_argument("--shapes", nargs="+", choices=list(SHAPES), default=list(SHAPES),
                        help="the benchmark's jobs: seed (256 x 4), large (65,536 x 256)")
    parser.add_argument("--restart-shape", choices=list(SHAPES), default="large",
                        help="the job the notice, resume and local-copy checks interrupt "
                             "(seed for a try on CPU first)")
    parser.add_argument("--scale", type=float, default=1.0,
                        help="the benchmark's steps times this (a try on CPU first: 0.01)")
    args = parser.parse_args()
    check = Check(os.path.abspath(args.out), args.platform, args.restart_shape)
    print(f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}: {', '.join(args.only)} on "
          f"{args.platform}", flush=True)
    for name in args.only:
        started = time.monotonic()
        try:
            if name == "bench":
                check.bench(args.rounds, args.shapes, args.scale)
            else:
                getattr(check, name)()
        except Exception as exc:  # noqa: BLE001  one check's failure is reported, the rest run
            check.record(name, False, f"{type(exc).__name__}: {exc}")
        print(f"  ({name}: {time.monotonic() - started:.1f} s)", flush=True)
        with open(os.path.join(check.out, "tpu_check.json"), "w") as f:  # after each: kept
            json.dump(check.results, f, indent=1)                         # if the run is cut
    sys.exit(0 if all(r.get("pass", True) for r in check.results.values()
                      if isinstance(r, dict)) else 1)


if __name__ == "__main__":
    main()
