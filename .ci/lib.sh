# Sourced by .ci/run and .ci/newest_end.sh (bash). The tested ends live in
# launcher/versions.py; these helpers read them and find the interpreters.

# Python may cache the bytecode it compiles (this machine's environment sets
# PYTHONDONTWRITEBYTECODE=1): the venvs are then installed without compiling every module of
# site-packages up front (the oldest end's venv 10 s of wall and 17 CPU-s -> 2.3 s and 1.6),
# and each module the tests import is compiled once, at its first import (about 3 CPU-s more
# for the first launch, none after); pytest's rewritten test modules are cached the same way.
unset PYTHONDONTWRITEBYTECODE

# tested NAME INDEX: TESTED_PYTHON or TESTED_JAX, 0 (oldest) or 1 (newest), read from
# launcher/versions.py with any python3 (the module is stdlib only; runpy imports nothing
# else of podlaunch).
tested() {
  python3 -c 'import runpy, sys; print(runpy.run_path("launcher/versions.py")[sys.argv[1]][int(sys.argv[2])])' "$1" "$2"
}

# find_python X.Y: print the path of a working Python X.Y interpreter, or fail.
# Looked for, in order: $PODLAUNCH_PYTHON_X_Y (e.g. PODLAUNCH_PYTHON_3_13=/opt/py/bin/python3),
# pyenv's installs (${PYENV_ROOT:-~/.pyenv}/versions/X.Y.*, newest patch first), pythonX.Y on
# PATH, python3 on PATH. Each candidate must run and report X.Y (pyenv's shims exist for
# versions that are not selected, and fail when run).
find_python() {
  local want=$1 var="PODLAUNCH_PYTHON_${1//./_}" c got
  local -a candidates=()
  [ -n "${!var:-}" ] && candidates+=("${!var}")
  local root=${PYENV_ROOT:-$HOME/.pyenv}
  while IFS= read -r c; do candidates+=("$c"); done < <(
    ls -d "$root"/versions/"$want".*/bin/python3 2>/dev/null | sort -rV)
  candidates+=("python$want" python3)
  for c in "${candidates[@]}"; do
    got=$("$c" -c 'import sys; print("%d.%d" % sys.version_info[:2], sys.executable)' 2>/dev/null) ||
      continue
    if [ "${got%% *}" = "$want" ]; then
      echo "${got#* }"
      return 0
    fi
  done
  echo "no Python $want here (looked at: ${candidates[*]}); install one (e.g. pyenv install $want)" \
       "or point $var at its interpreter" >&2
  return 1
}

# uv_for_venvs: print the path of the uv (https://docs.astral.sh/uv/) make_venv installs with:
# build/uv/bin/uv, put there with pip on first use (build/ is ignored by git); fails where pip
# cannot install it (make_venv then installs with pip). pip's --target needs no venv of its
# own: a fresh clone's CI waited 6 s for one (ensurepip alone 4 s), 2.8 s this way.
uv_for_venvs() {
  local boot=build/uv
  if [ ! -x "$boot/bin/uv" ]; then
    rm -rf "$boot"
    { python3 -m pip install -q --target "$boot" uv ||
      { rm -rf "$boot" && python3 -m venv --clear "$boot" &&
        "$boot/bin/python" -m pip install -q uv; }; } >&2 || return 1
  fi
  echo "$boot/bin/uv"
}

# make_venv PYTHON DIR JAX_VERSION: a fresh venv in DIR with the project (editable), its
# test extras and exactly jax/jaxlib JAX_VERSION; fails if the install resolves anything else
# (for instance when pyproject.toml's range no longer admits that version).
# uv installs it where it can: on this 2-core machine the oldest end's venv took 37 s of wall
# and 34 CPU-s with pip, 10 s and 17 CPU-s with uv compiling site-packages' bytecode, 2.3 s
# and 1.6 CPU-s without (see PYTHONDONTWRITEBYTECODE above); both venvs are built while CI
# runs, one of them beside the suite.
# uv reads PyPI (or UV_INDEX_URL), not pip.conf: where its install fails (say, only a pip
# mirror is reachable), pip installs instead.
make_venv() {
  local py=$1 dir=$2 jax=$3 uv
  # editable_mode=compat: the checkout on sys.path by a plain .pth line instead of
  # setuptools' import finder, which every Python process of the venv imported at start
  # (15 -> 6 ms of `site` here; the suite starts about 2,100 of them). pip is installed for
  # the commands the docs give (`.venv/bin/pip install -e '.[profile]'`); uv's --seed would
  # add setuptools' distutils hook, another .pth imported by every process.
  if uv=$(uv_for_venvs) && "$uv" venv -q --clear --python "$py" "$dir" &&
     VIRTUAL_ENV=$dir "$uv" pip install -q -C editable_mode=compat \
       -e '.[test]' "jax==$jax" "jaxlib==$jax" pip; then
    :
  else
    echo "make_venv: uv could not make $dir; installing with pip" >&2
    "$py" -m venv --clear "$dir"
    "$dir/bin/python" -m pip install -q --upgrade pip
    "$dir/bin/python" -m pip install -q -e '.[test]' "jax==$jax" "jaxlib==$jax"
  fi
  # The project's own modules, compiled once for this interpreter, before the suite's three
  # workers would each compile them at once (and for a shell that does not source this file
  # with PYTHONDONTWRITEBYTECODE set, where every process compiled them from source again: a
  # launcher process 0.45 -> 0.37 CPU-s).
  "$dir/bin/python" -m compileall -q -j 0 launcher worker tests examples bench >/dev/null
  "$dir/bin/python" - "$jax" <<'EOF'
import platform, sys
from importlib.metadata import version
want = sys.argv[1]
got = {name: version(name) for name in ("jax", "jaxlib")}
print(f"testing with Python {platform.python_version()}, jax {got['jax']}, jaxlib {got['jaxlib']}",
      flush=True)
if any(v != want for v in got.values()):
    sys.exit(f"expected jax and jaxlib {want}, got {got}")
EOF
}
