"""Secrets in the spellings users write: names without separators (``DBPASSWORD``) and
credentials inside values (``password=`` in a connection string, ``user:pw@`` in an address,
``Bearer T`` in a header), in ``cluster.env`` and a program's ``argv``, masked in
``--dry-run`` and in spec.yaml."""

from __future__ import annotations

import re

import pytest
import yaml

from harness.helpers import launch
from launcher import backends
from launcher import spec as specs
from worker.contract import redact

SECRETS = {"DBPASSWORD": "pw-glued-1", "AUTHTOKEN": "pw-glued-2", "SECRETKEY": "pw-glued-3",
           "SESSIONID": "pw-glued-4", "DBPASS": "pw-glued-5",
           "PG_CONN": "host=db user=me password=pw-conn-1 dbname=x",
           "ODBC": "Server=db;Uid=sa;Pwd=pw-conn-2;Database=x",
           "HTTPS_PROXY": "svc:pw-bare-1@proxy.corp:3128",
           "FEED": "https://h.example/x?token=pw-query-1&page=2",
           "HEADERS": "Authorization: Bearer pw-http-1"}
VISIBLE = {"TOKENIZER": "bert-base", "KEYBOARD": "us", "BYPASS_CACHE": "yes", "COMPASS": "north",
           "CLOCK": "10:30@site"}
ARGV = ["python", "p.py", "--db", "host=h password=pw-argv-1", "--mirror",
        "https://u:pw-argv-2@h/x", "svc:pw-argv-3@host.example", "AUTHTOKEN=pw-argv-4", "-H", "Authorization: Basic pw-argv-5", "--lr", "0.1"]


@pytest.fixture
def job_file(tmp_path):
    prog = tmp_path / "prog"
    prog.mkdir()
    (prog / "p.py").write_text("print('hi')\n")
    spec = {"name": "creds", "program": {"argv": ARGV, "dir": str(prog)},
            "cluster": {"backend": "local", "num_processes": 1, "devices_per_process": 1,
                        "env": {**SECRETS, **VISIBLE}}}
    (tmp_path / "j.yaml").write_text(yaml.safe_dump(spec))
    return str(tmp_path / "j.yaml")


def _no_secret_in(text: str) -> None:
    """Every secret value above is spelled pw-KIND-N."""
    assert not re.findall(r"pw-[a-z]+-\d", text), text


def test_glued_names_and_credentials_in_values_are_masked_by_dry_run(job_file):
    done = launch(job_file, "--dry-run")
    assert done.returncode == 0, done.stdout + done.stderr
    _no_secret_in(done.stdout + done.stderr)
    for name, value in VISIBLE.items():
        assert f"{name}={value}" in done.stdout, done.stdout
    assert "password=**** dbname=x" in done.stdout and "svc:****@proxy.corp:3128" in done.stdout


def test_glued_names_and_credentials_in_values_are_masked_in_spec_yaml(job_file):
    job = specs.load(job_file, None, (), registry=backends)
    kept = yaml.safe_dump(job.to_masked_dict())  # what spec.yaml holds (launcher.run.starts.write_run_files)
    _no_secret_in(kept)
    assert "Pwd=****;Database=x" in kept and "token=****&page=2" in kept
    assert "bert-base" in kept and "10:30@site" in kept
    command = " ".join(redact.masked_argv(["--set", "cluster.env.DBPASSWORD=pw-set-1",
                                           "--set", "cluster.env.URL=redis://:pw-set-2@h:6379"]))
    assert "pw-set" not in command, command  # the run lock's record of the command line


@pytest.mark.parametrize("name", ["DBPASSWORD", "AUTHTOKEN", "SECRETKEY", "SESSIONID", "DBPASS",
                                  "ACCESSKEY", "HFTOKEN", "myDbpassword", "x.PRIVATEKEY"])
def test_a_secret_name_without_separators_is_a_secret(name):
    assert redact.is_secret(name)


@pytest.mark.parametrize("name", ["TOKENIZER", "KEYBOARD", "PASSAGE", "BYPASS", "COMPASS_DIR",
                                  "MONKEY", "PATH", "HOME"])
def test_ordinary_words_stay_visible(name):
    assert not redact.is_secret(name)


