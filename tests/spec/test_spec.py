"""Spec loading: YAML traps, every kind of mistake, overrides, and the shipped files.

Bad input goes through the real CLI: exit 2, one path-qualified line per
problem, no traceback, and nothing started (no run directory appears).
"""

import glob
import json
import os
import textwrap

import numpy as np
import pytest

from harness.helpers import REPO, launch
from launcher import backends
from launcher import spec
from launcher.spec import yamlio
from launcher.errors import SpecError
from worker.contract import sections

GOOD = textwrap.dedent("""\
    name: t
    task:
      name: linear_regression
    data:
      source: synthetic
      num_examples: 64
    optimizer:
      name: sgd
      learning_rate: 0.1
    train:
      num_steps: 5
      global_batch_size: 64
    logging:
      log_every_steps: 1
      tensorboard: true
    cluster:
      backend: local
      num_processes: 2
      devices_per_process: 2
    """)


def edit(old: str, new: str) -> str:
    assert old in GOOD, old
    return GOOD.replace(old, new)


# (id, spec text, extra CLI args, substrings every one of which must be in stderr)
BAD = [
    ("unknown-top-key", GOOD + "trian: {}\n", [], ["bad.yaml:20: trian: unknown key; did you mean 'train'?"]),
    ("unknown-nested-key", edit("  num_steps: 5", "  num_stepz: 5"), [],
     ["bad.yaml:11: train.num_stepz: unknown key; did you mean 'num_steps'?",
      "train.num_steps: missing"]),
    ("wrong-type", edit("learning_rate: 0.1", "learning_rate: fast"), [],
     ["bad.yaml:9: optimizer.learning_rate: expected a number, got 'fast'"]),
    ("negative-count", edit("num_steps: 5", "num_steps: -5"), [],
     ["bad.yaml:11: train.num_steps: expected a number > 0, got -5"]),
    ("zero-processes", edit("num_processes: 2", "num_processes: 0"), [],
     ["bad.yaml:18: cluster.num_processes: expected 1 to 256, got 0"]),
    ("batch-does-not-divide", edit("global_batch_size: 64", "global_batch_size: 62"), [],
     ["bad.yaml:12: train.global_batch_size: 62 does not divide evenly over device_count 4"]),
    ("missing-data-file", edit("source: synthetic\n  num_examples: 64", "source: file\n  path: nope.csv"),
     [], ["bad.yaml:6: data.path: no such file", "nope.csv"]),
    ("missing-required", edit("  global_batch_size: 64\n", ""), [],
     ["train.global_batch_size: missing; expected an integer"]),
    ("yaml11-bool", edit("tensorboard: true", "tensorboard: yes"), [],
     ["bad.yaml:15: logging.tensorboard: expected true or false, got 'yes'", "YAML 1.1"]),
    ("yaml11-octal", edit("devices_per_process: 2", "devices_per_process: 010"), [],
     ["bad.yaml:19: cluster.devices_per_process: expected an integer, got '010'", "octal"]),
    ("duplicate-key", edit("  num_steps: 5\n", "  num_steps: 5\n  num_steps: 6\n"), [],
     ["bad.yaml:12: train.num_steps: duplicate key (first written on line 11)"]),
    ("syntax-error", edit("  name: sgd", "  name: [sgd"), [], ["bad.yaml:", "not valid YAML"]),
    ("empty-file", "", [], ["bad.yaml: the file is empty"]),
    ("top-level-list", "- a\n- b\n", [], ["bad.yaml:1: expected a mapping of settings at the top"]),
    ("unknown-optimizer", edit("name: sgd", "name: adm"), [],
     ["bad.yaml:8: optimizer.name: expected one of sgd, adam, adamw, got 'adm'", "did you mean 'adam'?"]),
    ("unknown-backend", edit("backend: local", "backend: kubernetes"), [],
     ["bad.yaml:17: cluster.backend: expected one of local"]),
    ("path-with-synthetic", edit("num_examples: 64", "num_examples: 64\n  path: x.csv"), [],
     ["bad.yaml:7: data.path: only used with data.source: file"]),
    ("synthetic-key-with-file", edit("source: synthetic\n  num_examples: 64",
                                     "source: file\n  path: data/diabetes.csv\n  noise_std: 0.1"),
     [], ["data.noise_std: only used with data.source: synthetic"]),
    ("malformed-task", edit("name: linear_regression", "name: not a task"), [],
     ["bad.yaml:3: task.name: expected a built-in task"]),
    ("task-not-importable", edit("name: linear_regression", "name: no_such_module_xyz:make"), [],
     ["bad.yaml:3: task.name: module 'no_such_module_xyz' is not importable by the workers"]),
    ("data-beyond-memory", edit("num_examples: 64", "num_examples: 2000000000"), [],
     ["bad.yaml:6: data.num_examples: 2000000000 rows x 5 float32 columns need about",
      "lower data.num_examples or data.in_features"]),
    ("shuffle-not-bool", edit("num_examples: 64", "num_examples: 64\n  shuffle: yes"), [],
     ["bad.yaml:7: data.shuffle: expected true or false"]),
    ("prefetch-zero", edit("num_examples: 64", "num_examples: 64\n  prefetch: 0"), [],
     ["bad.yaml:7: data.prefetch: expected"]),
    ("target-dtype-synthetic", edit("num_examples: 64", "num_examples: 64\n  target_dtype: int32"), [],
     ["bad.yaml:7: data.target_dtype: only used with data.source: file"]),
    ("target-dtype-unknown", edit("num_examples: 64", "num_examples: 64\n  target_dtype: int8"), [],
     ["bad.yaml:7: data.target_dtype: expected one of"]),
    ("resident-and-shuffle", edit("num_examples: 64", "num_examples: 64\n  shuffle: true\n  resident: true"), [],
     ["bad.yaml:8: data.resident: cannot be used with data.shuffle: true"]),
    ("builtin-task-unknown-arg", GOOD, ["--set", "task.args.sleep_s=0"],
     ["--set: task.args.sleep_s: linear_regression takes no argument 'sleep_s'; it takes none"]),
    ("builtin-task-misspelt-arg", edit("name: linear_regression",
                                       "name: softmax_classifier\n  args: {num_clases: 3}"), [],
     ["bad.yaml:4: task.args.num_clases: softmax_classifier takes no argument 'num_clases'; "
      "did you mean 'num_classes'?", "bad.yaml:4: task.args: softmax_classifier needs num_classes"]),
    ("builtin-task-arg-of-another-kind", edit("name: linear_regression",
                                              "name: softmax_classifier\n  args: {num_classes: 1.5}"),
     [], ["bad.yaml:4: task.args.num_classes: expected an integer >= 2, got 1.5"]),
    ("user-task-unknown-arg", GOOD, ["--set", "task.name=faulty_task:make", "--set",
                                     "task.args.sleep=1"],
     ["--set: task.args.sleep: make() in ", "faulty_task.py:20 takes no argument 'sleep'; "
      "did you mean 'sleep_s'?"]),
    ("user-task-missing-arg", GOOD, ["--set", "task.name=ssh_task:record_env", "--set",
                                     "task.args.out_dir=x"],
     ["task.args: record_env() in ", "ssh_task.py:16 needs names: add it under task.args"]),
    ("set-task-not-importable", GOOD, ["--set", "task.name=no_such_module_xyz:make"],
     ["--set: task.name: module 'no_such_module_xyz' is not importable by the workers"]),
    # issue 70: a string where a list was meant shows the list to write (a command's words
    # split, its secret flags masked; a secret list's items masked)
    ("notify-command-string", GOOD + "notify: {command: 'sh notify.sh --api-token=abc run'}\n", [],
     ["bad.yaml:20: notify.command: expected a list, got 'sh notify.sh --api-token=**** run' "
      "(a string); write it as a list of the "
      "command's words (no shell runs it): [\"sh\", \"notify.sh\", \"--api-token=****\", \"run\"]"]),
    # the string as given is masked too, not only the list to write
    ("notify-command-string-bearer", GOOD + "notify: {command: \"curl -H 'Authorization: Bearer "
     "sk-ab12' --token=zz99 https://x\"}\n", [],
     ["notify.command: expected a list, got \"curl -H 'Authorization: Bearer ****' --token=**** "
      "https://x\" (a string)"]),
    # any value quoted back after "got", whatever the key, has its credentials masked
    ("notify-timeout-token", GOOD + "notify: {timeout_s: 'Bearer sk-ab12'}\n", [],
     ["bad.yaml:20: notify.timeout_s: expected a number, got 'Bearer ****' (a string)"]),
    ("secrets-string", GOOD, ["--set", "secrets=MY_TOKEN"],
     ["--set: secrets: expected a list, got **** (a string); write it as a list: [\"****\"]"]),
    ("env-float", GOOD + "  env: {RATIO: 1.50}\n", [],
     ["bad.yaml:20: cluster.env.RATIO: expected a string or an integer, got 1.5", "quote it"]),
    ("env-bad-name", GOOD + "  env: {A-B: x}\n", [], ["cluster.env: expected environment variable name (letters, digits and '_', not starting with a digit), got 'A-B': '-' at position 1"]),
    ("job-name-space", edit("name: t", "name: my job"), [], ["bad.yaml:1: name: expected a job name (letters, digits, '_', '.', '-', at most 128; it names the run directory), got 'my job': ' ' at position 2 is not allowed"]),
    ("too-few-examples", edit("num_examples: 64", "num_examples: 32"), [],
     ["bad.yaml:6: data.num_examples: 32 rows cannot fill one global batch of 64"]),
    ("set-without-equals", GOOD, ["--set", "train.num_steps"], ["--set: expected KEY=VALUE"]),
    ("set-unknown-key", GOOD, ["--set", "train.lr=0.1"], ["--set: train.lr: unknown key"]),
    ("set-unknown-section", GOOD, ["--set", "a.b.c=1"], ["--set: a: unknown key"]),
    ("internal-field-is-not-a-key", GOOD + "source: x.yaml\n", [], ["bad.yaml:20: source: unknown key"]),
    ("set-bad-value", GOOD, ["--set", "train.num_steps=many"],
     ["--set: train.num_steps: expected an integer, got 'many'"]),
    ("port-out-of-range", GOOD + "  coordinator_port: 70000\n", [],
     ["bad.yaml:20: cluster.coordinator_port: expected a TCP port 1-65535"]),
    ("momentum-out-of-range", edit("learning_rate: 0.1", "learning_rate: 0.1\n  momentum: 1.5"), [],
     ["optimizer.momentum: expected 0.0 to 1.0, got 1.5"]),
    ("section-not-mapping", edit("logging:\n  log_every_steps: 1\n  tensorboard: true", "logging: 5"), [],
     ["bad.yaml:13: logging: expected a mapping of settings, got 5"]),
    ("null-value", edit("learning_rate: 0.1", "learning_rate: ~"), [],
     ["bad.yaml:9: optimizer.learning_rate: expected a number, got null"]),
    ("float-for-int", edit("num_steps: 5", "num_steps: 5.0"), [], ["train.num_steps: expected an integer", "write 5"]),
    ("underscore-number", edit("num_steps: 5", "num_steps: 1_000"), [], ["without underscores"]),
    ("infinite-rate", edit("learning_rate: 0.1", "learning_rate: .inf"), [], ["expected a finite number"]),
    ("missing-cluster-file", GOOD, ["--cluster", "no/such/cluster.yaml"], ["--cluster no/such/cluster.yaml: cannot read"]),
]


