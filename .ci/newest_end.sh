#!/usr/bin/env bash
# The newest end of the tested range, called by .ci/run before the main suite (the oldest
# end): Python TESTED_PYTHON[1] with jax/jaxlib TESTED_JAX[1] (launcher/versions.py) in
# their own venv, build/venv-newest (ignored by git, recreated each run; set
# PODLAUNCH_NEWEST_VENV to put it elsewhere). To stay within CI's time it runs the fast
# tests, one real multi-process local run and one real run over sshd, not the whole suite.
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

# The fast tests, then one real multi-process local run (2 processes x 2 devices, TensorBoard
# read back) and one real run over sshd (4 hosts, parameters equal to single-host mode).
# -rs lists skips; .ci/run (which sets CI=true) makes a test without its sshd fail, not skip.
# One process, no xdist: beside the oldest end's suite the cores are taken anyway, and each
# xdist worker collects (imports) the whole suite again.
"$venv/bin/python" -m pytest -q -rs --timeout=300 -p no:cacheprovider -m "not slow"
# PYTEST_XDIST_WORKER=gw7: the sshd port range of a worker the oldest end (three workers,
# gw0 to gw2, running at the same time) does not have (tests/harness/sshenv.py FIRST_PORT)
PYTEST_XDIST_WORKER=gw7 "$venv/bin/python" -m pytest -q -rs --timeout=300 -p no:cacheprovider \
  "tests/backends/local/test_local_run.py::test_main_job_trains_and_logs_to_tensorboard" \
  "tests/backends/ssh/test_ssh.py::test_four_hosts_match_single_host_debug_mode"
echo "newest end: passed in $((SECONDS - started)) s"
