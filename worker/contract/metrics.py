"""What a run's metrics hold, for the workers that write them and whoever reads them back:
the columns of the train step's metrics array (``STEP_METRICS``: the scalars of every log
step, a task's own added after them) and the file process 0 writes every log step's scalars
to, one JSON record a line, beside its TensorBoard events (``METRICS_FILE``, in
``<run dir>/tensorboard``; ``launch runs`` reads a run's last loss from it).

Each process's own step time is ``step_time_s/process_NNN`` in a record
(``PROCESS_STEP_TIME``), and in TensorBoard the scalar ``own_step_time_s``
(``OWN_STEP_TIME``) of a run of its own, ``<run dir>/tensorboard/process_NNN``
(``process_run``): TensorBoard colours a chart's lines by run, so one chart of that tag
tells every process apart.
"""

STEP_METRICS = ("loss", "grad_norm", "param_norm")
METRICS_FILE = "metrics.jsonl"
PROCESS_STEP_TIME = "step_time_s/process_"  # + the process id, 3 digits: a record's key
OWN_STEP_TIME = "own_step_time_s"  # the tag in each process's own TensorBoard run


def process_run(process_id: int) -> str:
    """The directory, under a run's ``tensorboard/``, of process ``process_id``'s own run."""
    return f"process_{process_id:03d}"