@pytest.mark.parametrize("text,args,expected", [c[1:] for c in BAD], ids=[c[0] for c in BAD])
def test_bad_spec_exits_2_with_path_and_starts_nothing(tmp_path, text, args, expected):
    # data paths are relative to the spec file: put it beside jobs/data
    path = os.path.join(REPO, "jobs", f".bad-{os.getpid()}-{tmp_path.name}.yaml")
    with open(path, "w") as f:
        f.write(text)
    run_dir = tmp_path / "run"
    try:
        result = launch(path, "--run-dir", str(run_dir), *args, timeout_s=60)
    finally:
        os.remove(path)
    stderr = result.stderr.replace(os.path.basename(path), "bad.yaml")
    assert result.returncode == 2, stderr
    for needle in expected:
        assert needle in stderr, f"{needle!r} not in:\n{stderr}"
    assert "Traceback" not in stderr
    assert "nothing was started" in stderr
    assert not run_dir.exists()


def test_every_mistake_in_a_file_is_reported_at_once_each_at_its_line(tmp_path):
    # one run lists them all (not one per run), in file order, each with its own line
    text = (edit("learning_rate: 0.1", "learning_rate: ~")
            .replace("num_steps: 5", "num_steps: 5.0")
            .replace("logging:\n  log_every_steps: 1\n  tensorboard: true", "logging: 5")
            .replace("devices_per_process: 2", "devices_per_process: 2\n  coordinator_port: 70000"))
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    with pytest.raises(SpecError) as err:
        spec.load(str(path), registry=backends)
    lines = [line for line in str(err.value).splitlines() if line.startswith(str(path))]
    got = [(int(line.split(":")[1]), line) for line in lines]
    want = [(9, "optimizer.learning_rate: expected a number, got null"),
            (11, "train.num_steps: expected an integer"),
            (13, "logging: expected a mapping of settings, got 5"),
            (18, "cluster.coordinator_port: expected a TCP port 1-65535")]
    assert [n for n, _ in got] == [n for n, _ in want], lines
    for (_, line), (_, needle) in zip(got, want):
        assert needle in line, (needle, line)


