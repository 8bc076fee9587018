"""What a program or directory sync copies (launcher.spec.syncrules), without hosts: the
include rule names what it brings back, and a launch's own output is never its input."""

from __future__ import annotations

import json
import os

import pytest

from launcher.backends.ssh import syncdir
from launcher.spec import syncrules


def _program(root):
    """A program directory with a key in it, as a user's project may have one."""
    (root / "main.py").write_text("print(1)\n")
    (root / ".ssh").mkdir()
    (root / ".ssh" / "id_ed25519").write_text("KEY")
    (root / "id_ed25519").write_text("KEY")
    (root / "build").mkdir()
    (root / "build" / "gen.py").write_text("x = 1\n")
    return root


@pytest.mark.parametrize("include", [("*",), ("**",), ("*/*",), ("*", "*/*", "build")])
def test_include_star_brings_back_skipped_names_but_never_a_key(tmp_path, include):
    # issue 51.9: matched by pattern instead of by name, include: ["*"] copied ~/.ssh's key
    src = _program(tmp_path)
    files, _, secrets = syncrules.walk(str(src), syncrules.Rules(include=include))
    assert not any("id_ed25519" in rel for rel in files), sorted(files)
    assert sorted(secrets) == [".ssh/", "id_ed25519"]
    why = syncrules.check_source(str(src), syncrules.Rules(include=include))
    assert why and ".ssh/" in why and "id_ed25519" in why, why


def test_a_key_named_under_include_is_copied_on_purpose(tmp_path):
    src = _program(tmp_path)
    files, _, secrets = syncrules.walk(str(src), syncrules.Rules(include=(".ssh", "build")))
    assert sorted(files) == [".ssh/id_ed25519", "build/gen.py", "main.py"]
    assert secrets == ["id_ed25519"]  # the other key is not named: still refused


def _shared(tmp_path):
    """program.dir holding the hosts' workdirs (a shared filesystem) after one launch: each
    workdir holds the synced program and its manifest; and the local run directory."""
    src = tmp_path / "proj"
    src.mkdir()
    (src / "main.py").write_text("print(1)\n")
    for host in ("h1", "h2"):
        workdir = src / "hosts" / host
        (workdir / ".podlaunch").mkdir(parents=True)
        (workdir / "main.py").write_text("print(1)\n")
        (workdir / syncdir.MANIFEST).write_text(json.dumps({"files": {}, "dirs": {}}))
    run_dir = src / "out" / "run-1"
    (run_dir / "logs").mkdir(parents=True)
    (run_dir / "run.json").write_text("{}")
    (src / "out" / "notes.txt").write_text("kept\n")
    return src, run_dir


@pytest.mark.parametrize("include", [(), ("hosts", "out")])
def test_the_hosts_workdirs_and_the_run_directory_inside_the_program_are_never_copied(
        tmp_path, include):
    # issue 51.7: with the workdirs inside program.dir, every launch copied every host's
    # workdir and the local run directory into every host, one level deeper each time
    src, run_dir = _shared(tmp_path)
    [(_, _, _, (files, dirs))] = syncdir.walked(
        [(str(src), "proj", syncrules.Rules(include=include))], avoid=(str(run_dir),))
    assert sorted(files) == ["main.py", "out/notes.txt"], sorted(files)
    assert sorted(dirs) == ["hosts", "out"]  # made, empty: the workdirs in it are not copied
    # the walk itself, as check_source uses it: the copies hold no secrets of their own
    files, _, _ = syncrules.walk(str(src), syncrules.Rules(), avoid=(str(run_dir),))
    assert sorted(files) == ["main.py", "out/notes.txt"]


def test_a_run_directory_reached_through_another_spelling_is_still_avoided(tmp_path):
    src, run_dir = _shared(tmp_path)
    spelled = os.path.join(str(src), "out", "..", "out", "run-1")
    files, _, _ = syncrules.walk(str(src), syncrules.Rules(), avoid=(spelled,))
    assert "out/run-1/run.json" not in files


@pytest.mark.parametrize("include", [(), ("earlier",)])
def test_an_earlier_runs_directory_inside_the_program_is_never_copied(tmp_path, include):
    # issue 71.7: a second launch with --run-dir inside program.dir copied the first run's
    # directory (its job.json, lock, launcher.log, logs and checkpoints) to every host: only
    # this launch's own run directory was avoided
    src, run_dir = _shared(tmp_path)
    earlier = src / "earlier"
    (earlier / "logs").mkdir(parents=True)
    (earlier / "launcher.lock").write_text('{"pid": 1}\n')
    (earlier / "job.json").write_text("{}")
    (earlier / "logs" / "process-000.log").write_text("step 1\n")
    files, dirs, _ = syncrules.walk(str(src), syncrules.Rules(include=include),
                                    avoid=(str(run_dir),))
    assert not [f for f in files if f.startswith("earlier")], sorted(files)
    assert "earlier" not in dirs
    assert "main.py" in files


def test_a_file_gone_between_the_listing_and_its_stat_is_left_out(tmp_path, monkeypatch):
    # another process's temporary file (an editor's, a test's spec written and removed beside
    # a synced program): the sync skips it instead of failing the start with FileNotFoundError
    src = tmp_path / "src"
    src.mkdir()
    (src / "train.py").write_text("print(1)\n")
    (src / ".tmp-spec.yaml").write_text("name: t\n")
    real_scandir = os.scandir

    def listed_then_removed(path):
        entries = list(real_scandir(path))
        if os.path.exists(src / ".tmp-spec.yaml"):
            os.remove(src / ".tmp-spec.yaml")
        return iter(entries)

    monkeypatch.setattr(syncrules.os, "scandir", listed_then_removed)
    files, _, _ = syncrules.walk(str(src), syncrules.Rules())
    assert sorted(files) == ["train.py"]
