"""No bad input gets through: identifiers, numbers, YAML, reserved names, secrets, search paths.

Each kind is tried with several instances through the real CLI (``--dry-run``
too, which must refuse exactly what a run refuses): exit 2, one line naming
the key, no traceback, nothing started.
"""

import json
import os
import stat
import textwrap

import pytest

from harness.helpers import REPO, launch

BASE = textwrap.dedent("""\
    name: t
    train: {num_steps: 2, global_batch_size: 8}
    logging: {log_every_steps: 1}
    checkpoint: {every_steps: 0}
    """)
LOCAL = "cluster: {backend: local, num_processes: 2, devices_per_process: 2%s}\n"


def _spec(tmp_path, text: str, name: str = "job.yaml") -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def _refused(result, *needles):
    assert result.returncode == 2, result.stdout + result.stderr
    assert "Traceback" not in result.stderr, result.stderr
    for needle in needles:
        assert needle in result.stderr, f"{needle!r} not in:\n{result.stderr}"
    assert "nothing was started" in result.stderr


def _both(path, *args):
    """The same input with and without --dry-run."""
    return [launch(path, *args, "--dry-run"), launch(path, *args)]


# ---- 2. full-match names: a trailing newline is not a name ------------------------------
@pytest.mark.parametrize("text, needle", [
    (BASE + LOCAL % ', env: {"API_TOKEN\\n": x}', "'\\n' at position 9 is not allowed"),
    (BASE + LOCAL % ', env: {"A B": x}', "' ' at position 1 is not allowed"),
    (BASE.replace("name: t", 'name: "t\\n"'), "name: expected a job name"),
    (BASE + "task: {name: \"pkg.mod:make\\n\"}\n" + LOCAL % "", "task.name: expected a built-in task"),
])
def test_names_are_matched_whole(tmp_path, text, needle):
    for result in _both(_spec(tmp_path, text)):
        _refused(result, needle)


# ---- 5. env values pass exactly as written -----------------------------------------------
def test_env_integers_pass_as_written(tmp_path):
    path = _spec(tmp_path, BASE + LOCAL % ", env: {V: 0x1F, W: +7, Z: 0o17, N: 12}")
    result = launch(path, "--dry-run", "--set", "cluster.env.Q=0x10")
    assert result.returncode == 0, result.stderr
    for shown in ("V=0x1F", "W=+7", "Z=0o17", "N=12", "Q=0x10"):
        assert shown in result.stdout, result.stdout


# ---- 6. numbers the consumers cannot take ------------------------------------------------
@pytest.mark.parametrize("override, needle", [
    ("train.seed=9223372036854775808", "train.seed: expected a seed from 0 to 4294967295"),
    ("data.seed=-1", "data.seed: expected a seed from 0 to 4294967295"),
    ("train.num_steps=99999999999", "train.num_steps: expected at most 2147483647"),
    ("logging.log_every_steps=1e12", "logging.log_every_steps: expected an integer"),
    ("optimizer.learning_rate=.inf", "optimizer.learning_rate: expected a finite number"),
    ("watchdog.stall_timeout_s=1e300", "watchdog.stall_timeout_s: expected at most 2147483647"),
    ("restarts.backoff_s=.nan", "restarts.backoff_s: expected a finite number"),
    ("cluster.grace_s=3e10", "cluster.grace_s: expected at most 2147483647"),
])
def test_numbers_out_of_range_are_bad_input(tmp_path, override, needle):
    path = _spec(tmp_path, BASE + LOCAL % "")
    for result in _both(path, "--set", override):
        _refused(result, "--set: " + needle)


# ---- 7. YAML real specs use, and YAML that attacks ---------------------------------------
def test_a_merge_key_with_a_local_override_and_an_x_anchor(tmp_path):
    path = _spec(tmp_path, textwrap.dedent("""\
        x-train: &train {num_steps: 2, global_batch_size: 8}
        name: t
        train: {<<: *train, num_steps: 3}
        checkpoint: {every_steps: 0}
        cluster: {backend: local, num_processes: 2, devices_per_process: 2}
        """))
    result = launch(path, "--dry-run")
    assert result.returncode == 0, result.stderr
    assert "global_batch_size 8" in result.stdout