def test_yaml_reads_what_the_user_sees():
    value, lines = yamlio.load("a: yes\nb: 1e-3\nc: 0755\nd: 12:30\ne: 2024-01-01\nf: on\n"
                               "g: true\nh: 0o17\ni: 0x1F\nj: 1_000\n", "x.yaml")
    assert value == {"a": "yes", "b": 0.001, "c": "0755", "d": "12:30", "e": "2024-01-01",
                     "f": "on", "g": True, "h": 15, "i": 31, "j": "1_000"}
    assert lines[("c",)] == 3


def test_overrides_are_typed_and_validated_like_the_file():
    job = spec.load(os.path.join(REPO, "jobs", "linear.yaml"),
                    overrides=("train.num_steps=7", "optimizer.learning_rate=1e-2",
                               "cluster.env.GREETING=hello world", "cluster.env.N=007"),
                    registry=backends)
    assert job.train.num_steps == 7 and job.optimizer.learning_rate == 0.01
    assert job.cluster.env == {"GREETING": "hello world", "N": "007"}
    with pytest.raises(SpecError) as info:
        spec.load(os.path.join(REPO, "jobs", "linear.yaml"), overrides=("cluster.num_processes=3",),
                  registry=backends)
    assert "does not divide evenly over device_count 6" in str(info.value)