def test_a_set_flag_s_secrets_are_masked_in_the_commands_printed_and_the_run_lock():
    """A newcomer's report: ``--set cluster.env.HF_TOKEN=...`` and the flow form ``--set
    'cluster.env={HF_TOKEN: ...}'`` came back in clear in the failed run's "continue this
    run" command (the console, launcher.log) and the flow form in launcher.lock's command.
    The continue command is now ``launch resume RUN`` (issue 70: the run recorded its settings,
    none is given again); a new run's command (after a diverged loss) masks them."""
    import types

    from launcher.console import nextsteps

    sets = ("cluster.env.HF_TOKEN=pw-set-3", "cluster.env={HF_TOKEN: pw-set-4, MODE: fast}",
            'cluster={"env": {"WANDB_API_KEY": "pw-set-5"}, "num_processes": 2}',
            "task.args={db: 'postgres://u:pw-set-6@h/x', lr: 0.1}", "cluster.env.TEAM=pw-mine-1",
            "optimizer.learning_rate=0.5")
    lines = nextsteps.closing("jobs/linear.yaml", "/runs/r1", 1, False, overrides=sets,
                              secrets=("TEAM",))
    assert lines[-2].startswith("this failed run saved no checkpoint"), lines
    assert lines[-1].endswith("launch resume /runs/r1") and "pw-" not in "".join(lines), lines
    diverged = types.SimpleNamespace(repeats=True, why="the loss is inf: lower "
                                     "optimizer.learning_rate")
    # the run's rate 0.5, the job file's not known: a hundredth (launcher.console.nextsteps.lower_rate)
    lines = nextsteps.closing("jobs/linear.yaml", "/runs/r1", 1, False, overrides=sets,
                              secrets=("TEAM",), failure=diverged, rates=(0.5, None))
    command = lines[-1]
    assert not re.findall(r"pw-[a-z]+-\d", command), command
    assert "MODE: fast" in command and "optimizer.learning_rate=0.005" in command
    assert command.endswith("(secrets shown as ****: give their values again)")
    # the run lock's record of the command line (launcher.rundir.runlock)
    locked = " ".join(redact.masked_argv([part for s in sets[:4] for part in ("--set", s)]))
    assert not re.findall(r"pw-[a-z]+-\d", locked), locked


def test_secrets_given_every_way_stay_masked_in_the_lock_the_dry_run_and_errors(tmp_path, monkeypatch):
    """A tester's report on the change above: launcher.lock ignored the spec's ``secrets:``
    names (and a refused second launch printed that line); ``--set=KEY=VALUE`` in one argument
    and a block mapping (``cluster.env=HF_TOKEN: x``) were not masked; a dotted entry in
    ``secrets:`` did nothing; a bad value of a secret key was quoted in its error."""
    import json
    import sys as system

    from launcher.rundir import runlock

    monkeypatch.setattr(system, "argv", ["launch", "j.yaml", "--set", "cluster.env.TEAM_PIN=pw-lock-1",
                                         "--set=cluster.env.DB_PASSWORD=pw-lock-2",
                                         "--set", "cluster.env=HF_TOKEN: pw-lock-3"])
    lock = runlock.acquire(str(tmp_path / "run"), "--run-dir", ("TEAM_PIN",))
    try:
        kept = (tmp_path / "run" / "launcher.lock").read_text()
    finally:
        lock.release()
    assert not re.findall(r"pw-[a-z]+-\d", kept), kept
    assert json.loads(kept)["command"].count("****") == 3, kept
    dry = launch("jobs/linear.yaml", "--dry-run", "--set", "secrets=[cluster.env.OTHER]",
                 "--set", "cluster.env.OTHER=pw-dot-1")
    assert dry.returncode == 0 and "pw-dot" not in dry.stdout and "OTHER='****'" in dry.stdout, dry.stdout
    for value in ("!pw-tag-1", "*pw-alias-1", "1e5", "true", "12.5"):
        bad = launch("jobs/linear.yaml", "--dry-run", "--set", f"cluster.env.DB_PASSWORD={value}")
        assert bad.returncode == 2 and "DB_PASSWORD" in bad.stderr, bad.stderr
        assert value.lstrip("!*") not in bad.stderr and "100000" not in bad.stderr \
            and "True" not in bad.stderr, bad.stderr
    plain = launch("jobs/linear.yaml", "--dry-run", "--set", "train.num_steps=abc")
    assert "got 'abc' (a string)" in plain.stderr  # other keys' values are still quoted


def test_a_spec_s_secrets_list_is_kept_as_names_not_masked(tmp_path):
    """The ``secrets:`` list holds key names; masked as a secret itself (its key is named
    "secrets"), spec.yaml and TensorBoard showed ``secrets: '****'`` and nobody could tell
    which keys were listed."""
    masked = redact.masked({"secrets": ["TEAM"], "cluster": {"env": {"TEAM": "pw-list-1"}}},
                           ("TEAM",))
    assert masked == {"secrets": ["TEAM"], "cluster": {"env": {"TEAM": "****"}}}