@pytest.mark.parametrize("text, needle", [
    ("a: &a [1,1,1,1,1,1,1,1,1]\n" + "".join(
        f"{c}: &{c} [{','.join(['*' + p] * 9)}]\n" for p, c in zip("abcdefgh", "bcdefghi")),
     "expands to more than 100,000 values"),
    ("name: t\nx-loop: &a [*a]\n", "a recursive alias"),
    ("name: t\ntrain: " + "[" * 5000 + "]" * 5000 + "\n", "nested too deeply"),
    ("name: t\ntrain: " + "{a: " * 100 + "1" + "}" * 100 + "\n", "nested more than 64 levels"),
    # issue 25, item 6: bounded while PyYAML composes (12 million items took 4.2 GB and minutes)
    ("name: t\nxs: [" + "1," * 70_000 + "]\n", "holds more than 60,000 values"),
    ("name: t\nx: '" + "a" * (3 << 20) + "'\n", "is 3.0 MiB; a spec is at most 2 MiB"),
])
def test_hostile_yaml_is_one_line_and_exit_2(tmp_path, text, needle):
    for result in _both(_spec(tmp_path, text)):
        _refused(result, needle)
        assert len(result.stderr.strip().splitlines()) == 2, result.stderr  # the problem + the summary


# ---- 8. the launcher's own variables are not the user's ----------------------------------
@pytest.mark.parametrize("name", ["PODLAUNCH_PROCESS_ID", "PODLAUNCH_COORDINATOR_ADDRESS",
                                  "JAX_PLATFORMS", "JAX_NUM_CPU_DEVICES", "MEGASCALE_SLICE_ID",
                                  # jax's older name of JAX_PLATFORMS: a tpu here was blamed
                                  # on the network when every process failed to join
                                  "JAX_PLATFORM_NAME"])
def test_reserved_env_names_are_refused(tmp_path, name):
    for result in _both(_spec(tmp_path, BASE + LOCAL % f", env: {{{name}: '1'}}")):
        _refused(result, f"cluster.env: {name!r} is set by podlaunch itself")


# ---- 9. the import check looks where the workers look ------------------------------------
def test_a_task_on_the_workers_pythonpath_or_in_the_current_directory_is_accepted(tmp_path):
    tasks = tmp_path / "mytasks"
    tasks.mkdir()
    (tasks / "mytask_xyz.py").write_text("def make():\n    pass\n")
    task = "task: {name: 'mytask_xyz:make'}\n"
    via_env = _spec(tmp_path, BASE + task + LOCAL % f", env: {{PYTHONPATH: '{tasks}'}}")
    assert launch(via_env, "--dry-run").returncode == 0
    in_cwd = _spec(tasks, BASE + task + LOCAL % "")
    result = launch(in_cwd, "--dry-run", cwd=str(tasks))
    assert result.returncode == 0, result.stderr
    # and from elsewhere, with nothing pointing at it, the workers could not import it
    _refused(launch(in_cwd, "--dry-run"), "module 'mytask_xyz' is not importable by the workers")


# ---- 9b. a task module Python cannot compile is refused before start, one that works is not
@pytest.mark.parametrize("source, needle", [
    (b"def make(:\n    pass\n", "bad_task_xyz.py:1: SyntaxError: "),
    (b"def make():\n    return 1\n\x00\n", "source code string cannot contain null bytes"),
    (b"def make():\n  return 1\n    x = 2\n", "bad_task_xyz.py:3: IndentationError: "),
])
def test_a_task_module_that_does_not_compile_is_one_line_and_starts_nothing(tmp_path, source,
                                                                             needle):
    # each passed the dry run and failed in every worker with a traceback
    tasks = tmp_path / "tasks"
    tasks.mkdir()
    (tasks / "bad_task_xyz.py").write_bytes(source)
    path = _spec(tmp_path, BASE + "task: {name: 'bad_task_xyz:make'}\n"
                 + LOCAL % f", env: {{PYTHONPATH: '{tasks}'}}")
    for result in _both(path, "--run-dir", str(tmp_path / "run")):
        _refused(result, "task.name: ", needle, "every worker's import of it would fail")
        assert len(result.stderr.strip().splitlines()) == 2, result.stderr
    assert not (tmp_path / "run").exists()