def test_derived_values_are_computed():
    job = spec.load(os.path.join(REPO, "jobs", "linear.yaml"),
                    overrides=("cluster.num_processes=4", "cluster.devices_per_process=2"),
                    registry=backends)
    assert (job.num_processes, job.device_count, job.per_device_batch_size) == (4, 8, 32)


@pytest.mark.parametrize("path", sorted(glob.glob(os.path.join(REPO, "jobs", "*.yaml"))))
def test_every_shipped_job_loads(path):
    job = spec.load(path, registry=backends)
    assert isinstance(job, spec.ProgramJobSpec) or job.train.global_batch_size % job.device_count == 0


@pytest.mark.parametrize("path", sorted(glob.glob(os.path.join(REPO, "jobs", "clusters", "*.yaml"))))
def test_every_shipped_cluster_loads(path, tmp_path):
    overrides = ()
    if "platform: tpu" in open(path).read():  # this machine's chips: four files stand for them
        for i in range(4):
            (tmp_path / f"accel{i}").write_text("")
        overrides = (f"cluster.tpu_device_paths=[{str(tmp_path / 'accel*')!r}]",)
    if "platform: gpu" in open(path).read():  # this machine's GPUs: four stand-in files
        for i in range(4):
            (tmp_path / f"nvidia{i}").write_text("")
        overrides = (f"cluster.gpu_device_paths=[{str(tmp_path / 'nvidia*')!r}]",)
    job = spec.load(os.path.join(REPO, "jobs", "linear.yaml"), cluster_path=path,
                    overrides=overrides, registry=backends)
    # what the launcher writes for the workers (cli: job.json) reads back as the same job there
    from worker.contract.job import WorkerJob

    worker_job = job.job_file()
    assert WorkerJob.from_dict(json.loads(json.dumps(worker_job.to_dict()))) == worker_job
    assert worker_job.train.global_batch_size % job.device_count == 0


def test_file_data_rows_are_checked_before_launch(tmp_path):
    np.save(tmp_path / "d.npy", np.zeros((10, 3), np.float32))
    (tmp_path / "job.yaml").write_text(GOOD.replace(
        "source: synthetic\n  num_examples: 64", "source: file\n  path: d.npy"))
    with pytest.raises(SpecError) as info:
        spec.load(str(tmp_path / "job.yaml"), registry=backends)
    assert "train.global_batch_size: 64 is more than the 10 rows" in str(info.value)


def test_dry_run_prints_the_plan_masks_secrets_and_starts_nothing(tmp_path):
    run_dir = tmp_path / "run"
    result = launch("jobs/linear.yaml", "--dry-run", "--run-dir", str(run_dir),
                    "--set", "cluster.env.API_TOKEN=s3cret", "--set", "cluster.env.MSG=a b $c")
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "s3cret" not in out and "API_TOKEN='****'" in out
    assert "MSG='a b $c'" in out
    for process_id in (0, 1):
        assert f"p{process_id}: host localhost, process_id {process_id}, 2 devices" in out
        assert f"PODLAUNCH_PROCESS_ID={process_id}" in out
    assert "global_batch_size 256 = 64 per device" in out
    assert not run_dir.exists()


