"""Backends start the planned processes and hand back ``supervise.Worker`` handles.

Each backend module provides:
  prepare(job, run_dir, python, console) -> Plan   choose ports, discover hosts,
      run preflight checks; raises SpecError (bad input) or LaunchError.
  describe_start(plan) -> str                      one line for the console.
  start(plan, console) -> list[Worker]             start every process, in process_id order.
"""

import importlib

BACKENDS = {"local": "launcher.backends.local", "ssh": "launcher.backends.ssh",
            "tpu": "launcher.backends.tpu"}


def get(name: str):
    """The backend module for ``cluster.backend``."""
    return importlib.import_module(BACKENDS[name])