def test_a_task_module_too_deep_to_compile_is_refused_exactly_where_python_refuses_it(tmp_path):
    # 3,000 terms: a RecursionError in every worker's import on Python 3.11, compiled by later
    # ones (the workers run this interpreter): refused where it fails, accepted where it works
    source = b"X = " + b"+".join([b"1"] * 3000) + b"\n\ndef make():\n    pass\n"
    try:
        compile(source, "deep.py", "exec")
        compiles = True
    except RecursionError:
        compiles = False
    tasks = tmp_path / "tasks"
    tasks.mkdir()
    (tasks / "deep_task_xyz.py").write_bytes(source)
    path = _spec(tmp_path, BASE + "task: {name: 'deep_task_xyz:make'}\n"
                 + LOCAL % f", env: {{PYTHONPATH: '{tasks}'}}")
    result = launch(path, "--dry-run")
    if compiles:
        assert result.returncode == 0, result.stderr
    else:
        _refused(result, "an expression is nested too deeply for Python to compile "
                 "(RecursionError); split it")


def test_a_task_function_rebound_to_a_wrapper_is_left_to_its_start(tmp_path):
    # a module that puts a **kwargs wrapper in its def's place was refused, although it works
    tasks = tmp_path / "tasks"
    tasks.mkdir()
    (tasks / "wrapped_task_xyz.py").write_text(textwrap.dedent("""\
        import functools

        def make(width):
            return width

        def logged(fn):
            @functools.wraps(fn)
            def wrapper(**kwargs):
                return fn(kwargs.get("width", 1))
            return wrapper

        make = logged(make)
        """))
    path = _spec(tmp_path, BASE + "task: {name: 'wrapped_task_xyz:make', args: {depth: 3}}\n"
                 + LOCAL % f", env: {{PYTHONPATH: '{tasks}'}}")
    result = launch(path, "--dry-run")
    assert result.returncode == 0, result.stderr
    # the same def not rebound: its missing and unknown arguments are still said
    (tasks / "wrapped_task_xyz.py").write_text("def make(width):\n    return width\n")
    _refused(launch(path, "--dry-run"), "task.args.depth: make() in ", "takes no argument 'depth'")


def test_a_task_function_that_takes_keyword_arguments_takes_any_but_one_with_positional_ones_does_not(
        tmp_path):
    """``def make(width, **options)`` is called as ``make(**task.args)`` with any other
    argument too: nothing is refused (its required ``width`` still is, when missing);
    ``def make(width, *rest)`` takes no other argument by keyword: ``depth`` is refused.
    The check as a launch runs it (``checks.check_task_importable``), in this process."""
    from launcher import backends
    from launcher import spec as specs
    from launcher.errors import SpecError
    from launcher.spec import checks

    tasks = tmp_path / "tasks"
    tasks.mkdir()

    def checked(source: str, args: str):
        (tasks / "kw_task_xyz.py").write_text(source)
        path = _spec(tmp_path, BASE + f"task: {{name: 'kw_task_xyz:make', args: {args}}}\n"
                     + LOCAL % "")
        checks.check_task_importable(specs.load(path, registry=backends), str(tasks))

    kwargs = "def make(width, **options):\n    return width\n"
    checked(kwargs, "{width: 2, depth: 3}")  # no SpecError
    with pytest.raises(SpecError, match=r"make\(\) in .*kw_task_xyz.py:1 needs width"):
        checked(kwargs, "{depth: 3}")
    with pytest.raises(SpecError, match=r"make\(\) in .*kw_task_xyz.py:1 takes no argument 'depth'"):
        checked("def make(width, *rest):\n    return width\n", "{width: 2, depth: 3}")