@pytest.mark.parametrize("name,content,expected", [
    ("nonnum.csv", "a,b,c\n1,2,3\n4,x,6\n7,8,9\n", "nonnum.csv: line 3, column 2: 'x' is not a number"),
    ("ragged.csv", "1,2,3\n4,5\n1,2,3\n1,2,3\n", "ragged.csv: line 2 has 2 columns, expected 3"),
    ("empty.csv", "", "empty.csv: the file has no data rows"),
    # cells Python's float() takes and the workers' parser must refuse the same way
    ("underscore.csv", "1,2,3\n1_000,2,3\n", "underscore.csv: line 2, column 1: '1_000' is not a number"),
    ("hex.csv", "1,2,3\n4,0x10,6\n", "hex.csv: line 2, column 2: '0x10' is not a number"),
    ("nan.csv", "a,b,c\n1,2,3\n4,5,nan\n", "nan.csv: line 3, column 3: 'nan' is not a finite number"),
    ("inf.csv", "1,2,3\n-Infinity,5,6\n", "inf.csv: line 2, column 1: '-Infinity' is not a finite number"),
    ("huge.csv", "1,2,3\n4,1e999,6\n", "huge.csv: line 2, column 2: '1e999' is beyond float range"),
    ("blank-cell.csv", "1,2,3\n4,,6\n", "blank-cell.csv: line 2, column 2: '' marks a missing value"),
    # a headerless export whose first row has a missing value: that row, never taken for a header
    ("na-first.csv", "1.5,NA,3\n4,5,6\n", "na-first.csv: line 1, column 2: 'NA' marks a missing value"),
    ("null-first.csv", "NULL,2,3\n4,5,6\n", "null-first.csv: line 1, column 1: 'NULL' marks a missing"),
    ("blank-first.csv", "1,,3\n4,5,6\n", "blank-first.csv: line 1, column 2: '' marks a missing value"),
])
def test_bad_data_file_content_is_reported_before_launch(tmp_path, name, content, expected):
    (tmp_path / name).write_text(content)
    (tmp_path / "job.yaml").write_text(GOOD.replace(
        "source: synthetic\n  num_examples: 64", f"source: file\n  path: {name}").replace(
        "global_batch_size: 64", "global_batch_size: 4").replace("num_processes: 2", "num_processes: 1"))
    result = launch(str(tmp_path / "job.yaml"), "--run-dir", str(tmp_path / "run"))
    assert result.returncode == 2, result.stdout + result.stderr
    assert "job.yaml:6: data.path: " in result.stderr and expected in result.stderr, result.stderr
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("arrays, expected", [
    ({"x": (8, 3), "label": (8,)}, "data.npz: task linear_regression reads arrays x and y; y missing"),
    ({"x": (8, 3), "y": (7,)}, "data.npz: expected arrays with one row per example (equal first "
     "dimensions), got x (8, 3), y (7,)"),
    ({"x": (8, 3, 2), "y": (8,)}, "data.npz: expected x [rows, features], got x (8, 3, 2)"),
])
def test_bad_npz_arrays_are_reported_before_launch(tmp_path, arrays, expected):
    import numpy as np

    np.savez(tmp_path / "data.npz", **{n: np.zeros(shape, np.float32) for n, shape in arrays.items()})
    (tmp_path / "job.yaml").write_text(GOOD.replace(
        "source: synthetic\n  num_examples: 64", "source: file\n  path: data.npz").replace(
        "global_batch_size: 64", "global_batch_size: 4").replace("num_processes: 2", "num_processes: 1"))
    result = launch(str(tmp_path / "job.yaml"), "--run-dir", str(tmp_path / "run"))
    assert result.returncode == 2, result.stdout + result.stderr
    assert "job.yaml:6: data.path: " in result.stderr and expected in result.stderr, result.stderr
    assert "Traceback" not in result.stderr and not (tmp_path / "run").exists()


def test_a_truncated_npy_is_reported_before_launch(tmp_path):
    import numpy as np

    np.save(tmp_path / "data.npy", np.ones((40, 4), np.float32))
    size = (tmp_path / "data.npy").stat().st_size
    with open(tmp_path / "data.npy", "r+b") as f:
        f.truncate(size - 9 * 16 - 8)  # 30.5 rows left
    (tmp_path / "job.yaml").write_text(GOOD.replace(
        "source: synthetic\n  num_examples: 64", "source: file\n  path: data.npy").replace(
        "global_batch_size: 64", "global_batch_size: 4").replace("num_processes: 2", "num_processes: 1"))
    result = launch(str(tmp_path / "job.yaml"), "--run-dir", str(tmp_path / "run"))
    assert result.returncode == 2, result.stdout + result.stderr
    assert (f"job.yaml:6: data.path: {tmp_path / 'data.npy'}: the file is {size - 152} bytes, too "
            "short for its 40 rows: rows 31 onwards (counted from 1) are missing") in result.stderr, result.stderr
    assert not (tmp_path / "run").exists()


