"""``python -P -m worker --job NAME --run RUN --process-id N``: one process of a job.

The launcher starts workers with ``-P`` (Python 3.11+): the working directory is not put
first on ``sys.path``, so a user's own ``worker.py`` or ``launcher.py`` beside the job
cannot stand in for podlaunch's packages. The directory is still searched, last, for the
user's task modules (``task.name: mytask:make``), after ``PYTHONPATH`` and site-packages.
The arguments name the process in ``ps``; the identity itself comes from the environment
(``worker.contract``), and a ``--process-id`` that disagrees with it is refused.
"""

import os
import sys

from worker import contract
from worker.trainer.main import main


def _named_process_id(argv: list) -> str | None:
    """The value of ``--process-id`` in ``argv``, or None; other arguments are names only."""
    for i, arg in enumerate(argv):
        if arg == "--process-id" and i + 1 < len(argv):
            return argv[i + 1]
        if arg.startswith("--process-id="):
            return arg.split("=", 1)[1]
    return None


if sys.flags.safe_path and os.getcwd() not in sys.path:
    sys.path.append(os.getcwd())  # the user's task modules, after every package of ours
named = _named_process_id(sys.argv[1:])
if named is not None and named != os.environ.get(contract.PROCESS_ID, named):
    print(f"worker: --process-id {named} on the command line, but the environment's "
          f"{contract.PROCESS_ID} is {os.environ[contract.PROCESS_ID]}: a launcher bug",
          flush=True)
    sys.exit(contract.EXIT_MISMATCH)
main()