def test_a_path_given_with_set_is_the_shells_as_every_other_command_line_path(tmp_path):
    # --set data.path=x.csv was read relative to the spec file, not the shell
    (tmp_path / "spec").mkdir()
    (tmp_path / "shell").mkdir()
    (tmp_path / "shell" / "rows.csv").write_text("a,b,y\n" + "1,2,3\n" * 16)
    (tmp_path / "spec" / "rows.csv").write_text("a,b,y\n" + "1,2,3\n" * 24)  # not meant
    path = _spec(tmp_path / "spec", BASE + "data: {source: file, path: rows.csv}\n" + LOCAL % "")
    done = launch(path, "--dry-run", cwd=str(tmp_path / "spec"))  # in the file: the file's
    assert done.returncode == 0 and "data: 24 rows" in done.stdout, done.stdout + done.stderr
    done = launch(path, "--set", "data.path=rows.csv", "--dry-run", cwd=str(tmp_path / "shell"))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "data: 16 rows" in done.stdout, done.stdout
    _refused(launch(path, "--set", "data.path=rows.csv", "--dry-run", cwd=str(tmp_path)),
             f"--set: data.path: no such file: {tmp_path / 'rows.csv'} (a path given with --set "
             "is relative to the directory launch runs in)")


# ---- 3. secrets ----------------------------------------------------------------------------
@pytest.mark.slow  # starts JAX workers
def test_secrets_are_masked_everywhere_printed_or_kept(tmp_path):
    (tmp_path / "secret_task.py").write_text(textwrap.dedent("""\
        from worker.tasks import linear_regression

        def make(api_token, mode):
            assert api_token == "tok-arg-123", api_token
            return linear_regression()
        """))
    text = BASE.replace("name: t", "name: tsecret") + textwrap.dedent("""\
        secrets: [MY_PLAIN_NAME]
        task: {name: 'secret_task:make', args: {api_token: tok-arg-123, mode: none}}
        """) + LOCAL % (", env: {DB_PASS: pw-db-123, DATABASE_URL: 'postgres://u:pw-url-123@db/x',"
                        f" MY_PLAIN_NAME: plain-123, HOME_DIR: /home/visible, "
                        f"PYTHONPATH: '{tmp_path}{os.pathsep}{REPO}'}}")
    path = _spec(tmp_path, text)
    dry = launch(path, "--dry-run")
    assert dry.returncode == 0, dry.stderr
    for secret in ("pw-db-123", "pw-url-123", "plain-123"):
        assert secret not in dry.stdout + dry.stderr
    assert "DATABASE_URL='postgres://u:****@db/x'" in dry.stdout
    assert "HOME_DIR=/home/visible" in dry.stdout
    run_dir = tmp_path / "run"
    result = launch(path, "--run-dir", str(run_dir), "--set", "train.num_steps=1")
    assert result.returncode == 0, result.stdout + result.stderr
    kept = (run_dir / "spec.yaml").read_text()
    for secret in ("pw-db-123", "pw-url-123", "plain-123", "tok-arg-123"):
        assert secret not in kept
        assert secret not in result.stdout + result.stderr
    # TensorBoard's spec text and hparams, written by process 0, read back with TensorBoard
    from harness.helpers import read_plugin_data
    text, session, _ = read_plugin_data(str(run_dir / "tensorboard"))
    assert '"api_token": "****"' in text and "tok-arg-123" not in text
    assert session.hparams["task.args.api_token"].string_value == "****"
    assert "tok-arg-123" not in str(session)
    # the workers' copy carries the task's arguments, readable by the owner only
    job_json = run_dir / "job.json"
    assert stat.S_IMODE(job_json.stat().st_mode) == 0o600
    assert json.loads(job_json.read_text())["task"]["args"]["api_token"] == "tok-arg-123"