def _npy_with_header(path, header: str) -> None:
    """A .npy whose header dict is ``header`` (version 1.0, padded as numpy pads it), 40 rows of
    4 float32 after it."""
    text = header.encode("latin1") + b" "
    pad = -(10 + len(text) + 1) % 64
    text += b" " * pad + b"\n"
    path.write_bytes(b"\x93NUMPY\x01\x00" + len(text).to_bytes(2, "little") + text
                     + bytes(40 * 4 * 4))


@pytest.mark.parametrize("header, expected", [
    ("[1, 2, 3]", "header is not numpy's (a dict of descr, fortran_order and shape), got [1, 2, 3]"),
    ("{'descr': '<f4', 'fortran_order': False, 'shape': (10, None), }",
     "header has shape (10, None); expected a tuple of sizes >= 0"),
    ("{'descr': '<f4', 'fortran_order': False, 'shape': (-40, 4), }",
     "header has shape (-40, 4); expected a tuple of sizes >= 0"),
    ("{'descr': '<f4', 'fortran_order': False, 'shape': [40, 4], }",
     "header has shape [40, 4]; expected a tuple"),
    ("{'descr': '<f4', 'shape': (40, 4), }", "header is not numpy's"),
    ("{'descr': '<f4', 'fortran_order': False, 'shape': " + "(" * 400 + ")" * 400 + "}",
     "cannot read the file's header: too many nested parentheses"),
    # RecursionError on Python 3.11 ("it is not numpy's (nested too deeply)"), a ValueError of
    # literal_eval's on later ones: one line either way
    ("{'descr': '<f4', 'fortran_order': False, 'shape': " + "-" * 5000 + "1}",
     "cannot read the file's header: "),
])
def test_a_npy_whose_header_is_not_numpys_is_one_line_before_launch(tmp_path, header, expected):
    # each was an AttributeError or TypeError traceback
    _npy_with_header(tmp_path / "data.npy", header)
    (tmp_path / "job.yaml").write_text(GOOD.replace(
        "source: synthetic\n  num_examples: 64", "source: file\n  path: data.npy").replace(
        "global_batch_size: 64", "global_batch_size: 4").replace("num_processes: 2", "num_processes: 1"))
    for dry in (["--dry-run"], []):
        result = launch(str(tmp_path / "job.yaml"), "--run-dir", str(tmp_path / "run"), *dry)
        assert result.returncode == 2, result.stdout + result.stderr
        assert "job.yaml:6: data.path: " in result.stderr and expected in result.stderr, result.stderr
        assert "Traceback" not in result.stderr
    assert not (tmp_path / "run").exists()


def test_a_spec_that_is_not_utf8_is_bad_input(tmp_path):
    (tmp_path / "bin.yaml").write_bytes(b"\xff\xfe bad\n")
    result = launch(str(tmp_path / "bin.yaml"))
    assert result.returncode == 2 and "bin.yaml: not UTF-8 text" in result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize("kind", ["empty", "file", "under-a-file", "not-empty"])
def test_an_unusable_run_dir_is_bad_input_even_in_a_dry_run(tmp_path, kind):
    (tmp_path / "afile").write_text("x")
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "notes.txt").write_text("mine")
    run_dir = {"empty": "", "file": str(tmp_path / "afile"), "under-a-file": str(tmp_path / "afile" / "run"),
               "not-empty": str(tmp_path / "full")}[kind]
    for extra in ((), ("--dry-run",)):
        result = launch("jobs/linear.yaml", "--run-dir", run_dir, *extra)
        assert result.returncode == 2, result.stdout + result.stderr
        assert result.stderr.startswith("error: --run-dir: ") and "Traceback" not in result.stderr
    assert sorted(os.listdir(tmp_path / "full")) == ["notes.txt"]


