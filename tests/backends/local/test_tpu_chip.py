"""The TPU check (bench/tpu_check.py) on this machine's real TPU chip: every item at once.

Runs only where a TPU chip is (``/dev/accel*`` or numbered ``/dev/vfio/*``) and nothing else
holds it; CI has none, so there it is skipped, and the figures of the last run on a real
chip are in docs/tpu.md with their date. On a TPU VM:

    python -m pytest -m tpu_chip -rs tests/backends/local/test_tpu_chip.py
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from harness.helpers import REPO, env_for_tests
from launcher.backends.local import devices as localdevices

CHIPS = localdevices.device_files(localdevices.TPU_DEVICE_PATHS)

pytestmark = [pytest.mark.slow, pytest.mark.tpu_chip, pytest.mark.skipif(
    not CHIPS, reason="no TPU chip on this machine: the TPU check runs on a TPU VM only "
    "(its last figures: docs/tpu.md)")]


def test_every_item_of_the_tpu_check_passes_on_the_chip(tmp_path):
    env = {k: v for k, v in env_for_tests().items() if k != "JAX_COMPILATION_CACHE_DIR"}
    done = subprocess.run([sys.executable, "bench/tpu_check.py", "--out", str(tmp_path),
                           "--rounds", "1"], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=1800)
    results = json.loads((tmp_path / "tpu_check.json").read_text())
    failed = {name: r["detail"] for name, r in results.items()
              if isinstance(r, dict) and r.get("pass") is False}
    assert done.returncode == 0 and not failed, done.stdout[-4000:]