# ---- 1. identifiers that reach a shell, a path or an ssh_config token ----------------------
def test_a_host_name_cannot_run_a_command_through_ssh_config(tmp_path):
    """paramiko runs ``Match exec`` lines through a shell with %h replaced (CVE-2023-51385's kind)."""
    pwned = tmp_path / "pwned"
    config = tmp_path / "ssh_config"
    config.write_text('Match exec "test %h = bastion"\n    User nobody\n')
    host = f"10.0.0.1; touch {pwned}; true"
    cluster = (f"cluster: {{backend: ssh, ssh_config_file: '{config}', "
               f"hosts: ['{host}']}}\n")
    for result in _both(_spec(tmp_path, BASE + cluster)):
        _refused(result, "cluster.hosts[0].host: expected a host name or address",
                 "';' at position 8 is not allowed")
    assert not pwned.exists()


@pytest.mark.parametrize("cluster, needle", [
    ("{backend: ssh, hosts: [{host: h1, user: 'root;id'}]}", "cluster.hosts[0].user: expected a user name"),
    ("{backend: ssh, user: \"a\\nb\", hosts: [h1]}", "cluster.user: expected a user name"),
    ("{backend: ssh, hosts: [h1], workdir: '$(reboot)'}", "cluster.workdir: expected a path"),
    ("{backend: ssh, hosts: [{host: h1, workdir: '-rf'}]}", "cluster.hosts[0].workdir: expected a path"),
    ("{backend: ssh, hosts: [h1], python: 'python3 -c evil'}", "' ' at position 7 is not allowed"),
    ("{backend: ssh, hosts: [h1], identity_file: \"key\\n\"}", "cluster.identity_file: expected a file path"),
    ("{backend: ssh, hosts: ['-oProxyCommand=id']}", "'-' at position 0 is not allowed"),
    ("{backend: tpu, tpu: 'My_TPU', zone: us-central2-b, accelerator_type: v4-8}",
     "cluster.tpu: expected a Cloud resource name"),
    ("{backend: tpu, tpu: t, zone: 'us;id', accelerator_type: v4-8}", "cluster.zone: expected a Cloud zone"),
    ("{backend: tpu, slices: [a, 'b c'], zone: us-central2-b, accelerator_type: v4-8}",
     "cluster.slices: item 1: expected a Cloud resource name"),
    ("{backend: tpu, tpu: t, zone: us-central2-b, project: 'p$x', accelerator_type: v4-8}",
     "cluster.project: expected a Cloud project id"),
])
def test_identifiers_of_every_backend_are_strict(tmp_path, cluster, needle):
    for result in _both(_spec(tmp_path, BASE + f"cluster: {cluster}\n")):
        _refused(result, needle)