def test_steps_per_call_must_divide_the_steps_that_land_on_call_boundaries():
    path = os.path.join(REPO, "jobs", "linear.yaml")
    with pytest.raises(SpecError) as info:
        spec.load(path, overrides=("train.steps_per_call=4", "train.num_steps=10",
                                   "logging.log_every_steps=6", "checkpoint.every_steps=1000"),
                  registry=backends)
    text = str(info.value)
    assert "train.num_steps: 10 is not a multiple of train.steps_per_call 4" in text
    assert "log_every_steps" not in text  # log steps may fall inside a call
    assert "checkpoint.every_steps" not in text  # 1000 is a multiple of 4
    with pytest.raises(SpecError, match="checkpoint.every_steps: 10 is not a multiple"):
        spec.load(path, overrides=("train.steps_per_call=4", "train.num_steps=40",
                                   "logging.log_every_steps=4", "checkpoint.every_steps=10"),
                  registry=backends)
    with pytest.raises(SpecError, match="train.steps_per_call: expected 1 to 100000, got 0"):
        spec.load(path, overrides=("train.steps_per_call=0",), registry=backends)
    with pytest.raises(SpecError, match="train.allreduce"):
        spec.load(path, overrides=("train.allreduce=ring",), registry=backends)
    job = spec.load(path, overrides=("train.steps_per_call=5", "train.num_steps=100",
                                     "checkpoint.every_steps=0"), registry=backends)
    assert job.train.steps_per_call == 5 and job.train.allreduce == "packed"
    # auto (the default): the worker picks a divisor of both, so nothing to refuse
    job = spec.load(path, overrides=("train.num_steps=7", "checkpoint.every_steps=3"), registry=backends)
    assert job.train.steps_per_call == "auto"
    assert spec.load(path, overrides=("train.steps_per_call=auto",),
                     registry=backends).train.steps_per_call == "auto"
    with pytest.raises(SpecError, match=r"train.steps_per_call: expected an integer or one of "
                                        r"auto, got 'fast'"):
        spec.load(path, overrides=("train.steps_per_call=fast",), registry=backends)
    with pytest.raises(SpecError, match=r"train.steps_per_call: expected an integer, got 2.5"):
        spec.load(path, overrides=("train.steps_per_call=2.5",), registry=backends)


def test_parallelism_is_auto_pmap_or_jit_and_auto_by_default(tmp_path):
    path = os.path.join(REPO, "jobs", "linear.yaml")
    assert spec.load(path, registry=backends).train.parallelism == "auto"
    assert spec.load(path, overrides=("train.parallelism=pmap",),
                     registry=backends).train.parallelism == "pmap"
    assert spec.load(path, overrides=("train.parallelism=jit",),
                     registry=backends).train.parallelism == "jit"
    with pytest.raises(SpecError, match=r"--set: train\.parallelism: expected one of auto, pmap, jit, "
                       r"got 'pjit' \(a string\); did you mean 'jit'\?"):
        spec.load(path, overrides=("train.parallelism=pjit",), registry=backends)
    bad = tmp_path / "bad.yaml"
    bad.write_text(open(path).read().replace("train:\n", "train:\n  parallelism: shard_map\n", 1))
    with pytest.raises(SpecError, match=r"bad\.yaml:\d+: train\.parallelism: expected one of auto, pmap, jit"):
        spec.load(str(bad), registry=backends)


def _documented(path: str) -> set:
    """Every backticked name in a doc's tables and text (``train.num_steps``, ``in_features``)."""
    import re as _re

    with open(os.path.join(REPO, path), encoding="utf-8") as f:
        return set(_re.findall(r"`([A-Za-z_][A-Za-z0-9_.]*)`", f.read()))


def test_every_setting_is_in_the_docs_settings_reference():
    # the settings reference is tested against the fields themselves: a setting added to a
    # section must be documented (docs/settings.md for the job's sections and the local
    # cluster, programs.md for program:, the backend's own doc for its cluster settings)
    import dataclasses as _dc

    from launcher import backends as _backends
    from launcher.spec.programspec import ProgramSpec

    def fields(cls):
        return [f.name for f in _dc.fields(cls) if not f.metadata.get("internal")]

    missing = []
    settings_doc = _documented("docs/settings.md") | _documented("docs/programs.md")
    for section, cls in [("task", sections.Task), ("data", sections.Data),
                         ("optimizer", sections.Optimizer), ("train", sections.Train),
                         ("logging", sections.Logging), ("distributed", sections.Distributed),
                         ("checkpoint", sections.Checkpoint), ("restarts", spec.RestartSpec),
                         ("watchdog", sections.Watchdog), ("program", ProgramSpec)]:
        for name in fields(cls):
            if f"{section}.{name}" not in settings_doc and name not in settings_doc:
                missing.append(f"docs/settings.md: {section}.{name}")
    for name in sorted(set(fields(spec.TrainerJobSpec)) | set(fields(spec.ProgramJobSpec))):
        if name not in settings_doc and not any(t.startswith(name + ".") for t in settings_doc):
            missing.append(f"docs/settings.md: {name}")
    for backend in map(_backends.get, _backends.names()):  # every one the registry has
        assert backend.docs, f"{backend.name}: no Backend.docs names its settings' pages"
        documented = {"backend"}.union(*map(_documented, backend.docs))  # backend: settings.md
        for name in fields(backend.cluster_type):
            if name not in documented and f"cluster.{name}" not in documented:
                missing.append(f"{' or '.join(backend.docs)}: cluster.{name}")
    assert not missing, missing


