"""What a run's metrics hold, for the workers that write them and whoever reads them back:
the columns of the train step's metrics array (``STEP_METRICS``: the scalars of every log
step, a task's own added after them) and the file process 0 writes every log step's scalars
to, one JSON record a line, beside its TensorBoard events (``METRICS_FILE``, in
``<run dir>/tensorboard``; ``launch runs`` reads a run's last loss from it).
"""

STEP_METRICS = ("loss", "grad_norm", "param_norm")
METRICS_FILE = "metrics.jsonl"