@pytest.mark.parametrize("cluster, needle", [
    # sbatch reads any unambiguous prefix of a long option: --signa= is --signal
    ("sbatch_options: ['--signa=USR1@9']", "--signa (sbatch reads it as --signal) is set by podlaunch"),
    ("sbatch_options: ['--exclude=n1']", "--exclude changes where the job runs"),
    # Slurm's alias of --ntasks-per-node, and its abbreviation
    ("sbatch_options: ['--tasks-per-node=2']", "--tasks-per-node is set by podlaunch"),
    ("sbatch_options: ['--tasks-per-n=2']", "--tasks-per-n (sbatch reads it as --tasks-per-node)"),
    ("sbatch_options: ['--nodel=n1']", "--nodel (sbatch reads it as --nodelist) changes where the job runs"),
    # what ends the job, or when, is podlaunch's to follow (third attack on issue 28)
    ("sbatch_options: ['--hold']", "--hold changes whether or when the job ends"),
    ("sbatch_options: ['--no-kill']", "a node failure would no longer end the job"),
    ("sbatch_options: ['--time-min=5']", "--time-min changes whether or when the job ends"),
    ("sbatch_options: ['--time-m=5']", "--time-m (sbatch reads it as --time-min)"),
    ("sbatch_options: ['--time=10']", "--time is set by podlaunch from the cluster settings"),
    # a submitted job's settings in the user's own allocation: used by nothing
    ("mode: allocation, time_limit: '10'", "cluster.time_limit: is for a job podlaunch submits, and "
     "mode: allocation runs in your own job"),
    ("mode: allocation, partition: debug", "remove cluster.partition, or use mode: submit"),
    # a lead is a time before a finite limit, and under it
    ("time_limit: '2', time_limit_lead_s: 120",
     "cluster.time_limit_lead_s: 120 s is more than half of cluster.time_limit 2 (120 s)"),
    ("time_limit: '2', time_limit_lead_s: 61", "use at most 60 or raise time_limit"),
    # sbatch reads --time=0 as no limit
    ("time_limit: '0', time_limit_lead_s: 10", "which is 0: set a finite time_limit"),
    ("time_limit_lead_s: 60", "cluster.time_limit_lead_s: 60 s is a lead before cluster.time_limit, "
     "which is unset"),
    ("time_limit: UNLIMITED, time_limit_lead_s: 60", "which is UNLIMITED"),
])
def test_slurm_options_podlaunch_decides_and_a_lead_not_under_the_limit_are_refused(
        tmp_path, cluster, needle):
    for result in _both(_spec(tmp_path, BASE + f"cluster: {{backend: slurm, nodes: 1, {cluster}}}\n")):
        _refused(result, needle)


def test_the_default_lead_is_at_most_half_a_short_time_limit():
    """The attack's 2-minute job stopped as final after about 20 s: unset, the lead is 120 s
    or half the limit, whichever is less; every sbatch form of --time is read."""
    from launcher.backends.slurm.settings import SlurmCluster, time_limit_s

    assert [time_limit_s(v) for v in ("2", "2:30", "1:00:00", "1-0", "1-2:3", "1-2:3:4",
                                      "UNLIMITED", "infinite", "0", "0:00")] == [
        120, 150, 3600, 86400, 93780, 93784, None, None, None, None]
    assert SlurmCluster(time_limit="2").signal_lead_s == 60
    assert SlurmCluster(time_limit="1:00:00").signal_lead_s == 120
    assert SlurmCluster(time_limit="1:00:00", time_limit_lead_s=0).signal_lead_s == 0
    assert SlurmCluster(time_limit="UNLIMITED").signal_lead_s == 0


# ---- 4. the host-key refusal's advice is OpenSSH's -------------------------------------------
def test_known_hosts_names_and_fingerprints_as_openssh_writes_them(tmp_path):
    import subprocess

    import paramiko

    from launcher.backends.ssh.hosts import known_hosts_name, sha256_fingerprint

    assert known_hosts_name("db1", 22) == "db1"  # port 22 entries have no brackets
    assert known_hosts_name("10.0.0.7", 2222) == "[10.0.0.7]:2222"
    key_file = tmp_path / "key"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key_file)], check=True)
    expected = subprocess.run(["ssh-keygen", "-lf", f"{key_file}.pub"], capture_output=True,
                              text=True, check=True).stdout.split()[1]
    assert sha256_fingerprint(paramiko.Ed25519Key.from_private_key_file(str(key_file))) == expected


