"""YAML as other tools write it: layered merge keys load as PyYAML and YAML tools read them,
and what this loader does not read (a tag, a run's spec.yaml that is not a mapping) is one
line with file and line, exit 2, never PyYAML's traceback. Through the real CLI."""

from __future__ import annotations

import textwrap

import pytest

from harness.helpers import REPO, launch
from launcher import backends
from launcher import spec as specs
from test_inputs import _refused

LAYERED = textwrap.dedent("""\
    x-base: &base {num_steps: 20, global_batch_size: 128, seed: 1}
    x-cpu: &cpu {<<: *base, num_steps: 30}
    name: layered
    train: {<<: *cpu, seed: 3}
    cluster: {backend: local, num_processes: 2, devices_per_process: 2}
    """)


def test_layered_merge_keys_load_with_each_layers_own_keys_winning(tmp_path):
    path = tmp_path / "job.yaml"
    path.write_text(LAYERED)
    done = launch(str(path), "--dry-run")
    assert done.returncode == 0, done.stdout + done.stderr
    train = specs.load(str(path), None, (), registry=backends).train
    assert (train.num_steps, train.global_batch_size, train.seed) == (30, 128, 3)


@pytest.mark.parametrize("line, needle", [
    ("name: !foo x", "job.yaml:1: name: the tag !foo is not read here"),
    ("name: !!python/object:os.system x", "job.yaml:1: name: the tag !!python/object:os.system is not read here"),
    ("name: !!timestamp nope", "job.yaml:1: name: the tag !!timestamp is not read here"),
    ("name: t\ntrain: {num_steps: !!int abc}", "job.yaml:2: train.num_steps: 'abc' is not a whole number"),
    ("name: t\ntrain: {num_steps: !!float abc}", "job.yaml:2: train.num_steps: 'abc' is not a number"),
    ("!!int abc: 1", "job.yaml:1: 'abc' is not a whole number"),
    ("x-a: &a {<<: *a}\nname: t", "job.yaml:1: x-a: '<<' merges a mapping into itself"),
])
def test_a_tag_this_loader_does_not_read_is_one_line_not_a_traceback(tmp_path, line, needle):
    path = tmp_path / "job.yaml"
    path.write_text(line + "\n")
    _refused(launch(str(path), "--dry-run"), needle, "write the value without a tag"
             if "merges" not in needle else "write the keys out")


@pytest.mark.parametrize("text, needle", [("a: [1\n", "not valid YAML at line 2"),
                                          ("- 1\n", "not a mapping of settings")])
def test_a_resumed_runs_spec_yaml_that_is_not_a_spec_is_one_line(tmp_path, text, needle):
    (tmp_path / "spec.yaml").write_text(text)
    done = launch(f"{REPO}/jobs/linear.yaml", "--resume", str(tmp_path))
    _refused(done, f"--resume: {tmp_path} is not a run directory (cannot read "
             f"{tmp_path / 'spec.yaml'}: {needle})")


def test_a_control_character_is_named_by_line_and_column_in_a_file_and_in_set(tmp_path):
    path = tmp_path / "job.yaml"
    path.write_text("name: t\ntrain: {num_steps: 2,\n  global_batch_size: 8}\x01\n")
    _refused(launch(str(path), "--dry-run"), "job.yaml:3: column 24: the character U+0001 is not "
             "allowed in YAML")
    _refused(launch(f"{REPO}/jobs/linear.yaml", "--dry-run", "--set", "name=a\x07"),
             "--set: name: column 2: the character U+0007 is not allowed in YAML")


def test_half_a_surrogate_pair_is_refused_at_its_line_not_when_spec_yaml_is_written(tmp_path):
    """YAML's "\\uD800" escape makes a string UTF-8 cannot hold: it used to pass every check
    and end the launch in a UnicodeEncodeError traceback while spec.yaml was written."""
    path = tmp_path / "job.yaml"
    path.write_text('name: t\ntask: {args: {a: "x\\uDC00"}}\n')
    _refused(launch(str(path), "--dry-run"), "job.yaml:2: task.args.a: 'x\\udc00' holds '\\udc00', "
             "half of a UTF-16 surrogate pair")
    _refused(launch(f"{REPO}/jobs/linear.yaml", "--set", 'cluster.env.X="\\uD800"',
                    "--run-dir", str(tmp_path / "run")), "--set: cluster.env.X: ")
    assert not (tmp_path / "run").exists()