def test_a_large_learning_rate_is_no_int32_overflow():
    # the model's own numbers (learning_rate, weight_decay, noise_std) reach no int32 argument or
    # timer: 1e20 was refused with "larger values overflow the int32 and timer arguments"
    path = os.path.join(REPO, "jobs", "linear.yaml")
    assert spec.load(path, overrides=("optimizer.learning_rate=1e20",),
                     registry=backends).optimizer.learning_rate == 1e20
    with pytest.raises(SpecError, match=r"optimizer.learning_rate: expected a number > 0, got -1.0"):
        spec.load(path, overrides=("optimizer.learning_rate=-1",), registry=backends)
    with pytest.raises(SpecError, match=r"distributed.initialization_timeout_s: expected at most"):
        spec.load(path, overrides=("distributed.initialization_timeout_s=100000000000",),
                  registry=backends)


def _npz_claiming(path, rows: int, compressed: bool = True) -> None:
    """An .npz of arrays x [rows, 2] and y [rows, 1] float32 whose member headers claim
    ``rows`` rows, with 4 KiB of zeros after each: a small file that expands as its headers say."""
    import zipfile

    def member(shape) -> bytes:
        text = repr({"descr": "<f4", "fortran_order": False, "shape": shape}).encode() + b" "
        text += b" " * (-(10 + len(text) + 1) % 64) + b"\n"
        return b"\x93NUMPY\x01\x00" + len(text).to_bytes(2, "little") + text + bytes(4096)

    kind = zipfile.ZIP_DEFLATED if compressed else zipfile.ZIP_STORED
    with zipfile.ZipFile(path, "w", kind) as archive:
        archive.writestr("x.npy", member((rows, 2)))
        archive.writestr("y.npy", member((rows, 1)))


def _limited_launch(*args, as_bytes: int):
    """``launch ARGS`` with its address space limited to ``as_bytes`` (a machine without the
    memory a file asks for)."""
    import resource
    import subprocess

    from harness.helpers import LAUNCH, env_for_tests

    return subprocess.run(LAUNCH + list(args), env=env_for_tests(), capture_output=True, text=True,
                          timeout=120, preexec_fn=lambda: resource.setrlimit(
                              resource.RLIMIT_AS, (as_bytes, as_bytes)))


def test_a_compressed_npz_that_expands_past_its_bound_and_a_huge_npy_header_are_one_line(tmp_path):
    """A 10 KB .npz whose members expand to 3.6 GB ended the dry run in numpy's
    _ArrayMemoryError traceback; a 20,000-byte .npy header got numpy's advice to use
    allow_pickle=True. Each is now podlaunch's sentence before anything starts, dry run too."""
    _npz_claiming(tmp_path / "big.npz", 300_000_000)
    text = "{'descr': '<f4', 'fortran_order': False, 'shape': (40, 4), }"
    _npy_with_header(tmp_path / "wide.npy", text + " " * (20000 - len(text)))
    job = GOOD.replace("source: synthetic\n  num_examples: 64", "source: file\n  path: DATA").replace(
        "global_batch_size: 64", "global_batch_size: 4").replace("num_processes: 2", "num_processes: 1")
    for data, expected in [
            ("big.npz", "array 'x' is compressed (0.0 MiB in the file) and expands to 2.2 GiB, which "
                        "every process would read whole into memory (more than 1.0 GiB, "
                        "PODLAUNCH_COMPRESSED_MAX_BYTES): save the arrays with numpy.savez"),
            ("wide.npy", "wide.npy's header is 20,022 bytes; numpy's are at most 10,000")]:
        (tmp_path / "job.yaml").write_text(job.replace("DATA", data))
        for dry in (["--dry-run"], []):
            result = _limited_launch(str(tmp_path / "job.yaml"), "--run-dir", str(tmp_path / "run"),
                                     *dry, as_bytes=2 << 30)
            assert result.returncode == 2, result.stdout + result.stderr
            assert "job.yaml:6: data.path: " in result.stderr and expected in result.stderr, \
                result.stderr
            assert "Traceback" not in result.stderr and "allow_pickle" not in result.stderr
    assert not (tmp_path / "run").exists()


def test_a_compressed_npz_within_its_bound_is_checked_and_the_bound_can_be_set(tmp_path, monkeypatch):
    from launcher.spec import datafiles

    _npz_claiming(tmp_path / "small.npz", 1024)
    assert datafiles.shape(str(tmp_path / "small.npz")) == (1024, 2)
    monkeypatch.setenv(datafiles.COMPRESSED_VAR, "8000")
    with pytest.raises(datafiles.DataFileError, match="array 'x' is compressed .* expands to 0.0 MiB"):
        datafiles.shape(str(tmp_path / "small.npz"))
    _npz_claiming(tmp_path / "stored.npz", 1024, compressed=False)  # memory-mapped: no bound
    assert datafiles.shape(str(tmp_path / "stored.npz")) == (1024, 2)
