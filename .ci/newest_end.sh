#!/usr/bin/env bash
# The newest end of the tested range, called by .ci/run before the main suite (the oldest
# end): Python TESTED_PYTHON[1] with jax/jaxlib TESTED_JAX[1] (launcher/versions.py) in
# their own venv, build/venv-newest (ignored by git, recreated each run; set
# PODLAUNCH_NEWEST_VENV to put it elsewhere). To stay within CI's time it runs what a newer
# Python or jax can break (below) and a few real runs end to end, not the whole suite.
# Needs /usr/sbin/sshd (.ci/run installs it) and root for the sshd test.
#
# No Python TESTED_PYTHON[1] here is a failure, not a skip: an end that silently stops
# running is how a "tested" range stops being true. Install one, or point
# PODLAUNCH_PYTHON_3_13 (for 3.13) at an interpreter (.ci/lib.sh find_python).
set -euo pipefail
cd "$(dirname "$0")/.."
source .ci/lib.sh

py_version=$(tested TESTED_PYTHON 1)
jax_version=$(tested TESTED_JAX 1)
echo "newest end: Python $py_version, jax $jax_version"
py=$(find_python "$py_version")
venv=${PODLAUNCH_NEWEST_VENV:-build/venv-newest}

started=$SECONDS
make_venv "$py" "$venv" "$jax_version"
echo "newest end: venv ready in $((SECONDS - started)) s"

# What the newest Python and jax can break, not the whole suite again (it ran the fast
# tests, 865 of them, in 860 s beside the oldest end: the largest share of CI's time): the
# worker's parts (tests/worker: jax's API, the step, the data, checkpoints), every module
# imported and its floors (tests/fitness), the version rules (tests/spec/test_versions.py),
# the profiler's requests (tests/commands/test_profile.py), then real runs end to end: the main
# job with TensorBoard read back, a 2 x 2 run's every tag, a worker killed and the run
# resumed from its checkpoint, a re-run loading what the first compiled (the compilation
# cache), a live profile, and four hosts over sshd equal to single-host mode.
# -rs lists skips; .ci/run (which sets CI=true) makes a test without its sshd fail, not skip.
# One process, no xdist: beside the oldest end's suite the cores are taken anyway.
# PYTEST_XDIST_WORKER=gw7: the sshd port range of a worker the oldest end (three workers,
# gw0 to gw2, running at the same time) does not have (tests/harness/sshenv.py FIRST_PORT)
"$venv/bin/python" -m pytest -q -rs --timeout=300 -p no:cacheprovider -m "not slow" \
  tests/worker tests/fitness tests/spec/test_versions.py tests/commands/test_profile.py
PYTEST_XDIST_WORKER=gw7 "$venv/bin/python" -m pytest -q -rs --timeout=300 -p no:cacheprovider \
  "tests/backends/local/test_local_run.py::test_main_job_trains_and_logs_to_tensorboard" \
  "tests/console/test_monitoring.py::test_a_2x2_run_logs_every_tag_and_per_process_curve_and_matching_metrics_jsonl" \
  "tests/run/test_restart.py::test_worker_killed_at_step_k_restarts_and_matches_the_uninterrupted_run" \
  "tests/run/test_restart.py::test_a_rerun_of_a_job_loads_what_the_earlier_run_compiled" \
  "tests/commands/test_profile.py::test_launch_profile_on_a_live_run_traces_every_process_and_changes_no_param" \
  "tests/backends/ssh/test_ssh.py::test_four_hosts_match_single_host_debug_mode"
echo "newest end: passed in $((SECONDS - started)) s"