@pytest.mark.parametrize("section", ["cluster", "program"])
def test_a_program_command_found_only_on_the_workers_path_is_accepted(tmp_path, section):
    """Both sides of the check (issue 71): a command on the workers' PATH, which
    ``cluster.env`` or ``program.env`` sets and this shell's PATH lacks, is theirs to run."""
    tools = tmp_path / "tools"
    tools.mkdir()
    (tools / "trainme").write_text("#!/bin/sh\nexit 0\n")
    os.chmod(tools / "trainme", 0o755)
    spec = tmp_path / "prog.yaml"
    spec.write_text(f"name: prog\nprogram:\n  argv: [trainme]\n"
                    + (f"  env: {{PATH: '{tools}:/usr/bin:/bin'}}\n" if section == "program" else "")
                    + "cluster:\n  num_processes: 1\n"
                    + (f"  env: {{PATH: '{tools}:/usr/bin:/bin'}}\n" if section == "cluster" else ""))
    done = launch(str(spec), "--dry-run")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "trainme" in done.stdout


@pytest.mark.parametrize("argv, needle", [
    ("[pythn, train.py]", "program.argv: 'pythn' is not on the workers' PATH"),
    ("[./nosuch.sh]", "program.argv: {tmp}/nosuch.sh is not an executable file"),
])
def test_a_program_command_the_workers_cannot_run_is_refused_before_start(tmp_path, argv, needle):
    spec = tmp_path / "prog.yaml"
    spec.write_text(f"name: prog\nprogram:\n  argv: {argv}\ncluster:\n  num_processes: 1\n")
    for extra in ((), ("--dry-run",)):
        done = launch(str(spec), "--run-dir", str(tmp_path / "run"), *extra)
        assert done.returncode == 2, done.stdout + done.stderr
        assert "Traceback" not in done.stderr
        assert f"error: {spec}:3: {needle.format(tmp=tmp_path)}" in done.stderr, done.stderr
        assert not (tmp_path / "run").exists()
    if argv.startswith("[pythn"):
        assert "did you mean 'python'?" in done.stderr


@pytest.mark.parametrize("suffix", [".npy", ".npz"])
def test_a_value_that_is_not_finite_in_a_npy_or_npz_is_refused_before_start(tmp_path, suffix):
    """A newcomer's report: a NaN in a CSV was refused before anything started, the same NaN in
    a .npy only after the workers started (exit 1, another process's XLA abort on the console,
    the row counted from 0). Now both before start, rows and columns counted from 1."""
    import numpy as np

    table = np.ones((100, 4), dtype=np.float64)
    table[41, 2] = np.nan
    data = tmp_path / f"data{suffix}"
    if suffix == ".npy":
        np.save(data, table)
    else:
        np.savez(data, x=table[:, :3], y=table[:, 3:])
    spec = tmp_path / "job.yaml"
    spec.write_text(textwrap.dedent(f"""\
        name: bad
        task:
          name: linear_regression
        data:
          source: file
          path: {data.name}
        train:
          num_steps: 5
          global_batch_size: 32
        cluster:
          num_processes: 2
        """))
    done = launch(str(spec), "--run-dir", str(tmp_path / "run"))
    assert done.returncode == 2, done.stdout + done.stderr
    where = "array 'x', " if suffix == ".npz" else ""
    assert (f"error: {spec}:6: data.path: {data}: {where}row 42, column 3: nan is not a finite "
            "number") in done.stderr, done.stderr
    assert "Traceback" not in done.stderr and not (tmp_path / "run" / "logs").exists()
    if suffix == ".npz":  # every array is read, not the first alone (issue 71)
        table[41, 2], table[6, 3] = 1.0, np.inf
        np.savez(data, x=table[:, :3], y=table[:, 3:])
        done = launch(str(spec), "--dry-run", cwd=str(tmp_path))
        assert done.returncode == 2, done.stdout + done.stderr
        assert (f"error: {spec}:6: data.path: {data}: array 'y', row 7, column 1: inf is not a "
                "finite number") in done.stderr, done.stderr
        table[6, 3] = 1.0
    table[41, 2] = 1e300  # finite in the file, inf in float32
    np.save(tmp_path / "big.npy", table)
    done = launch(str(spec), "--set", "data.path=big.npy", "--dry-run", cwd=str(tmp_path))
    assert done.returncode == 2 and "row 42, column 3: 1e+300 is beyond float32's range" in \
        done.stderr, done.stderr
